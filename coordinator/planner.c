/* coordinator/planner.c — glue between the scheduler and the plan library: ordered members
 * (names, addresses, joiner flags) + job parameters -> wagma_plan_build -> wagma_plan_to_json
 * (the library's direct encoder, a few ms at P = 10000), which agents decode with
 * wagma_plan_from_json.
 *
 * Ranks are the members' order (the scheduler keeps survivors in their previous rank order
 * and appends joiners), so a membership change moves as few ranks as possible. Pure apart from
 * the clock; thread-safe. */
#include <string.h>

#include "coord.h"
#include "wagma/collective.h"

int wg_planner_build_json(const wg_plan_request_t *req, char **json, double *seconds) {
  wagma_plan_t plan;
  int e;
  double t0 = wg_mono();
  memset(&plan, 0, sizeof plan);
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
out:
  wagma_plan_free(&plan);
  if (seconds)
    *seconds = wg_mono() - t0;
  return e;
}
