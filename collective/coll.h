/* coll.h — blocking collectives over a transport (private to collective/; coll.c).
 *
 * Used by the engine for the public wagma_comm_allreduce / _broadcast / _average and for
 * barrier-mode global rounds. Every participant calls the same operation with the same
 * ctx->ranks, ctx->round, ctx->group and ctx->seq; frames are WG_FRAME_COLL matched on
 * (src, round, group, seq), so concurrent collectives with different (round, group) never mix.
 * Algorithms: recursive doubling (with the usual fold-in of the non-power-of-two remainder)
 * when count * 4 <= small_threshold bytes, ring reduce-scatter + allgather otherwise.
 * Every wait ends at `deadline` (absolute wg_now() seconds): WAGMA_ETIMEDOUT, or WAGMA_EPEER
 * when a participant is known dead. No threads of its own; runs on the caller's thread. */
#ifndef WAGMA_COLLECTIVE_COLL_H
#define WAGMA_COLLECTIVE_COLL_H

#include <stddef.h>
#include <stdint.h>

#include "transport.h"

#define WG_COLL_SMALL_THRESHOLD_DEFAULT (64u * 1024u)

typedef struct wg_coll_ctx {
  const wg_transport_ops_t *ops;
  wg_transport_t *transport;
  int rank;         /* my rank in the plan */
  const int *ranks; /* participating ranks, sorted ascending, includes rank */
  int nranks;       /* entries in ranks, >= 1 */
  uint64_t round;   /* header.round of every frame of this operation */
  uint32_t group;   /* header.group of every frame of this operation */
  uint64_t seq;     /* header.seq base of this operation; the op may use seq .. seq + 2^20 */
  size_t small_threshold; /* bytes; 0 = WG_COLL_SMALL_THRESHOLD_DEFAULT */
} wg_coll_ctx_t;

/* buf (count floats, identical count everywhere) <- sum or mean over ctx->ranks. */
int wg_coll_allreduce(const wg_coll_ctx_t *ctx, float *buf, size_t count, wagma_reduce_op_t op,
                      double deadline);

/* buf <- root's buf on every participant (root is a plan rank inside ctx->ranks). */
int wg_coll_broadcast(const wg_coll_ctx_t *ctx, float *buf, size_t count, int root,
                      double deadline);

/* buf <- sum(w_i * buf_i) / sum(w_i); WAGMA_EINVAL on every participant if sum(w_i) == 0. */
int wg_coll_average(const wg_coll_ctx_t *ctx, float *buf, size_t count, float weight,
                    double deadline);

#endif
