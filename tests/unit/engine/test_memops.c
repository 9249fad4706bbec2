/* test_memops.c — the engine's memory operations (collective/memops.h).
 *  - host: every operation against a scalar reference written here, bit for bit (memcmp), on
 *    lengths 0..4099 and unaligned starts, with values of very different magnitudes (so a
 *    different order of evaluation, e.g. dst + a - b instead of dst + (a - b), changes bits);
 *    add_clear and add_clear_copy zero their source, add_clear_copy's copy is the new dst, copy
 *    handles dst == src;
 *  - cuda (label gpu, test_memops_gpu: exits 77 without a device): the same operations on device
 *    buffers give the host's bits (memcmp), so the engine's arithmetic is the same on both. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "memops.h"

#ifdef WAGMA_TEST_MEMOPS_GPU
#include <cuda_runtime.h>
#endif

static const size_t lengths[] = {0, 1, 3, 7, 64, 1023, 4099};

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float draw(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  /* magnitudes from 1e-6 to 1e6, both signs, some exact zeros and -0 */
  uint32_t k = (uint32_t)(rng_state >> 40);
  if (k % 53 == 0)
    return (k & 1) ? -0.0f : 0.0f;
  float mant = (float)(k % 100000) / 7919.0f - 6.0f;
  int e = (int)((rng_state >> 20) % 13) - 6;
  float scale = 1.0f;
  for (int i = 0; i < (e < 0 ? -e : e); i++)
    scale *= 10.0f;
  return e < 0 ? mant / scale : mant * scale;
}

static void fill(float *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    p[i] = draw();
}

/* The references: one statement per element, volatile so the compiler contracts nothing. */
static void ref_add(float *d, const float *s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    volatile float x = d[i] + s[i];
    d[i] = x;
  }
}
static void ref_add_diff(float *d, const float *a, const float *b, size_t n) {
  for (size_t i = 0; i < n; i++) {
    volatile float t = a[i] - b[i];
    volatile float x = d[i] + t;
    d[i] = x;
  }
}
static void ref_scale(float *d, float s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    volatile float x = d[i] * s;
    d[i] = x;
  }
}

typedef struct bufs {
  float *d1, *d2, *a, *b; /* inputs (host) */
  float *r1, *r2;         /* the reference's outputs */
} bufs_t;

/* Runs operation `op` of m on copies of the inputs (device copies for a device m) and checks
 * the outputs against the reference's. */
typedef enum {
  OP_COPY,
  OP_ADD,
  OP_ADD_CLEAR,
  OP_ADD_CLEAR_COPY,
  OP_ADD_DIFF,
  OP_ADD_DIFF2,
  OP_SCALE,
  OP_N
} op_t;

static void *dev_alloc(const wg_memops_t *m, size_t n) {
#ifdef WAGMA_TEST_MEMOPS_GPU
  if (strcmp(m->name, "cuda") == 0) {
    void *p = NULL;
    assert_int_equal(cudaMalloc(&p, (n ? n : 1) * sizeof(float)), cudaSuccess);
    return p;
  }
#endif
  (void)m;
  return malloc((n ? n : 1) * sizeof(float) + sizeof(float)); /* (+1: an unaligned start) */
}
static void dev_free(const wg_memops_t *m, void *p) {
#ifdef WAGMA_TEST_MEMOPS_GPU
  if (strcmp(m->name, "cuda") == 0) {
    cudaFree(p);
    return;
  }
#endif
  (void)m;
  free(p);
}
static void put(const wg_memops_t *m, float *dst, const float *src, size_t n) {
#ifdef WAGMA_TEST_MEMOPS_GPU
  if (strcmp(m->name, "cuda") == 0) {
    assert_int_equal(cudaMemcpy(dst, src, n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    return;
  }
#endif
  (void)m;
  memcpy(dst, src, n * sizeof(float));
}
static void get(const wg_memops_t *m, float *dst, const float *src, size_t n) {
#ifdef WAGMA_TEST_MEMOPS_GPU
  if (strcmp(m->name, "cuda") == 0) {
    assert_int_equal(cudaMemcpy(dst, src, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return;
  }
#endif
  (void)m;
  memcpy(dst, src, n * sizeof(float));
}

static void check_op(const wg_memops_t *m, op_t op, size_t n, int offset) {
  size_t bytes = (n ? n : 1) * sizeof(float);
  float *d1 = malloc(bytes), *d2 = malloc(bytes), *a = malloc(bytes), *b = malloc(bytes);
  float *r1 = malloc(bytes), *r2 = malloc(bytes), *o1 = malloc(bytes), *o2 = malloc(bytes);
  fill(d1, n), fill(d2, n), fill(a, n), fill(b, n);
  memcpy(r1, d1, n * sizeof(float));
  memcpy(r2, d2, n * sizeof(float));
  float s = draw();
  switch (op) {
  case OP_COPY: memcpy(r1, a, n * sizeof(float)); break;
  case OP_ADD: ref_add(r1, a, n); break;
  case OP_ADD_CLEAR:
  case OP_ADD_CLEAR_COPY:
    ref_add(r1, a, n);
    memset(r2, 0, n * sizeof(float)); /* r2: the source after the call */
    break;
  case OP_ADD_DIFF: ref_add_diff(r1, a, b, n); break;
  case OP_ADD_DIFF2:
    ref_add_diff(r1, a, b, n);
    ref_add_diff(r2, a, b, n);
    break;
  case OP_SCALE: ref_scale(r1, s, n); break;
  default: break;
  }
  float *D1 = (float *)dev_alloc(m, n) + offset, *D2 = (float *)dev_alloc(m, n) + offset;
  float *A = (float *)dev_alloc(m, n) + offset, *B = (float *)dev_alloc(m, n) + offset;
  put(m, D1, d1, n), put(m, D2, d2, n), put(m, A, a, n), put(m, B, b, n);
  switch (op) {
  case OP_COPY: m->copy(m->self, D1, A, n); break;
  case OP_ADD: m->add(m->self, D1, A, n); break;
  case OP_ADD_CLEAR:
    put(m, D2, a, n); /* the source is d2's buffer holding a */
    m->add_clear(m->self, D1, D2, n);
    break;
  case OP_ADD_CLEAR_COPY:
    put(m, D2, a, n);
    m->add_clear_copy(m->self, D1, B, D2, n); /* B: the copy */
    break;
  case OP_ADD_DIFF: m->add_diff(m->self, D1, A, B, n); break;
  case OP_ADD_DIFF2: m->add_diff2(m->self, D1, D2, A, B, n); break;
  case OP_SCALE: m->scale(m->self, D1, s, n); break;
  default: break;
  }
  assert_int_equal(m->sync(m->self), 0);
  get(m, o1, D1, n), get(m, o2, D2, n);
  if (memcmp(o1, r1, n * sizeof(float)) != 0)
    fail_msg("%s: op %d, n %zu, offset %d: result differs from the reference", m->name, op, n,
             offset);
  if ((op == OP_ADD_CLEAR || op == OP_ADD_CLEAR_COPY || op == OP_ADD_DIFF2) &&
      memcmp(o2, r2, n * sizeof(float)) != 0)
    fail_msg("%s: op %d, n %zu: second output differs from the reference", m->name, op, n);
  if (op == OP_ADD_CLEAR_COPY) { /* the copy holds the new dst */
    get(m, o2, B, n);
    if (memcmp(o2, r1, n * sizeof(float)) != 0)
      fail_msg("%s: add_clear_copy, n %zu: the copy differs from the sum", m->name, n);
  }
  dev_free(m, D1 - offset), dev_free(m, D2 - offset), dev_free(m, A - offset),
      dev_free(m, B - offset);
  free(d1), free(d2), free(a), free(b), free(r1), free(r2), free(o1), free(o2);
}

static void check_all(const wg_memops_t *m, int offsets) {
  for (int op = 0; op < OP_N; op++)
    for (size_t k = 0; k < sizeof lengths / sizeof *lengths; k++)
      for (int off = 0; off <= offsets; off++)
        check_op(m, (op_t)op, lengths[k], off);
}

#ifndef WAGMA_TEST_MEMOPS_GPU
static void test_host_matches_the_reference(void **state) {
  (void)state;
  check_all(&wg_memops_host, 1);
}

static void test_host_copy_in_place(void **state) {
  (void)state;
  float x[5] = {1, 2, 3, 4, 5};
  wg_memops_host.copy(NULL, x, x, 5);
  assert_true(x[0] == 1 && x[4] == 5);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_host_matches_the_reference),
      cmocka_unit_test(test_host_copy_in_place),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
static void test_cuda_matches_the_host(void **state) {
  (void)state;
  wg_memops_t *m = NULL;
  assert_int_equal(wg_memops_cuda_new(NULL, &m), 0);
  check_all(m, 0); /* device allocations are aligned; the host's check covers offsets */
  wg_memops_cuda_free(m);
}

int main(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0)
    return 77; /* no GPU: skipped */
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_cuda_matches_the_host)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
