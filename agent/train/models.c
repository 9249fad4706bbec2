/* models.c — softmax regression, MLP and LeNet-5 as a sequence of layers over ONE flat
 * parameter buffer and ONE flat gradient buffer of the same layout, written once against the
 * backend interface (backend.h): every buffer below is the backend's memory and every
 * computation one of its operations.
 *
 * Owns: the model handle, its parameter and gradient buffers, per-layer activation buffers
 * sized for max_batch, conv/pool scratch, the backward ping-pong buffers and the batch stager
 * (all in the backend's memory). No threads of its own (OpenBLAS may run its pool inside
 * sgemm; CUDA work runs on the backend's streams). Invariants: layer i's parameters are
 * params[p_off, p_off + w_len) (weights, row-major as the kernels expect) followed by b_len
 * biases; backward() overwrites every gradient entry, so grads never need zeroing; backward is
 * valid once, right after a forward (it uses that forward's activations and conv columns). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/train/backend.h"
#include "agent/train/internal.h"
#include "agent/train/layers.h"
#include "agent/train/train.h"

/* ------------------------------------------------------------------ model */

enum layer_kind { LAYER_DENSE, LAYER_CONV, LAYER_POOL, LAYER_ACT };

typedef struct layer {
  int kind;
  size_t in_len, out_len; /* floats per sample */
  size_t p_off, w_len, b_len;
  size_t fan_in, fan_out;
  int he_init; /* 1: followed by ReLU (He-uniform), 0: Glorot-uniform */
  size_t dense_in, dense_out;
  wg_conv_shape_t conv;
  wg_pool_shape_t pool;
  int mode; /* pool mode or activation function */
  float *out;
  int32_t *argmax;
  float *cols, *tmp;
} layer_t;

#define MAX_LAYERS 32

struct wagma_model {
  wagma_model_config_t cfg;
  wagma_backend_t *be;
  layer_t layers[MAX_LAYERS];
  size_t n_layers;
  size_t in_len, n_params;
  float *params, *grads;
  wg_stager_t *stager;
  const float *input; /* the last forward batch, where the stager put it */
  const int32_t *labels;
  float *dbuf[2]; /* backward ping-pong, each max_batch * widest activation */
  size_t last_n;  /* samples of the last forward, 0 when backward is not allowed */
  char desc[512];
  uint64_t signature;
};

wagma_model_config_t wagma_model_defaults(int arch) {
  wagma_model_config_t c;
  memset(&c, 0, sizeof(c));
  c.arch = arch;
  c.channels = 1;
  c.rows = 28;
  c.cols = 28;
  c.classes = 10;
  c.hidden[0] = 256;
  c.hidden[1] = 128;
  c.n_hidden = arch == WAGMA_ARCH_MLP ? 2 : 0;
  c.activation = WAGMA_ACT_RELU;
  c.pool = WAGMA_POOL_MAX;
  c.max_batch = 256;
  return c;
}

int wagma_model_config_parse(const char *spec, wagma_model_config_t *cfg, char *err,
                             size_t err_len) {
  char buf[256];
  if (!spec || !cfg || strlen(spec) >= sizeof(buf)) {
    wg_errf(err, err_len, "model spec missing or longer than %zu characters", sizeof(buf) - 1);
    return WAGMA_EINVAL;
  }
  strcpy(buf, spec);
  char *save = NULL, *name = strtok_r(buf, ",", &save);
  char *sizes = name ? strchr(name, ':') : NULL;
  if (sizes)
    *sizes++ = '\0';
  int arch;
  if (!name) {
    wg_errf(err, err_len, "empty model spec");
    return WAGMA_EINVAL;
  } else if (!strcmp(name, "softmax") || !strcmp(name, "logreg")) {
    arch = WAGMA_ARCH_SOFTMAX;
  } else if (!strcmp(name, "mlp")) {
    arch = WAGMA_ARCH_MLP;
  } else if (!strcmp(name, "lenet5") || !strcmp(name, "lenet")) {
    arch = WAGMA_ARCH_LENET5;
  } else {
    wg_errf(err, err_len, "unknown model '%s' (softmax, mlp, lenet5)", name);
    return WAGMA_EINVAL;
  }
  wagma_model_config_t c = wagma_model_defaults(arch);
  if (sizes) {
    if (arch != WAGMA_ARCH_MLP) {
      wg_errf(err, err_len, "model '%s' takes no layer sizes", name);
      return WAGMA_EINVAL;
    }
    c.n_hidden = 0;
    if (!*sizes) {
      wg_errf(err, err_len, "empty MLP hidden sizes (e.g. mlp:256-128)");
      return WAGMA_EINVAL;
    }
    char *s = sizes;
    while (*s) {
      char *end = NULL;
      unsigned long v = strtoul(s, &end, 10);
      if (end == s || v == 0 || v > 65536 || c.n_hidden == WAGMA_MLP_MAX_HIDDEN ||
          (*end && *end != '-') || (*end == '-' && !end[1])) {
        wg_errf(err, err_len, "bad MLP hidden sizes '%s' (e.g. mlp:256-128, at most 8)", sizes);
        return WAGMA_EINVAL;
      }
      c.hidden[c.n_hidden++] = v;
      s = *end ? end + 1 : end;
    }
  }
  for (char *opt = strtok_r(NULL, ",", &save); opt; opt = strtok_r(NULL, ",", &save)) {
    if (!strcmp(opt, "relu"))
      c.activation = WAGMA_ACT_RELU;
    else if (!strcmp(opt, "tanh"))
      c.activation = WAGMA_ACT_TANH;
    else if (!strcmp(opt, "maxpool"))
      c.pool = WAGMA_POOL_MAX;
    else if (!strcmp(opt, "avgpool"))
      c.pool = WAGMA_POOL_AVG;
    else {
      wg_errf(err, err_len, "unknown model option '%s' (relu, tanh, maxpool, avgpool)", opt);
      return WAGMA_EINVAL;
    }
  }
  *cfg = c;
  return WAGMA_OK;
}

/* Appends a layer, its parameter slice and a word of the description. */
static layer_t *push_layer(wagma_model_t *m, int kind, size_t in_len, size_t out_len, size_t w_len,
                           size_t b_len, const char *word) {
  if (m->n_layers == MAX_LAYERS)
    return NULL;
  layer_t *l = &m->layers[m->n_layers++];
  memset(l, 0, sizeof(*l));
  l->kind = kind;
  l->in_len = in_len;
  l->out_len = out_len;
  l->p_off = m->n_params;
  l->w_len = w_len;
  l->b_len = b_len;
  m->n_params += w_len + b_len;
  size_t used = strlen(m->desc);
  snprintf(m->desc + used, sizeof(m->desc) - used, " %s", word);
  return l;
}

static layer_t *add_dense(wagma_model_t *m, size_t in, size_t out) {
  char word[32];
  snprintf(word, sizeof(word), "dense%zu", out);
  layer_t *l = push_layer(m, LAYER_DENSE, in, out, in * out, out, word);
  if (l) {
    l->dense_in = in;
    l->dense_out = out;
    l->fan_in = in;
    l->fan_out = out;
  }
  return l;
}

static layer_t *add_act(wagma_model_t *m, size_t len, int fn) {
  layer_t *l = push_layer(m, LAYER_ACT, len, len, 0, 0, fn == WAGMA_ACT_TANH ? "tanh" : "relu");
  if (l) {
    l->mode = fn;
    if (m->n_layers >= 2)
      m->layers[m->n_layers - 2].he_init = fn == WAGMA_ACT_RELU;
  }
  return l;
}

static layer_t *add_conv(wagma_model_t *m, size_t c, size_t h, size_t w, size_t oc, size_t k,
                         size_t pad) {
  wg_conv_shape_t s;
  char word[48];
  if (wg_conv_shape_init(&s, c, h, w, oc, k, pad))
    return NULL;
  snprintf(word, sizeof(word), "conv%zux%zux%zu/p%zu", k, k, oc, pad);
  layer_t *l = push_layer(m, LAYER_CONV, c * h * w, oc * s.oh * s.ow, oc * c * k * k, oc, word);
  if (l) {
    l->conv = s;
    l->fan_in = c * k * k;
    l->fan_out = oc * k * k;
  }
  return l;
}

static layer_t *add_pool(wagma_model_t *m, size_t c, size_t h, size_t w, size_t k, int mode) {
  wg_pool_shape_t s;
  char word[32];
  if (wg_pool_shape_init(&s, c, h, w, k))
    return NULL;
  snprintf(word, sizeof(word), "%spool%zu", mode == WAGMA_POOL_AVG ? "avg" : "max", k);
  layer_t *l = push_layer(m, LAYER_POOL, c * h * w, c * s.oh * s.ow, 0, 0, word);
  if (l) {
    l->pool = s;
    l->mode = mode;
  }
  return l;
}

/* Lays out the layers of cfg; 0 or WAGMA_EINVAL when the shapes do not work out. */
static int build_layers(wagma_model_t *m, char *err, size_t err_len) {
  const wagma_model_config_t *c = &m->cfg;
  size_t in = c->channels * c->rows * c->cols;
  switch (c->arch) {
  case WAGMA_ARCH_SOFTMAX:
    snprintf(m->desc, sizeof(m->desc), "softmax in%zux%zux%zu", c->channels, c->rows, c->cols);
    if (!add_dense(m, in, c->classes))
      goto bad;
    return WAGMA_OK;
  case WAGMA_ARCH_MLP: {
    snprintf(m->desc, sizeof(m->desc), "mlp in%zux%zux%zu", c->channels, c->rows, c->cols);
    size_t width = in;
    for (size_t i = 0; i < c->n_hidden; i++) {
      if (!add_dense(m, width, c->hidden[i]) || !add_act(m, c->hidden[i], c->activation))
        goto bad;
      width = c->hidden[i];
    }
    if (!add_dense(m, width, c->classes))
      goto bad;
    return WAGMA_OK;
  }
  case WAGMA_ARCH_LENET5: {
    snprintf(m->desc, sizeof(m->desc), "lenet5 in%zux%zux%zu", c->channels, c->rows, c->cols);
    layer_t *l = add_conv(m, c->channels, c->rows, c->cols, 6, 5, 2);
    if (!l || !add_act(m, l->out_len, c->activation))
      goto bad;
    l = add_pool(m, 6, l->conv.oh, l->conv.ow, 2, c->pool);
    if (!l)
      goto bad;
    l = add_conv(m, 6, l->pool.oh, l->pool.ow, 16, 5, 0);
    if (!l || !add_act(m, l->out_len, c->activation))
      goto bad;
    l = add_pool(m, 16, l->conv.oh, l->conv.ow, 2, c->pool);
    if (!l)
      goto bad;
    size_t flat = l->out_len;
    if (!add_dense(m, flat, 120) || !add_act(m, 120, c->activation) || !add_dense(m, 120, 84) ||
        !add_act(m, 84, c->activation) || !add_dense(m, 84, c->classes))
      goto bad;
    return WAGMA_OK;
  }
  default: wg_errf(err, err_len, "unknown model architecture %d", c->arch); return WAGMA_EINVAL;
  }
bad:
  wg_errf(err, err_len, "model '%s' does not fit its input (%zux%zux%zu)", m->desc, c->channels,
          c->rows, c->cols);
  return WAGMA_EINVAL;
}

static int check_config(const wagma_model_config_t *c, char *err, size_t err_len) {
  const size_t big = (size_t)1 << 16;
  if (c->channels == 0 || c->rows == 0 || c->cols == 0 || c->channels > 64 || c->rows > 4096 ||
      c->cols > 4096 || c->channels * c->rows * c->cols > ((size_t)1 << 22)) {
    wg_errf(err, err_len, "bad input shape %zux%zux%zu (1..64 channels, 1..4096 rows/cols)",
            c->channels, c->rows, c->cols);
    return WAGMA_EINVAL;
  }
  if (c->classes < 2 || c->classes > 256) {
    wg_errf(err, err_len, "classes must be in 2..256, got %zu", c->classes);
    return WAGMA_EINVAL;
  }
  if (c->max_batch == 0 || c->max_batch > big) {
    wg_errf(err, err_len, "max_batch must be in 1..65536, got %zu", c->max_batch);
    return WAGMA_EINVAL;
  }
  if (c->activation != WAGMA_ACT_RELU && c->activation != WAGMA_ACT_TANH) {
    wg_errf(err, err_len, "unknown activation %d", c->activation);
    return WAGMA_EINVAL;
  }
  if (c->pool != WAGMA_POOL_MAX && c->pool != WAGMA_POOL_AVG) {
    wg_errf(err, err_len, "unknown pooling %d", c->pool);
    return WAGMA_EINVAL;
  }
  if (c->arch == WAGMA_ARCH_MLP) {
    if (c->n_hidden > WAGMA_MLP_MAX_HIDDEN) {
      wg_errf(err, err_len, "too many hidden layers: %zu", c->n_hidden);
      return WAGMA_EINVAL;
    }
    for (size_t i = 0; i < c->n_hidden; i++)
      if (c->hidden[i] == 0 || c->hidden[i] > big) {
        wg_errf(err, err_len, "hidden sizes must be in 1..65536, got %zu", c->hidden[i]);
        return WAGMA_EINVAL;
      }
  }
  return WAGMA_OK;
}

/* Ownership: on success *out is a new model the caller frees with wagma_model_destroy. */
int wagma_model_create(const wagma_model_config_t *cfg, wagma_model_t **out, char *err,
                       size_t err_len) {
  return wagma_model_create_on(NULL, cfg, out, err, err_len);
}

/* Zeroed backend memory for count elements of size bytes each. */
static void *balloc(wagma_model_t *m, size_t count, size_t size) {
  return m->be->ops->alloc(m->be, count * size);
}

int wagma_model_create_on(wagma_backend_t *be, const wagma_model_config_t *cfg, wagma_model_t **out,
                          char *err, size_t err_len) {
  int rc = WAGMA_ENOMEM;
  wagma_model_t *m = NULL;
  if (!cfg || !out) {
    wg_errf(err, err_len, "missing argument");
    return WAGMA_EINVAL;
  }
  *out = NULL;
  rc = check_config(cfg, err, err_len);
  if (rc)
    goto out;
  rc = WAGMA_ENOMEM;
  m = calloc(1, sizeof(*m));
  if (!m)
    goto out;
  m->be = be ? be : wagma_backend_cpu();
  m->cfg = *cfg;
  if (m->cfg.arch != WAGMA_ARCH_MLP)
    m->cfg.n_hidden = 0;
  m->in_len = cfg->channels * cfg->rows * cfg->cols;
  rc = build_layers(m, err, err_len);
  if (rc)
    goto out;
  rc = WAGMA_ENOMEM;
  const wg_backend_ops_t *ops = m->be->ops;
  const size_t nb = cfg->max_batch;
  size_t widest = m->in_len;
  m->params = balloc(m, m->n_params, sizeof(float));
  m->grads = balloc(m, m->n_params, sizeof(float));
  m->stager = ops->stager_create(m->be, nb * m->in_len, nb);
  if (!m->params || !m->grads || !m->stager)
    goto out;
  for (size_t i = 0; i < m->n_layers; i++) {
    layer_t *l = &m->layers[i];
    if (l->out_len > widest)
      widest = l->out_len;
    l->out = balloc(m, nb * l->out_len, sizeof(float));
    if (!l->out)
      goto out;
    if (l->kind == LAYER_CONV) {
      l->cols = balloc(m, ops->conv_cols_len(&l->conv, nb), sizeof(float));
      l->tmp = balloc(m, ops->conv_tmp_len(&l->conv, nb), sizeof(float));
      if (!l->cols || !l->tmp)
        goto out;
    } else if (l->kind == LAYER_POOL && l->mode == WAGMA_POOL_MAX) {
      l->argmax = balloc(m, nb * l->out_len, sizeof(int32_t));
      if (!l->argmax)
        goto out;
    }
  }
  for (int k = 0; k < 2; k++)
    if (!(m->dbuf[k] = balloc(m, nb * widest, sizeof(float))))
      goto out;
  uint64_t h = wg_fnv1a(WG_FNV_OFFSET, m->desc, strlen(m->desc));
  uint64_t n64 = m->n_params;
  m->signature = wg_fnv1a(h, &n64, sizeof(n64));
  *out = m;
  m = NULL;
  rc = WAGMA_OK;
out:
  if (rc == WAGMA_ENOMEM)
    wg_errf(err, err_len, "out of %s memory for model (max_batch %zu)",
            m && m->be ? m->be->ops->kind : "host", cfg->max_batch);
  wagma_model_destroy(m);
  return rc;
}

void wagma_model_destroy(wagma_model_t *m) {
  if (!m)
    return;
  wagma_backend_t *be = m->be;
  if (be) {
    be->ops->sync(be); /* nothing queued may still use the buffers */
    for (size_t i = 0; i < m->n_layers; i++) {
      be->ops->free(be, m->layers[i].out);
      be->ops->free(be, m->layers[i].argmax);
      be->ops->free(be, m->layers[i].cols);
      be->ops->free(be, m->layers[i].tmp);
    }
    be->ops->free(be, m->dbuf[0]);
    be->ops->free(be, m->dbuf[1]);
    be->ops->free(be, m->params);
    be->ops->free(be, m->grads);
    be->ops->stager_destroy(be, m->stager);
  }
  free(m);
}

/* The initial values are drawn on the host (the same bits on every backend) and uploaded. */
void wagma_model_init(wagma_model_t *m, uint64_t seed) {
  wagma_rng_t rng;
  wagma_rng_seed(&rng, seed);
  const int host = m->be->ops->host_memory;
  float *params = host ? m->params : calloc(m->n_params, sizeof(float));
  if (!params) { /* cannot draw: leave zeros and say so through the backend's next status */
    m->be->ops->zero(m->be, m->params, m->n_params * sizeof(float));
    snprintf(m->be->err, sizeof(m->be->err), "out of host memory to initialise the model");
    return;
  }
  for (size_t i = 0; i < m->n_layers; i++) {
    layer_t *l = &m->layers[i];
    if (!l->w_len)
      continue;
    double bound =
        l->he_init ? sqrt(6.0 / (double)l->fan_in) : sqrt(6.0 / (double)(l->fan_in + l->fan_out));
    float *w = params + l->p_off;
    for (size_t j = 0; j < l->w_len; j++)
      w[j] = (float)((2.0 * wagma_rng_uniform(&rng) - 1.0) * bound);
    memset(w + l->w_len, 0, l->b_len * sizeof(float));
  }
  if (!host) {
    m->be->ops->upload(m->be, m->params, params, m->n_params * sizeof(float));
    free(params);
  }
  m->be->ops->zero(m->be, m->grads, m->n_params * sizeof(float));
  m->last_n = 0;
}

size_t wagma_model_param_count(const wagma_model_t *m) {
  return m->n_params;
}
float *wagma_model_params(wagma_model_t *m) {
  return m->params;
}
float *wagma_model_grads(wagma_model_t *m) {
  return m->grads;
}
const wagma_model_config_t *wagma_model_config(const wagma_model_t *m) {
  return &m->cfg;
}
wagma_backend_t *wagma_model_backend(const wagma_model_t *m) {
  return m->be;
}

int wagma_model_get_params(wagma_model_t *m, float *host) {
  return m->be->ops->download(m->be, host, m->params, m->n_params * sizeof(float));
}

int wagma_model_get_grads(wagma_model_t *m, float *host) {
  return m->be->ops->download(m->be, host, m->grads, m->n_params * sizeof(float));
}

int wagma_model_set_params(wagma_model_t *m, const float *host) {
  return m->be->ops->upload(m->be, m->params, host, m->n_params * sizeof(float));
}

int wagma_model_set_grads(wagma_model_t *m, const float *host) {
  return m->be->ops->upload(m->be, m->grads, host, m->n_params * sizeof(float));
}

int wagma_model_params_download_async(wagma_model_t *m, float *host) {
  return m->be->ops->download_async(m->be, host, m->params, m->n_params * sizeof(float));
}

int wagma_model_params_download_wait(wagma_model_t *m) {
  return m->be->ops->download_wait(m->be);
}

const char *wagma_model_describe(const wagma_model_t *m) {
  return m->desc;
}
uint64_t wagma_model_signature(const wagma_model_t *m) {
  return m->signature;
}

int wagma_model_forward(wagma_model_t *m, const float *x, const int32_t *y, size_t n,
                        wagma_eval_t *out) {
  if (!m || !x || !y || n == 0 || n > m->cfg.max_batch)
    return WAGMA_EINVAL;
  for (size_t i = 0; i < n; i++)
    if (y[i] < 0 || (size_t)y[i] >= m->cfg.classes)
      return WAGMA_EINVAL;
  wagma_backend_t *be = m->be;
  const wg_backend_ops_t *ops = be->ops;
  m->last_n = 0;
  int rc = ops->stage(be, m->stager, x, n * m->in_len, y, n, &m->input, &m->labels);
  if (rc)
    return rc;
  const float *cur = m->input;
  for (size_t i = 0; i < m->n_layers; i++) {
    layer_t *l = &m->layers[i];
    const float *p = m->params + l->p_off;
    switch (l->kind) {
    case LAYER_DENSE:
      wg_dense_forward(be, n, l->dense_in, l->dense_out, cur, p, p + l->w_len, l->out);
      break;
    case LAYER_CONV:
      ops->conv_forward(be, &l->conv, n, cur, p, p + l->w_len, l->out, l->cols, l->tmp);
      break;
    case LAYER_POOL: ops->pool_forward(be, &l->pool, l->mode, n, cur, l->out, l->argmax); break;
    case LAYER_ACT: ops->act_forward(be, l->mode, n * l->out_len, cur, l->out); break;
    }
    cur = l->out;
  }
  size_t correct = 0;
  double loss = 0.0;
  /* dlogits go to dbuf[0], where backward starts. */
  rc = ops->softmax_xent(be, n, m->cfg.classes, cur, m->labels, m->dbuf[0], &loss, &correct);
  if (rc)
    return rc;
  m->last_n = n;
  if (out) {
    out->loss = loss;
    out->correct = correct;
    out->n = n;
  }
  return WAGMA_OK;
}

int wagma_model_backward(wagma_model_t *m) {
  if (!m || m->last_n == 0)
    return WAGMA_EINVAL;
  wagma_backend_t *be = m->be;
  const wg_backend_ops_t *ops = be->ops;
  const size_t n = m->last_n;
  int cur = 0; /* dbuf[cur] holds d loss / d (output of layer i) */
  for (size_t i = m->n_layers; i-- > 0;) {
    layer_t *l = &m->layers[i];
    const float *x = i ? m->layers[i - 1].out : m->input;
    float *dy = m->dbuf[cur];
    float *dx = i ? m->dbuf[1 - cur] : NULL; /* the input needs no gradient */
    const float *p = m->params + l->p_off;
    float *g = m->grads + l->p_off;
    switch (l->kind) {
    case LAYER_DENSE:
      wg_dense_backward(be, n, l->dense_in, l->dense_out, x, p, dy, g, g + l->w_len, dx);
      break;
    case LAYER_CONV:
      ops->conv_backward(be, &l->conv, n, l->cols, p, dy, g, g + l->w_len, dx, l->tmp);
      break;
    case LAYER_POOL:
      if (dx)
        ops->pool_backward(be, &l->pool, l->mode, n, dy, l->argmax, dx);
      break;
    case LAYER_ACT:
      if (dx)
        ops->act_backward(be, l->mode, n * l->out_len, l->out, dy, dx);
      break;
    }
    cur = 1 - cur;
  }
  m->last_n = 0; /* one backward per forward */
  return ops->status(be);
}

int wagma_model_evaluate(wagma_model_t *m, const wagma_dataset_t *ds, size_t first, size_t count,
                         wagma_eval_t *out) {
  int rc = WAGMA_OK;
  float *x = NULL;
  int32_t *y = NULL;
  uint32_t *idx = NULL;
  if (!m || !ds || !out || ds->features != m->in_len || first >= ds->n ||
      ds->classes > m->cfg.classes)
    return WAGMA_EINVAL;
  if (count == 0 || count > ds->n - first)
    count = ds->n - first;
  const size_t nb = m->cfg.max_batch;
  x = malloc(nb * m->in_len * sizeof(float));
  y = malloc(nb * sizeof(int32_t));
  idx = malloc(nb * sizeof(uint32_t));
  if (!x || !y || !idx) {
    rc = WAGMA_ENOMEM;
    goto out;
  }
  double loss_sum = 0.0;
  size_t correct = 0;
  for (size_t done = 0; done < count;) {
    size_t b = count - done < nb ? count - done : nb;
    for (size_t i = 0; i < b; i++)
      idx[i] = (uint32_t)(first + done + i);
    wagma_eval_t e;
    if ((rc = wagma_dataset_gather(ds, idx, b, x, y)) || (rc = wagma_model_forward(m, x, y, b, &e)))
      goto out;
    loss_sum += e.loss * (double)b;
    correct += e.correct;
    done += b;
  }
  m->last_n = 0;
  out->loss = loss_sum / (double)count;
  out->correct = correct;
  out->n = count;
out:
  free(x);
  free(y);
  free(idx);
  return rc;
}
