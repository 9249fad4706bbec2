/* test_seal.c — data-plane encryption of the TCP transport (sealed frames, tcp_seal.c) between
 * real processes on loopback:
 *  - a sealed world of 3 ranks moves frames of every size (empty, small, through the read
 *    buffer, read in place, several MiB) intact, through the mailbox and through a reader
 *    session's sink, and a blocking allreduce is exact; nothing is rejected;
 *  - a sealed rank and a clear rank refuse each other in the handshake;
 *  - on the wire (a proxy in the parent between rank 1 and rank 0, recording what passes):
 *    a payload pattern sent in clear is visible, sealed it is not;
 *  - a proxy that flips one byte of the first frame after the handshake: sealed, the
 *    receiver rejects the frame (never delivers it) and drops the connection; in clear the
 *    altered payload is delivered (what sealing is for);
 *  - open refuses to seal without a secret. */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "coll.h"
#include "tcp_internal.h"
#include "world.h"

static const wg_transport_ops_t *ops = &wg_tcp_transport;

#define MAXR 3
static const size_t sizes[] = {0, 1, 1000, 40000, 200000, (size_t)3 << 20};
#define NSIZES (sizeof sizes / sizeof sizes[0])

typedef struct seal_report {
  int step_failed[MAXR]; /* 0, or where the rank failed */
  uint64_t rejected[MAXR];
  int alive[MAXR][MAXR];
} seal_report_t;

static uint8_t pattern_byte(size_t i, int src, int dst, int k) {
  return (uint8_t)(i * 31u + (size_t)src * 7u + (size_t)dst * 13u + (size_t)k * 101u);
}

/* Every rank sends every size to every other rank, then takes them: from one peer as the
 * progress thread read them into the mailbox, from the other through a reader session (the
 * caller reads the socket itself; odd sizes into a sink, in place for large payloads). Then
 * a sum allreduce of integers, which must be exact. */
static int exchange_all(world_t *w, int rank, void *arg) {
  (void)arg;
  seal_report_t *rep = w->shared;
  wg_transport_t *t = NULL;
  if (world_open(w, rank, (size_t)8 << 20, 10.0, &t) != 0)
    return 10;
  uint8_t *buf = malloc(sizes[NSIZES - 1]), *got = malloc(sizes[NSIZES - 1]);
  int rc = buf == NULL || got == NULL ? 11 : 0;
  for (int dst = 0; dst < w->nranks && rc == 0; dst++) {
    if (dst == rank)
      continue;
    for (int k = 0; k < (int)NSIZES && rc == 0; k++) {
      for (size_t i = 0; i < sizes[k]; i++)
        buf[i] = pattern_byte(i, rank, dst, k);
      wg_frame_header_t h = {.kind = WG_FRAME_COLL, .seq = (uint64_t)k, .round = 7};
      if (ops->send(t, dst, &h, buf, sizes[k]) != 0)
        rc = 20 + k;
    }
  }
  for (int src = 0; src < w->nranks && rc == 0; src++) {
    if (src == rank)
      continue;
    /* from one peer through the progress thread, from the other through a session */
    int session = (src + rank) % 2 == 1;
    wg_reader_t *rd = NULL;
    if (session && ops->reader_begin(t, &src, 1, &rd) != 0)
      rc = 30;
    for (int k = 0; k < (int)NSIZES && rc == 0; k++) {
      wg_match_t m;
      wg_match_any(&m);
      m.src = (uint64_t)src;
      m.seq = (uint64_t)k;
      m.round = 7; /* not a frame of the allreduce a faster rank may have started */
      m.kinds = 1u << WG_FRAME_COLL;
      wg_message_t *msg = NULL;
      const uint8_t *payload;
      if (!session || k % 2 == 0 || sizes[k] == 0) {
        if (ops->recv_into(t, rd, &m, wg_now() + 20, NULL, &msg) != 0 ||
            msg->header.length != sizes[k]) {
          rc = 40 + k;
          break;
        }
        payload = msg->payload;
      } else {
        wg_sink_t sink = {.dst = got, .length = sizes[k]};
        if (ops->recv_into(t, rd, &m, wg_now() + 20, &sink, &msg) != 0) {
          rc = 50 + k;
          break;
        }
        payload = got;
      }
      for (size_t i = 0; i < sizes[k] && rc == 0; i++)
        if (payload[i] != pattern_byte(i, src, rank, k))
          rc = 60 + k;
      wg_message_free(msg);
    }
    ops->reader_end(t, rd);
  }
  if (rc == 0) {
    enum { COUNT = 300000 };
    float *v = malloc(COUNT * sizeof *v);
    int ranks[MAXR] = {0, 1, 2};
    for (size_t i = 0; v != NULL && i < COUNT; i++)
      v[i] = (float)((i % 97) * (size_t)(rank + 1));
    wg_coll_ctx_t ctx = {
        .ops = ops, .transport = t, .rank = rank, .ranks = ranks, .nranks = w->nranks, .round = 9};
    int arc = v == NULL ? WAGMA_ENOMEM
                        : wg_coll_allreduce(&ctx, v, COUNT, WAGMA_REDUCE_SUM, wg_now() + 30);
    if (arc != 0) {
      fprintf(stderr, "rank %d: allreduce: %s\n", rank, wagma_strerror(arc));
      rc = 70;
    }
    int factor = w->nranks * (w->nranks + 1) / 2;
    for (size_t i = 0; rc == 0 && i < COUNT; i++)
      if (v[i] != (float)((i % 97) * (size_t)factor))
        rc = 71;
    free(v);
  }
  wg_transport_stats_t st;
  ops->stats(t, &st);
  rep->rejected[rank] = st.frames_rejected;
  rep->step_failed[rank] = rc;
  free(buf);
  free(got);
  ops->close(t);
  return rc;
}

static void sealed_world_moves_every_size_intact(void **state) {
  (void)state;
  world_t w;
  assert_int_equal(world_init(&w, MAXR, sizeof(seal_report_t)), 0);
  w.seal = 1;
  int codes[MAXR];
  assert_int_equal(world_run(&w, exchange_all, NULL, 120, NULL, codes, NULL, NULL), 0);
  seal_report_t *rep = w.shared;
  for (int r = 0; r < MAXR; r++)
    print_message("rank %d: exit %d, step %d, rejected %llu\n", r, codes[r], rep->step_failed[r],
                  (unsigned long long)rep->rejected[r]);
  for (int r = 0; r < MAXR; r++) {
    assert_int_equal(codes[r], 0);
    assert_int_equal(rep->rejected[r], 0);
  }
  world_free(&w);
}

/* Rank 0 seals, rank 1 does not (both hold the secret): neither takes the other. */
static int open_mixed(world_t *w, int rank, void *arg) {
  (void)arg;
  seal_report_t *rep = w->shared;
  wg_transport_config_t cfg = {.plan = &w->plan,
                               .rank = rank,
                               .epoch = w->epoch,
                               .connect_timeout_s = 2.0,
                               .log = world_log};
  cfg.auth =
      (wg_transport_auth_t){.secret = w->secret, .secret_len = w->secret_len, .seal = rank == 0};
  wg_transport_t *t = NULL;
  if (ops->open(&cfg, &t) != 0)
    return 10;
  wg_transport_stats_t st;
  ops->stats(t, &st);
  rep->rejected[rank] = st.frames_rejected;
  rep->alive[rank][1 - rank] = ops->peer_alive(t, 1 - rank);
  ops->close(t);
  return 0;
}

static void sealed_and_clear_ranks_refuse_each_other(void **state) {
  (void)state;
  world_t w;
  assert_int_equal(world_init(&w, 2, sizeof(seal_report_t)), 0);
  int codes[2];
  assert_int_equal(world_run(&w, open_mixed, NULL, 60, NULL, codes, NULL, NULL), 0);
  seal_report_t *rep = w.shared;
  assert_int_equal(codes[0], 0);
  assert_int_equal(codes[1], 0);
  assert_int_equal(rep->alive[0][1], 0);
  assert_int_equal(rep->alive[1][0], 0);
  assert_true(rep->rejected[0] + rep->rejected[1] >= 1);
  world_free(&w);
}

/* ---- a proxy between rank 1 (dialer) and rank 0 (acceptor) ------------------------------ */

/* What rank 1 sends rank 0: an ASCII pattern a reader of the wire would recognise. */
#define SECRET_TEXT "model weights nobody on the path should read; "
#define SECRET_REPEAT 200

typedef struct proxy {
  int listen_fd;
  char target[64]; /* rank 0's real address */
  long flip_at;    /* offset in the 1 -> 0 stream whose byte is flipped, or -1 */
  uint8_t *seen;   /* what passed 1 -> 0 */
  size_t seen_len, seen_cap;
} proxy_t;

static proxy_t g_proxy;

typedef struct proxy_case {
  int seal;
  int flip;
} proxy_case_t;

/* The members: rank 1 dials the proxy (its plan gives rank 0 the proxy's address), sends the
 * pattern, waits until rank 0 answered or dropped it; rank 0 takes the frame. */
static int through_proxy(world_t *w, int rank, void *arg) {
  const proxy_case_t *pc = arg;
  seal_report_t *rep = w->shared;
  wagma_plan_t plan = w->plan;
  wagma_member_t members[2];
  memcpy(members, w->plan.members, sizeof members);
  struct sockaddr_in a;
  socklen_t alen = sizeof a;
  if (getsockname(g_proxy.listen_fd, (struct sockaddr *)&a, &alen) != 0)
    return 9;
  if (rank == 1)
    snprintf(members[0].address, sizeof members[0].address, "127.0.0.1:%u",
             (unsigned)ntohs(a.sin_port));
  plan.members = members;
  wg_transport_config_t cfg = {
      .plan = &plan, .rank = rank, .epoch = w->epoch, .connect_timeout_s = 10.0, .log = world_log};
  cfg.auth =
      (wg_transport_auth_t){.secret = w->secret, .secret_len = w->secret_len, .seal = pc->seal};
  wg_transport_t *t = NULL;
  if (ops->open(&cfg, &t) != 0)
    return 10;
  char text[sizeof SECRET_TEXT * SECRET_REPEAT];
  size_t len = 0;
  for (int i = 0; i < SECRET_REPEAT; i++, len += sizeof SECRET_TEXT - 1)
    memcpy(text + len, SECRET_TEXT, sizeof SECRET_TEXT - 1);
  int rc = 0;
  wg_match_t m;
  wg_match_any(&m);
  if (rank == 1) {
    wg_frame_header_t h = {.kind = WG_FRAME_COLL, .seq = 1};
    if (ops->send(t, 0, &h, text, len) != 0)
      rc = 20;
    m.src = 0;
    wg_message_t *ack = NULL;
    int r = ops->recv(t, &m, wg_now() + 10, &ack); /* rank 0's answer, or its drop */
    rep->step_failed[1] = r;
    wg_message_free(ack);
  } else {
    m.src = 1;
    wg_message_t *msg = NULL;
    int r = ops->recv(t, &m, wg_now() + 10, &msg);
    /* step_failed[0]: 1 delivered intact, 2 delivered altered, 3 not delivered */
    rep->step_failed[0] = r != 0                                                          ? 3
                          : msg->header.length == len && !memcmp(msg->payload, text, len) ? 1
                                                                                          : 2;
    wg_message_free(msg);
    if (r == 0) {
      wg_frame_header_t h = {.kind = WG_FRAME_COLL, .seq = 2};
      ops->send(t, 1, &h, NULL, 0);
    }
  }
  wg_transport_stats_t st;
  ops->stats(t, &st);
  rep->rejected[rank] = st.frames_rejected;
  rep->alive[rank][1 - rank] = ops->peer_alive(t, 1 - rank);
  ops->close(t);
  return rc;
}

/* The parent: accepts rank 1's connection, dials rank 0, and forwards both ways (recording
 * the 1 -> 0 bytes, flipping one if asked) until both sides closed or 20 s passed. */
static int proxy_main(world_t *w, void *arg) {
  (void)w;
  (void)arg;
  proxy_t *p = &g_proxy;
  struct pollfd lp = {.fd = p->listen_fd, .events = POLLIN};
  if (poll(&lp, 1, 15000) != 1)
    return -1;
  int from1 = accept(p->listen_fd, NULL, NULL);
  int to0 = world_raw_connect(p->target, wg_now() + 10);
  if (from1 < 0 || to0 < 0)
    return -2;
  int open1 = 1, open0 = 1;
  double end = wg_now() + 20;
  uint8_t chunk[65536];
  while ((open1 || open0) && wg_now() < end) {
    struct pollfd fds[2] = {{.fd = open1 ? from1 : -1, .events = POLLIN},
                            {.fd = open0 ? to0 : -1, .events = POLLIN}};
    if (poll(fds, 2, 200) <= 0)
      continue;
    if (fds[0].revents) {
      ssize_t n = recv(from1, chunk, sizeof chunk, 0);
      if (n <= 0) {
        open1 = 0;
        shutdown(to0, SHUT_WR);
      } else {
        for (ssize_t i = 0; i < n; i++)
          if (p->flip_at >= 0 && (long)(p->seen_len + (size_t)i) == p->flip_at)
            chunk[i] ^= 0x20;
        if (p->seen_len + (size_t)n <= p->seen_cap) {
          memcpy(p->seen + p->seen_len, chunk, (size_t)n);
        }
        p->seen_len += (size_t)n;
        if (world_raw_write(to0, chunk, (size_t)n) != 0)
          open1 = 0;
      }
    }
    if (fds[1].revents) {
      ssize_t n = recv(to0, chunk, sizeof chunk, 0);
      if (n <= 0) {
        open0 = 0;
        shutdown(from1, SHUT_WR);
      } else if (world_raw_write(from1, chunk, (size_t)n) != 0) {
        open0 = 0;
      }
    }
  }
  close(from1);
  close(to0);
  return 0;
}

/* Runs the two members through the proxy; the report in *rep. */
static void run_proxy_case(int seal, int flip, seal_report_t *out) {
  world_t w;
  assert_int_equal(world_init(&w, 2, sizeof(seal_report_t)), 0);
  memset(&g_proxy, 0, sizeof g_proxy);
  g_proxy.listen_fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  assert_int_equal(bind(g_proxy.listen_fd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(g_proxy.listen_fd, 4), 0);
  snprintf(g_proxy.target, sizeof g_proxy.target, "%s", w.plan.members[0].address);
  /* the first byte of the first payload after the dialer's handshake, +10 */
  g_proxy.flip_at = flip ? (long)(2 * WG_FRAME_HEADER_SIZE + WG_HELLO_STEP1_LEN +
                                  WG_HELLO_STEP3_LEN + WG_FRAME_HEADER_SIZE + 10)
                         : -1;
  g_proxy.seen_cap = (size_t)1 << 20;
  g_proxy.seen = calloc(1, g_proxy.seen_cap);
  proxy_case_t pc = {.seal = seal, .flip = flip};
  int codes[2], prc = -100;
  assert_int_equal(world_run(&w, through_proxy, &pc, 60, NULL, codes, proxy_main, &prc), 0);
  assert_int_equal(prc, 0);
  assert_int_equal(codes[0], 0);
  assert_int_equal(codes[1], 0);
  memcpy(out, w.shared, sizeof *out);
  print_message("%s%s: rank 0 got %s, rejected %llu, %zu bytes passed 1 -> 0\n",
                seal ? "sealed" : "clear", flip ? ", one byte flipped" : "",
                out->step_failed[0] == 1   ? "the frame intact"
                : out->step_failed[0] == 2 ? "an altered frame"
                                           : "nothing",
                (unsigned long long)out->rejected[0], g_proxy.seen_len);
  world_free(&w);
  close(g_proxy.listen_fd);
}

static int wire_shows(const char *text) {
  return memmem(g_proxy.seen,
                g_proxy.seen_len < g_proxy.seen_cap ? g_proxy.seen_len : g_proxy.seen_cap, text,
                strlen(text)) != NULL;
}

static void the_wire_shows_no_plaintext_when_sealed(void **state) {
  (void)state;
  seal_report_t rep;
  run_proxy_case(0, 0, &rep);
  assert_int_equal(rep.step_failed[0], 1);
  assert_true(wire_shows(SECRET_TEXT)); /* the check can see plaintext when it is there */
  free(g_proxy.seen);
  run_proxy_case(1, 0, &rep);
  assert_int_equal(rep.step_failed[0], 1); /* delivered, decrypted */
  assert_int_equal(rep.rejected[0], 0);
  assert_false(wire_shows(SECRET_TEXT));
  assert_false(wire_shows("nobody on the path"));
  free(g_proxy.seen);
}

static void an_altered_frame_is_rejected_when_sealed(void **state) {
  (void)state;
  seal_report_t rep;
  run_proxy_case(0, 1, &rep);
  assert_int_equal(rep.step_failed[0], 2); /* clear: delivered altered, nobody noticed */
  free(g_proxy.seen);
  run_proxy_case(1, 1, &rep);
  assert_int_equal(rep.step_failed[0], 3); /* sealed: never delivered */
  assert_true(rep.rejected[0] >= 1);
  assert_int_equal(rep.alive[0][1], 0);
  free(g_proxy.seen);
}

static void sealing_needs_a_secret(void **state) {
  (void)state;
  world_t w;
  assert_int_equal(world_init(&w, 1, sizeof(int)), 0);
  wg_transport_config_t cfg = {.plan = &w.plan, .rank = 0, .epoch = 1, .log = world_log};
  cfg.auth.seal = 1;
  wg_transport_t *t = NULL;
  assert_int_equal(ops->open(&cfg, &t), WAGMA_EINVAL);
  assert_null(t);
  world_free(&w);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(sealing_needs_a_secret),
      cmocka_unit_test(sealed_world_moves_every_size_intact),
      cmocka_unit_test(sealed_and_clear_ranks_refuse_each_other),
      cmocka_unit_test(the_wire_shows_no_plaintext_when_sealed),
      cmocka_unit_test(an_altered_frame_is_rejected_when_sealed),
  };
  return cmocka_run_group_tests_name("seal", tests, NULL, NULL);
}
