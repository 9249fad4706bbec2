/* The NCCL transport's group collectives (nccl_groups.c) between real processes over the fake
 * NCCL: four ranks, groups of two (two phases) and the world's communicator.
 *  - Every group's and the world's allreduce gives every member the same bits, the exact sum
 *    for two (and the sum in rank order for four, the fake's order); a list that is not a
 *    group of the round is refused (group_ready 0, WAGMA_EIO) without posting anything.
 *  - A member frozen (SIGSTOP) mid-round: its partner's allreduce ends at its deadline, the
 *    communicator is revoked and the frozen member, woken, learns it (group_ready 0 on both);
 *    the other group's rounds go on.
 *  - A member killed (SIGKILL): its partner's allreduce fails at once (WAGMA_EPEER), long
 *    before the deadline. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "nccl_internal.h"
#include "nccl_test_rank.h"
#include "process.h"

#define P 4
#define COUNT 4099 /* not a multiple of anything */
#define ROUNDS 6

enum { FAULT_NONE, FAULT_FREEZE, FAULT_KILL };

typedef struct shared {
  int ports[P];
  volatile int step[P]; /* how far each rank got (the parent and the peers wait on it) */
  int errors[P];
  float sums[ROUNDS][P][8];          /* the first floats each rank got, per round */
  uint32_t crc[ROUNDS][P];           /* of all its floats */
  int fault_rc;                      /* the victim's partner: its allreduce's status */
  double fault_s;                    /* and how long it took */
  int ready_after[P];                /* group_ready of the victim's group after the fault */
  int partner, partner_ready_before; /* the victim's partner, and group_ready before */
  int other_rounds;                  /* the other group's rounds completed after the fault */
} shared_t;

static shared_t *sh;

static float value(int r, int round, size_t k) {
  return (float)((r + 1) * 1000003 % 97) * 0.37f + (float)k * 1e-3f * (float)(round + 1) +
         (k % 5 == 0 ? 1e7f : 0.f) * (float)(r % 2 ? -1 : 1);
}

static uint32_t crc_of(const float *f, size_t n) {
  uint32_t h = 2166136261u;
  const uint8_t *b = (const uint8_t *)f;
  for (size_t i = 0; i < n * sizeof(float); i++)
    h = (h ^ b[i]) * 16777619u;
  return h;
}

static void fail_rank(int me, const char *what, int rc) {
  fprintf(stderr, "rank %d: %s: %d\n", me, what, rc);
  sh->errors[me]++;
}

/* Waits (20 s at most) until every rank in mask reached step s. */
static void wait_step(unsigned mask, int s) {
  for (double until = proc_now() + 20; proc_now() < until;) {
    int all = 1;
    for (int r = 0; r < P; r++)
      if (mask & (1u << r))
        all &= sh->step[r] >= s;
    if (all)
      return;
    proc_sleep(0.002);
  }
}

/* The ranks of my group in round's phase (ascending), and their count. */
static int group_ranks(const wagma_plan_t *plan, uint64_t round, int me, int *out) {
  const wagma_phase_t *ph = wagma_plan_phase(plan, round);
  int g = ph->group_of[me], n = 0;
  for (int i = ph->offsets[g]; i < ph->offsets[g + 1]; i++)
    out[n++] = ph->ranks[i];
  return n;
}

static void rank_main(int me, int fault, int victim) {
  wagma_plan_t plan;
  wg_transport_config_t cfg;
  if (nt_rank_setup(P, me, sh->ports, &plan, &cfg) != 0 || plan.nphases != 2)
    exit(1);
  const wg_transport_ops_t *ops = &wg_ncclfake_transport;
  wg_transport_t *tp = NULL;
  if (ops->open(&cfg, &tp) != 0)
    exit(2);
  int all[P] = {0, 1, 2, 3}, mine[P], n = 0;
  /* ready once every member said its communicators are up */
  for (double until = proc_now() + 15; proc_now() < until; proc_sleep(0.002))
    if (ops->group_ready(tp, 0, all, P) && (n = group_ranks(&plan, 0, me, mine)) &&
        ops->group_ready(tp, 0, mine, n) && (n = group_ranks(&plan, 1, me, mine)) &&
        ops->group_ready(tp, 1, mine, n))
      break;
  float *src = malloc(COUNT * sizeof(float));
  if (!src)
    exit(1);
  for (int round = 0; round < ROUNDS; round++) {
    int world = round % 3 == 2;
    n = world ? P : group_ranks(&plan, (uint64_t)round, me, mine);
    const int *ranks = world ? all : mine;
    for (size_t k = 0; k < COUNT; k++)
      src[k] = value(me, round, k);
    if (!ops->group_ready(tp, (uint64_t)round, ranks, n))
      fail_rank(me, "not ready", round);
    const float *sum = NULL;
    int rc = ops->group_allreduce(tp, ranks, n, (uint64_t)round, src, COUNT, proc_now() + 10, &sum);
    if (rc != 0) {
      fail_rank(me, "group_allreduce", rc);
      continue;
    }
    memcpy(sh->sums[round][me], sum, sizeof sh->sums[round][me]);
    sh->crc[round][me] = crc_of(sum, COUNT);
    for (size_t k = 0; k < COUNT; k++) { /* the fake's order: rank order */
      float want = value(ranks[0], round, k);
      for (int i = 1; i < n; i++)
        want += value(ranks[i], round, k);
      if (memcmp(&want, &sum[k], sizeof want) != 0) {
        fail_rank(me, "a sum differs", (int)k);
        break;
      }
    }
  }
  /* a list that is no group of the round: refused, nothing posted */
  int odd[2] = {me, (me + 3) % P == me ? 0 : (me + 3) % P};
  if (odd[0] > odd[1]) {
    int x = odd[0];
    odd[0] = odd[1];
    odd[1] = x;
  }
  const float *sum = NULL;
  n = group_ranks(&plan, 0, me, mine);
  if (!(n == 2 && mine[0] == odd[0] && mine[1] == odd[1])) {
    if (ops->group_ready(tp, 0, odd, 2))
      fail_rank(me, "ready for a list that is no group", 0);
    int rc = ops->group_allreduce(tp, odd, 2, 0, src, COUNT, proc_now() + 1, &sum);
    if (rc != WAGMA_EIO)
      fail_rank(me, "allreduce for a list that is no group", rc);
  }
  sh->step[me] = 1;
  if (fault != FAULT_NONE) {
    wait_step(0xf, 1);
    /* round 6: phase 0; the victim's partner runs it alone, the others pair normally */
    n = group_ranks(&plan, 6, me, mine);
    int in_victims = mine[0] == victim || mine[1] == victim;
    if (me == victim) {
      sh->step[me] = 2;
      int partner = mine[0] == me ? mine[1] : mine[0];
      while (sh->step[partner] < 3) /* the parent stops (or kills) me meanwhile */
        proc_sleep(0.01);
      /* woken: the partner's revoke reached me (NC_GROUP_DOWN), bounded */
      for (double until = proc_now() + 5; ops->group_ready(tp, 6, mine, n) && proc_now() < until;)
        proc_sleep(0.01);
      sh->ready_after[me] = ops->group_ready(tp, 6, mine, n);
      sh->step[me] = 3;
      ops->interrupt(tp);
      ops->close(tp);
      WG_NCCL(forget)();
      exit(0);
    }
    wait_step(1u << victim, 2);
    proc_sleep(0.3); /* the parent's signal */
    if (in_victims) {
      sh->partner = me;
      sh->partner_ready_before = ops->group_ready(tp, 6, mine, n);
      double t0 = proc_now();
      sh->fault_rc = ops->group_allreduce(tp, mine, n, 6, src, COUNT, proc_now() + 1.5, &sum);
      sh->fault_s = proc_now() - t0;
      sh->ready_after[me] = ops->group_ready(tp, 6, mine, n);
    } else {
      for (int round = 6; round < 6 + 2 * 4; round += 2)
        if (ops->group_allreduce(tp, mine, n, (uint64_t)round, src, COUNT, proc_now() + 5, &sum) ==
                0 &&
            me == mine[0])
          sh->other_rounds++;
    }
    sh->step[me] = 3;
  }
  ops->interrupt(tp);
  ops->close(tp);
  WG_NCCL(forget)();
  wagma_plan_free(&plan);
  free(src);
  exit(sh->errors[me] ? 3 : 0);
}

static void run(int fault) {
  sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true(sh != MAP_FAILED);
  memset(sh, 0, sizeof *sh);
  assert_int_equal(proc_free_ports(P, sh->ports), 0);
  int victim = 3;
  pid_t pid[P];
  fflush(NULL);
  for (int r = 0; r < P; r++) {
    pid[r] = fork();
    if (pid[r] == 0)
      rank_main(r, fault, victim);
    assert_true(pid[r] > 0);
  }
  if (fault != FAULT_NONE) {
    wait_step(1u << victim, 2);
    kill(pid[victim], fault == FAULT_KILL ? SIGKILL : SIGSTOP);
    wait_step(0x7, 3);
    if (fault == FAULT_FREEZE)
      kill(pid[victim], SIGCONT);
  }
  assert_true(nt_wait_ranks(pid, P, fault == FAULT_KILL ? victim : -1));
  for (int round = 0; round < ROUNDS; round++)
    for (int r = 1; r < P; r++) {
      int world = round % 3 == 2;
      if (world) /* every rank has the same bits */
        assert_int_equal(sh->crc[round][r], sh->crc[round][0]);
    }
  if (fault == FAULT_FREEZE) {
    assert_int_equal(sh->fault_rc, WAGMA_ETIMEDOUT);
    assert_true(sh->fault_s >= 1.4 && sh->fault_s < 4.0);
  } else if (fault == FAULT_KILL) {
    assert_int_equal(sh->fault_rc, WAGMA_EPEER);
    assert_true(sh->fault_s < 1.0); /* the death, not the 1.5 s deadline */
  }
  if (fault != FAULT_NONE) {
    /* the revoked group is no longer offered: by the partner that revoked it, and by the
     * frozen member once woken (told over TCP) */
    assert_int_equal(sh->ready_after[sh->partner], 0);
    assert_int_equal(sh->partner_ready_before, 1);
    if (fault == FAULT_FREEZE)
      assert_int_equal(sh->ready_after[victim], 0);
    assert_int_equal(sh->other_rounds, 4); /* the other group went on */
  }
  munmap(sh, sizeof *sh);
}

static void test_group_and_world_sums(void **s) {
  (void)s;
  run(FAULT_NONE);
}

static void test_member_frozen(void **s) {
  (void)s;
  run(FAULT_FREEZE);
}

static void test_member_killed(void **s) {
  (void)s;
  run(FAULT_KILL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_group_and_world_sums),
      cmocka_unit_test(test_member_frozen),
      cmocka_unit_test(test_member_killed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
