/* worker/own.c — libwagma's calls for a program that averages by an algorithm of its own
 * (wagma/worker.h: wagma_worker_advance, _allreduce, _member_address, _report_algorithm): the
 * built-in trainer's adpsgd, asgd and dc-asgd, whose models move over endpoints of the
 * program's (agent/adpsgd.h, agent/ps.h). libwagma keeps what it keeps for every program: the
 * epochs and their opening sync, the iteration count, the reports, the stop.
 *
 * Threads: the training thread only (the handle's rule, worker.c). */
#include <stdio.h>
#include <string.h>

#include "worker_internal.h"

int wagma_worker_advance(wagma_worker_t *w, uint64_t iterations) {
  if (wg_worker_averages(w))
    return wg_worker_fail(w, WAGMA_EINVAL,
                          "wagma_worker_advance is for a program's own algorithm; libwagma "
                          "averages %s jobs in wagma_worker_step",
                          w->cfg.algorithm);
  uint64_t epoch = w->epoch;
  int e = wg_worker_boundary(w);
  if (e)
    return e;
  w->has_model = 1;
  uint64_t before = w->iteration;
  /* a new epoch counts from its start_round (the boundary set it): the iterations the caller
   * counted belong to the epoch it trained them in, and the plan's start_round includes them
   * as far as the coordinator saw them */
  if (w->epoch == epoch)
    w->iteration += iterations;
  return wg_worker_step_end(w, before);
}

int wagma_worker_allreduce(wagma_worker_t *w, float *buf, size_t n, wagma_worker_reduce_t op) {
  if (!buf && n)
    return wg_worker_fail(w, WAGMA_EINVAL, "no buffer to allreduce");
  if (op != WAGMA_WORKER_SUM && op != WAGMA_WORKER_MEAN)
    return wg_worker_fail(w, WAGMA_EINVAL, "unknown reduction %d", (int)op);
  if (!w->comm)
    return wg_worker_fail(w, w->epoch ? WAGMA_ECANCELED : WAGMA_EUNAVAIL,
                          w->epoch ? "the epoch was superseded: the next step enters the newer"
                                   : "no epoch entered yet (wagma_worker_register first)");
  if (n == 0)
    return 0;
  int e = wagma_comm_allreduce(w->comm, buf, n,
                               op == WAGMA_WORKER_MEAN ? WAGMA_REDUCE_MEAN : WAGMA_REDUCE_SUM);
  if (e == WAGMA_ECANCELED) {
    wg_worker_close_comm(w); /* a newer plan or a stop: the next boundary takes it */
    return wg_worker_fail(w, e, "the epoch was superseded during the allreduce");
  }
  if (e)
    return wg_worker_fail(w, e, "allreduce of %zu floats: %s (%s)", n, wagma_strerror(e),
                          wagma_comm_last_error(w->comm));
  return 0;
}

int wagma_worker_member_address(const wagma_worker_t *w, int rank, char *out, size_t len) {
  if (!w->epoch || rank < 0 || rank >= w->cur.nranks)
    return WAGMA_EINVAL;
  int n = snprintf(out, len, "%s", w->cur.members[rank].address);
  return n < 0 || (size_t)n >= len ? WAGMA_ERANGE : 0;
}

int wagma_worker_report_algorithm(wagma_worker_t *w, const wagma_worker_algorithm_stats_t *stats) {
  static const char *const roles[] = {"worker", "active", "passive", "server"};
  const char *role = stats->role && stats->role[0] ? stats->role : "worker";
  int known = 0;
  for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++)
    known |= strcmp(role, roles[i]) == 0;
  if (!known)
    return wg_worker_fail(w, WAGMA_EINVAL, "unknown role \"%.20s\"", role);
  snprintf(w->role, sizeof w->role, "%s", role);
  w->staleness = stats->staleness;
  w->own_averaged = stats->averaged;
  w->own_served = stats->served;
  w->own_skipped = stats->skipped;
  return 0;
}
