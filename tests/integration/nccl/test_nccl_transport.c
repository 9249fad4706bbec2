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
#include "nccl_test_rank.h"
#include "process.h"

#define FRAMES 60     /* the first exchange's frames to each peer */
#define WARM_FRAMES 2 /* the second's, all on the lane, with the page-locked cache warm */
#define MAXP 4

typedef struct shared {
  int ports[MAXP];
  volatile int phase_done[MAXP]; /* the step each rank reached (barrier) */
  int errors[MAXP];
  uint64_t transfers[MAXP], failures[MAXP];
  long locked_copies[MAXP], pageable_copies[MAXP]; /* the fake's: host sides of the copies */
  long warm_locked[MAXP], warm_pageable[MAXP];     /* those of the second exchange */
  /* the fake's calls that waited for the whole device: by the lane thread, by the sending
   * (main) thread, by any thread */
  long lane_waits[MAXP], sender_waits[MAXP], device_waits[MAXP];
  int other_device; /* the fake's: the transport on device 1, its sender on device 0 */
} shared_t;

static shared_t *sh;

static size_t frame_len(int i) {
  if (i >= FRAMES) /* the second exchange: on the lane */
    return 3000 + 97 * (size_t)(i - FRAMES);
  return i % 3 == 0 ? 16 : 3000 + 97 * (size_t)i; /* 1 in 3 on TCP, the rest on the lane */
}

static uint8_t pattern(int src, int dst, int i, size_t k) {
  return (uint8_t)(src * 31 + dst * 7 + i * 13 + (int)k);
}

static void log_stderr(void *user, int level, const char *msg) {
  (void)level;
  fprintf(stderr, "[rank %d] %s\n", *(int *)user, msg);
}

/* Sends frames first .. first + n - 1 to every peer and receives them from every peer, each
 * intact and in order; what goes wrong is counted in sh->errors[me]. */
static void exchange(const wg_transport_ops_t *ops, wg_transport_t *tp, int P, int me, int first,
                     int n) {
  nc_t *t = (nc_t *)tp;
  uint8_t *buf = malloc(1 << 16);
  if (!buf) {
    sh->errors[me]++;
    return;
  }
  for (int i = first; i < first + n; i++)
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
  free(buf);
  int next[MAXP];
  for (int r = 0; r < MAXP; r++)
    next[r] = first;
  double deadline = proc_now() + 30;
  for (int got = 0; got < n * (P - 1) && sh->errors[me] == 0;) {
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
}

/* Waits (30 s at most) until every rank reached step `phase` (1: first exchange received, 2:
 * counters taken, 3: second exchange received). */
static void barrier(int P, int me, int phase) {
  sh->phase_done[me] = phase;
  for (double until = proc_now() + 30; proc_now() < until;) {
    int all = 1;
    for (int r = 0; r < P; r++)
      all &= sh->phase_done[r] >= phase;
    if (all)
      return;
    proc_sleep(0.005);
  }
}

/* Waits (5 s at most) until every transfer of mine was confirmed: a sender sees its last
 * transfer complete a little after its receiver did. */
static void wait_sent(nc_t *t) {
  for (double until = proc_now() + 5; proc_now() < until;) {
    pthread_mutex_lock(&t->mu);
    int idle = t->out == NULL;
    pthread_mutex_unlock(&t->mu);
    if (idle && !atomic_load(&t->busy))
      return;
    proc_sleep(0.002);
  }
}

static void rank_main(int P, int me) {
  wagma_plan_t plan;
  wg_transport_config_t cfg;
  if (nt_rank_setup(P, me, sh->ports, &plan, &cfg) != 0)
    exit(1);
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
  exchange(ops, tp, P, me, 0, FRAMES);
  barrier(P, me, 1);
  wait_sent(t);
#ifdef WG_NCCL_FAKE
  /* the cache holds what the keeper put there and what came back: the next exchange, smaller
   * than it, finds every buffer page-locked */
  proc_sleep(0.2);
  long locked0 = fakecuda_locked_copies(), pageable0 = fakecuda_pageable_copies();
#endif
  barrier(P, me, 2); /* nobody's second exchange reaches me before I counted */
  exchange(ops, tp, P, me, FRAMES, WARM_FRAMES);
  barrier(P, me, 3);
  wait_sent(t);
  sh->transfers[me] = atomic_load(&t->lane_transfers);
  sh->failures[me] = atomic_load(&t->lane_failures);
#ifdef WG_NCCL_FAKE
  sh->locked_copies[me] = fakecuda_locked_copies();
  sh->pageable_copies[me] = fakecuda_pageable_copies();
  sh->warm_locked[me] = sh->locked_copies[me] - locked0;
  sh->warm_pageable[me] = sh->pageable_copies[me] - pageable0;
  sh->lane_waits[me] = fakecuda_device_waits_by(t->lane_thread);
  sh->sender_waits[me] = fakecuda_device_waits_by(pthread_self());
  sh->device_waits[me] = fakecuda_device_waits();
#endif
  ops->interrupt(tp);
  ops->close(tp);
  WG_NCCL(forget)();
  wagma_plan_free(&plan);
  exit(sh->errors[me] ? 3 : 0);
}

/* What page-locked memory there is (the fake's). LOCKED_ALL: the second exchange, with the
 * keeper's cache warm, copies to and from the device only from page-locked memory (the first
 * may use pageable memory while the cache fills); LOCKED_NONE: none can be had and every copy
 * is from pageable memory; LOCKED_OTHER_DEVICE: as LOCKED_ALL, with the transport on device 1
 * and its sender's thread on device 0 (the keeper allocates, never the sender); LOCKED_ANY: no
 * claim (a device so busy the keeper is slow to fill the cache). */
enum { LOCKED_ALL, LOCKED_NONE, LOCKED_OTHER_DEVICE, LOCKED_ANY };

/* faulty: a fault is injected (the lane must go down); locked: as above. The frames arrive
 * intact and in order in every case. */
static void run_with(int P, int faulty, int locked) {
#ifndef WG_NCCL_FAKE
  (void)locked; /* the real runtime does not say */
#endif
  sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true(sh != MAP_FAILED);
  memset(sh, 0, sizeof *sh);
  sh->other_device = locked == LOCKED_OTHER_DEVICE;
  assert_int_equal(proc_free_ports(P, sh->ports), 0);
  pid_t pid[MAXP];
  fflush(NULL);
  for (int r = 0; r < P; r++) {
    pid[r] = fork();
    if (pid[r] == 0)
      rank_main(P, r);
    assert_true(pid[r] > 0);
  }
  assert_true(nt_wait_ranks(pid, P, -1));
  uint64_t failures = 0;
  for (int r = 0; r < P; r++) {
    assert_int_equal(sh->errors[r], 0);
    failures += sh->failures[r];
    if (!faulty) {
      assert_int_equal(sh->failures[r], 0);
      /* 2 of 3 frames of the first exchange and all of the second took the lane, to and from
       * each peer (both ends count a transfer) */
      assert_int_equal(sh->transfers[r], (uint64_t)(2 * (P - 1) * (FRAMES * 2 / 3 + WARM_FRAMES)));
#ifdef WG_NCCL_FAKE
      fprintf(stderr,
              "  rank %d: %llu transfers, %ld copies page-locked, %ld pageable (second exchange: "
              "%ld, %ld)\n",
              r, (unsigned long long)sh->transfers[r], sh->locked_copies[r], sh->pageable_copies[r],
              sh->warm_locked[r], sh->warm_pageable[r]);
      /* one copy per transfer at each end: into the device to send, out of it received */
      assert_int_equal(sh->locked_copies[r] + sh->pageable_copies[r], (long)sh->transfers[r]);
      if (locked == LOCKED_ALL || locked == LOCKED_OTHER_DEVICE) {
        assert_int_equal(sh->warm_pageable[r], 0);
        assert_int_equal(sh->warm_locked[r], (long)(2 * (P - 1) * WARM_FRAMES));
      } else if (locked == LOCKED_NONE) {
        assert_int_equal(sh->locked_copies[r], 0);
      }
#endif
    }
  }
#ifdef WG_NCCL_FAKE
  for (int r = 0; r < P; r++) {
    /* no call that waits for the whole device (for the application's kernels) on the lane
     * thread, which reads the control channel, or on a sender's thread: the keeper makes them
     * (and has, where page-locked memory could be had); without memory pools the lane's
     * buffer comes from cudaMalloc, which waits */
    assert_int_equal(sh->sender_waits[r], 0);
    if (getenv("FAKE_CUDA_NO_MEMORY_POOLS"))
      assert_true(sh->lane_waits[r] > 0);
    else
      assert_int_equal(sh->lane_waits[r], 0);
    if (locked == LOCKED_ALL || locked == LOCKED_OTHER_DEVICE)
      assert_true(sh->device_waits[r] > 0);
  }
#endif
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
/* After each test, passed or failed: no fault is left for the next one. */
static int clear_faults(void **s) {
  (void)s;
  const char *vars[] = {"FAKE_NCCL_HANG_OP",         "FAKE_NCCL_REMOTE_ERROR_OP",
                        "FAKE_CUDA_NO_HOST_ALLOC",   "FAKE_NCCL_DEVICES",
                        "FAKE_CUDA_SYNC_MS",         "FAKE_CUDA_NO_MEMORY_POOLS",
                        "WG_NCCL_TEST_SEND_PAUSE_US"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
    unsetenv(vars[i]);
  return 0;
}

static void test_op_never_completes_mid_way(void **s) {
  (void)s;
  setenv("FAKE_NCCL_HANG_OP", "12", 1);
  run_with(3, 1, LOCKED_ALL);
}

/* The lane is revoked while senders are between their first look at it and the copy of
 * their payload (a pause there stands for a large copy): every such frame still arrives, on
 * TCP, and nothing that follows it from the same sender waits behind it. */
static void test_revoke_while_sending(void **s) {
  (void)s;
  setenv("FAKE_NCCL_HANG_OP", "12", 1);
  setenv("WG_NCCL_TEST_SEND_PAUSE_US", "40000", 1);
  run_with(3, 1, LOCKED_ALL);
}

static void test_remote_error_mid_way(void **s) {
  (void)s;
  setenv("FAKE_NCCL_REMOTE_ERROR_OP", "9", 1);
  run_with(3, 1, LOCKED_ALL);
}

/* cudaHostAlloc fails: payloads fall back to pageable buffers and nothing else changes. */
static void test_without_page_locked_memory(void **s) {
  (void)s;
  setenv("FAKE_CUDA_NO_HOST_ALLOC", "1", 1);
  run_with(3, 0, LOCKED_NONE);
}

/* The sender's thread is on another device than the transport: its buffers still come
 * page-locked from the cache, which the keeper fills on the transport's device. */
static void test_sender_on_another_device(void **s) {
  (void)s;
  setenv("FAKE_NCCL_DEVICES", "2", 1);
  run_with(3, 0, LOCKED_OTHER_DEVICE);
}

/* The application's compute stream always has 3.5 s of work queued, so every call that waits
 * for the whole device (cudaMalloc, cudaFree, cudaHostAlloc, cudaFreeHost) takes that long,
 * more than a transfer's and a clear-to-send's deadlines: the lane, which makes none of them,
 * carries every transfer and none fails (the keeper, which makes them all, fills the cache
 * late). */
static void test_slow_compute_stream(void **s) {
  (void)s;
  setenv("FAKE_CUDA_SYNC_MS", "3500", 1);
  run_with(3, 0, LOCKED_ANY);
}

/* A device without memory pools (cudaMallocAsync unsupported): the lane's buffer comes from
 * cudaMalloc and nothing else changes. */
static void test_without_memory_pools(void **s) {
  (void)s;
  setenv("FAKE_CUDA_NO_MEMORY_POOLS", "1", 1);
  run_with(2, 0, LOCKED_ALL);
}
#endif

int main(void) {
#ifdef WG_NCCL_FAKE
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_all_to_all_p2, clear_faults),
      cmocka_unit_test_teardown(test_all_to_all_p3, clear_faults),
      cmocka_unit_test_teardown(test_all_to_all_p4, clear_faults),
      cmocka_unit_test_teardown(test_op_never_completes_mid_way, clear_faults),
      cmocka_unit_test_teardown(test_revoke_while_sending, clear_faults),
      cmocka_unit_test_teardown(test_remote_error_mid_way, clear_faults),
      cmocka_unit_test_teardown(test_without_page_locked_memory, clear_faults),
      cmocka_unit_test_teardown(test_sender_on_another_device, clear_faults),
      cmocka_unit_test_teardown(test_slow_compute_stream, clear_faults),
      cmocka_unit_test_teardown(test_without_memory_pools, clear_faults),
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
