/* The NCCL transport's frame contract between real processes: every rank sends to every other
 * at once (so each pair has transfers both ways and P = 3 and 4 make cycles of ranks each
 * waiting for the next), small frames (on TCP) interleaved with large ones (on the lane). Each
 * receiver must get every frame of a sender intact and in the order it was sent, the lane must
 * carry the large ones, and no transfer may fail: a deadlock of the agreement would show as a
 * missed deadline (a revoked lane), not only as a hang.
 *
 * Built twice. test_nccl_transport links tests/fake_nccl (every machine); there, with a fault
 * injected mid-way (an operation that never completes, ncclRemoteError) the lane is revoked
 * and every frame still arrives, intact and in order, on TCP; every copy between a payload
 * and the device is from page-locked memory, or, when none can be had, from pageable memory
 * with nothing else changed. test_nccl_multi_gpu (label gpu)
 * links NCCL and the CUDA runtime: rank r on GPU r, P = 2, 3, 4 as far as the machine has
 * GPUs; below 2 GPUs it exits 77 (skipped) with the count, since NCCL refuses two ranks on one
 * GPU. The fault cases need the fake. */
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

#include "gpu_count.h"
#include "nccl_internal.h"
#include "process.h"

#define FRAMES 60
#define MAXP 4

typedef struct shared {
  int ports[MAXP];
  volatile int received[MAXP]; /* done receiving: the others may close */
  int errors[MAXP];
  uint64_t transfers[MAXP], failures[MAXP];
  long locked_copies[MAXP], pageable_copies[MAXP]; /* the fake's: host sides of the copies */
  int other_device; /* the fake's: the transport on device 1, its sender on device 0 */
} shared_t;

static shared_t *sh;

static size_t frame_len(int i) {
  return i % 3 == 0 ? 16 : 3000 + 97 * (size_t)i; /* 1 in 3 on TCP, the rest on the lane */
}

static uint8_t pattern(int src, int dst, int i, size_t k) {
  return (uint8_t)(src * 31 + dst * 7 + i * 13 + (int)k);
}

static void log_stderr(void *user, int level, const char *msg) {
  (void)level;
  fprintf(stderr, "[rank %d] %s\n", *(int *)user, msg);
}

static void rank_main(int P, int me) {
  wagma_plan_t plan;
  if (wagma_plan_build(P, 2, NULL, &plan) != 0)
    exit(1);
  plan.epoch = 1;
  for (int r = 0; r < P; r++) {
    snprintf(plan.members[r].name, WAGMA_NAME_MAX, "r%d", r);
    snprintf(plan.members[r].address, WAGMA_ADDRESS_MAX, "127.0.0.1:%d", sh->ports[r]);
  }
  wg_transport_config_t cfg = {0};
  cfg.plan = &plan;
  cfg.rank = me;
  cfg.epoch = 1;
  cfg.max_payload = 1 << 20;
  cfg.max_queued_bytes = 64 << 20;
  cfg.connect_timeout_s = 15;
#ifndef WG_NCCL_FAKE
  cfg.device = me; /* one GPU per rank (the fake has one device, which every rank shares) */
#else
  cfg.device = sh->other_device ? 1 : 0;
#endif
  if (getenv("NW_DEBUG")) {
    cfg.log = log_stderr;
    cfg.log_user = &me;
  }
#ifdef WG_NCCL_FAKE
  const wg_transport_ops_t *ops = &wg_ncclfake_transport;
#else
  const wg_transport_ops_t *ops = &wg_nccl_transport;
#endif
  wg_transport_t *tp = NULL;
  if (ops->open(&cfg, &tp) != 0)
    exit(2);
  nc_t *t = (nc_t *)tp;
#ifdef WG_NCCL_FAKE
  if (sh->other_device) /* an application thread on another device sends */
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
#endif
  for (double until = proc_now() + 15;
       atomic_load(&t->lane_state) == NC_LANE_INIT && proc_now() < until;)
    proc_sleep(0.002);
  proc_sleep(0.1); /* every peer's LANE_UP */
  uint8_t *buf = malloc(1 << 16);
  for (int i = 0; i < FRAMES; i++)
    for (int d = 0; d < P; d++) {
      if (d == me)
        continue;
      size_t len = frame_len(i);
      for (size_t k = 0; k < len; k++)
        buf[k] = pattern(me, d, i, k);
      wg_frame_header_t h = {0};
      h.kind = WG_FRAME_COLL;
      h.group = 7;
      h.seq = (uint64_t)i;
      int rc = ops->send(tp, d, &h, buf, len);
      if (rc != 0) {
        fprintf(stderr, "rank %d: send %d to %d: %d\n", me, i, d, rc);
        sh->errors[me]++;
      }
    }
  int next[MAXP] = {0};
  double deadline = proc_now() + 30;
  for (int got = 0; got < FRAMES * (P - 1) && sh->errors[me] == 0;) {
    wg_match_t m;
    wg_match_any(&m);
    m.kinds = 1u << WG_FRAME_COLL;
    m.group = 7;
    wg_message_t *msg = NULL;
    int rc = ops->recv(tp, &m, deadline, &msg);
    if (rc != 0) {
      fprintf(stderr, "rank %d: recv: %d (lane state %d, failures %llu, next", me, rc,
              atomic_load(&t->lane_state), (unsigned long long)atomic_load(&t->lane_failures));
      for (int r = 0; r < P; r++)
        fprintf(stderr, " %d", next[r]);
      fprintf(stderr, ")\n");
      sh->errors[me]++;
      break;
    }
    int src = (int)msg->header.src, i = (int)msg->header.seq;
    if (src == me || src >= P || i != next[src] || msg->header.length != frame_len(i)) {
      fprintf(stderr, "rank %d: from %d got seq %d, expected %d\n", me, src, i,
              src < P ? next[src] : -1);
      sh->errors[me]++;
    } else {
      for (size_t k = 0; k < frame_len(i); k++)
        if (msg->payload[k] != pattern(src, me, i, k)) {
          fprintf(stderr, "rank %d: from %d seq %d: byte %zu differs\n", me, src, i, k);
          sh->errors[me]++;
          break;
        }
      next[src]++;
    }
    wg_message_free(msg);
    got++;
  }
  sh->received[me] = 1;
  for (double until = proc_now() + 30; proc_now() < until;) {
    int all = 1;
    for (int r = 0; r < P; r++)
      all &= sh->received[r];
    if (all)
      break;
    proc_sleep(0.005);
  }
  /* a sender sees its last transfer complete a little after its receiver did */
  for (double until = proc_now() + 5; proc_now() < until;) {
    pthread_mutex_lock(&t->mu);
    int idle = t->out == NULL;
    pthread_mutex_unlock(&t->mu);
    if (idle && !atomic_load(&t->busy))
      break;
    proc_sleep(0.002);
  }
  sh->transfers[me] = atomic_load(&t->lane_transfers);
  sh->failures[me] = atomic_load(&t->lane_failures);
#ifdef WG_NCCL_FAKE
  sh->locked_copies[me] = fakecuda_locked_copies();
  sh->pageable_copies[me] = fakecuda_pageable_copies();
#endif
  ops->interrupt(tp);
  ops->close(tp);
  WG_NCCL(forget)();
  wagma_plan_free(&plan);
  free(buf);
  exit(sh->errors[me] ? 3 : 0);
}

/* What page-locked memory there is (the fake's): LOCKED_ALL, every copy to or from the
 * device is from page-locked memory; LOCKED_NONE, none can be had and every copy is from
 * pageable memory; LOCKED_BY_LANE, the sender's thread is on another device than the
 * transport, so it takes page-locked buffers only from the cache its lane fills (its first
 * sends are pageable), while every receive (the lane thread's) is page-locked. */
enum { LOCKED_ALL, LOCKED_NONE, LOCKED_BY_LANE };

/* faulty: a fault is injected (the lane must go down); locked: as above. The frames arrive
 * intact and in order in every case. */
static void run_with(int P, int faulty, int locked) {
#ifndef WG_NCCL_FAKE
  (void)locked; /* the real runtime does not say */
#endif
  sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true(sh != MAP_FAILED);
  memset(sh, 0, sizeof *sh);
  sh->other_device = locked == LOCKED_BY_LANE;
  assert_int_equal(proc_free_ports(P, sh->ports), 0);
  pid_t pid[MAXP];
  fflush(NULL);
  for (int r = 0; r < P; r++) {
    pid[r] = fork();
    if (pid[r] == 0)
      rank_main(P, r);
    assert_true(pid[r] > 0);
  }
  int ok = 1;
  for (int r = 0; r < P; r++) {
    int st = proc_wait(pid[r], 60);
    if (st != 0) {
      fprintf(stderr, "rank %d: exit %d\n", r, st);
      proc_stop(pid[r], SIGKILL, 0);
      ok = 0;
    }
  }
  assert_true(ok);
  uint64_t failures = 0;
  for (int r = 0; r < P; r++) {
    assert_int_equal(sh->errors[r], 0);
    failures += sh->failures[r];
    if (!faulty) {
      assert_int_equal(sh->failures[r], 0);
      /* 2 of 3 frames to and from each peer took the lane (both ends count a transfer) */
      assert_int_equal(sh->transfers[r], (uint64_t)(2 * (P - 1) * (FRAMES * 2 / 3)));
#ifdef WG_NCCL_FAKE
      fprintf(stderr, "  rank %d: %llu transfers, %ld copies page-locked, %ld pageable\n", r,
              (unsigned long long)sh->transfers[r], sh->locked_copies[r], sh->pageable_copies[r]);
      /* one copy per transfer at each end: into the device to send, out of it received */
      assert_int_equal(sh->locked_copies[r] + sh->pageable_copies[r], (long)sh->transfers[r]);
      if (locked == LOCKED_ALL)
        assert_int_equal(sh->pageable_copies[r], 0);
      else if (locked == LOCKED_NONE)
        assert_int_equal(sh->locked_copies[r], 0);
      else { /* every receive page-locked, and the first sends of each size class pageable */
        assert_true(sh->locked_copies[r] >= (long)sh->transfers[r] / 2);
        assert_true(sh->pageable_copies[r] > 0);
      }
#endif
    }
  }
  if (faulty) /* the lane went down mid-way; what it had not delivered came on TCP */
    assert_true(failures > 0);
  munmap(sh, sizeof *sh);
}

static void run(int P) {
  run_with(P, 0, LOCKED_ALL);
}

#ifndef WG_NCCL_FAKE
static int gpus; /* CUDA devices, counted in a child (no CUDA before the fork of the ranks) */
#endif

static void run_if_gpus(int P) {
#ifndef WG_NCCL_FAKE
  if (gpus < P) {
    printf("  P = %d needs %d GPUs, %d here: skipped\n", P, P, gpus);
    skip();
  }
#endif
  run(P);
}

static void test_all_to_all_p2(void **s) {
  (void)s;
  run_if_gpus(2);
}

static void test_all_to_all_p3(void **s) {
  (void)s;
  run_if_gpus(3);
}

static void test_all_to_all_p4(void **s) {
  (void)s;
  run_if_gpus(4);
}

#ifdef WG_NCCL_FAKE
static void test_op_never_completes_mid_way(void **s) {
  (void)s;
  setenv("FAKE_NCCL_HANG_OP", "12", 1);
  run_with(3, 1, LOCKED_ALL);
  unsetenv("FAKE_NCCL_HANG_OP");
}

static void test_remote_error_mid_way(void **s) {
  (void)s;
  setenv("FAKE_NCCL_REMOTE_ERROR_OP", "9", 1);
  run_with(3, 1, LOCKED_ALL);
  unsetenv("FAKE_NCCL_REMOTE_ERROR_OP");
}

/* cudaHostAlloc fails: payloads fall back to pageable buffers and nothing else changes. */
static void test_without_page_locked_memory(void **s) {
  (void)s;
  setenv("FAKE_CUDA_NO_HOST_ALLOC", "1", 1);
  run_with(3, 0, LOCKED_NONE);
  unsetenv("FAKE_CUDA_NO_HOST_ALLOC");
}

/* The sender's thread is on another device: it never allocates page-locked memory (that
 * would make a context there), takes it from the cache the lane fills, and sends from pageable
 * memory until the lane did. */
static void test_sender_on_another_device(void **s) {
  (void)s;
  setenv("FAKE_NCCL_DEVICES", "2", 1);
  run_with(3, 0, LOCKED_BY_LANE);
  unsetenv("FAKE_NCCL_DEVICES");
}
#endif

int main(void) {
#ifdef WG_NCCL_FAKE
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_all_to_all_p2),
      cmocka_unit_test(test_all_to_all_p3),
      cmocka_unit_test(test_all_to_all_p4),
      cmocka_unit_test(test_op_never_completes_mid_way),
      cmocka_unit_test(test_remote_error_mid_way),
      cmocka_unit_test(test_without_page_locked_memory),
      cmocka_unit_test(test_sender_on_another_device),
  };
#else
  if ((gpus = gpu_count_for_ranks("test_nccl_multi_gpu")) < 0)
    return 77;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_all_to_all_p2),
      cmocka_unit_test(test_all_to_all_p3),
      cmocka_unit_test(test_all_to_all_p4),
  };
#endif
  return cmocka_run_group_tests(tests, NULL, NULL);
}
