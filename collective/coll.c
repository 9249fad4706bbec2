/* coll.c — blocking collectives over a transport (coll.h).
 *
 * Owns no state and no threads: each call runs on the caller's thread, sends through
 * ops->send (which never blocks) and waits in ops->recv for WG_FRAME_COLL frames matched on
 * (src, round, group, seq). Data moves in segments of at most WG_COLL_SEGMENT_BYTES so a large
 * buffer streams: a segment is forwarded as soon as it has been reduced.
 *
 * Algorithms (idx = position of a rank in ctx->ranks, n = ctx->nranks):
 *  - allreduce, count * 4 <= small_threshold: recursive doubling over the largest power of two
 *    pof2 <= n; the first 2 * (n - pof2) positions pair up (even sends to odd) before, and the
 *    odd ones send the result back after.
 *  - allreduce, larger: ring reduce-scatter then ring allgather, n chunks, each cut in
 *    segments. For MEAN the owner of a chunk divides it before the allgather.
 *    Both give bitwise identical results on every participant (float addition commutes, and
 *    each ring chunk is reduced once and copied).
 *  - broadcast: binomial tree when small, a segmented chain (pipeline) when large.
 *  - average: an allreduce of the weights, then of w * buf, divided by the weight sum.
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

typedef struct coll {
  const wg_coll_ctx_t *ctx;
  int me; /* my index in ctx->ranks */
  int n;
  double deadline;
  uint64_t span;       /* seq values this operation may use from ctx->seq */
  uint64_t notice_seq; /* seq of this operation's failure notices */
} coll_t;

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

/* Ownership: on success *out is the caller's (wg_message_free). */
static int recv_floats(const coll_t *c, int idx, uint64_t seq, size_t n, wg_message_t **out) {
  const wg_coll_ctx_t *ctx = c->ctx;
  wg_match_t m;
  wg_match_any(&m);
  m.src = (uint64_t)ctx->ranks[idx];
  m.kinds = (uint64_t)1 << WG_FRAME_COLL;
  m.round = ctx->round;
  m.group = ctx->group;
  m.seq = seq;
  int rc;
  for (;;) {
    double until = wg_now() + WG_COLL_WAIT_SLICE_S;
    if (!(until < c->deadline))
      until = c->deadline;
    rc = ctx->ops->recv(ctx->transport, &m, until, out);
    if (rc != WAGMA_ETIMEDOUT || until >= c->deadline)
      break;
    if (notice_seen(c))
      return WAGMA_EPEER; /* another participant found a peer dead: this operation failed */
  }
  if (rc == WAGMA_EPEER)
    announce_failure(c, ctx->ranks[idx]);
  if (rc == 0 && (*out)->header.length != n * sizeof(float)) {
    wg_message_free(*out);
    *out = NULL;
    rc = WAGMA_EPROTO;
  }
  return rc;
}

static void add_floats(float *restrict dst, const float *restrict src, size_t n) {
  for (size_t i = 0; i < n; i++)
    dst[i] += src[i];
}

static void div_floats(float *buf, size_t n, float by) {
  for (size_t i = 0; i < n; i++)
    buf[i] /= by;
}

/* Segments of count floats: nseg segments of seglen (the last ones possibly shorter or
 * empty). */
typedef struct segs {
  size_t seglen;
  uint64_t nseg;
} segs_t;

static segs_t make_segs(size_t count, uint64_t max_nseg) {
  segs_t s;
  size_t per = WG_COLL_SEGMENT_BYTES / sizeof(float);
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

/* Receives segments seq_base + k from idx into buf (add = 1: reduce, 0: copy). */
static int recv_all(const coll_t *c, int idx, uint64_t seq_base, const segs_t *s, float *buf,
                    size_t count, int add) {
  for (uint64_t k = 0; k < s->nseg; k++) {
    size_t a, len;
    seg_range(s, count, k, &a, &len);
    wg_message_t *m = NULL;
    int rc = recv_floats(c, idx, seq_base + k, len, &m);
    if (rc != 0)
      return rc;
    if (add)
      add_floats(buf + a, (const float *)m->payload, len);
    else if (len > 0)
      memcpy(buf + a, m->payload, len * sizeof(float));
    wg_message_free(m);
  }
  return 0;
}

static int allreduce_doubling(const coll_t *c, float *buf, size_t count) {
  const int n = c->n, me = c->me;
  int pof2 = 1, log2 = 0;
  while (pof2 * 2 <= n) {
    pof2 *= 2;
    log2++;
  }
  const int rem = n - pof2;
  const uint64_t steps = (uint64_t)log2 + 2;
  segs_t s = make_segs(count, c->span / steps);
  const uint64_t base = c->ctx->seq;
  int rc = 0, newrank;

  if (me < 2 * rem) {
    if (me % 2 == 0) {
      rc = send_all(c, me + 1, base, &s, buf, count);
      newrank = -1;
    } else {
      rc = recv_all(c, me - 1, base, &s, buf, count, 1);
      newrank = me / 2;
    }
  } else {
    newrank = me - rem;
  }
  if (rc != 0)
    return rc;
  if (newrank >= 0) {
    uint64_t step = 1;
    for (int mask = 1; mask < pof2; mask <<= 1, step++) {
      int vpeer = newrank ^ mask;
      int peer = vpeer < rem ? vpeer * 2 + 1 : vpeer + rem;
      rc = send_all(c, peer, base + step * s.nseg, &s, buf, count);
      if (rc == 0)
        rc = recv_all(c, peer, base + step * s.nseg, &s, buf, count, 1);
      if (rc != 0)
        return rc;
    }
  }
  const uint64_t last = base + (steps - 1) * s.nseg;
  if (me < 2 * rem) {
    if (me % 2 == 1)
      rc = send_all(c, me - 1, last, &s, buf, count);
    else
      rc = recv_all(c, me + 1, last, &s, buf, count, 0);
  }
  return rc;
}

/* Ring reduce-scatter + allgather; when mean, the owner of each chunk divides it. */
static int allreduce_ring(const coll_t *c, float *buf, size_t count, int mean) {
  const int n = c->n, me = c->me;
  const int left = (me + n - 1) % n, right = (me + 1) % n;
  const size_t base_len = count / (size_t)n, extra = count % (size_t)n;
  /* chunk i: base_len + (i < extra) floats */
#define CHUNK_OFF(i) ((size_t)(i)*base_len + ((size_t)(i) < extra ? (size_t)(i) : extra))
#define CHUNK_LEN(i) (base_len + ((size_t)(i) < extra ? 1u : 0u))
  segs_t s = make_segs(base_len + (extra ? 1 : 0), c->span / (2 * (uint64_t)(n - 1)));
  const uint64_t rs = c->ctx->seq, ag = rs + (uint64_t)(n - 1) * s.nseg;
  int rc = send_all(c, right, rs, &s, buf + CHUNK_OFF(me), CHUNK_LEN(me));
  if (rc != 0)
    return rc;
  /* Phase 0 reduce-scatters (adds what comes in), phase 1 allgathers (copies it); each step
   * takes chunk segments from the left and passes them right for the next step. */
  for (int phase = 0; phase < 2; phase++) {
    const uint64_t seq = phase == 0 ? rs : ag;
    for (int step = 0; step < n - 1; step++) {
      int ch = (me - step - (phase == 0 ? 1 : 0) + 2 * n) % n;
      float *cb = buf + CHUNK_OFF(ch);
      size_t clen = CHUNK_LEN(ch);
      for (uint64_t k = 0; k < s.nseg; k++) {
        size_t a, len;
        seg_range(&s, clen, k, &a, &len);
        wg_message_t *m = NULL;
        rc = recv_floats(c, left, seq + (uint64_t)step * s.nseg + k, len, &m);
        if (rc != 0)
          return rc;
        if (phase == 0)
          add_floats(cb + a, (const float *)m->payload, len);
        else if (len > 0)
          memcpy(cb + a, m->payload, len * sizeof(float));
        wg_message_free(m);
        if (step < n - 2) {
          rc = send_floats(c, right, seq + (uint64_t)(step + 1) * s.nseg + k, cb + a, len);
        } else if (phase == 0) { /* chunk ch = me + 1 is complete: start the allgather with it */
          if (mean)
            div_floats(cb + a, len, (float)n);
          rc = send_floats(c, right, ag + k, cb + a, len);
        }
        if (rc != 0)
          return rc;
      }
    }
  }
#undef CHUNK_OFF
#undef CHUNK_LEN
  return 0;
}

static int allreduce_span(const wg_coll_ctx_t *ctx, float *buf, size_t count, wagma_reduce_op_t op,
                          double deadline, uint64_t span, uint64_t notice_seq) {
  coll_t c;
  int rc = coll_init(&c, ctx, buf, count, deadline);
  if (rc != 0)
    return rc;
  c.span = span;
  c.notice_seq = notice_seq;
  if (op != WAGMA_REDUCE_SUM && op != WAGMA_REDUCE_MEAN)
    return WAGMA_EINVAL;
  if (c.n == 1 || count == 0)
    return 0;
  if (count * sizeof(float) <= small_threshold(ctx)) {
    rc = allreduce_doubling(&c, buf, count);
    if (rc == 0 && op == WAGMA_REDUCE_MEAN)
      div_floats(buf, count, (float)c.n);
    return rc;
  }
  return allreduce_ring(&c, buf, count, op == WAGMA_REDUCE_MEAN);
}

int wg_coll_allreduce(const wg_coll_ctx_t *ctx, float *buf, size_t count, wagma_reduce_op_t op,
                      double deadline) {
  return allreduce_span(ctx, buf, count, op, deadline, SEQ_SPAN,
                        ctx ? ctx->seq | WG_COLL_NOTICE_BIT : 0);
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
  const int n = c.n;
  const int vrank = (c.me - root_idx + n) % n;
#define REAL(v) (((v) + root_idx) % n)
  segs_t s = make_segs(count, SEQ_SPAN);
  const uint64_t base = ctx->seq;
  if (count * sizeof(float) <= small_threshold(ctx)) {
    int mask = 1;
    while (mask < n) { /* binomial tree: receive from the parent */
      if (vrank & mask) {
        rc = recv_all(&c, REAL(vrank - mask), base, &s, buf, count, 0);
        if (rc != 0)
          return rc;
        break;
      }
      mask <<= 1;
    }
    for (mask >>= 1; mask > 0; mask >>= 1)
      if (vrank + mask < n && (rc = send_all(&c, REAL(vrank + mask), base, &s, buf, count)))
        return rc;
    return 0;
  }
  /* Chain root -> root+1 -> ...: each segment is forwarded as soon as it arrives. */
  for (uint64_t k = 0; k < s.nseg; k++) {
    size_t a, len;
    seg_range(&s, count, k, &a, &len);
    if (vrank > 0) {
      wg_message_t *m = NULL;
      rc = recv_floats(&c, REAL(vrank - 1), base + k, len, &m);
      if (rc != 0)
        return rc;
      memcpy(buf + a, m->payload, len * sizeof(float));
      wg_message_free(m);
    }
    if (vrank < n - 1 && (rc = send_floats(&c, REAL(vrank + 1), base + k, buf + a, len)))
      return rc;
  }
#undef REAL
  return 0;
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
  rc = allreduce_span(&sub, &wsum, 1, WAGMA_REDUCE_SUM, deadline, SEQ_SPAN / 2, c.notice_seq);
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
  rc = allreduce_span(&sub, buf, count, WAGMA_REDUCE_SUM, deadline, SEQ_SPAN / 2, c.notice_seq);
  if (rc == 0 && wsum != 1.0f)
    div_floats(buf, count, wsum);
  return rc;
}
