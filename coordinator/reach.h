/* coordinator/reach.h — the partition rule: which members of a job's plan the coordinator
 * leaves out because their peers cannot reach them on the data plane, or they cannot reach
 * their peers (docs/design.md §7.3). A pure function of the members' reports: no etcd, no
 * clock, no allocation the caller sees; the scheduler (scheduler.c) feeds it and applies
 * what it decides. */
#ifndef WAGMA_COORD_REACH_H
#define WAGMA_COORD_REACH_H

#include <stdint.h>

#include "wagma/api.h"

/* What the rule knows of the member of plan rank r. */
typedef struct wg_reach_member {
  /* 1: its agent is registered at the plan's address and its report is of the plan's epoch.
   * 0: the member is gone or silent (the lease decides about it): its report and the cut
   * links to it count for nothing, and it does not count among the members present. */
  int present;
  int nunreachable; /* its report's list (plan ranks, how long); may hold ranks out of range */
  const struct wagma_unreachable *unreachable;
} wg_reach_member_t;

/* Decides whom of the n members to leave out. A link a-b between present members is cut when
 * a reports b unreachable for at least grace_s, or b reports a. A member is left out when it
 * is cut off from more than half of the other present members. So one member cut off from
 * three is left out whether it or they report it; a minority that reports everyone else
 * unreachable is left out, and none of those it names (each is cut off from the minority
 * only); the first reports of a cut, which name one or two links, leave out nobody until the
 * picture shows who is cut off from most; a single bad link between two members that reach
 * everyone else leaves both in. When that would leave out half the present members or more,
 * nobody is left out and the result is WG_REACH_NO_MAJORITY: with no side a majority, the
 * rule cannot tell the healthy side. Sets out[r] = 1 for each member left out, 0 for the
 * others. Returns how many were left out (0: none), WG_REACH_NO_MAJORITY, or WAGMA_ENOMEM. */
#define WG_REACH_NO_MAJORITY WAGMA_ECONFLICT
int wg_reach_decide(const wg_reach_member_t *m, int n, double grace_s, int *out);

#endif
