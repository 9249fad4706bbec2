/* coordinator/planner.c — glue between the scheduler and the plan library: ordered members
 * (names, addresses, joiner flags) + job parameters -> wagma_plan_build -> wagma_plan_to_json
 * (the library's direct encoder, a few ms at P = 10000), which agents decode with
 * wagma_plan_from_json; and the plan history entry of the same epoch (wagma_plan_record_t:
 * start_round, group parameters, member names and a hash of the phases), from which
 * wg_planner_from_record rebuilds the epoch's groups for GET /v1/jobs/{id}/groups.
 *
 * Ranks are the members' order (the scheduler keeps survivors in their previous rank order
 * and appends joiners), so a membership change moves as few ranks as possible. Pure apart from
 * the clock; thread-safe. */
#include <stdlib.h>
#include <string.h>

#include "planner.h"
#include "wagma/collective.h"
#include "wagma/clock_internal.h"

/* FNV-1a 64 over one int, byte by byte (little-endian order, whatever the host). */
static uint64_t fnv_int(uint64_t h, int64_t v) {
  for (int i = 0; i < 8; i++) {
    h ^= (uint64_t)((uint64_t)v >> (8 * i)) & 0xffu;
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t wg_planner_phases_hash(const wagma_plan_t *plan) {
  uint64_t h = 0xcbf29ce484222325ull;
  h = fnv_int(h, plan->nranks);
  h = fnv_int(h, plan->nphases);
  for (int p = 0; p < plan->nphases; p++) {
    const wagma_phase_t *ph = &plan->phases[p];
    h = fnv_int(h, ph->ngroups);
    for (int g = 0; g <= ph->ngroups; g++)
      h = fnv_int(h, ph->offsets[g]);
    for (int r = 0; r < plan->nranks; r++)
      h = fnv_int(h, ph->ranks[r]);
  }
  return h;
}

/* The history entry of a built plan. Ownership: *json is the caller's (free). */
static int record_json(const wagma_plan_t *plan, const wg_plan_request_t *req, char **json) {
  wagma_plan_record_t rec = {.epoch = plan->epoch,
                             .start_round = plan->start_round,
                             .group_size = plan->group_size,
                             .staleness_bound = plan->staleness_bound,
                             .global_sync = req->global_sync,
                             .phases_hash = wg_planner_phases_hash(plan),
                             .nmembers = plan->nranks};
  rec.members = calloc((size_t)plan->nranks, sizeof *rec.members);
  if (!rec.members)
    return WAGMA_ENOMEM;
  for (int r = 0; r < plan->nranks; r++)
    memcpy(rec.members[r], plan->members[r].name, sizeof rec.members[r]);
  int e = wagma_plan_record_to_json(&rec, json);
  wagma_plan_record_free(&rec);
  return e;
}

int wg_planner_build(const wg_plan_request_t *req, char **json, char **record, double *seconds) {
  wagma_plan_t plan;
  int e;
  double t0 = wg_mono();
  memset(&plan, 0, sizeof plan);
  *json = NULL;
  if (record)
    *record = NULL;
  if (req->nmembers < 1 || req->nmembers > WAGMA_API_MAX_WORKERS)
    return WAGMA_EINVAL;
  e = wagma_plan_build(req->nmembers, req->group_size, NULL, &plan);
  if (e)
    goto out;
  plan.epoch = req->epoch;
  plan.start_round = req->start_round;
  plan.staleness_bound = req->staleness_bound;
  plan.global_sync = req->global_sync == WAGMA_SYNC_WAIT_AVOIDING ? WAGMA_GLOBAL_WAIT_AVOIDING
                                                                  : WAGMA_GLOBAL_BARRIER;
  for (int r = 0; r < req->nmembers; r++) {
    const wg_plan_member_t *m = &req->members[r];
    if (strlen(m->name) >= sizeof plan.members[r].name ||
        strlen(m->address) >= sizeof plan.members[r].address) {
      e = WAGMA_EINVAL;
      goto out;
    }
    strcpy(plan.members[r].name, m->name);
    strcpy(plan.members[r].address, m->address);
    plan.members[r].joiner = m->joiner;
  }
  e = wagma_plan_to_json(&plan, json);
  if (e == 0 && record && (e = record_json(&plan, req, record)) != 0) {
    free(*json);
    *json = NULL;
  }
out:
  wagma_plan_free(&plan);
  if (seconds)
    *seconds = wg_mono() - t0;
  return e;
}

int wg_planner_build_json(const wg_plan_request_t *req, char **json, double *seconds) {
  return wg_planner_build(req, json, NULL, seconds);
}

int wg_planner_from_record(const wagma_plan_record_t *rec, wagma_plan_t *plan) {
  memset(plan, 0, sizeof *plan);
  int e = wagma_plan_build(rec->nmembers, rec->group_size, NULL, plan);
  if (e)
    return e;
  plan->epoch = rec->epoch;
  plan->start_round = rec->start_round;
  plan->staleness_bound = rec->staleness_bound;
  plan->global_sync = rec->global_sync == WAGMA_SYNC_WAIT_AVOIDING ? WAGMA_GLOBAL_WAIT_AVOIDING
                                                                   : WAGMA_GLOBAL_BARRIER;
  for (int r = 0; r < rec->nmembers; r++)
    memcpy(plan->members[r].name, rec->members[r], sizeof plan->members[r].name);
  if (rec->phases_hash && wg_planner_phases_hash(plan) != rec->phases_hash) {
    wagma_plan_free(plan);
    return WAGMA_ERANGE;
  }
  return 0;
}
