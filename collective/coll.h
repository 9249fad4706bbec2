/* coll.h — blocking collectives over a transport (private to collective/; coll.c).
 *
 * Used by the engine for the public wagma_comm_allreduce / _broadcast / _average and for
 * barrier-mode global rounds. Every participant calls the same operation with the same
 * ctx->ranks, ctx->round, ctx->group and ctx->seq; frames are WG_FRAME_COLL matched on
 * (src, round, group, seq), so concurrent collectives with different (round, group) never mix.
 * Algorithms (wg_coll_pick): recursive doubling for small buffers, Rabenseifner (recursive
 * halving + doubling) for medium ones, a pipelined ring for large ones, each with the usual
 * fold-in of the non-power-of-two remainder where it needs one. Where the transport offers
 * reader sessions (transport.h), an operation reads the sockets of the peers it receives
 * from on its own thread, and copies land straight in buf.
 * Every wait ends at `deadline` (absolute wg_now() seconds): WAGMA_ETIMEDOUT, or WAGMA_EPEER
 * when a participant is known dead. No threads of its own; runs on the caller's thread.
 *
 * Failure notices: a participant that finds a peer dead in the middle of an operation (a recv
 * from it finds nothing queued and the transport marks it dead, or a send to it fails) sends
 * a notice (WG_FRAME_COLL, flags WG_COLL_FAILED, aux = the dead rank, seq = ctx->seq |
 * WG_COLL_NOTICE_BIT) to every other participant, and returns WAGMA_EPEER. Every participant
 * that waits longer than WG_COLL_WAIT_SLICE_S looks for such a notice of its operation and
 * returns WAGMA_EPEER too, so all survivors learn of a death within about one slice, not at
 * their deadline. A peer that finished its part and closed is not a failure: everything it
 * sent precedes its close on the wire, so a recv from it finds its frame queued. */
#ifndef WAGMA_COLLECTIVE_COLL_H
#define WAGMA_COLLECTIVE_COLL_H

#include <stddef.h>
#include <stdint.h>

#include "transport.h"

#define WG_COLL_SMALL_THRESHOLD_DEFAULT (64u * 1024u)
/* Largest frame payload an operation sends (its data moves in segments of at most this), for
 * the transport's max_payload. */
#define WG_COLL_SEGMENT_BYTES ((size_t)1 << 20)
/* seq values with this bit set are failure notices; ctx->seq must stay below it. */
#define WG_COLL_NOTICE_BIT ((uint64_t)1 << 63)
#define WG_COLL_FAILED 1u          /* flags of a failure notice */
#define WG_COLL_WAIT_SLICE_S 0.025 /* how often a waiter looks for failure notices */

typedef struct wg_coll_ctx {
  const wg_transport_ops_t *ops;
  wg_transport_t *transport;
  int rank;               /* my rank in the plan */
  const int *ranks;       /* participating ranks, sorted ascending, includes rank */
  int nranks;             /* entries in ranks, >= 1 */
  uint64_t round;         /* header.round of every frame of this operation */
  uint32_t group;         /* header.group of every frame of this operation */
  uint64_t seq;           /* header.seq base of this operation; the op may use seq .. seq + 2^20 */
  size_t small_threshold; /* bytes; 0 = the measured choice (wg_coll_pick); else recursive
                             doubling up to this, the measured choice of the others above */
  int algorithm;          /* 0 = choose (above); or force one wg_coll_algorithm_t */
  int *failed_rank;       /* may be NULL; on WAGMA_EPEER: the participant found dead (by me
                             or by the sender of a notice), else left unchanged */
  int release;            /* 1: the operation's reader session ends without the linger
                             (ops->reader_release): other threads expect frames from these
                             peers next (the engine's data thread) */
} wg_coll_ctx_t;

#define WG_COLL_ALGORITHMS 1 /* this header has wg_coll_ctx_t.algorithm (for benchmarks) */
typedef enum wg_coll_algorithm {
  WG_COLL_AUTO = 0,
  WG_COLL_DOUBLING = 1,     /* recursive doubling: log2 P steps of the whole buffer */
  WG_COLL_RABENSEIFNER = 2, /* recursive halving reduce-scatter + recursive doubling allgather */
  WG_COLL_RING = 3,         /* ring reduce-scatter + ring allgather, segments pipelined */
} wg_coll_algorithm_t;

/* The allreduce algorithm used for `bytes` over n participants when ctx->algorithm is 0 and
 * ctx->small_threshold is 0 (measured on loopback TCP: docs/benchmarks.md): doubling up to
 * 32 KiB, Rabenseifner above, the ring from 1 MiB when n is not a power of two. */
wg_coll_algorithm_t wg_coll_pick(size_t bytes, int n);

/* buf (count floats, identical count everywhere) <- sum or mean over ctx->ranks. */
int wg_coll_allreduce(const wg_coll_ctx_t *ctx, float *buf, size_t count, wagma_reduce_op_t op,
                      double deadline);
/* The same out of place: buf <- sum or mean of every participant's src, src unchanged and only
 * read (where buf is first written: the same sums, bit for bit, as copying src into buf and
 * reducing in place, one pass over the model fewer). src == buf or NULL is in place;
 * overlapping buffers otherwise are WAGMA_EINVAL. On a failure buf is undefined. */
int wg_coll_allreduce_from(const wg_coll_ctx_t *ctx, const float *src, float *buf, size_t count,
                           wagma_reduce_op_t op, double deadline);

/* The MEAN out of place, and delta[i] = buf[i] - src[i] (float32, as a - b rounds) written as
 * each buf[i] gets its final value, while it is fresh: the wait-avoiding engine's correction
 * (mean minus contribution) without a pass of its own. delta is a third buffer; WAGMA_EINVAL
 * when src is NULL or buf. On a failure buf and delta are undefined. */
int wg_coll_allreduce_delta(const wg_coll_ctx_t *ctx, const float *src, float *buf, float *delta,
                            size_t count, double deadline);

/* From the sum of n contributions: mean[i] = sum[i] / n and delta[i] = mean[i] - src[i], each
 * rounded as wg_coll_allreduce_delta rounds its MEAN and deltas (for a sum reduced elsewhere:
 * a transport's own collective). sum may be mean. */
void wg_coll_mean_delta(const float *sum, int n, const float *src, float *mean, float *delta,
                        size_t count);

/* buf <- root's buf on every participant (root is a plan rank inside ctx->ranks). */
int wg_coll_broadcast(const wg_coll_ctx_t *ctx, float *buf, size_t count, int root,
                      double deadline);

/* buf <- sum(w_i * buf_i) / sum(w_i); WAGMA_EINVAL on every participant if sum(w_i) == 0. */
int wg_coll_average(const wg_coll_ctx_t *ctx, float *buf, size_t count, float weight,
                    double deadline);

#endif
