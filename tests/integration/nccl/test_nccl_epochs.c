/* The NCCL transport across epochs, between real processes on 127.0.0.1 over tests/fake_nccl:
 * epoch 1 of members a, b, c (fresh communicator, allreduce mean); c leaves, epoch 2 of a, b
 * shrinks epoch 1's communicator (broadcast); d joins, epoch 3 of a, b, d initialises afresh
 * (weighted average, d with weight 0); c comes back as rank 0 of epoch 4 with a: its kept
 * communicator (epoch 1's, which covers both) is stale, a holds epoch 3's, so epoch 4
 * initialises afresh (c used to ask for a shrink of epoch 1 that a could not do, and the lane
 * stayed off for the epoch). Also the start-up errors: no device, and NCCL chosen in a build
 * without it. */
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine_internal.h"
#include "nccl_internal.h"
#include "process.h"

#define N 6000 /* floats: 24 KB payloads take the lane */
#define NPROC 4

typedef struct shared {
  int ports[NPROC];
  volatile int stage;              /* 3: epoch 2 is over, d may start epoch 3; 4: c may come back */
  volatile int finished[5][NPROC]; /* [epoch][proc]: its collective returned */
  int errors[NPROC];
  int lane_up[NPROC][5]; /* [proc][epoch] */
  int shrunk[NPROC][5];
  uint64_t transfers[NPROC][5];
  float result[NPROC][5]; /* buf[5] after each epoch's collective */
} shared_t;

static shared_t *sh;
static const char *const names[NPROC] = {"a", "b", "c", "d"};

static void log_stderr(void *user, int level, const char *msg) {
  (void)user;
  (void)level;
  fprintf(stderr, "[%d] %s\n", (int)getpid(), msg);
}

static int make_comm(int me, uint64_t epoch, const int *procs, int n, wagma_comm_t **comm) {
  wagma_plan_t plan;
  if (wagma_plan_build(n, 2, NULL, &plan) != 0)
    return -1;
  plan.epoch = epoch;
  int rank = -1;
  for (int r = 0; r < n; r++) {
    snprintf(plan.members[r].name, WAGMA_NAME_MAX, "%s", names[procs[r]]);
    snprintf(plan.members[r].address, WAGMA_ADDRESS_MAX, "127.0.0.1:%d", sh->ports[procs[r]]);
    if (procs[r] == me)
      rank = r;
  }
  wagma_comm_options_t o;
  wagma_comm_options_init(&o);
  o.plan = &plan;
  o.rank = rank;
  o.count = N;
  o.transport = WAGMA_TRANSPORT_NCCL;
  o.connect_timeout_s = 15;
  o.global_timeout_s = 15;
  if (getenv("NW_DEBUG"))
    o.log = log_stderr;
  int rc = wg_comm_create_with(&o, &wg_ncclfake_transport, comm);
  wagma_plan_free(&plan);
  if (rc != 0)
    return rc;
  /* the lane comes up after create returned: wait for it, so the collective uses it */
  nc_t *t = (nc_t *)(*comm)->tp;
  for (double until = proc_now() + 10; proc_now() < until;) {
    int st = atomic_load(&t->lane_state);
    if (st != NC_LANE_INIT)
      break;
    proc_sleep(0.005);
  }
  proc_sleep(0.05); /* the peers' LANE_UP */
  return 0;
}

/* Waits (bounded) until every member of the epoch has its result, so that nobody closes
 * while a peer still receives on the lane (close would re-send on TCP: correct, but then the
 * lane did not carry it), then records what the lane did and destroys. */
static void record_and_destroy(int me, int epoch, wagma_comm_t *comm, const float *buf,
                               const int *procs, int n) {
  sh->finished[epoch][me] = 1;
  for (double until = proc_now() + 10; proc_now() < until;) {
    int all = 1;
    for (int k = 0; k < n; k++)
      all &= sh->finished[epoch][procs[k]];
    if (all)
      break;
    proc_sleep(0.002);
  }
  nc_t *t = (nc_t *)comm->tp;
  sh->lane_up[me][epoch] = atomic_load(&t->lane_state) == NC_LANE_UP;
  sh->shrunk[me][epoch] = t->shrunk;
  sh->transfers[me][epoch] = atomic_load(&t->lane_transfers);
  sh->result[me][epoch] = buf[5];
  wagma_comm_destroy(comm);
}

static float *filled(int me) {
  float *buf = malloc(N * sizeof(float));
  for (int i = 0; i < N; i++)
    buf[i] = (float)(me * 100 + i % 7);
  return buf;
}

static void child(int me) {
  wagma_comm_t *comm = NULL;
  float *buf = filled(me);
  if (me != 3) { /* epoch 1: a, b, c */
    const int e1[] = {0, 1, 2};
    if (make_comm(me, 1, e1, 3, &comm) != 0 ||
        wagma_comm_allreduce(comm, buf, N, WAGMA_REDUCE_MEAN) != 0)
      sh->errors[me]++;
    if (comm)
      record_and_destroy(me, 1, comm, buf, e1, 3);
    comm = NULL;
  }
  if (me == 2) { /* c leaves, keeping epoch 1's communicator, and comes back in epoch 4 */
    for (double until = proc_now() + 60; sh->stage != 4 && proc_now() < until;)
      proc_sleep(0.01);
    goto epoch4;
  }
  if (me != 3) { /* epoch 2: a, b: members only left */
    const int e2[] = {0, 1};
    for (int i = 0; i < N; i++)
      buf[i] = me == 1 ? 7.0f : -1.0f;
    if (make_comm(me, 2, e2, 2, &comm) != 0 || wagma_comm_broadcast(comm, buf, N, 1) != 0)
      sh->errors[me]++;
    if (comm)
      record_and_destroy(me, 2, comm, buf, e2, 2);
    comm = NULL;
    if (me == 0)
      sh->stage = 3;
  }
  while (sh->stage != 3)
    proc_sleep(0.01);
  { /* epoch 3: a, b, d: d joined, weight 0 */
    const int e3[] = {0, 1, 3};
    for (int i = 0; i < N; i++)
      buf[i] = me == 0 ? 2.0f : me == 1 ? 4.0f : 100.0f;
    if (make_comm(me, 3, e3, 3, &comm) != 0 ||
        wagma_comm_average(comm, buf, N, me == 3 ? 0.0f : 1.0f) != 0)
      sh->errors[me]++;
    if (comm)
      record_and_destroy(me, 3, comm, buf, e3, 3);
    comm = NULL;
    if (me == 0)
      sh->stage = 4;
  }
  if (me != 0)
    goto out;
epoch4 : { /* epoch 4: c (rank 0) and a */
  const int e4[] = {2, 0};
  for (int i = 0; i < N; i++)
    buf[i] = me == 2 ? 10.0f : 20.0f;
  if (make_comm(me, 4, e4, 2, &comm) != 0 ||
      wagma_comm_allreduce(comm, buf, N, WAGMA_REDUCE_MEAN) != 0)
    sh->errors[me]++;
  if (comm)
    record_and_destroy(me, 4, comm, buf, e4, 2);
}
out:
  WG_NCCL(forget)(); /* the communicator kept for a next epoch that will not come */
  free(buf);
  exit(sh->errors[me] ? 1 : 0);
}

static void test_shrink_then_fresh_init(void **s) {
  (void)s;
  sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true(sh != MAP_FAILED);
  memset(sh, 0, sizeof *sh);
  assert_int_equal(proc_free_ports(NPROC, sh->ports), 0);
  pid_t pids[NPROC];
  fflush(NULL);
  for (int p = 0; p < NPROC; p++) {
    pids[p] = fork();
    if (pids[p] == 0)
      child(p);
    assert_true(pids[p] > 0);
  }
  int ok = 1;
  for (int p = 0; p < NPROC; p++) {
    int st = proc_wait(pids[p], 90);
    if (st != 0) {
      fprintf(stderr, "process %s: status %d\n", names[p], st);
      proc_stop(pids[p], SIGKILL, 0);
      ok = 0;
    }
  }
  assert_true(ok);
  /* epoch 1: fresh, mean of a, b, c at i = 5: (5 + 105 + 205) / 3 */
  for (int p = 0; p < 3; p++) {
    assert_int_equal(sh->errors[p], 0);
    assert_true(sh->lane_up[p][1]);
    assert_false(sh->shrunk[p][1]);
    assert_true(sh->transfers[p][1] > 0);
    assert_float_equal(sh->result[p][1], 105.0f, 1e-3);
  }
  /* epoch 2: shrunk from epoch 1's communicator; b's buffer broadcast */
  for (int p = 0; p < 2; p++) {
    assert_true(sh->lane_up[p][2]);
    assert_true(sh->shrunk[p][2]);
    assert_float_equal(sh->result[p][2], 7.0f, 1e-6);
  }
  assert_true(sh->transfers[0][2] > 0); /* a received b's broadcast on the lane */
  /* epoch 3: d joined, so a fresh communicator; d got the mean of a and b */
  const int e3[] = {0, 1, 3};
  for (int k = 0; k < 3; k++) {
    int p = e3[k];
    assert_int_equal(sh->errors[p], 0);
    assert_true(sh->lane_up[p][3]);
    assert_false(sh->shrunk[p][3]);
    assert_float_equal(sh->result[p][3], 3.0f, 1e-5);
  }
  assert_true(sh->transfers[3][3] > 0);
  /* epoch 4: c's kept communicator is epoch 1's, a's epoch 3's: a fresh one, on the lane */
  for (int p = 0; p < 3; p += 2) {
    assert_true(sh->lane_up[p][4]);
    assert_false(sh->shrunk[p][4]);
    assert_true(sh->transfers[p][4] > 0);
    assert_float_equal(sh->result[p][4], 15.0f, 1e-5);
  }
  munmap(sh, sizeof *sh);
}

static void test_no_device_is_a_clear_error(void **s) {
  (void)s;
  int ports[1];
  assert_int_equal(proc_free_ports(1, ports), 0);
  wagma_plan_t plan;
  assert_int_equal(wagma_plan_build(1, 2, NULL, &plan), 0);
  plan.epoch = 1;
  snprintf(plan.members[0].name, WAGMA_NAME_MAX, "solo");
  snprintf(plan.members[0].address, WAGMA_ADDRESS_MAX, "127.0.0.1:%d", ports[0]);
  wagma_comm_options_t o;
  wagma_comm_options_init(&o);
  o.plan = &plan;
  o.count = 16;
  o.transport = WAGMA_TRANSPORT_NCCL;
  wagma_comm_t *comm = NULL;
  setenv("FAKE_NCCL_DEVICES", "0", 1);
  assert_int_equal(wg_comm_create_with(&o, &wg_ncclfake_transport, &comm), WAGMA_EUNAVAIL);
  assert_null(comm);
  unsetenv("FAKE_NCCL_DEVICES");
  o.device = 3; /* the fake has one device */
  assert_int_equal(wg_comm_create_with(&o, &wg_ncclfake_transport, &comm), WAGMA_EUNAVAIL);
  assert_null(comm);
  /* the product's choice: no NCCL in the build, or (here, without a GPU) no device */
  char err[256] = "";
  int rc = wagma_comm_transport_check(WAGMA_TRANSPORT_NCCL, 0, err, sizeof err);
#if WAGMA_TEST_HAVE_NCCL
  assert_true(rc == 0 || rc == WAGMA_EUNAVAIL);
#else
  assert_int_equal(rc, WAGMA_ENOSYS);
  assert_non_null(strstr(err, "no NCCL"));
#endif
  if (rc != 0) {
    o.device = 0;
    assert_int_equal(wagma_comm_create(&o, &comm), rc);
    assert_null(comm);
    assert_true(strlen(err) > 10);
  }
  wagma_plan_free(&plan);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_no_device_is_a_clear_error),
      cmocka_unit_test(test_shrink_then_fresh_init),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
