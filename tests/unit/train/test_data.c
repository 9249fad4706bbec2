/* Data: the IDX parser on the real Fashion-MNIST files (when installed) and on corrupt or
 * truncated files written here, synthetic data determinism, random streams and the sampler. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zlib.h>

#include "agent/train/train.h"
#include "test_train.h"

/* ------------------------------------------------------------------ IDX files */

/* Writes an IDX file: 4-byte magic (type, ndims), big-endian dims, payload, extra bytes. */
static void write_idx(const char *path, int gz, unsigned type, unsigned ndims, const uint32_t *dims,
                      const uint8_t *payload, size_t len, size_t extra) {
  unsigned char head[16] = {0, 0, (unsigned char)type, (unsigned char)ndims};
  for (unsigned i = 0; i < ndims && i < 3; i++)
    for (int b = 0; b < 4; b++)
      head[4 + 4 * i + b] = (unsigned char)(dims[i] >> (24 - 8 * b));
  size_t head_len = 4 + 4 * (ndims < 3 ? ndims : 3);
  uint8_t *trail = calloc(extra + 1, 1);
  if (gz) {
    gzFile f = gzopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(gzwrite(f, head, (unsigned)head_len), (int)head_len);
    if (len)
      assert_int_equal(gzwrite(f, payload, (unsigned)len), (int)len);
    if (extra)
      assert_int_equal(gzwrite(f, trail, (unsigned)extra), (int)extra);
    assert_int_equal(gzclose(f), Z_OK);
  } else {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(head, 1, head_len, f), head_len);
    if (len)
      assert_int_equal(fwrite(payload, 1, len, f), len);
    if (extra)
      assert_int_equal(fwrite(trail, 1, extra, f), extra);
    fclose(f);
  }
  free(trail);
}

typedef struct idx_case {
  char dir[256], img[300], lab[300];
  uint8_t pixels[5 * 3 * 4];
  uint8_t labels[5];
} idx_case_t;

static void idx_case_init(idx_case_t *c) {
  test_mkdtemp(c->dir, sizeof(c->dir));
  snprintf(c->img, sizeof(c->img), "%s/images.gz", c->dir);
  snprintf(c->lab, sizeof(c->lab), "%s/labels.gz", c->dir);
  for (size_t i = 0; i < sizeof(c->pixels); i++)
    c->pixels[i] = (uint8_t)(i * 37 % 256);
  const uint8_t labels[5] = {3, 0, 9, 1, 3};
  memcpy(c->labels, labels, sizeof(labels));
}

static const uint32_t img_dims[3] = {5, 3, 4}, lab_dims[1] = {5};

static void write_good(idx_case_t *c, int gz) {
  write_idx(c->img, gz, 8, 3, img_dims, c->pixels, sizeof(c->pixels), 0);
  write_idx(c->lab, gz, 8, 1, lab_dims, c->labels, sizeof(c->labels), 0);
}

/* Loads the case's files and expects rc and, on failure, a message containing `needle`. */
static void expect_load(idx_case_t *c, int rc, const char *needle) {
  wagma_dataset_t ds;
  char err[512] = "";
  int got = wagma_dataset_load_idx(&ds, c->img, c->lab, 10, err, sizeof(err));
  if (got != rc || (needle && !strstr(err, needle))) {
    print_error("load: rc %d (want %d), message '%s' (want '%s')\n", got, rc, err,
                needle ? needle : "");
    fail();
  }
  if (got)
    assert_null(ds.x_u8);
  wagma_dataset_free(&ds);
}

static void idx_valid_files_load(void **state) {
  (void)state;
  idx_case_t c;
  idx_case_init(&c);
  for (int gz = 1; gz >= 0; gz--) {
    write_good(&c, gz);
    wagma_dataset_t ds;
    char err[256] = "";
    assert_int_equal(wagma_dataset_load_idx(&ds, c.img, c.lab, 10, err, sizeof(err)), 0);
    assert_int_equal(ds.n, 5);
    assert_int_equal(ds.rows, 3);
    assert_int_equal(ds.cols, 4);
    assert_int_equal(ds.features, 12);
    float x[2 * 12];
    int32_t y[2];
    const uint32_t idx[2] = {4, 1};
    assert_int_equal(wagma_dataset_gather(&ds, idx, 2, x, y), 0);
    assert_int_equal(y[0], 3);
    assert_int_equal(y[1], 0);
    for (size_t j = 0; j < 12; j++) {
      assert_true(fabsf(x[j] - c.pixels[4 * 12 + j] / 255.0f) < 1e-6f);
      assert_true(fabsf(x[12 + j] - c.pixels[12 + j] / 255.0f) < 1e-6f);
    }
    const uint32_t out_of_range = 5;
    assert_int_equal(wagma_dataset_gather(&ds, &out_of_range, 1, x, y), WAGMA_ERANGE);
    assert_int_equal(wagma_dataset_standardize(&ds, 0.5f, 0.25f), 0);
    assert_int_equal(wagma_dataset_gather(&ds, idx, 1, x, y), 0);
    assert_true(fabsf(x[0] - (c.pixels[48] / 255.0f - 0.5f) / 0.25f) < 1e-5f);
    wagma_dataset_free(&ds);
    wagma_dataset_free(&ds); /* idempotent */
  }
  test_rmtree(c.dir);
}

static void idx_corrupt_files_are_rejected(void **state) {
  (void)state;
  idx_case_t c;
  idx_case_init(&c);

  write_good(&c, 1);
  write_idx(c.img, 1, 0x09, 3, img_dims, c.pixels, sizeof(c.pixels), 0); /* signed bytes */
  expect_load(&c, WAGMA_EPROTO, "bad IDX magic");
  write_idx(c.img, 1, 8, 2, img_dims, c.pixels, sizeof(c.pixels), 0); /* 2 dimensions */
  expect_load(&c, WAGMA_EPROTO, "bad IDX magic");
  write_idx(c.lab, 1, 8, 3, img_dims, c.pixels, sizeof(c.pixels), 0); /* images as labels */
  write_idx(c.img, 1, 8, 3, img_dims, c.pixels, sizeof(c.pixels), 0);
  expect_load(&c, WAGMA_EPROTO, "labels.gz: bad IDX magic");

  write_good(&c, 1);
  const uint32_t zero_rows[3] = {5, 0, 4};
  write_idx(c.img, 1, 8, 3, zero_rows, c.pixels, 0, 0);
  expect_load(&c, WAGMA_EPROTO, "dimension");
  const uint32_t huge[3] = {5, 100000, 4};
  write_idx(c.img, 1, 8, 3, huge, c.pixels, sizeof(c.pixels), 0);
  expect_load(&c, WAGMA_EPROTO, "dimension");

  write_idx(c.img, 1, 8, 3, img_dims, c.pixels, sizeof(c.pixels) - 5, 0);
  expect_load(&c, WAGMA_EPROTO, "truncated IDX payload");
  write_idx(c.img, 0, 8, 3, img_dims, c.pixels, 0, 0); /* header only, plain */
  expect_load(&c, WAGMA_EPROTO, "truncated IDX payload");
  write_idx(c.img, 1, 8, 3, img_dims, c.pixels, sizeof(c.pixels), 3);
  expect_load(&c, WAGMA_EPROTO, "trailing data");

  FILE *f = fopen(c.img, "wb"); /* shorter than a header */
  fwrite("\0\0\x08", 1, 3, f);
  fclose(f);
  expect_load(&c, WAGMA_EPROTO, "truncated IDX header");

  write_good(&c, 1);
  const uint32_t four[1] = {4};
  write_idx(c.lab, 1, 8, 1, four, c.labels, 4, 0);
  expect_load(&c, WAGMA_EPROTO, "5 images");

  c.labels[2] = 10; /* not below 10 classes */
  write_good(&c, 1);
  expect_load(&c, WAGMA_EPROTO, "label 10 of sample 2");
  c.labels[2] = 9;

  /* A gzip stream cut in half, and one with garbage in its deflate data. */
  enum { BIG = 4096 };
  uint8_t *big = malloc(BIG * 3 * 4);
  for (size_t i = 0; i < BIG * 12; i++)
    big[i] = (uint8_t)((i * 2654435761u) >> 13);
  const uint32_t big_dims[3] = {BIG, 3, 4};
  write_idx(c.img, 1, 8, 3, big_dims, big, BIG * 12, 0);
  struct stat st;
  assert_int_equal(stat(c.img, &st), 0);
  assert_int_equal(truncate(c.img, st.st_size / 2), 0);
  expect_load(&c, WAGMA_EPROTO, "truncated IDX payload");
  write_idx(c.img, 1, 8, 3, big_dims, big, BIG * 12, 0);
  f = fopen(c.img, "r+b");
  fseek(f, st.st_size / 2, SEEK_SET);
  fwrite("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 1, 16, f);
  fclose(f);
  expect_load(&c, WAGMA_EPROTO, NULL);
  free(big);

  unlink(c.img);
  expect_load(&c, WAGMA_ENOTFOUND, "images.gz");

  /* An empty folder has no Fashion-MNIST. */
  wagma_dataset_t train, test;
  char err[512] = "";
  assert_int_equal(wagma_dataset_load_fashion_mnist(c.dir, &train, &test, err, sizeof(err)),
                   WAGMA_ENOTFOUND);
  assert_non_null(strstr(err, "train-images-idx3-ubyte"));
  test_rmtree(c.dir);
}

static int fashion_present(void) {
  return access(WAGMA_FASHION_MNIST_DIR "/train-images-idx3-ubyte.gz", R_OK) == 0;
}

static void fashion_mnist_real_files(void **state) {
  (void)state;
  if (!fashion_present()) {
    print_message("fashion-mnist not installed under %s: skipped\n", WAGMA_FASHION_MNIST_DIR);
    skip();
  }
  wagma_dataset_t train, test;
  char err[512] = "";
  int rc = wagma_dataset_load_fashion_mnist(NULL, &train, &test, err, sizeof(err));
  if (rc)
    print_error("%s\n", err);
  assert_int_equal(rc, 0);
  assert_int_equal(train.n, 60000);
  assert_int_equal(test.n, 10000);
  assert_int_equal(train.features, 784);
  assert_int_equal(test.rows, 28);
  /* Fashion-MNIST is balanced: 6000 training and 1000 test images per class. */
  size_t counts[10] = {0}, test_counts[10] = {0};
  for (size_t i = 0; i < train.n; i++)
    counts[train.labels[i]]++;
  for (size_t i = 0; i < test.n; i++)
    test_counts[test.labels[i]]++;
  for (int k = 0; k < 10; k++) {
    assert_int_equal(counts[k], 6000);
    assert_int_equal(test_counts[k], 1000);
  }
  /* Standardized with the training statistics: mean ~0, sd ~1 over many samples. */
  enum { S = 2000 };
  float *x = malloc((size_t)S * 784 * sizeof(float));
  int32_t y[S];
  uint32_t idx[S];
  for (uint32_t i = 0; i < S; i++)
    idx[i] = i * 29;
  assert_int_equal(wagma_dataset_gather(&train, idx, S, x, y), 0);
  double sum = 0, sq = 0;
  for (size_t i = 0; i < (size_t)S * 784; i++) {
    sum += x[i];
    sq += (double)x[i] * x[i];
  }
  double mean = sum / (S * 784.0), sd = sqrt(sq / (S * 784.0) - mean * mean);
  assert_true(fabs(mean) < 0.05);
  assert_true(fabs(sd - 1.0) < 0.05);
  free(x);
  wagma_dataset_free(&train);
  wagma_dataset_free(&test);
}

/* ------------------------------------------------------------------ synthetic data */

static void synthetic_is_deterministic(void **state) {
  (void)state;
  wagma_dataset_t a, b, c, t;
  char err[256];
  wagma_synthetic_config_t cfg = wagma_synthetic_defaults(300, 42, 0);
  assert_int_equal(wagma_dataset_synthetic(&a, &cfg, err, sizeof(err)), 0);
  assert_int_equal(wagma_dataset_synthetic(&b, &cfg, err, sizeof(err)), 0);
  assert_int_equal(a.n, 300);
  assert_int_equal(a.features, 784);
  assert_int_equal(a.classes, 10);
  assert_memory_equal(a.x_f32, b.x_f32, 300 * 784 * sizeof(float));
  assert_memory_equal(a.labels, b.labels, 300);
  size_t counts[10] = {0};
  for (size_t i = 0; i < a.n; i++) {
    assert_true(a.labels[i] < 10);
    counts[a.labels[i]]++;
  }
  for (int k = 0; k < 10; k++)
    assert_true(counts[k] > 0);
  cfg.seed = 43;
  assert_int_equal(wagma_dataset_synthetic(&c, &cfg, err, sizeof(err)), 0);
  assert_memory_not_equal(a.x_f32, c.x_f32, 784 * sizeof(float));
  cfg = wagma_synthetic_defaults(300, 42, 1);
  assert_int_equal(wagma_dataset_synthetic(&t, &cfg, err, sizeof(err)), 0);
  assert_memory_not_equal(a.x_f32, t.x_f32, 784 * sizeof(float));
  /* Same task across splits: the class means of the two splits are close (noise averages
   * out over ~30 samples: sd 1/sqrt(30) per coordinate, centres ~4/28 apart per coordinate). */
  double dist_same = 0, dist_other = 0;
  for (size_t j = 0; j < 784; j++) {
    double m[2][2] = {{0}}; /* [split][class 0 or 1] */
    size_t n[2][2] = {{0}};
    const wagma_dataset_t *sets[2] = {&a, &t};
    for (int s = 0; s < 2; s++)
      for (size_t i = 0; i < 300; i++)
        if (sets[s]->labels[i] < 2) {
          m[s][sets[s]->labels[i]] += sets[s]->x_f32[i * 784 + j];
          n[s][sets[s]->labels[i]]++;
        }
    double a0 = m[0][0] / n[0][0], t0 = m[1][0] / n[1][0], t1 = m[1][1] / n[1][1];
    dist_same += (a0 - t0) * (a0 - t0);
    dist_other += (a0 - t1) * (a0 - t1);
  }
  assert_true(dist_same < dist_other);
  wagma_dataset_free(&a);
  wagma_dataset_free(&b);
  wagma_dataset_free(&c);
  wagma_dataset_free(&t);
  cfg.rows = 27; /* 27 x 28 != 784 */
  assert_int_equal(wagma_dataset_synthetic(&a, &cfg, err, sizeof(err)), WAGMA_EINVAL);
  assert_null(a.x_f32);
}

/* ------------------------------------------------------------------ random streams, sampler */

static void rng_streams(void **state) {
  (void)state;
  wagma_rng_t a, b;
  wagma_rng_seed(&a, 1);
  wagma_rng_seed(&b, 1);
  for (int i = 0; i < 100; i++)
    assert_true(wagma_rng_next(&a) == wagma_rng_next(&b));
  wagma_rng_seed(&b, 2);
  assert_true(wagma_rng_next(&a) != wagma_rng_next(&b));
  double sum = 0, sq = 0;
  size_t hist[7] = {0};
  enum { N = 20000 };
  for (int i = 0; i < N; i++) {
    double u = wagma_rng_uniform(&a);
    assert_true(u >= 0.0 && u < 1.0);
    uint64_t k = wagma_rng_below(&a, 7);
    assert_true(k < 7);
    hist[k]++;
    double z = wagma_rng_normal(&a);
    sum += z;
    sq += z * z;
  }
  for (int k = 0; k < 7; k++) /* expected N/7 = 2857, sd ~50 */
    assert_true(hist[k] > 2500 && hist[k] < 3200);
  assert_true(fabs(sum / N) < 0.05);
  assert_true(fabs(sq / N - 1.0) < 0.05);
  assert_true(wagma_seed_derive(7, "worker-a") != wagma_seed_derive(7, "worker-b"));
  assert_true(wagma_seed_derive(7, "worker-a") != wagma_seed_derive(8, "worker-a"));
  assert_true(wagma_seed_derive(7, "worker-a") == wagma_seed_derive(7, "worker-a"));
}

static void sampler_shuffle_epochs(void **state) {
  (void)state;
  enum { N = 1000 };
  wagma_sampler_t s, again;
  assert_int_equal(wagma_sampler_init(&s, N, WAGMA_SAMPLE_SHUFFLE, 5), 0);
  uint32_t *first = malloc(3 * N * sizeof(uint32_t));
  /* Odd chunk sizes across the epoch boundaries. */
  for (size_t done = 0; done < 3 * N;) {
    size_t k = 3 * N - done < 37 ? 3 * N - done : 37;
    assert_int_equal(wagma_sampler_next(&s, first + done, k), 0);
    done += k;
  }
  for (int e = 0; e < 3; e++) { /* each epoch is a permutation */
    unsigned char seen[N] = {0};
    for (size_t i = 0; i < N; i++) {
      assert_true(first[e * N + i] < N);
      assert_false(seen[first[e * N + i]]);
      seen[first[e * N + i]] = 1;
    }
  }
  assert_memory_not_equal(first, first + N, N * sizeof(uint32_t)); /* a new order per epoch */
  /* seek(k) resumes the exact stream. */
  assert_int_equal(wagma_sampler_init(&again, N, WAGMA_SAMPLE_SHUFFLE, 5), 0);
  uint32_t tail[700];
  wagma_sampler_seek(&again, 1900);
  assert_int_equal(wagma_sampler_next(&again, tail, 700), 0);
  assert_memory_equal(tail, first + 1900, sizeof(tail));
  wagma_sampler_seek(&again, 10);
  assert_int_equal(wagma_sampler_next(&again, tail, 5), 0);
  assert_memory_equal(tail, first + 10, 5 * sizeof(uint32_t));
  wagma_sampler_free(&again);
  /* Another worker's stream differs. */
  assert_int_equal(wagma_sampler_init(&again, N, WAGMA_SAMPLE_SHUFFLE, 6), 0);
  assert_int_equal(wagma_sampler_next(&again, tail, 100), 0);
  assert_memory_not_equal(tail, first, 100 * sizeof(uint32_t));
  wagma_sampler_free(&again);
  wagma_sampler_free(&s);
  free(first);
  assert_int_equal(wagma_sampler_init(&s, 0, WAGMA_SAMPLE_SHUFFLE, 5), WAGMA_EINVAL);
  assert_int_equal(wagma_sampler_init(&s, 10, 7, 5), WAGMA_EINVAL);
}

static void sampler_with_replacement(void **state) {
  (void)state;
  enum { N = 50, K = 5000 };
  wagma_sampler_t s;
  assert_int_equal(wagma_sampler_init(&s, N, WAGMA_SAMPLE_REPLACEMENT, 9), 0);
  uint32_t idx[K], again[100];
  assert_int_equal(wagma_sampler_next(&s, idx, K), 0);
  size_t hist[N] = {0};
  for (size_t i = 0; i < K; i++) {
    assert_true(idx[i] < N);
    hist[idx[i]]++;
  }
  for (size_t i = 0; i < N; i++) /* expected 100 each */
    assert_true(hist[i] > 50 && hist[i] < 160);
  wagma_sampler_seek(&s, 1234);
  assert_int_equal(wagma_sampler_next(&s, again, 100), 0);
  assert_memory_equal(again, idx + 1234, sizeof(again));
  wagma_sampler_free(&s);
}

static void batch_draw_gathers_the_drawn_samples(void **state) {
  (void)state;
  wagma_dataset_t ds;
  char err[256];
  wagma_synthetic_config_t cfg = wagma_synthetic_defaults(100, 3, 0);
  assert_int_equal(wagma_dataset_synthetic(&ds, &cfg, err, sizeof(err)), 0);
  wagma_sampler_t s;
  wagma_batch_t b;
  assert_int_equal(wagma_sampler_init(&s, ds.n, WAGMA_SAMPLE_SHUFFLE, 1), 0);
  assert_int_equal(wagma_batch_alloc(&b, 16, ds.features), 0);
  assert_int_equal(wagma_batch_draw(&b, &s, &ds, 16), 0);
  assert_int_equal(b.n, 16);
  for (size_t i = 0; i < 16; i++) {
    assert_int_equal(b.y[i], ds.labels[b.idx[i]]);
    assert_memory_equal(b.x + i * 784, ds.x_f32 + (size_t)b.idx[i] * 784, 784 * sizeof(float));
  }
  assert_int_equal(wagma_batch_draw(&b, &s, &ds, 17), WAGMA_EINVAL);
  wagma_batch_free(&b);
  wagma_sampler_free(&s);
  wagma_dataset_free(&ds);
}

int train_data_tests(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(idx_valid_files_load),
      cmocka_unit_test(idx_corrupt_files_are_rejected),
      cmocka_unit_test(fashion_mnist_real_files),
      cmocka_unit_test(synthetic_is_deterministic),
      cmocka_unit_test(rng_streams),
      cmocka_unit_test(sampler_shuffle_epochs),
      cmocka_unit_test(sampler_with_replacement),
      cmocka_unit_test(batch_draw_gathers_the_drawn_samples),
  };
  return cmocka_run_group_tests_name("train/data", tests, NULL, NULL);
}
