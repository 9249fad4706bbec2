/* test_adpsgd: AD-PSGD's pairwise averaging endpoint (agent/adpsgd.c) over real loopback TCP,
 * in one process:
 * - the port/token exchange survives a SUM allreduce (simulated) exactly;
 * - one averaging leaves the active and the passive (after publish) at the mean of the two
 *   models, and the sum of all models is conserved;
 * - two actives gossiping concurrently with two passives that keep stepping and publishing:
 *   the sum of the models is the initial sum plus every local step (conservation under
 *   concurrency), and without steps the models reach consensus (the actives meet at a barrier
 *   every 10 averagings, so neither can finish before the other starts);
 * - a passive that accepts connections but never answers (what a SIGSTOPped agent looks
 *   like: its kernel still completes the handshake) costs one deadline, then is skipped while
 *   the active keeps averaging with the other passive;
 * - a reply that comes after its deadline (a passive that was stopped and resumed) is
 *   collected at the next averaging and the active's half applied then;
 * - a request with a wrong token or of another epoch is refused and changes nothing. */
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "agent/adpsgd.h"
#include "wagma/clock_internal.h"

#define N 1000
#define RANKS 4

typedef struct world {
  wg_adpsgd_t *g[RANKS];
  wg_adpsgd_peer_t peers[RANKS];
  float model[RANKS][N];
} world_t;

static uint64_t token_of(int r) {
  return 0x1234567890abcdefull ^ ((uint64_t)r * 0x9e3779b97f4a7c15ull);
}

static void world_open(world_t *w, uint64_t seed, double deadline_s) {
  wagma_rng_t rng;
  wagma_rng_seed(&rng, seed);
  memset(w, 0, sizeof *w);
  for (int r = 0; r < RANKS; r++) {
    assert_int_equal(wg_adpsgd_open("127.0.0.1", N, NULL, NULL, &w->g[r]), 0);
    snprintf(w->peers[r].host, sizeof w->peers[r].host, "127.0.0.1");
    w->peers[r].port = wg_adpsgd_port(w->g[r]);
    assert_true(w->peers[r].port > 0);
    w->peers[r].token = token_of(r);
    for (int i = 0; i < N; i++)
      w->model[r][i] = (float)wagma_rng_normal(&rng);
  }
  for (int r = 0; r < RANKS; r++)
    assert_int_equal(wg_adpsgd_set_epoch(w->g[r], 7, r, RANKS, w->peers, token_of(r), deadline_s,
                                         10.0, w->model[r]),
                     0);
}

static void world_close(world_t *w) {
  for (int r = 0; r < RANKS; r++)
    wg_adpsgd_close(w->g[r]);
}

static double sum_all(world_t *w, int i) {
  double s = 0;
  for (int r = 0; r < RANKS; r++)
    s += w->model[r][i];
  return s;
}

static double spread(world_t *w) {
  double worst = 0;
  for (int r = 1; r < RANKS; r++)
    for (int i = 0; i < N; i++)
      worst = fmax(worst, fabs(w->model[r][i] - w->model[0][i]));
  return worst;
}

static void exchange_codec_survives_a_sum(void **state) {
  (void)state;
  float sum[RANKS * WG_ADPSGD_EXCHANGE_FLOATS] = {0};
  const uint16_t ports[RANKS] = {1, 65535, 40000, 0};
  for (int r = 0; r < RANKS; r++) {
    float mine[RANKS * WG_ADPSGD_EXCHANGE_FLOATS] = {0};
    wg_adpsgd_exchange_encode(mine, r, ports[r], token_of(r));
    for (int i = 0; i < RANKS * WG_ADPSGD_EXCHANGE_FLOATS; i++)
      sum[i] += mine[i];
  }
  for (int r = 0; r < RANKS; r++) {
    uint16_t port;
    uint64_t token;
    wg_adpsgd_exchange_decode(sum, r, &port, &token);
    assert_int_equal(port, ports[r]);
    assert_true(token == token_of(r));
  }
}

static void one_averaging_reaches_the_mean_and_conserves_the_sum(void **state) {
  (void)state;
  world_t w;
  world_open(&w, 1, 2.0);
  float before[RANKS][N];
  memcpy(before, w.model, sizeof before);
  wagma_rng_t rng;
  wagma_rng_seed(&rng, 3);
  int peer = -1;
  assert_int_equal(wg_adpsgd_average(w.g[0], w.model[0], &rng, &peer), 0);
  assert_true(peer == 1 || peer == 3);
  for (int r = 0; r < RANKS; r++)
    assert_int_equal(wg_adpsgd_publish(w.g[r], w.model[r]), r == peer ? 1 : 0);
  for (int i = 0; i < N; i++) {
    float mean = 0.5f * (before[0][i] + before[peer][i]);
    assert_true(fabsf(w.model[0][i] - mean) <= 1e-6f);
    assert_true(fabsf(w.model[peer][i] - mean) <= 1e-5f);
    double s0 = 0;
    for (int r = 0; r < RANKS; r++)
      s0 += before[r][i];
    assert_true(fabs(sum_all(&w, i) - s0) <= 1e-5);
  }
  /* the untouched members kept their models */
  int other = peer == 1 ? 3 : 1;
  assert_memory_equal(w.model[other], before[other], sizeof before[other]);
  assert_memory_equal(w.model[2], before[2], sizeof before[2]);
  wg_adpsgd_counters_t c;
  wg_adpsgd_counters(w.g[0], &c);
  assert_int_equal(c.averaged, 1);
  wg_adpsgd_counters(w.g[peer], &c);
  assert_int_equal(c.served, 1);
  world_close(&w);
}

/* The actives meet at a barrier every ACTIVES_MEET_EVERY averagings. Without it a loaded
 * machine may run one active's 200 averagings before the other's first: the first active
 * and both passives then agree, the second active pulls the passives to its side alone, and
 * the halves end apart (spread 6.24 -> 1.17 when the second active starts 0.3 s late) however
 * correct every averaging is. In training both actives run for the whole job. */
#define ACTIVES_MEET_EVERY 10

typedef struct worker_arg {
  world_t *w;
  int rank;
  int steps;
  float step; /* passives add this to every parameter at each step */
  pthread_barrier_t *actives_meet;
  int averaged, skipped;
} worker_arg_t;

static void *active_main(void *p) {
  worker_arg_t *a = p;
  wagma_rng_t rng;
  wagma_rng_seed(&rng, 100 + (uint64_t)a->rank);
  for (int k = 0; k < a->steps; k++) {
    if (k % ACTIVES_MEET_EVERY == 0)
      pthread_barrier_wait(a->actives_meet);
    if (wg_adpsgd_average(a->w->g[a->rank], a->w->model[a->rank], &rng, NULL) == 0)
      a->averaged++;
    else
      a->skipped++;
  }
  return NULL;
}

static void *passive_main(void *p) {
  worker_arg_t *a = p;
  for (int k = 0; k < a->steps; k++) {
    for (int i = 0; i < N; i++)
      a->w->model[a->rank][i] += a->step;
    wg_adpsgd_publish(a->w->g[a->rank], a->w->model[a->rank]);
    usleep(200);
  }
  return NULL;
}

static void run_concurrently(world_t *w, float step, worker_arg_t *args) {
  pthread_t th[RANKS];
  pthread_barrier_t actives_meet;
  assert_int_equal(pthread_barrier_init(&actives_meet, NULL, RANKS / 2), 0);
  for (int r = 0; r < RANKS; r++) {
    args[r] = (worker_arg_t){
        .w = w, .rank = r, .steps = 200, .step = step, .actives_meet = &actives_meet};
    assert_int_equal(pthread_create(&th[r], NULL,
                                    wg_adpsgd_rank_active(r) ? active_main : passive_main,
                                    &args[r]),
                     0);
  }
  for (int r = 0; r < RANKS; r++)
    pthread_join(th[r], NULL);
  pthread_barrier_destroy(&actives_meet);
  for (int r = 0; r < RANKS; r++)
    wg_adpsgd_publish(w->g[r], w->model[r]); /* what the passives were still owed */
}

static void concurrent_gossip_conserves_the_sum_and_reaches_consensus(void **state) {
  (void)state;
  world_t w;
  worker_arg_t args[RANKS];
  /* with local steps: sum = initial sum + every passive's steps */
  world_open(&w, 2, 5.0); /* generous: a loaded machine must not make this a timeout test */
  double s0[N];
  for (int i = 0; i < N; i++)
    s0[i] = sum_all(&w, i);
  run_concurrently(&w, 0.001f, args);
  int averaged = args[0].averaged + args[2].averaged;
  print_message("concurrent: %d averagings, %d skipped\n", averaged,
                args[0].skipped + args[2].skipped);
  assert_true(averaged >= 380); /* (a late reply is counted when collected) */
  double worst = 0;
  for (int i = 0; i < N; i++)
    worst = fmax(worst, fabs(sum_all(&w, i) - (s0[i] + 2 * 200 * 0.001)));
  print_message("max |sum - (initial sum + local steps)| = %.3g\n", worst);
  assert_true(worst <= 1e-3);
  world_close(&w);

  /* without local steps: the models meet */
  world_open(&w, 3, 5.0);
  double before = spread(&w);
  run_concurrently(&w, 0.0f, args);
  double after = spread(&w);
  wg_adpsgd_counters_t c1, c3;
  wg_adpsgd_counters(w.g[1], &c1);
  wg_adpsgd_counters(w.g[3], &c3);
  print_message("spread of the models: %.3g -> %.3g (%d + %d averagings, %d + %d skipped; "
                "rank 1 answered %llu, rank 3 %llu)\n",
                before, after, args[0].averaged, args[2].averaged, args[0].skipped, args[2].skipped,
                (unsigned long long)c1.served, (unsigned long long)c3.served);
  assert_true(after < 1e-3 * before);
  world_close(&w);
}

static void stopped_passive_is_skipped_after_one_deadline(void **state) {
  (void)state;
  world_t w;
  world_open(&w, 4, 0.3);
  /* rank 3 becomes a listener that completes handshakes and never answers */
  int frozen = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof sa;
  assert_int_equal(bind(frozen, (struct sockaddr *)&sa, sizeof sa), 0);
  assert_int_equal(listen(frozen, 8), 0);
  assert_int_equal(getsockname(frozen, (struct sockaddr *)&sa, &sl), 0);
  w.peers[3].port = ntohs(sa.sin_port);
  assert_int_equal(
      wg_adpsgd_set_epoch(w.g[0], 7, 0, RANKS, w.peers, token_of(0), 0.3, 30.0, w.model[0]), 0);
  wagma_rng_t rng;
  wagma_rng_seed(&rng, 5);
  int timeouts = 0, with_1 = 0, after_timeout_with_3 = 0;
  double t0 = wg_mono(), slowest = 0;
  for (int k = 0; k < 40; k++) {
    int peer = -1;
    double t = wg_mono();
    int e = wg_adpsgd_average(w.g[0], w.model[0], &rng, &peer);
    slowest = fmax(slowest, wg_mono() - t);
    if (e == WAGMA_ETIMEDOUT) {
      assert_int_equal(peer, 3);
      timeouts++;
    } else {
      assert_int_equal(e, 0);
      assert_int_equal(peer, 1);
      with_1++;
      after_timeout_with_3 += timeouts > 0 && peer == 3;
    }
    wg_adpsgd_publish(w.g[1], w.model[1]);
  }
  double total = wg_mono() - t0;
  print_message("40 averagings: %d timed out (frozen peer), %d with rank 1, slowest %.3f s, "
                "total %.3f s\n",
                timeouts, with_1, slowest, total);
  /* the frozen peer is asked at most once (then suspect for 30 s) */
  assert_true(timeouts <= 1);
  assert_int_equal(after_timeout_with_3, 0);
  assert_int_equal(timeouts + with_1, 40);
  /* hang guard: one deadline of 0.3 s, not one per averaging */
  assert_true(total < 0.3 * 2 + 5.0);
  close(frozen);
  world_close(&w);
}

/* A passive that answers late: it reads one request, sleeps, then replies with `reply` (the
 * wire format of adpsgd.h: a 40-byte header, then the floats). */
typedef struct late_passive {
  int listen_fd;
  float reply[N];
  double sleep_s;
} late_passive_t;

static void *late_passive_main(void *arg) {
  late_passive_t *lp = arg;
  int fd = accept(lp->listen_fd, NULL, NULL);
  if (fd < 0)
    return NULL;
  struct {
    uint32_t magic;
    uint16_t version, kind;
    uint64_t epoch, token, count, reserved;
  } h;
  float w[N];
  if (recv(fd, &h, sizeof h, MSG_WAITALL) == (ssize_t)sizeof h &&
      recv(fd, w, sizeof w, MSG_WAITALL) == (ssize_t)sizeof w) {
    usleep((useconds_t)(lp->sleep_s * 1e6));
    h.kind = 2; /* reply */
    h.token = 0;
    h.count = N;
    if (send(fd, &h, sizeof h, 0) == (ssize_t)sizeof h)
      (void)!send(fd, lp->reply, sizeof lp->reply, 0);
  }
  usleep(300000); /* the active reads before the connection closes */
  close(fd);
  return NULL;
}

static void late_reply_is_applied_later(void **state) {
  (void)state;
  world_t w;
  world_open(&w, 7, 0.2);
  late_passive_t lp = {.sleep_s = 0.5};
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof sa;
  lp.listen_fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_int_equal(bind(lp.listen_fd, (struct sockaddr *)&sa, sizeof sa), 0);
  assert_int_equal(listen(lp.listen_fd, 4), 0);
  assert_int_equal(getsockname(lp.listen_fd, (struct sockaddr *)&sa, &sl), 0);
  for (int i = 0; i < N; i++)
    lp.reply[i] = 3.0f + 0.001f * (float)i;
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, late_passive_main, &lp), 0);
  /* rank 3 is the late passive; rank 1 unknown (port 0), so rank 3 is the only choice */
  w.peers[3].port = ntohs(sa.sin_port);
  w.peers[1].port = 0;
  assert_int_equal(
      wg_adpsgd_set_epoch(w.g[0], 7, 0, RANKS, w.peers, token_of(0), 0.2, 30.0, w.model[0]), 0);
  float sent[N];
  memcpy(sent, w.model[0], sizeof sent);
  wagma_rng_t rng;
  wagma_rng_seed(&rng, 9);
  assert_int_equal(wg_adpsgd_average(w.g[0], w.model[0], &rng, NULL), WAGMA_ETIMEDOUT);
  assert_memory_equal(w.model[0], sent, sizeof sent); /* nothing applied yet */
  usleep(600000);                                     /* the reply is in by now */
  /* the next averaging collects it (no peer left to ask: rank 3 waits out its back-off) */
  assert_int_equal(wg_adpsgd_average(w.g[0], w.model[0], &rng, NULL), WAGMA_ENOTFOUND);
  for (int i = 0; i < N; i++)
    assert_true(fabsf(w.model[0][i] - (sent[i] + 0.5f * (lp.reply[i] - sent[i]))) <= 1e-6f);
  wg_adpsgd_counters_t c;
  wg_adpsgd_counters(w.g[0], &c);
  assert_int_equal(c.late, 1);
  assert_int_equal(c.averaged, 1);
  pthread_join(th, NULL);
  close(lp.listen_fd);
  world_close(&w);
}

static void wrong_token_or_epoch_is_refused(void **state) {
  (void)state;
  world_t w;
  world_open(&w, 6, 2.0);
  wg_adpsgd_peer_t bad[RANKS];
  memcpy(bad, w.peers, sizeof bad);
  bad[1].token ^= 1;
  bad[3].token ^= 1;
  assert_int_equal(
      wg_adpsgd_set_epoch(w.g[0], 7, 0, RANKS, bad, token_of(0), 2.0, 0.001, w.model[0]), 0);
  float keep[N];
  memcpy(keep, w.model[0], sizeof keep);
  wagma_rng_t rng;
  wagma_rng_seed(&rng, 8);
  assert_int_equal(wg_adpsgd_average(w.g[0], w.model[0], &rng, NULL), WAGMA_EPEER);
  assert_memory_equal(keep, w.model[0], sizeof keep);
  /* right tokens, wrong epoch */
  assert_int_equal(
      wg_adpsgd_set_epoch(w.g[0], 8, 0, RANKS, w.peers, token_of(0), 2.0, 0.001, w.model[0]), 0);
  assert_int_equal(wg_adpsgd_average(w.g[0], w.model[0], &rng, NULL), WAGMA_EPEER);
  assert_memory_equal(keep, w.model[0], sizeof keep);
  wg_adpsgd_counters_t c1, c3;
  wg_adpsgd_counters(w.g[1], &c1);
  wg_adpsgd_counters(w.g[3], &c3);
  assert_int_equal(c1.refused + c3.refused, 2);
  assert_int_equal(c1.served + c3.served, 0);
  world_close(&w);
}

typedef struct late_epoch_arg {
  world_t *w;
  double delay_s;
} late_epoch_arg_t;

/* The passives enter epoch 8 delay_s after the active did. */
static void *passives_enter_late(void *p) {
  late_epoch_arg_t *a = p;
  usleep((useconds_t)(a->delay_s * 1e6));
  for (int r = 1; r < RANKS; r += 2)
    wg_adpsgd_set_epoch(a->w->g[r], 8, r, RANKS, a->w->peers, token_of(r), 2.0, 10.0,
                        a->w->model[r]);
  return NULL;
}

/* An active of a new epoch asks before the passive has entered it (their endpoint exchanges
 * return microseconds apart): the request waits for the passive's set_epoch and is served,
 * instead of being refused and the passive skipped for the whole back-off. */
static void request_ahead_of_the_passive_waits_for_its_epoch(void **state) {
  (void)state;
  world_t w;
  world_open(&w, 9, 2.0);
  assert_int_equal(
      wg_adpsgd_set_epoch(w.g[0], 8, 0, RANKS, w.peers, token_of(0), 2.0, 10.0, w.model[0]), 0);
  late_epoch_arg_t a = {&w, 0.1};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, passives_enter_late, &a), 0);
  wagma_rng_t rng;
  wagma_rng_seed(&rng, 10);
  int peer = -1;
  double t0 = wg_mono();
  assert_int_equal(wg_adpsgd_average(w.g[0], w.model[0], &rng, &peer), 0);
  print_message("served %.3f s after the request, by rank %d\n", wg_mono() - t0, peer);
  pthread_join(t, NULL);
  wg_adpsgd_counters_t c;
  wg_adpsgd_counters(w.g[peer], &c);
  assert_int_equal(c.served, 1);
  assert_int_equal(c.refused, 0);
  world_close(&w);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(exchange_codec_survives_a_sum),
      cmocka_unit_test(one_averaging_reaches_the_mean_and_conserves_the_sum),
      cmocka_unit_test(concurrent_gossip_conserves_the_sum_and_reaches_consensus),
      cmocka_unit_test(stopped_passive_is_skipped_after_one_deadline),
      cmocka_unit_test(late_reply_is_applied_later),
      cmocka_unit_test(wrong_token_or_epoch_is_refused),
      cmocka_unit_test(request_ahead_of_the_passive_waits_for_its_epoch),
  };
  return cmocka_run_group_tests_name("adpsgd", tests, NULL, NULL);
}
