/* data_idx.c — IDX files (the MNIST / Fashion-MNIST format) read through zlib, which takes
 * gzip-compressed and plain files alike.
 *
 * Owns nothing past a call: a loaded dataset belongs to the caller. No threads. Invariant:
 * nothing is allocated from a size before the header is validated, every dimension is bounded,
 * and the payload must be exactly as long as the header says (truncated or trailing data is a
 * clear error, never a partial dataset). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <zlib.h>

#include "agent/train/internal.h"
#include "agent/train/train.h"

#define IDX_TYPE_UBYTE 0x08
#define IDX_MAX_COUNT 100000000u /* samples */
#define IDX_MAX_SIDE 65536u
#define IDX_MAX_BYTES ((size_t)1 << 32)

typedef struct idx_file {
  uint32_t dims[3];
  uint8_t *data; /* dims product bytes */
  size_t len;
} idx_file_t;

static uint32_t be32(const unsigned char *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Reads exactly len bytes; returns bytes read, or -1 on a zlib/gzip error. */
static long long read_full(gzFile f, void *buf, size_t len) {
  size_t done = 0;
  while (done < len) {
    size_t chunk = len - done > (1u << 30) ? (1u << 30) : len - done;
    int got = gzread(f, (char *)buf + done, (unsigned)chunk);
    if (got < 0)
      return -1;
    if (got == 0)
      break;
    done += (size_t)got;
  }
  return (long long)done;
}

/* Reads an IDX file of unsigned bytes with `ndims` dimensions.
 * Ownership: on success out->data is malloc'ed for the caller; on error nothing is held. */
static int idx_read(const char *path, unsigned ndims, idx_file_t *out, char *err, size_t err_len) {
  int rc = WAGMA_EPROTO;
  gzFile f = NULL;
  unsigned char head[16];
  memset(out, 0, sizeof(*out));
  struct stat st;
  if (stat(path, &st) != 0) {
    wg_errf(err, err_len, "%s: %s", path, strerror(errno));
    return errno == ENOENT ? WAGMA_ENOTFOUND : WAGMA_EIO;
  }
  f = gzopen(path, "rb");
  if (!f) {
    wg_errf(err, err_len, "%s: cannot open: %s", path, strerror(errno));
    rc = WAGMA_EIO;
    goto out;
  }
  size_t head_len = 4 + 4 * (size_t)ndims;
  long long got = read_full(f, head, head_len);
  if (got != (long long)head_len) {
    wg_errf(err, err_len, "%s: %s IDX header (%lld of %zu bytes)", path,
            got < 0 ? "unreadable (corrupt gzip?)" : "truncated", got < 0 ? 0 : got, head_len);
    goto out;
  }
  if (head[0] != 0 || head[1] != 0 || head[2] != IDX_TYPE_UBYTE || head[3] != ndims) {
    wg_errf(err, err_len,
            "%s: bad IDX magic 0x%02x%02x%02x%02x (want 0x000008%02x: unsigned bytes, "
            "%u dimension%s)",
            path, head[0], head[1], head[2], head[3], ndims, ndims, ndims > 1 ? "s" : "");
    goto out;
  }
  size_t total = 1;
  for (unsigned i = 0; i < ndims; i++) {
    out->dims[i] = be32(head + 4 + 4 * i);
    uint32_t limit = i == 0 ? IDX_MAX_COUNT : IDX_MAX_SIDE;
    if (out->dims[i] == 0 || out->dims[i] > limit) {
      wg_errf(err, err_len, "%s: bad IDX dimension %u = %u (must be 1..%u)", path, i, out->dims[i],
              limit);
      goto out;
    }
    total *= out->dims[i];
    if (total > IDX_MAX_BYTES) {
      wg_errf(err, err_len, "%s: IDX payload larger than %zu bytes", path, IDX_MAX_BYTES);
      goto out;
    }
  }
  out->data = malloc(total);
  if (!out->data) {
    wg_errf(err, err_len, "%s: out of memory for %zu bytes", path, total);
    rc = WAGMA_ENOMEM;
    goto out;
  }
  out->len = total;
  got = read_full(f, out->data, total);
  if (got != (long long)total) {
    int zerr = 0;
    const char *zmsg = gzerror(f, &zerr);
    wg_errf(err, err_len, "%s: truncated IDX payload (%lld of %zu bytes%s%s)", path,
            got < 0 ? 0 : got, total, zerr ? ": " : "", zerr ? zmsg : "");
    goto out;
  }
  unsigned char extra;
  got = read_full(f, &extra, 1);
  if (got != 0) {
    wg_errf(err, err_len, "%s: %s after the IDX payload of %zu bytes", path,
            got < 0 ? "corrupt data" : "trailing data", total);
    goto out;
  }
  rc = WAGMA_OK;
out:
  if (f)
    gzclose(f);
  if (rc) {
    free(out->data);
    memset(out, 0, sizeof(*out));
  }
  return rc;
}

/* Ownership: on success *ds owns the image and label bytes. */
int wagma_dataset_load_idx(wagma_dataset_t *ds, const char *images_path, const char *labels_path,
                           size_t classes, char *err, size_t err_len) {
  int rc;
  idx_file_t img = {0}, lab = {0};
  if (!ds || !images_path || !labels_path || classes < 2 || classes > 256) {
    wg_errf(err, err_len, "bad arguments (classes must be in 2..256)");
    return WAGMA_EINVAL;
  }
  memset(ds, 0, sizeof(*ds));
  if ((rc = idx_read(images_path, 3, &img, err, err_len)) ||
      (rc = idx_read(labels_path, 1, &lab, err, err_len)))
    goto out;
  rc = WAGMA_EPROTO;
  if (img.dims[0] != lab.dims[0]) {
    wg_errf(err, err_len, "%s has %u images but %s has %u labels", images_path, img.dims[0],
            labels_path, lab.dims[0]);
    goto out;
  }
  for (size_t i = 0; i < lab.len; i++)
    if (lab.data[i] >= classes) {
      wg_errf(err, err_len, "%s: label %u of sample %zu is not below %zu classes", labels_path,
              lab.data[i], i, classes);
      goto out;
    }
  ds->n = img.dims[0];
  ds->rows = img.dims[1];
  ds->cols = img.dims[2];
  ds->features = ds->rows * ds->cols;
  ds->classes = classes;
  ds->x_u8 = img.data;
  ds->labels = lab.data;
  ds->scale = 1.0f / 255.0f;
  ds->offset = 0.0f;
  img.data = lab.data = NULL;
  rc = WAGMA_OK;
out:
  free(img.data);
  free(lab.data);
  return rc;
}

/* Picks "<dir>/<base>.gz", else "<dir>/<base>". */
static void find_file(char *out, size_t len, const char *dir, const char *base) {
  struct stat st;
  snprintf(out, len, "%s/%s.gz", dir, base);
  if (stat(out, &st) == 0)
    return;
  snprintf(out, len, "%s/%s", dir, base);
  if (stat(out, &st) != 0) /* report the usual name */
    snprintf(out, len, "%s/%s.gz", dir, base);
}

/* Ownership: on success *train (and *test when given) own their data; on error both are
 * zeroed. */
int wagma_dataset_load_fashion_mnist(const char *dir, wagma_dataset_t *train, wagma_dataset_t *test,
                                     char *err, size_t err_len) {
  char ip[PATH_MAX], lp[PATH_MAX];
  int rc;
  if (!train)
    return WAGMA_EINVAL;
  if (!dir)
    dir = WAGMA_FASHION_MNIST_DIR;
  if (test)
    memset(test, 0, sizeof(*test));
  find_file(ip, sizeof(ip), dir, "train-images-idx3-ubyte");
  find_file(lp, sizeof(lp), dir, "train-labels-idx1-ubyte");
  if ((rc = wagma_dataset_load_idx(train, ip, lp, 10, err, err_len)))
    goto out;
  if (test) {
    find_file(ip, sizeof(ip), dir, "t10k-images-idx3-ubyte");
    find_file(lp, sizeof(lp), dir, "t10k-labels-idx1-ubyte");
    if ((rc = wagma_dataset_load_idx(test, ip, lp, 10, err, err_len)))
      goto out;
    if (test->rows != train->rows || test->cols != train->cols) {
      wg_errf(err, err_len, "%s: test images are %zux%zu, training images %zux%zu", dir, test->rows,
              test->cols, train->rows, train->cols);
      rc = WAGMA_EPROTO;
      goto out;
    }
  }
  /* Standardize both with the training set's pixel statistics. */
  double sum = 0.0, sq = 0.0;
  size_t len = train->n * train->features;
  for (size_t i = 0; i < len; i++) {
    double v = train->x_u8[i] / 255.0;
    sum += v;
    sq += v * v;
  }
  double mean = sum / (double)len, var = sq / (double)len - mean * mean;
  float std = var > 1e-12 ? (float)sqrt(var) : 1.0f;
  wagma_dataset_standardize(train, (float)mean, std);
  if (test)
    wagma_dataset_standardize(test, (float)mean, std);
out:
  if (rc) {
    wagma_dataset_free(train);
    if (test)
      wagma_dataset_free(test);
  }
  return rc;
}
