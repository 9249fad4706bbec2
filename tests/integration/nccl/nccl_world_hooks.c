/* nccl_world_hooks.c — see nccl_world_hooks.h. Single-threaded use per process: the rank's
 * compute thread creates and destroys its communicators. Built against the fake (WG_NCCL_FAKE)
 * and, for test_nccl_engine_multi_gpu, against NCCL with rank r on GPU r. */
#include "nccl_world_hooks.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "engine_internal.h"
#include "nccl_internal.h"

nw_lane_t *nw_lanes;
static int my_rank;

void nw_init(void) {
  if (!nw_lanes) {
    void *p = mmap(NULL, NW_MAXP * sizeof(nw_lane_t), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    nw_lanes = p == MAP_FAILED ? NULL : p;
  }
  nw_reset();
}

void nw_reset(void) {
  if (nw_lanes)
    memset(nw_lanes, 0, NW_MAXP * sizeof(nw_lane_t));
}

int nw_comm_create(const wagma_comm_options_t *options, wagma_comm_t **comm) {
  my_rank = options ? options->rank : 0;
  /* NW_TCP=1: the same scenarios over TCP, to tell the transport's failures from the engine's */
  const char *tcp = getenv("NW_TCP");
#ifdef WG_NCCL_FAKE
  return wg_comm_create_with(options,
                             tcp && *tcp == '1' ? &wg_tcp_transport : &wg_ncclfake_transport, comm);
#else
  if (!options)
    return WAGMA_EINVAL;
  wagma_comm_options_t o = *options;
  o.device = my_rank; /* one GPU per rank: rank r on GPU r */
  return wg_comm_create_with(&o, tcp && *tcp == '1' ? &wg_tcp_transport : &wg_nccl_transport, comm);
#endif
}

void nw_comm_destroy(wagma_comm_t *comm) {
  if (comm && comm->tp && nw_lanes && comm->ops != &wg_tcp_transport && my_rank >= 0 &&
      my_rank < NW_MAXP) {
    nc_t *t = (nc_t *)comm->tp;
    nw_lane_t *l = &nw_lanes[my_rank];
    l->recorded = 1;
    l->state = atomic_load(&t->lane_state);
    l->shrunk = t->shrunk;
    l->transfers = atomic_load(&t->lane_transfers);
    l->failures = atomic_load(&t->lane_failures);
    l->collectives = atomic_load(&t->collectives);
    l->collective_failures = atomic_load(&t->collective_failures);
    pthread_mutex_lock(&t->mu);
    for (int r = 0; r < t->nranks && r < 32; r++)
      if (t->dead_done[r])
        l->dead_mask |= 1u << r;
    pthread_mutex_unlock(&t->mu);
  }
  wagma_comm_destroy(comm);
  WG_NCCL(forget)(); /* the worlds run one epoch: drop the kept communicator (LSan) */
}
