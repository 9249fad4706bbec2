/* test_engine_invariants.c — the engine's invariants over the in-process fake transport
 * (threads as ranks), each reproduced as the scenario that broke it in the earlier engine:
 *  - a snapshot goes into at most one round, also on the leader's own path: leader 0 waits on
 *    round 0 for a late rank 1 while rank 2's CONTRIB of round 1 reaches it (P = 4, S = 2,
 *    models 0/100/200/300): rank 0 must end at 150, not A(0) + A(1) - C = 175;
 *  - a round ends the same way for all its contributors: a member whose leader stalls for
 *    longer than any member timeout still applies the late RESULT (P = 2, models 0 and 100
 *    must end as 50 and 50, not 50 and 100);
 *  - a member that jumped over a wait-avoiding global round it contributed to, and was then
 *    left out of it, catches up at its next step (it used to count the round as in its model
 *    and train on without its mean);
 *  - allreduce rounds: a partial success (rank 1's allreduce reports a failure, rank 0's
 *    succeeded: injected through wg_engine_data_fault) ends the round void for both, so the
 *    models stay 0 and 100; applying one's own result without the leader's COMMIT would
 *    leave 50 and 100 and break conservation. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine_internal.h"
#include "fake_transport.h"

#define COUNT 8
#define MAXP 4

typedef struct rank_ctx {
  int rank;
  int P;
  const wagma_plan_t *plan;
  double floor_s;
  void (*body)(struct rank_ctx *);
  wagma_comm_t *comm;
  float model[COUNT];
  wagma_round_stats_t st[4];
  int errors;
} rank_ctx_t;

static pthread_barrier_t g_barrier;
static int g_rounds;        /* wagma_comm_options_t.rounds of the world's ranks */
static rank_ctx_t *g_ranks; /* the world's ranks, for a rank that must wait on another */

static void *rank_main(void *arg) {
  rank_ctx_t *rc = arg;
  wagma_comm_options_t o;
  wagma_comm_options_init(&o);
  o.plan = rc->plan;
  o.rank = rc->rank;
  o.count = COUNT;
  o.round_deadline_floor_s = rc->floor_s;
  o.global_timeout_s = 20;
  o.rounds = g_rounds;
  if (wg_comm_create_with(&o, &fake_transport, &rc->comm) != 0)
    rc->errors++;
  pthread_barrier_wait(&g_barrier);
  if (rc->comm)
    rc->body(rc);
  pthread_barrier_wait(&g_barrier); /* nobody destroys while others still run */
  wagma_comm_destroy(rc->comm);
  return NULL;
}

static void run_world(int P, int S, int tau, const double *floor_s, void (*body)(rank_ctx_t *),
                      rank_ctx_t *ranks) {
  wagma_plan_t plan;
  assert_int_equal(fake_plan(P, S, tau, WAGMA_GLOBAL_WAIT_AVOIDING, &plan), 0);
  fake_world_init(P);
  pthread_barrier_init(&g_barrier, NULL, (unsigned)P);
  pthread_t th[MAXP];
  g_ranks = ranks;
  for (int i = 0; i < P; i++) {
    memset(&ranks[i], 0, sizeof(ranks[i]));
    ranks[i].rank = i;
    ranks[i].P = P;
    ranks[i].plan = &plan;
    ranks[i].floor_s = floor_s[i];
    ranks[i].body = body;
    for (int k = 0; k < COUNT; k++)
      ranks[i].model[k] = (float)(100 * i);
    pthread_create(&th[i], NULL, rank_main, &ranks[i]);
  }
  for (int i = 0; i < P; i++)
    pthread_join(th[i], NULL);
  pthread_barrier_destroy(&g_barrier);
  fake_world_free();
  wagma_plan_free(&plan);
  for (int i = 0; i < P; i++)
    assert_int_equal(ranks[i].errors, 0);
}

static void step(rank_ctx_t *rc, int k) {
  if (wagma_comm_step(rc->comm, rc->model, &rc->st[k]) != 0)
    rc->errors++;
}

/* Waits until nothing of mine is open (bounded), then adds what arrived. */
static void settle(rank_ctx_t *rc, double max_s) {
  double until = wg_now() + max_s;
  while (wg_comm_busy(rc->comm) > 0 && wg_now() < until)
    usleep(5000);
  wg_comm_apply_pending(rc->comm, rc->model);
}

/* ---------------------------------------------------------------- one snapshot, one round */

/* Round 0 groups {0,1} {2,3}; round 1 groups {0,2} {1,3}; tau 8: no global round. */
static void body_leader_two_rounds(rank_ctx_t *rc) {
  switch (rc->rank) {
  case 0: /* leads round 0 (waits for rank 1) and round 1 (rank 2 arrives meanwhile) */
    step(rc, 0);
    step(rc, 1);
    break;
  case 1: /* late for round 0; then done */
    usleep(400 * 1000);
    step(rc, 0);
    break;
  case 2: /* round 0 with rank 3 at once, then round 1 with rank 0 while 0 still waits */
    step(rc, 0);
    /* ...once rank 0 is in round 0 (else its round 1 would decline: no snapshot yet) */
    for (double until = wg_now() + 10; wg_comm_busy(g_ranks[0].comm) == 0 && wg_now() < until;)
      usleep(1000);
    step(rc, 1);
    break;
  case 3: step(rc, 0); break;
  }
  pthread_barrier_wait(&g_barrier);
  settle(rc, 5);
}

static void test_leader_contributes_a_snapshot_to_one_round(void **state) {
  (void)state;
  rank_ctx_t ranks[4];
  const double floors[4] = {3, 3, 3, 3};
  run_world(4, 2, 8, floors, body_leader_two_rounds, ranks);
  /* round 0: {0, 100} -> 50 for ranks 0 and 1; {200, 300} -> 250 for ranks 2 and 3.
   * round 1: rank 0 contributes its snapshot after round 0 ended (50), rank 2 its 250. */
  for (int k = 0; k < COUNT; k++) {
    assert_float_equal(ranks[0].model[k], 150.0f, 1e-3);
    assert_float_equal(ranks[1].model[k], 50.0f, 1e-3);
    assert_float_equal(ranks[2].model[k], 150.0f, 1e-3);
    assert_float_equal(ranks[3].model[k], 250.0f, 1e-3);
  }
  assert_int_equal(ranks[0].st[0].contributors, 2);
}

/* ---------------------------------------------------------------- a stalled leader */

static atomic_int g_member_returned; /* rank 1's step came back while its leader was frozen */

static void body_stalled_leader(rank_ctx_t *rc) {
  if (rc->rank == 0) {
    /* Frozen before it ever ran: rank 1's contribution waits in its mailbox for 3 s, far
     * beyond rank 1's member timeout (1.5 x 0.2 + 0.1 = 0.4 s) and any multiple of it. */
    fake_freeze(0, 1);
    pthread_barrier_wait(&g_barrier);
    usleep(3000 * 1000);
    if (!atomic_load(&g_member_returned))
      rc->errors++; /* the member blocked on its stalled leader */
    fake_freeze(0, 0);
    step(rc, 0);
  } else {
    pthread_barrier_wait(&g_barrier);
    step(rc, 0); /* returns after its member timeout without a result */
    atomic_store(&g_member_returned, 1);
    /* train on for a while; every step start used to drop the expired contribution */
    for (int i = 0; i < 40; i++) {
      usleep(100 * 1000);
      wg_comm_apply_pending(rc->comm, rc->model);
    }
  }
  pthread_barrier_wait(&g_barrier);
  settle(rc, 5);
}

static void test_stalled_leader_result_applied_by_all(void **state) {
  (void)state;
  rank_ctx_t ranks[2];
  const double floors[2] = {5, 0.2};
  atomic_store(&g_member_returned, 0);
  run_world(2, 2, 8, floors, body_stalled_leader, ranks);
  for (int k = 0; k < COUNT; k++) {
    assert_float_equal(ranks[0].model[k], 50.0f, 1e-3);
    assert_float_equal(ranks[1].model[k], 50.0f, 1e-3);
  }
}

/* ---- allreduce rounds: a partial success is void for every contributor ------------------ */

static int fail_rank1_round0(int rank, uint64_t round, int rc) {
  if (rank != 1 || round != 0)
    return rc;
  usleep(200 * 1000); /* rank 0's allreduce has ended well by now: a partial success */
  return WAGMA_EPEER; /* the data moved; rank 1 says it did not */
}

static void body_one_round(rank_ctx_t *rc) {
  step(rc, 0);
  pthread_barrier_wait(&g_barrier);
  settle(rc, 5);
}

static void test_partial_allreduce_success_is_void_for_all(void **state) {
  (void)state;
  rank_ctx_t ranks[2];
  const double floors[2] = {0.5, 0.5};
  g_rounds = WAGMA_ROUNDS_ALLREDUCE;
  wg_engine_data_fault = fail_rank1_round0;
  run_world(2, 2, 8, floors, body_one_round, ranks);
  wg_engine_data_fault = NULL;
  g_rounds = 0;
  for (int k = 0; k < COUNT; k++) {
    assert_float_equal(ranks[0].model[k], 0.0f, 1e-6);
    assert_float_equal(ranks[1].model[k], 100.0f, 1e-6);
  }
  assert_int_equal(ranks[0].st[0].left_out, ranks[0].st[0].members); /* void: no correction */
}

/* ---- a jump over a global round that then goes void ------------------------------------- */

static wg_transport_t *g_raw; /* rank 0 of the jump test, driven by hand */

static int raw_take(unsigned kinds, uint64_t round, double wait_s, wg_message_t **m) {
  wg_match_t k;
  wg_match_any(&k);
  k.kinds = kinds;
  if (round != WG_ANY)
    k.round = round;
  return fake_transport.recv(g_raw, &k, wg_now() + wait_s, m);
}

static void raw_send(int kind, uint64_t round, uint32_t flags, uint64_t seq, uint64_t aux,
                     const void *payload, size_t len) {
  wg_frame_header_t h = {0};
  h.kind = (uint32_t)kind;
  h.round = round;
  h.flags = flags;
  h.seq = seq;
  h.aux = aux;
  assert_int_equal(fake_transport.send(g_raw, 1, &h, payload, len), 0);
}

/* Rank 0's answers while rank 1 steps: EXCLUDED to every contribution; to a catch-up request,
 * the mean of global round 3 (every weight 7) as of round 6. */
typedef struct jump_answers {
  int catchup_requests;
} jump_answers_t;

static void *answer_rank1(void *arg) {
  jump_answers_t *a = arg;
  wg_message_t *m = NULL;
  unsigned kinds = (1u << WG_FRAME_CONTRIB) | (1u << WG_FRAME_CATCHUP_REQ);
  while (raw_take(kinds, WG_ANY, 1.5, &m) == 0) {
    if (m->header.kind == WG_FRAME_CATCHUP_REQ) {
      float mean[COUNT];
      for (int i = 0; i < COUNT; i++)
        mean[i] = 7.0f;
      a->catchup_requests++;
      raw_send(WG_FRAME_CATCHUP_REP, 3, 0, m->header.seq, 6, mean, sizeof mean);
    } else if (!(m->header.flags & WG_CONTRIB_DECLINE)) {
      raw_send(WG_FRAME_RESULT, m->header.round, WG_RESULT_EXCLUDED, (uint64_t)-1, 0, NULL, 0);
    }
    wg_message_free(m);
    m = NULL;
  }
  return NULL;
}

/* One step of rank 1 while rank 0 answers. */
static wagma_round_stats_t step_answered(wagma_comm_t *c, float *model, jump_answers_t *a) {
  pthread_t th;
  wagma_round_stats_t st;
  assert_int_equal(pthread_create(&th, NULL, answer_rank1, a), 0);
  assert_int_equal(wagma_comm_step(c, model, &st), 0);
  pthread_join(th, NULL);
  return st;
}

static void test_jump_over_a_void_global_round_catches_up(void **state) {
  (void)state;
  wagma_plan_t plan;
  assert_int_equal(fake_plan(2, 2, 4, WAGMA_GLOBAL_WAIT_AVOIDING, &plan), 0); /* global: 3, 7 */
  fake_world_init(2);
  wg_transport_config_t cfg = {0};
  cfg.plan = &plan;
  cfg.rank = 0;
  cfg.epoch = plan.epoch;
  assert_int_equal(fake_transport.open(&cfg, &g_raw), 0);
  wagma_comm_options_t o;
  wagma_comm_options_init(&o);
  o.plan = &plan;
  o.rank = 1;
  o.count = COUNT;
  o.round_deadline_floor_s = 0.2;
  o.global_timeout_s = 5;
  wagma_comm_t *c = NULL;
  assert_int_equal(wg_comm_create_with(&o, &fake_transport, &c), 0);
  float model[COUNT];
  for (int i = 0; i < COUNT; i++)
    model[i] = 100.0f;
  jump_answers_t a = {0};
  wagma_round_stats_t st = step_answered(c, model, &a); /* round 0, left out */
  assert_int_equal(st.next_round, 1);

  /* Rank 0 activates global round 3: rank 1's round thread contributes at once. */
  raw_send(WG_FRAME_ACTIVATE, 3, 0, (uint64_t)-1, 0, NULL, 0);
  wg_message_t *m = NULL;
  assert_int_equal(raw_take(1u << WG_FRAME_CONTRIB, 3, 3.0, &m), 0);
  wg_message_free(m);
  /* Its compute thread, at round 1, jumps over round 3 (its correction is to come). */
  assert_int_equal(wagma_comm_step(c, model, &st), 0);
  assert_int_equal(st.next_round, 4);
  /* ... which does not come: round 3 ends without it. */
  wagma_comm_counters_t before, after;
  wagma_comm_counters(c, &before);
  raw_send(WG_FRAME_RESULT, 3, WG_RESULT_EXCLUDED, (uint64_t)-1, 0, NULL, 0);
  double until = wg_now() + 3.0;
  do {
    usleep(10000);
    wagma_comm_counters(c, &after);
  } while (after.rounds_left_out == before.rounds_left_out && wg_now() < until);
  assert_true(after.rounds_left_out > before.rounds_left_out);
  /* Rank 0 is past round 3 (it activates round 5). */
  raw_send(WG_FRAME_ACTIVATE, 5, 0, (uint64_t)-1, 0, NULL, 0);
  if (raw_take(1u << WG_FRAME_CONTRIB, 5, 1.0, &m) == 0) {
    if (!(m->header.flags & WG_CONTRIB_DECLINE))
      raw_send(WG_FRAME_RESULT, 5, WG_RESULT_EXCLUDED, (uint64_t)-1, 0, NULL, 0);
    wg_message_free(m);
  }
  /* At round 4 rank 1 sees the global round it missed and catches up on its mean. */
  st = step_answered(c, model, &a);
  assert_int_equal(a.catchup_requests, 1);
  assert_int_equal(st.caught_up, 1);
  for (int i = 0; i < COUNT; i++)
    assert_true(model[i] == 7.0f);
  wagma_comm_destroy(c);
  fake_transport.close(g_raw);
  fake_world_free();
  wagma_plan_free(&plan);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_partial_allreduce_success_is_void_for_all),
      cmocka_unit_test(test_leader_contributes_a_snapshot_to_one_round),
      cmocka_unit_test(test_stalled_leader_result_applied_by_all),
      cmocka_unit_test(test_jump_over_a_void_global_round_catches_up),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
