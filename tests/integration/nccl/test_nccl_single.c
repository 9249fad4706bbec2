/* One rank over NCCL: the lane comes up, a self-transfer (ncclSend + ncclRecv to myself in one
 * group) on the lane's communicator and stream, engine steps and a blocking allreduce, then the
 * epoch paths one rank can take: NCCL refuses a shrink that excludes nobody, so the kept
 * communicator is replaced by a fresh one; revoked, then replaced; aborted (forgotten), then
 * initialised afresh. Shrinking to survivors needs two ranks (test_nccl_epochs, the fake).
 *
 * Built twice: test_nccl_gpu against NCCL and the CUDA runtime (label gpu: it exits 77, a
 * skip, with the reason when this machine has no usable GPU), and test_nccl_single against
 * tests/fake_nccl (runs everywhere). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine_internal.h"
#include "nccl_internal.h"
#include "process.h"

#define COUNT 4096

static int port;

/* The transport's log on stderr: a lane that stays off says why. */
static void log_stderr(void *user, int level, const char *msg) {
  (void)user;
  fprintf(stderr, "  [transport %d] %s\n", level, msg);
}

static int create(uint64_t epoch, wagma_comm_t **comm) {
  wagma_plan_t plan;
  if (wagma_plan_build(1, 2, NULL, &plan) != 0)
    return -1;
  plan.epoch = epoch;
  snprintf(plan.members[0].name, WAGMA_NAME_MAX, "solo");
  snprintf(plan.members[0].address, WAGMA_ADDRESS_MAX, "127.0.0.1:%d", port);
  wagma_comm_options_t o;
  wagma_comm_options_init(&o);
  o.plan = &plan;
  o.count = COUNT;
  o.transport = WAGMA_TRANSPORT_NCCL;
  o.connect_timeout_s = 20;
  o.log = log_stderr;
#ifdef WG_NCCL_FAKE
  int rc = wg_comm_create_with(&o, &wg_ncclfake_transport, comm);
#else
  int rc = wagma_comm_create(&o, comm);
#endif
  wagma_plan_free(&plan);
  return rc;
}

static nc_t *lane_of(wagma_comm_t *comm) {
  nc_t *t = (nc_t *)comm->tp;
  for (double until = proc_now() + 20; proc_now() < until;) {
    if (atomic_load(&t->lane_state) != NC_LANE_INIT)
      break;
    proc_sleep(0.005);
  }
  return t;
}

static void self_transfer(nc_t *t) {
  size_t bytes = COUNT * sizeof(float);
  float *host = malloc(bytes), *back = malloc(bytes);
  void *a = NULL, *b = NULL;
  for (int i = 0; i < COUNT; i++)
    host[i] = (float)i * 0.5f;
  assert_int_equal(cudaMalloc(&a, bytes), cudaSuccess);
  assert_int_equal(cudaMalloc(&b, bytes), cudaSuccess);
  assert_int_equal(cudaMemcpy(a, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  assert_int_equal(ncclGroupStart(), ncclSuccess);
  assert_int_equal(ncclSend(a, COUNT, ncclFloat32, 0, t->comm, t->stream), ncclSuccess);
  assert_int_equal(ncclRecv(b, COUNT, ncclFloat32, 0, t->comm, t->stream), ncclSuccess);
  ncclResult_t r = ncclGroupEnd();
  assert_true(r == ncclSuccess || r == ncclInProgress);
  double until = proc_now() + 10;
  for (;;) {
    ncclResult_t e = ncclSuccess;
    assert_int_equal(ncclCommGetAsyncError(t->comm, &e), ncclSuccess);
    assert_true(e == ncclSuccess || e == ncclInProgress);
    if (e == ncclSuccess && cudaStreamQuery(t->stream) == cudaSuccess)
      break;
    assert_true(proc_now() < until);
    proc_sleep(0.0005);
  }
  assert_int_equal(cudaMemcpy(back, b, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  assert_memory_equal(back, host, bytes);
  cudaFree(a);
  cudaFree(b);
  free(host);
  free(back);
}

/* Epoch `epoch` of the one member: its lane comes up on a fresh communicator (one rank never
 * shrinks: NCCL refuses a shrink that excludes nobody) and carries a self-transfer. */
static nc_t *fresh_epoch(uint64_t epoch, wagma_comm_t **comm) {
  assert_int_equal(create(epoch, comm), 0);
  nc_t *t = lane_of(*comm);
  assert_int_equal(atomic_load(&t->lane_state), NC_LANE_UP);
  assert_false(t->shrunk);
  self_transfer(t);
  return t;
}

static void test_single_rank(void **s) {
  (void)s;
  wagma_comm_t *comm = NULL;
  float *model = calloc(COUNT, sizeof(float));
  assert_int_equal(proc_free_ports(1, &port), 0);

  /* epoch 1: fresh */
  nc_t *t = fresh_epoch(1, &comm);
  for (int k = 0; k < 5; k++) {
    model[0] = (float)k;
    assert_int_equal(wagma_comm_step(comm, model, NULL), 0);
    assert_float_equal(model[0], (float)k, 0);
  }
  assert_int_equal(wagma_comm_allreduce(comm, model, COUNT, WAGMA_REDUCE_MEAN), 0);

  /* NCCL refuses a shrink that excludes nobody (the fake does as NCCL 2.28.9 does) */
  {
    int none[1] = {0};
    ncclComm_t child = NULL;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    assert_int_equal(ncclCommShrink(t->comm, none, 0, &child, &config, NCCL_SHRINK_DEFAULT),
                     ncclInvalidArgument);
    assert_null(child);
  }
  wagma_comm_destroy(comm);

  /* epoch 2: the same member: nobody left, so the kept communicator is replaced by a fresh one
   * (a shrink would exclude nobody) */
  t = fresh_epoch(2, &comm);
  /* revoke: the lane goes down, the communicator is kept revoked; steps go on (over TCP) */
  WG_NCCL(lane_down)(t, "test: revoke");
  assert_int_equal(atomic_load(&t->lane_state), NC_LANE_DOWN);
  assert_int_equal(wagma_comm_step(comm, model, NULL), 0);
  wagma_comm_destroy(comm);

  /* epoch 3: the revoked communicator is aborted and a fresh one initialised */
  fresh_epoch(3, &comm);
  wagma_comm_destroy(comm);

  /* abort the kept one: epoch 4 initialises afresh */
  WG_NCCL(forget)();
  fresh_epoch(4, &comm);
  wagma_comm_destroy(comm);
  WG_NCCL(forget)();
  free(model);
}

int main(void) {
#ifndef WG_NCCL_FAKE
  char err[256];
  if (wagma_comm_transport_check(WAGMA_TRANSPORT_NCCL, 0, err, sizeof err) != 0) {
    printf("SKIP: test_nccl_gpu needs a CUDA GPU and NCCL: %s\n", err);
    return 77;
  }
#endif
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_single_rank)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
