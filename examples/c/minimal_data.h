/* examples/c/minimal_data.h — minimal.c's data set and model: logistic regression on DIM
 * features, SAMPLES samples drawn from a fixed seed (the same on every member: x uniform in
 * [-1, 1], y = [w_true . x > 0]); the last quarter is the test set. Static functions: include
 * it in one file. */
#ifndef WAGMA_EXAMPLE_MINIMAL_DATA_H
#define WAGMA_EXAMPLE_MINIMAL_DATA_H

#include <math.h>
#include <stdint.h>

#define DIM 16
#define SAMPLES 4096

static uint64_t rng(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static double uniform(uint64_t *s) {
  return (double)(rng(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

/* The data is the same on every member (a fixed seed): x uniform, y = [w_true . x > 0]. */
static float X[SAMPLES][DIM];
static int Y[SAMPLES];

static void make_data(void) {
  uint64_t s = 42;
  double truth[DIM];
  for (int d = 0; d < DIM; d++)
    truth[d] = uniform(&s);
  for (int i = 0; i < SAMPLES; i++) {
    double dot = 0;
    for (int d = 0; d < DIM; d++)
      dot += truth[d] * (X[i][d] = (float)uniform(&s));
    Y[i] = dot > 0;
  }
}

/* Loss and accuracy of w (DIM weights + bias) on samples [from, to). */
static void evaluate(const float *w, int from, int to, double *loss, double *acc) {
  double l = 0;
  int right = 0;
  for (int i = from; i < to; i++) {
    double z = w[DIM];
    for (int d = 0; d < DIM; d++)
      z += w[d] * X[i][d];
    double p = 1.0 / (1.0 + exp(-z));
    l -= Y[i] ? log(p + 1e-12) : log(1 - p + 1e-12);
    right += (p > 0.5) == Y[i];
  }
  *loss = l / (to - from);
  *acc = (double)right / (to - from);
}

#endif
