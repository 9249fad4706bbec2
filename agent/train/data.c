/* data.c — what every dataset shares: freeing, gathering samples into float batches,
 * standardization, and the per-worker minibatch sampler.
 *
 * Owns: the sampler's epoch permutation and the batch buffers. No threads. Invariant: the
 * sampler's k-th index is a pure function of (mode, seed, n, k), so seek() is exact and two
 * workers with different seeds walk independent streams over the WHOLE set (no shards). */
#include <stdlib.h>
#include <string.h>

#include "agent/train/train.h"

void wagma_dataset_free(wagma_dataset_t *ds) {
  if (!ds)
    return;
  free(ds->x_u8);
  free(ds->x_f32);
  free(ds->labels);
  memset(ds, 0, sizeof(*ds));
}

int wagma_dataset_standardize(wagma_dataset_t *ds, float mean, float std) {
  if (!ds || !ds->x_u8 || !(std > 0.0f))
    return WAGMA_EINVAL;
  ds->scale = 1.0f / (255.0f * std);
  ds->offset = -mean / std;
  return WAGMA_OK;
}

int wagma_dataset_gather(const wagma_dataset_t *ds, const uint32_t *idx, size_t count, float *x,
                         int32_t *y) {
  const size_t f = ds->features;
  for (size_t i = 0; i < count; i++)
    if (idx[i] >= ds->n)
      return WAGMA_ERANGE;
  for (size_t i = 0; i < count; i++) {
    size_t s = idx[i];
    if (ds->x_f32) {
      memcpy(x + i * f, ds->x_f32 + s * f, f * sizeof(float));
    } else {
      const uint8_t *src = ds->x_u8 + s * f;
      float *dst = x + i * f;
      for (size_t j = 0; j < f; j++)
        dst[j] = (float)src[j] * ds->scale + ds->offset;
    }
    y[i] = ds->labels[s];
  }
  return WAGMA_OK;
}

/* ------------------------------------------------------------------ sampler */

int wagma_sampler_init(wagma_sampler_t *s, size_t n, int mode, uint64_t seed) {
  memset(s, 0, sizeof(*s));
  if (n == 0 || n > UINT32_MAX ||
      (mode != WAGMA_SAMPLE_SHUFFLE && mode != WAGMA_SAMPLE_REPLACEMENT))
    return WAGMA_EINVAL;
  s->mode = mode;
  s->seed = seed;
  s->n = n;
  s->perm_epoch = UINT64_MAX;
  return WAGMA_OK;
}

void wagma_sampler_free(wagma_sampler_t *s) {
  if (!s)
    return;
  free(s->perm);
  memset(s, 0, sizeof(*s));
}

void wagma_sampler_seek(wagma_sampler_t *s, uint64_t drawn) {
  s->drawn = drawn;
}

/* Fisher-Yates over 0..n-1 from a stream that depends on (seed, epoch) only. */
static int make_permutation(wagma_sampler_t *s, uint64_t epoch) {
  if (!s->perm && !(s->perm = malloc(s->n * sizeof(uint32_t))))
    return WAGMA_ENOMEM;
  wagma_rng_t rng;
  wagma_rng_seed(&rng, wagma_mix64(s->seed ^ wagma_mix64(epoch + 1)));
  for (size_t i = 0; i < s->n; i++)
    s->perm[i] = (uint32_t)i;
  for (size_t i = s->n - 1; i > 0; i--) {
    size_t j = (size_t)wagma_rng_below(&rng, i + 1);
    uint32_t t = s->perm[i];
    s->perm[i] = s->perm[j];
    s->perm[j] = t;
  }
  s->perm_epoch = epoch;
  return WAGMA_OK;
}

int wagma_sampler_next(wagma_sampler_t *s, uint32_t *idx, size_t count) {
  for (size_t i = 0; i < count; i++, s->drawn++) {
    if (s->mode == WAGMA_SAMPLE_REPLACEMENT) {
      uint64_t h = wagma_mix64(s->seed ^ wagma_mix64(s->drawn));
      idx[i] = (uint32_t)(((unsigned __int128)h * s->n) >> 64);
      continue;
    }
    uint64_t epoch = s->drawn / s->n;
    if (epoch != s->perm_epoch) {
      int rc = make_permutation(s, epoch);
      if (rc)
        return rc;
    }
    idx[i] = s->perm[s->drawn % s->n];
  }
  return WAGMA_OK;
}

/* ------------------------------------------------------------------ batches */

/* Ownership: the batch owns its buffers until wagma_batch_free. */
int wagma_batch_alloc(wagma_batch_t *b, size_t cap, size_t features) {
  memset(b, 0, sizeof(*b));
  if (cap == 0 || features == 0)
    return WAGMA_EINVAL;
  b->x = malloc(cap * features * sizeof(float));
  b->y = malloc(cap * sizeof(int32_t));
  b->idx = malloc(cap * sizeof(uint32_t));
  if (!b->x || !b->y || !b->idx) {
    wagma_batch_free(b);
    return WAGMA_ENOMEM;
  }
  b->cap = cap;
  b->features = features;
  return WAGMA_OK;
}

void wagma_batch_free(wagma_batch_t *b) {
  if (!b)
    return;
  free(b->x);
  free(b->y);
  free(b->idx);
  memset(b, 0, sizeof(*b));
}

int wagma_batch_draw(wagma_batch_t *b, wagma_sampler_t *s, const wagma_dataset_t *ds,
                     size_t count) {
  if (count == 0 || count > b->cap || ds->features != b->features || s->n != ds->n)
    return WAGMA_EINVAL;
  int rc = wagma_sampler_next(s, b->idx, count);
  if (rc)
    return rc;
  b->n = count;
  return wagma_dataset_gather(ds, b->idx, count, b->x, b->y);
}
