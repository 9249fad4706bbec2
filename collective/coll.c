/* coll.c — blocking collectives over a transport (coll.h).
 *
 * Owns no state and no threads: each call runs on the caller's thread, sends through
 * ops->send (which never blocks) and waits in ops->recv (or ops->recv_into) for
 * WG_FRAME_COLL frames matched on (src, round, group, seq). Data moves in segments of
 * PIPE_SEGMENT_BYTES (at most WG_COLL_SEGMENT_BYTES) so a large buffer streams: a segment is
 * forwarded as soon as it has been reduced, and at most PIPE_WINDOW segments run ahead of
 * what has been received.
 *
 * Where the transport offers reader sessions (ops->reader_begin), an operation is a session
 * over the peers it receives from: its thread reads their sockets itself while it waits (one
 * wake-up per hop, no hand-off through the progress thread), and a payload that is only
 * copied (allgather, the fold-out of a non-power-of-two) is read straight into buf.
 *
 * Algorithms (idx = position of a rank in ctx->ranks, n = ctx->nranks, pof2 = the largest
 * power of two <= n, rem = n - pof2; the first 2 * rem positions pair up, even sends to odd,
 * before, and the odd ones send the result back after):
 *  - doubling: log2(pof2) exchanges of the whole buffer (for MEAN the last one divides).
 *  - Rabenseifner: recursive halving (each exchange sends half of what is left and reduces
 *    the other half) leaves each of the pof2 ranks with one reduced block; recursive
 *    doubling gathers the blocks back. Moves 2 (pof2 - 1) / pof2 of the buffer each way, in
 *    2 log2(pof2) exchanges. For MEAN each owner divides its block as the last halving
 *    reduces it (one pass), before the gather.
 *  - ring: reduce-scatter then allgather around the ring, n chunks cut in segments,
 *    2 (n - 1) steps. For MEAN the owner of a chunk divides it as its last step reduces it.
 *  - broadcast: binomial tree when small, a segmented chain (pipeline) when large.
 *  - average: an allreduce of the weights, then of w * buf, divided by the weight sum.
 * All give bitwise identical results on every participant: float addition commutes, so a
 * pairwise exchange adds the same two values on both sides, and a block or chunk reduced by
 * one owner is copied to the others.
 * wg_coll_pick chooses by size from measurements (docs/benchmarks.md, allreduce).
 *
 * seq plan of one operation (base = ctx->seq): step s, segment k -> base + s * nseg + k;
 * failure notices use base | WG_COLL_NOTICE_BIT.
 * Every wait ends at the deadline. A wait on a participant that is dead returns WAGMA_EPEER at
 * once (the transport knows) and sends a failure notice to every other participant; they wait
 * in slices of WG_COLL_WAIT_SLICE_S and look for a notice between slices, so the participants
 * further along a ring or tree return WAGMA_EPEER within about a slice instead of at their
 * deadline. A participant being dead is not by itself an error: one that finished its part and
 * closed is dead to the transport, yet everything it sent is queued before its death, so the
 * others still complete; only a wait that finds nothing queued from a dead peer is a failure. */
#include "coll.h"

#include <math.h>
#include <string.h>

#define SEQ_SPAN ((uint64_t)1 << 20) /* seq range an operation may use (coll.h) */

/* Data moves in segments of PIPE_SEGMENT_BYTES (at most WG_COLL_SEGMENT_BYTES, the frame
 * bound), and a pipelined sender runs at most PIPE_WINDOW segments ahead of what it received.
 * Measured (docs/benchmarks.md): 128 KiB with a window of 2 keeps what is in flight within
 * the sockets' buffers and each received segment in cache for its reduction; it took 40-50 %
 * less CPU per operation than 1 MiB segments from 4 MiB up (Rabenseifner, P = 4 and 8), and
 * a window of 3 or 4 undid most of it. */
#define PIPE_SEGMENT_BYTES ((size_t)128 << 10)
#define PIPE_WINDOW 2

typedef struct coll {
  const wg_coll_ctx_t *ctx;
  int me; /* my index in ctx->ranks */
  int n;
  double deadline;
  uint64_t span;       /* seq values this operation may use from ctx->seq */
  uint64_t notice_seq; /* seq of this operation's failure notices */
  wg_reader_t *rd;     /* the reader session over the peers it receives from, or NULL */
  const float *src;    /* an out-of-place allreduce's input (wg_coll_allreduce_from), read
                          where the output is touched first; NULL = in place */
  float *out;          /* the output buffer and, with delta non-NULL, where each output */
  float *delta;        /* element's final value minus src's goes as it is written (MEAN) */
} coll_t;

/* Starts the operation's reader session over the positions in idx (best effort: without
 * one, recv works as before). */
static void reader_begin(coll_t *c, const int *idx, int k) {
  const wg_coll_ctx_t *ctx = c->ctx;
  c->rd = NULL;
  if (ctx->ops->reader_begin == NULL || ctx->ops->recv_into == NULL || k == 0)
    return;
  int ranks[64];
  if (k > 64)
    k = 64;
  for (int i = 0; i < k; i++)
    ranks[i] = ctx->ranks[idx[i]];
  if (ctx->ops->reader_begin(ctx->transport, ranks, k, &c->rd) != 0)
    c->rd = NULL;
}

static void reader_end(coll_t *c) {
  const wg_transport_ops_t *ops = c->ctx->ops;
  if (c->rd != NULL && c->ctx->release && ops->reader_release)
    ops->reader_release(c->ctx->transport, c->rd);
  else if (c->rd != NULL)
    ops->reader_end(c->ctx->transport, c->rd);
  c->rd = NULL;
}

static int coll_init(coll_t *c, const wg_coll_ctx_t *ctx, const float *buf, size_t count,
                     double deadline) {
  if (ctx == NULL || ctx->ops == NULL || ctx->transport == NULL || ctx->ranks == NULL ||
      ctx->nranks < 1 || (count > 0 && buf == NULL) || ctx->seq >= WG_COLL_NOTICE_BIT - SEQ_SPAN)
    return WAGMA_EINVAL;
  c->ctx = ctx;
  c->notice_seq = ctx->seq | WG_COLL_NOTICE_BIT;
  c->n = ctx->nranks;
  c->me = -1;
  c->deadline = deadline;
  c->span = SEQ_SPAN;
  c->rd = NULL;
  c->src = NULL;
  c->out = NULL;
  c->delta = NULL;
  for (int i = 0; i < ctx->nranks; i++) {
    if (i > 0 && ctx->ranks[i] <= ctx->ranks[i - 1])
      return WAGMA_EINVAL; /* must be sorted and unique */
    if (ctx->ranks[i] == ctx->rank)
      c->me = i;
  }
  return c->me < 0 ? WAGMA_EINVAL : 0;
}

static size_t small_threshold(const wg_coll_ctx_t *ctx) {
  return ctx->small_threshold ? ctx->small_threshold : WG_COLL_SMALL_THRESHOLD_DEFAULT;
}

/* Tells every other participant that dead failed this operation (best effort) and records
 * it for the caller. */
static void announce_failure(const coll_t *c, int dead) {
  const wg_coll_ctx_t *ctx = c->ctx;
  if (ctx->failed_rank)
    *ctx->failed_rank = dead;
  for (int i = 0; i < c->n; i++) {
    if (i == c->me || ctx->ranks[i] == dead)
      continue;
    wg_frame_header_t h = {0};
    h.kind = WG_FRAME_COLL;
    h.round = ctx->round;
    h.group = ctx->group;
    h.seq = c->notice_seq;
    h.flags = WG_COLL_FAILED;
    h.aux = (uint64_t)(int64_t)dead;
    (void)ctx->ops->send(ctx->transport, ctx->ranks[i], &h, NULL, 0);
  }
}

/* 1 (and records the dead rank) if a failure notice of this operation is queued. */
static int notice_seen(const coll_t *c) {
  const wg_coll_ctx_t *ctx = c->ctx;
  wg_match_t m;
  wg_match_any(&m);
  m.kinds = (uint64_t)1 << WG_FRAME_COLL;
  m.round = ctx->round;
  m.group = ctx->group;
  m.seq = c->notice_seq;
  wg_message_t *notice = NULL;
  if (ctx->ops->recv(ctx->transport, &m, 0.0, &notice) != 0)
    return 0;
  if (ctx->failed_rank)
    *ctx->failed_rank = (int)(int64_t)notice->header.aux;
  wg_message_free(notice);
  return 1;
}

static int send_floats(const coll_t *c, int idx, uint64_t seq, const float *data, size_t n) {
  const wg_coll_ctx_t *ctx = c->ctx;
  wg_frame_header_t h = {0};
  h.kind = WG_FRAME_COLL;
  h.round = ctx->round;
  h.group = ctx->group;
  h.seq = seq;
  int rc = ctx->ops->send(ctx->transport, ctx->ranks[idx], &h, data, n * sizeof(float));
  if (rc == WAGMA_EPEER)
    announce_failure(c, ctx->ranks[idx]);
  return rc;
}

/* Takes the frame (src idx, seq) of n floats: into *out (ownership: the caller's,
 * wg_message_free), or, with dst, its payload copied into dst (*out stays NULL). */
static int recv_frame(const coll_t *c, int idx, uint64_t seq, size_t n, float *dst,
                      wg_message_t **out) {
  const wg_coll_ctx_t *ctx = c->ctx;
  wg_match_t m;
  wg_match_any(&m);
  m.src = (uint64_t)ctx->ranks[idx];
  m.kinds = (uint64_t)1 << WG_FRAME_COLL;
  m.round = ctx->round;
  m.group = ctx->group;
  m.seq = seq;
  wg_sink_t sink = {.dst = dst, .length = n * sizeof(float)};
  *out = NULL;
  int rc;
  for (;;) {
    double until = wg_now() + WG_COLL_WAIT_SLICE_S;
    if (!(until < c->deadline))
      until = c->deadline;
    if (ctx->ops->recv_into != NULL)
      rc = ctx->ops->recv_into(ctx->transport, c->rd, &m, until, dst ? &sink : NULL, out);
    else
      rc = ctx->ops->recv(ctx->transport, &m, until, out);
    if (rc != WAGMA_ETIMEDOUT || until >= c->deadline)
      break;
    if (notice_seen(c))
      return WAGMA_EPEER; /* another participant found a peer dead: this operation failed */
  }
  if (rc == WAGMA_EPEER)
    announce_failure(c, ctx->ranks[idx]);
  if (rc == 0 && *out != NULL && (*out)->header.length != n * sizeof(float)) {
    wg_message_free(*out);
    *out = NULL;
    rc = WAGMA_EPROTO;
  }
  if (rc == 0 && dst != NULL && *out != NULL) { /* a transport without recv_into */
    if (n > 0)
      memcpy(dst, (*out)->payload, n * sizeof(float));
    wg_message_free(*out);
    *out = NULL;
  }
  return rc;
}

/* Receives n floats (src idx, seq) and adds them to dst, or with from non-NULL writes
 * from + them into dst (the first touch of an out-of-place allreduce's output: the same sums,
 * operand for operand); with div > 0, divides each sum by div in the same pass (the owner of
 * a MEAN block: no second pass over it). */
__attribute__((optimize("tree-vectorize"))) void
wg_coll_mean_delta(const float *sum, int n, const float *restrict src, float *mean,
                   float *restrict delta, size_t count) {
  float by = (float)n;
  for (size_t i = 0; i < count; i++) {
    float x = sum[i] / by;
    mean[i] = x;
    delta[i] = x - src[i];
  }
}

static int recv_add(const coll_t *c, int idx, uint64_t seq, float *dst, const float *from, size_t n,
                    float div);

/* delta[i] = dst[i] - src[i] */
__attribute__((optimize("tree-vectorize"))) static void
diff_floats(float *restrict delta, const float *restrict dst, const float *restrict src, size_t n) {
  for (size_t i = 0; i < n; i++)
    delta[i] = dst[i] - src[i];
}

/* dst[0..n) of the output holds its final values: their deltas (wg_coll_allreduce_delta). */
static void finalized(const coll_t *c, const float *dst, size_t n) {
  if (!c->delta || n == 0)
    return;
  size_t off = (size_t)(dst - c->out);
  diff_floats(c->delta + off, dst, c->src + off, n);
}

/* Receives n floats (src idx, seq) into dst: in an allreduce, their final values. */
static int recv_copy(const coll_t *c, int idx, uint64_t seq, float *dst, size_t n) {
  wg_message_t *m = NULL;
  int rc = recv_frame(c, idx, seq, n, n > 0 ? dst : NULL, &m);
  wg_message_free(m); /* an empty frame: no sink */
  if (rc == 0)
    finalized(c, dst, n);
  return rc;
}

__attribute__((optimize("tree-vectorize"))) static void
add_floats(float *restrict dst, const float *restrict src, size_t n) {
  for (size_t i = 0; i < n; i++)
    dst[i] += src[i];
}

/* Vectorized (divps divides each lane exactly like divss): the scalar loop took 12 % of the
 * CPU of a 1 MiB MEAN allreduce at P = 4. */
__attribute__((optimize("tree-vectorize"))) static void div_floats(float *restrict buf, size_t n,
                                                                   float by) {
  for (size_t i = 0; i < n; i++)
    buf[i] /= by;
}

/* dst = (dst + src) / by, rounded as add_floats then div_floats would (each sum is rounded to
 * float before the division), in one pass over dst. */
__attribute__((optimize("tree-vectorize"))) static void
add_div_floats(float *restrict dst, const float *restrict src, size_t n, float by) {
  for (size_t i = 0; i < n; i++)
    dst[i] = (dst[i] + src[i]) / by;
}

/* dst = a + b (each sum rounded to float), in one pass. */
__attribute__((optimize("tree-vectorize"))) static void
sum_floats(float *restrict dst, const float *restrict a, const float *restrict b, size_t n) {
  for (size_t i = 0; i < n; i++)
    dst[i] = a[i] + b[i];
}

/* dst = (a + b) / by, rounded as sum_floats then div_floats would. */
__attribute__((optimize("tree-vectorize"))) static void sum_div_floats(float *restrict dst,
                                                                       const float *restrict a,
                                                                       const float *restrict b,
                                                                       size_t n, float by) {
  for (size_t i = 0; i < n; i++)
    dst[i] = (a[i] + b[i]) / by;
}

/* dst = (a + b) / by and delta = dst - s, in one pass (a MEAN's final values and their
 * deltas, wg_coll_allreduce_delta). a may be dst. */
__attribute__((optimize("tree-vectorize"))) static void
sum_div_delta_floats(float *dst, float *restrict delta, const float *a, const float *restrict b,
                     const float *restrict s, size_t n, float by) {
  for (size_t i = 0; i < n; i++) {
    float x = (a[i] + b[i]) / by;
    dst[i] = x;
    delta[i] = x - s[i];
  }
}

static int recv_add(const coll_t *c, int idx, uint64_t seq, float *dst, const float *from, size_t n,
                    float div) {
  wg_message_t *m = NULL;
  int rc = recv_frame(c, idx, seq, n, NULL, &m);
  const float *got = rc == 0 ? (const float *)m->payload : NULL;
  if (rc == 0 && div > 0 && c->delta) { /* final values: their deltas in the same pass */
    size_t off = (size_t)(dst - c->out);
    sum_div_delta_floats(dst, c->delta + off, from ? from : dst, got, c->src + off, n, div);
    wg_message_free(m);
    return 0;
  }
  if (rc == 0 && from && div > 0)
    sum_div_floats(dst, from, got, n, div);
  else if (rc == 0 && from)
    sum_floats(dst, from, got, n);
  else if (rc == 0 && div > 0)
    add_div_floats(dst, got, n, div);
  else if (rc == 0)
    add_floats(dst, got, n);
  wg_message_free(m);
  if (rc == 0 && div > 0)
    finalized(c, dst, n); /* a MEAN's division is its element's last write */
  return rc;
}

/* Segments of count floats: nseg segments of seglen (the last ones possibly shorter or
 * empty). */
typedef struct segs {
  size_t seglen;
  uint64_t nseg;
} segs_t;

static segs_t make_segs(size_t count, uint64_t max_nseg) {
  segs_t s;
  size_t per = PIPE_SEGMENT_BYTES / sizeof(float);
  s.nseg = count == 0 ? 1 : (count + per - 1) / per;
  if (s.nseg > max_nseg)
    s.nseg = max_nseg;
  s.seglen = count == 0 ? 0 : (count + s.nseg - 1) / s.nseg;
  return s;
}

static void seg_range(const segs_t *s, size_t count, uint64_t k, size_t *start, size_t *len) {
  size_t a = (size_t)k * s->seglen, b = a + s->seglen;
  if (a > count)
    a = count;
  if (b > count)
    b = count;
  *start = a;
  *len = b - a;
}

/* Sends buf[0..count) to idx as segments seq_base + k. */
static int send_all(const coll_t *c, int idx, uint64_t seq_base, const segs_t *s, const float *buf,
                    size_t count) {
  for (uint64_t k = 0; k < s->nseg; k++) {
    size_t a, len;
    seg_range(s, count, k, &a, &len);
    int rc = send_floats(c, idx, seq_base + k, buf + a, len);
    if (rc != 0)
      return rc;
  }
  return 0;
}

/* Receives segments seq_base + k from idx into buf (add = 1: reduce, 0: copy; div > 0 with
 * add: each sum divided by div; from: the reduction's other operand when it is not buf,
 * recv_add). */
static int recv_all(const coll_t *c, int idx, uint64_t seq_base, const segs_t *s, float *buf,
                    const float *from, size_t count, int add, float div) {
  for (uint64_t k = 0; k < s->nseg; k++) {
    size_t a, len;
    seg_range(s, count, k, &a, &len);
    int rc = add ? recv_add(c, idx, seq_base + k, buf + a, from ? from + a : NULL, len, div)
                 : recv_copy(c, idx, seq_base + k, buf + a, len);
    if (rc != 0)
      return rc;
  }
  return 0;
}

/* Sends buf[0..count) to idx and receives the peer's copy of it into the same range
 * (add = 1: reduce, 0: copy; the copy needs rbuf distinct from what is sent; div and from as
 * recv_all), as segments seq_base + k, at most PIPE_WINDOW segments ahead. */
static int exchange(const coll_t *c, int idx, uint64_t seq_base, const segs_t *s, const float *sbuf,
                    size_t scount, float *rbuf, const float *from, size_t rcount, int add,
                    float div) {
  uint64_t sent = 0;
  for (uint64_t k = 0; k < s->nseg; k++) {
    for (; sent < s->nseg && sent < k + PIPE_WINDOW; sent++) {
      size_t a, len;
      seg_range(s, scount, sent, &a, &len);
      int rc = send_floats(c, idx, seq_base + sent, sbuf + a, len);
      if (rc != 0)
        return rc;
    }
    size_t a, len;
    seg_range(s, rcount, k, &a, &len);
    int rc = add ? recv_add(c, idx, seq_base + k, rbuf + a, from ? from + a : NULL, len, div)
                 : recv_copy(c, idx, seq_base + k, rbuf + a, len);
    if (rc != 0)
      return rc;
  }
  return 0;
}

/* Positions of the non-power-of-two fold: pof2, rem, and my position among the pof2 (-1 when
 * I only fold in and out). */
static void fold_plan(int n, int me, int *pof2, int *rem, int *newrank) {
  int p = 1;
  while (p * 2 <= n)
    p *= 2;
  *pof2 = p;
  *rem = n - p;
  if (me < 2 * *rem)
    *newrank = me % 2 == 0 ? -1 : me / 2;
  else
    *newrank = me - *rem;
}

static int real_of(int vrank, int rem) {
  return vrank < rem ? vrank * 2 + 1 : vrank + rem;
}

/* The positions an operation of the fold family (doubling, Rabenseifner) receives from. */
static int fold_peers(int n, int me, int *idx) {
  int pof2, rem, newrank, k = 0;
  fold_plan(n, me, &pof2, &rem, &newrank);
  if (me < 2 * rem)
    idx[k++] = me % 2 == 0 ? me + 1 : me - 1;
  if (newrank >= 0)
    for (int mask = 1; mask < pof2 && k < 64; mask <<= 1)
      idx[k++] = real_of(newrank ^ mask, rem);
  return k;
}

/* Recursive doubling; when mean, the last exchange divides each sum by n as it adds (every
 * rank of the pof2 then holds the same quotients, and the fold-out copies them). */
static int allreduce_doubling(const coll_t *c, float *buf, size_t count, int mean) {
  const int me = c->me;
  int pof2, rem, newrank;
  fold_plan(c->n, me, &pof2, &rem, &newrank);
  int log2 = 0;
  while ((1 << log2) < pof2)
    log2++;
  const uint64_t steps = (uint64_t)log2 + 2;
  segs_t s = make_segs(count, c->span / steps);
  const uint64_t base = c->ctx->seq;
  int rc = 0;
  /* from: my data where buf is not written yet (out of place), NULL once it is (or in place) */
  const float *from = c->src;

  if (me < 2 * rem) {
    rc = me % 2 == 0 ? send_all(c, me + 1, base, &s, from ? from : buf, count)
                     : recv_all(c, me - 1, base, &s, buf, from, count, 1, 0);
    from = NULL; /* an odd rank's buf holds the fold; an even one's gets the fold-out */
  }
  if (rc != 0)
    return rc;
  if (newrank >= 0) {
    uint64_t step = 1;
    for (int mask = 1; mask < pof2; mask <<= 1, step++) {
      int peer = real_of(newrank ^ mask, rem);
      float div = mean && mask == pof2 / 2 ? (float)c->n : 0;
      rc = send_all(c, peer, base + step * s.nseg, &s, from ? from : buf, count);
      if (rc == 0)
        rc = recv_all(c, peer, base + step * s.nseg, &s, buf, from, count, 1, div);
      if (rc != 0)
        return rc;
      from = NULL;
    }
  }
  const uint64_t last = base + (steps - 1) * s.nseg;
  if (me < 2 * rem)
    rc = me % 2 == 1 ? send_all(c, me - 1, last, &s, buf, count)
                     : recv_all(c, me + 1, last, &s, buf, NULL, count, 0, 0);
  return rc;
}

/* Rabenseifner: recursive halving reduce-scatter, then recursive doubling allgather, over the
 * pof2 ranks of the fold. The buffer is cut in pof2 blocks; at the exchange with mask m the
 * two partners hold the same block range [lo, hi) (they differ only in bit m, and earlier
 * exchanges halved by lower bits), keep the lower half if bit m is 0, send the other. */
static int allreduce_rabenseifner(const coll_t *c, float *buf, size_t count, int mean) {
  const int me = c->me, n = c->n;
  int pof2, rem, newrank;
  fold_plan(n, me, &pof2, &rem, &newrank);
  int log2 = 0;
  while ((1 << log2) < pof2)
    log2++;
  const size_t base_len = count / (size_t)pof2, extra = count % (size_t)pof2;
#define BLK_OFF(i) ((size_t)(i)*base_len + ((size_t)(i) < extra ? (size_t)(i) : extra))
  /* seq plan: fold-in, log2 halving steps, log2 doubling steps, fold-out; each step's
   * segments cover at most half the buffer (the folds the whole). */
  const uint64_t steps = 2 * (uint64_t)log2 + 2;
  segs_t s = make_segs(count, c->span / steps);
  const uint64_t base = c->ctx->seq;
  int rc = 0;
  /* from: as in allreduce_doubling; after the first halving step every later step reads and
   * writes inside the range that step wrote, and the allgather copies the rest */
  const float *from = c->src;
  if (me < 2 * rem) {
    rc = me % 2 == 0 ? send_all(c, me + 1, base, &s, from ? from : buf, count)
                     : recv_all(c, me - 1, base, &s, buf, from, count, 1, 0);
    from = NULL;
  }
  if (rc != 0)
    return rc;
  if (newrank >= 0) {
    int lo = 0, hi = pof2;
    int los[32], his[32];
    uint64_t step = 1;
    for (int mask = 1, j = 0; mask < pof2; mask <<= 1, j++, step++) {
      int peer = real_of(newrank ^ mask, rem);
      int mid = (lo + hi) / 2;
      int klo = (newrank & mask) ? mid : lo, khi = (newrank & mask) ? hi : mid;
      int slo = (newrank & mask) ? lo : mid, shi = (newrank & mask) ? mid : hi;
      size_t so = BLK_OFF(slo), sn = BLK_OFF(shi) - so, ko = BLK_OFF(klo), kn = BLK_OFF(khi) - ko;
      segs_t ss = make_segs(sn > kn ? sn : kn, s.nseg);
      /* The last halving leaves me my block: for MEAN, divided as it is reduced. */
      float div = mean && mask == pof2 / 2 ? (float)n : 0;
      rc = exchange(c, peer, base + step * s.nseg, &ss, (from ? from : buf) + so, sn, buf + ko,
                    from ? from + ko : NULL, kn, 1, div);
      if (rc != 0)
        return rc;
      from = NULL;
      los[j] = lo;
      his[j] = hi;
      lo = klo;
      hi = khi;
    }
    for (int mask = pof2 >> 1, j = log2 - 1; mask > 0; mask >>= 1, j--, step++) {
      int peer = real_of(newrank ^ mask, rem);
      /* I hold [lo, hi); the partner holds the other half of [los[j], his[j]). */
      int olo = lo == los[j] ? hi : los[j], ohi = lo == los[j] ? his[j] : lo;
      size_t so = BLK_OFF(lo), sn = BLK_OFF(hi) - so, ro = BLK_OFF(olo), rn = BLK_OFF(ohi) - ro;
      segs_t ss = make_segs(sn > rn ? sn : rn, s.nseg);
      rc = exchange(c, peer, base + step * s.nseg, &ss, buf + so, sn, buf + ro, NULL, rn, 0, 0);
      if (rc != 0)
        return rc;
      lo = los[j];
      hi = his[j];
    }
  }
#undef BLK_OFF
  const uint64_t last = base + (steps - 1) * s.nseg;
  if (me < 2 * rem) {
    if (me % 2 == 1)
      rc = send_all(c, me - 1, last, &s, buf, count);
    else
      rc = recv_all(c, me + 1, last, &s, buf, NULL, count, 0, 0);
  }
  return rc;
}

/* Ring reduce-scatter + allgather; when mean, the owner of each chunk divides it. The
 * frames to the right form one stream: item j < nseg is a segment of my own chunk, item
 * j >= nseg forwards what item j - nseg of the stream from the left brought (reduced in the
 * first phase, copied in the second). A send runs at most PIPE_WINDOW items ahead of the
 * receives. */
static int allreduce_ring(const coll_t *c, float *buf, size_t count, int mean) {
  const int n = c->n, me = c->me;
  const int left = (me + n - 1) % n, right = (me + 1) % n;
  const size_t base_len = count / (size_t)n, extra = count % (size_t)n;
  /* chunk i: base_len + (i < extra) floats */
#define CHUNK_OFF(i) ((size_t)(i)*base_len + ((size_t)(i) < extra ? (size_t)(i) : extra))
#define CHUNK_LEN(i) (base_len + ((size_t)(i) < extra ? 1u : 0u))
  segs_t s = make_segs(base_len + (extra ? 1 : 0), c->span / (2 * (uint64_t)(n - 1)));
  const uint64_t nseg = s.nseg, steps = 2 * (uint64_t)(n - 1), total = steps * nseg;
  const uint64_t rs = c->ctx->seq;
  /* Item i of the stream (either direction): step i / nseg (0 .. 2n-3), segment i % nseg;
   * step st < n-1 reduces, the rest copy; chunk of receive step st: me - st - 1 (phase 0)
   * or me - (st - (n - 1)) (phase 1). seq of item i: rs + i (ag = rs + (n-1) nseg). */
  uint64_t sent = 0;
  for (uint64_t i = 0; i <= total; i++) {
    /* Send the items that are ready: j < nseg at once, j >= nseg once receive j - nseg is
     * in, at most PIPE_WINDOW ahead. */
    uint64_t ready = i + nseg < total ? i + nseg : total;
    for (; sent < ready && sent < i + PIPE_WINDOW; sent++) {
      int ch;
      if (sent < nseg) {
        ch = me;
      } else {
        uint64_t st = (sent - nseg) / nseg;
        ch = st < (uint64_t)(n - 1) ? (int)((me - (int)st - 1 + 2 * n) % n)
                                    : (int)((me - (int)(st - (uint64_t)(n - 1)) + 2 * n) % n);
      }
      size_t a, len;
      seg_range(&s, CHUNK_LEN(ch), sent % nseg, &a, &len);
      /* my own chunk goes out before anything is written into it: out of place, from src */
      const float *sb = sent < nseg && c->src ? c->src : buf;
      int rc = send_floats(c, right, rs + sent, sb + CHUNK_OFF(ch) + a, len);
      if (rc != 0)
        return rc;
    }
    if (i == total)
      break;
    uint64_t st = i / nseg, k = i % nseg;
    int phase0 = st < (uint64_t)(n - 1);
    int ch = phase0 ? (int)((me - (int)st - 1 + 2 * n) % n)
                    : (int)((me - (int)(st - (uint64_t)(n - 1)) + 2 * n) % n);
    float *cb = buf + CHUNK_OFF(ch);
    size_t a, len;
    seg_range(&s, CHUNK_LEN(ch), k, &a, &len);
    /* At step n - 2 chunk me + 1 is complete: for MEAN, divided as it is reduced. */
    float div = phase0 && st == (uint64_t)(n - 2) && mean ? (float)n : 0;
    /* phase 0 reduces each chunk but mine exactly once: its first touch (out of place) */
    const float *from = phase0 && c->src ? c->src + CHUNK_OFF(ch) + a : NULL;
    int rc = phase0 ? recv_add(c, left, rs + i, cb + a, from, len, div)
                    : recv_copy(c, left, rs + i, cb + a, len);
    if (rc != 0)
      return rc;
  }
#undef CHUNK_OFF
#undef CHUNK_LEN
  return 0;
}

/* Measured on loopback TCP, 2 cores, P = 3 .. 8 (docs/benchmarks.md): doubling's log2 P
 * whole-buffer steps win up to 32 KiB (fewest hops); above, Rabenseifner moves the ring's
 * bytes in 2 log2 P steps instead of 2 (P - 1) and took the least CPU per operation; with a
 * non-power-of-two P its fold-in and fold-out move the whole buffer twice more for 2 rem
 * ranks, and from 1 MiB the ring was faster (P = 3, 6; even at P = 5). */
wg_coll_algorithm_t wg_coll_pick(size_t bytes, int n) {
  if (bytes <= ((size_t)32 << 10))
    return WG_COLL_DOUBLING;
  if ((n & (n - 1)) != 0 && bytes >= ((size_t)1 << 20))
    return WG_COLL_RING;
  return WG_COLL_RABENSEIFNER;
}

static int allreduce_span(const wg_coll_ctx_t *ctx, const float *src, float *buf, float *delta,
                          size_t count, wagma_reduce_op_t op, double deadline, uint64_t span,
                          uint64_t notice_seq) {
  coll_t c;
  int rc = coll_init(&c, ctx, buf, count, deadline);
  if (rc != 0)
    return rc;
  c.span = span;
  c.notice_seq = notice_seq;
  c.src = src != buf ? src : NULL;
  if (op != WAGMA_REDUCE_SUM && op != WAGMA_REDUCE_MEAN)
    return WAGMA_EINVAL;
  if (c.src && count > 0 && c.src < buf + count && buf < c.src + count)
    return WAGMA_EINVAL; /* overlapping, but not the same buffer */
  if (delta && (!c.src || op != WAGMA_REDUCE_MEAN || delta == buf || delta == c.src))
    return WAGMA_EINVAL; /* deltas: out of place, MEAN (its division marks a final value) */
  c.out = buf;
  c.delta = delta;
  if (c.n == 1 || count == 0) {
    if (c.src && count > 0)
      memcpy(buf, c.src, count * sizeof(float));
    if (delta && count > 0)
      memset(delta, 0, count * sizeof(float));
    return 0;
  }
  const size_t bytes = count * sizeof(float);
  int alg = ctx->algorithm;
  if (alg < WG_COLL_DOUBLING || alg > WG_COLL_RING) {
    alg = wg_coll_pick(bytes, c.n);
    if (ctx->small_threshold != 0)
      alg = bytes <= ctx->small_threshold ? WG_COLL_DOUBLING
                                          : (alg == WG_COLL_DOUBLING ? WG_COLL_RING : alg);
  }
  const int mean = op == WAGMA_REDUCE_MEAN;
  int peers[64], npeers;
  if (alg == WG_COLL_RING) {
    peers[0] = (c.me + c.n - 1) % c.n;
    npeers = 1;
  } else {
    npeers = fold_peers(c.n, c.me, peers);
  }
  reader_begin(&c, peers, npeers);
  if (alg == WG_COLL_DOUBLING) {
    rc = allreduce_doubling(&c, buf, count, mean);
  } else if (alg == WG_COLL_RABENSEIFNER) {
    rc = allreduce_rabenseifner(&c, buf, count, mean);
  } else {
    rc = allreduce_ring(&c, buf, count, mean);
  }
  reader_end(&c);
  return rc;
}

int wg_coll_allreduce(const wg_coll_ctx_t *ctx, float *buf, size_t count, wagma_reduce_op_t op,
                      double deadline) {
  return allreduce_span(ctx, NULL, buf, NULL, count, op, deadline, SEQ_SPAN,
                        ctx ? ctx->seq | WG_COLL_NOTICE_BIT : 0);
}

int wg_coll_allreduce_from(const wg_coll_ctx_t *ctx, const float *src, float *buf, size_t count,
                           wagma_reduce_op_t op, double deadline) {
  return allreduce_span(ctx, src, buf, NULL, count, op, deadline, SEQ_SPAN,
                        ctx ? ctx->seq | WG_COLL_NOTICE_BIT : 0);
}

int wg_coll_allreduce_delta(const wg_coll_ctx_t *ctx, const float *src, float *buf, float *delta,
                            size_t count, double deadline) {
  return allreduce_span(ctx, src, buf, delta, count, WAGMA_REDUCE_MEAN, deadline, SEQ_SPAN,
                        ctx ? ctx->seq | WG_COLL_NOTICE_BIT : 0);
}

static int broadcast_run(coll_t *c, float *buf, size_t count, int root_idx) {
  const wg_coll_ctx_t *ctx = c->ctx;
  const int n = c->n;
  const int vrank = (c->me - root_idx + n) % n;
#define REAL(v) (((v) + root_idx) % n)
  segs_t s = make_segs(count, SEQ_SPAN);
  const uint64_t base = ctx->seq;
  int rc = 0;
  if (count * sizeof(float) <= small_threshold(ctx)) {
    int mask = 1;
    while (mask < n) { /* binomial tree: receive from the parent */
      if (vrank & mask) {
        int parent = REAL(vrank - mask);
        reader_begin(c, &parent, 1);
        rc = recv_all(c, parent, base, &s, buf, NULL, count, 0, 0);
        reader_end(c);
        if (rc != 0)
          return rc;
        break;
      }
      mask <<= 1;
    }
    for (mask >>= 1; mask > 0; mask >>= 1)
      if (vrank + mask < n && (rc = send_all(c, REAL(vrank + mask), base, &s, buf, count)))
        return rc;
    return 0;
  }
  /* Chain root -> root+1 -> ...: each segment is forwarded as soon as it arrives. */
  int prev = REAL(vrank + n - 1);
  if (vrank > 0)
    reader_begin(c, &prev, 1);
  for (uint64_t k = 0; k < s.nseg && rc == 0; k++) {
    size_t a, len;
    seg_range(&s, count, k, &a, &len);
    if (vrank > 0)
      rc = recv_copy(c, prev, base + k, buf + a, len);
    if (rc == 0 && vrank < n - 1)
      rc = send_floats(c, REAL(vrank + 1), base + k, buf + a, len);
  }
  reader_end(c);
#undef REAL
  return rc;
}

int wg_coll_broadcast(const wg_coll_ctx_t *ctx, float *buf, size_t count, int root,
                      double deadline) {
  coll_t c;
  int rc = coll_init(&c, ctx, buf, count, deadline);
  if (rc != 0)
    return rc;
  int root_idx = -1;
  for (int i = 0; i < c.n; i++)
    if (ctx->ranks[i] == root)
      root_idx = i;
  if (root_idx < 0)
    return WAGMA_EINVAL;
  if (c.n == 1 || count == 0)
    return 0;
  return broadcast_run(&c, buf, count, root_idx);
}

int wg_coll_average(const wg_coll_ctx_t *ctx, float *buf, size_t count, float weight,
                    double deadline) {
  coll_t c;
  int rc = coll_init(&c, ctx, buf, count, deadline);
  if (rc != 0)
    return rc;
  /* First the weights (seq half 0), then the data (seq half 1). */
  wg_coll_ctx_t sub = *ctx;
  float wsum = weight;
  rc = allreduce_span(&sub, NULL, &wsum, NULL, 1, WAGMA_REDUCE_SUM, deadline, SEQ_SPAN / 2,
                      c.notice_seq);
  if (rc != 0)
    return rc;
  if (!(isfinite(wsum) && wsum != 0.0f))
    return WAGMA_EINVAL;
  if (weight == 0.0f)
    memset(buf, 0, count * sizeof(float)); /* a joiner's buffer is ignored, even NaNs */
  else if (weight != 1.0f)
    for (size_t i = 0; i < count; i++)
      buf[i] *= weight;
  sub.seq = ctx->seq + SEQ_SPAN / 2;
  rc = allreduce_span(&sub, NULL, buf, NULL, count, WAGMA_REDUCE_SUM, deadline, SEQ_SPAN / 2,
                      c.notice_seq);
  if (rc == 0 && wsum != 1.0f)
    div_floats(buf, count, wsum);
  return rc;
}
