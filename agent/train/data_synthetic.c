/* data_synthetic.c — seeded synthetic classification data for tests and demos: gaussian
 * clusters, one per class, shaped like Fashion-MNIST (784 = 28x28 features, 10 classes) so the
 * same models apply. Class centres are images constant on 4x4 pixel blocks, so convolutions and
 * pooling see the class signal as they would in real images.
 *
 * Owns nothing past a call. No threads. Invariant: the class centres are a pure function of
 * the seed and the samples of (seed, split), so the training and test splits of one seed are
 * the same task and every run regenerates the same bits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "agent/train/internal.h"
#include "agent/train/train.h"

#define BLOCK 4 /* side of the constant blocks of the class centres */

wagma_synthetic_config_t wagma_synthetic_defaults(size_t n, uint64_t seed, uint32_t split) {
  wagma_synthetic_config_t c;
  memset(&c, 0, sizeof(c));
  c.n = n;
  c.rows = 28;
  c.cols = 28;
  c.features = 784;
  c.classes = 10;
  c.separation = 6.0f;
  c.noise = 1.0f;
  c.seed = seed;
  c.split = split;
  return c;
}

/* Ownership: on success *ds owns its float samples and labels; on error it is zeroed. */
int wagma_dataset_synthetic(wagma_dataset_t *ds, const wagma_synthetic_config_t *cfg, char *err,
                            size_t err_len) {
  int rc = WAGMA_EINVAL;
  float *centres = NULL;
  if (!ds || !cfg)
    return WAGMA_EINVAL;
  memset(ds, 0, sizeof(*ds));
  if (cfg->n == 0 || cfg->n > UINT32_MAX || cfg->features == 0 ||
      cfg->features > ((size_t)1 << 22) || cfg->rows * cfg->cols != cfg->features ||
      cfg->cols > 4096 || cfg->classes < 2 || cfg->classes > 256 || !(cfg->separation >= 0.0f) ||
      !(cfg->noise >= 0.0f) || cfg->n > (((size_t)1 << 34) / cfg->features)) {
    wg_errf(err, err_len,
            "bad synthetic config: n %zu (1..2^32, n*features <= 2^34), features %zu = "
            "rows %zu x cols %zu, classes %zu (2..256), separation and noise >= 0",
            cfg->n, cfg->features, cfg->rows, cfg->cols, cfg->classes);
    goto out;
  }
  rc = WAGMA_ENOMEM;
  const size_t f = cfg->features;
  centres = malloc(cfg->classes * f * sizeof(float));
  ds->x_f32 = malloc(cfg->n * f * sizeof(float));
  ds->labels = malloc(cfg->n);
  if (!centres || !ds->x_f32 || !ds->labels) {
    wg_errf(err, err_len, "out of memory for %zu synthetic samples", cfg->n);
    goto out;
  }
  wagma_rng_t rng;
  wagma_rng_seed(&rng, wagma_seed_derive(cfg->seed, "synthetic-centres"));
  /* Centres are constant on BLOCK x BLOCK pixel blocks: images with structure that pooling
   * and small convolutions keep (i.i.d. pixel centres would be pure high-frequency noise). */
  const double centre_sd = cfg->separation / sqrt((double)f);
  const size_t brows = (cfg->rows + BLOCK - 1) / BLOCK, bcols = (cfg->cols + BLOCK - 1) / BLOCK;
  for (size_t k = 0; k < cfg->classes; k++) {
    float cell[((4096 + BLOCK - 1) / BLOCK)];
    for (size_t br = 0; br < brows; br++) {
      for (size_t bc = 0; bc < bcols; bc++)
        cell[bc] = (float)(centre_sd * wagma_rng_normal(&rng));
      for (size_t r = br * BLOCK; r < cfg->rows && r < (br + 1) * BLOCK; r++)
        for (size_t c = 0; c < cfg->cols; c++)
          centres[k * f + r * cfg->cols + c] = cell[c / BLOCK];
    }
  }
  wagma_rng_seed(&rng, wagma_mix64(wagma_seed_derive(cfg->seed, "synthetic-samples") ^
                                   wagma_mix64(cfg->split)));
  for (size_t s = 0; s < cfg->n; s++) {
    size_t label = (size_t)wagma_rng_below(&rng, cfg->classes);
    const float *c = centres + label * f;
    float *x = ds->x_f32 + s * f;
    for (size_t j = 0; j < f; j++)
      x[j] = c[j] + (float)(cfg->noise * wagma_rng_normal(&rng));
    ds->labels[s] = (uint8_t)label;
  }
  ds->n = cfg->n;
  ds->features = f;
  ds->rows = cfg->rows;
  ds->cols = cfg->cols;
  ds->classes = cfg->classes;
  ds->scale = 1.0f;
  rc = WAGMA_OK;
out:
  free(centres);
  if (rc)
    wagma_dataset_free(ds);
  return rc;
}
