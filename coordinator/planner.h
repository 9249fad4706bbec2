/* coordinator/planner.h — plan glue (planner.c, pure): members -> wagma_plan_build -> the plan's
 * JSON and its history entry, and a history entry back to its groups. */
#ifndef WAGMA_COORD_PLANNER_H
#define WAGMA_COORD_PLANNER_H

#include <stdint.h>

#include "wagma/api.h"

typedef struct wg_plan_member {
  const char *name;
  const char *address;
  int joiner;
} wg_plan_member_t;

typedef struct wg_plan_request {
  uint64_t epoch;
  uint64_t start_round;
  int group_size;
  int staleness_bound;
  wagma_sync_t global_sync;
  int nmembers;
  const wg_plan_member_t *members; /* rank order */
} wg_plan_request_t;

/* Builds the plan and encodes it, and with record non-NULL its history entry
 * (wagma_plan_record_t, see wagma/api.h). Ownership: *json and *record are the caller's
 * (free); both NULL on failure. */
int wg_planner_build(const wg_plan_request_t *req, char **json, char **record, double *seconds);
/* wg_planner_build without the history entry. */
int wg_planner_build_json(const wg_plan_request_t *req, char **json, double *seconds);
/* FNV-1a 64 of the plan's phases (nranks, nphases, every phase's offsets and ranks). */
struct wagma_plan; /* wagma/collective.h */
uint64_t wg_planner_phases_hash(const struct wagma_plan *plan);
/* Rebuilds the groups of a history entry: wagma_plan_build(nmembers, group_size) with the
 * entry's epoch, start_round, staleness bound, global sync and member names (no addresses).
 * WAGMA_ERANGE when the phases do not hash to the entry's phases_hash (a planner that groups
 * differently wrote it). Ownership: on 0, *plan is the caller's (wagma_plan_free). */
int wg_planner_from_record(const wagma_plan_record_t *rec, struct wagma_plan *plan);

#endif
