/* optimizer.c — SGD (momentum, Nesterov, weight decay), Adam and AdamW over one flat parameter
 * buffer, and the learning-rate schedule (linear warmup, step decay). The per-parameter math
 * is elementwise.h's, run by the backend's sgd / adam operations.
 *
 * Owns: the optimizer handle and its flat state buffer (velocity, or Adam's m then v) in the
 * backend's memory. No threads. Invariants: the state has the parameters' layout, so it can
 * be checkpointed or
 * averaged like the parameters; the learning rate depends only on the job iteration passed to
 * step(), and Adam's bias correction only on the number of updates taken. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "agent/train/backend.h"
#include "agent/train/internal.h"
#include "agent/train/train.h"

struct wagma_optim {
  wagma_optim_config_t cfg;
  wagma_backend_t *be;
  size_t n;
  size_t state_len;
  float *state;
  uint64_t updates;
};

double wagma_lr_at(const wagma_lr_schedule_t *s, uint64_t iteration) {
  double lr = s->lr;
  if (s->warmup_steps && iteration < s->warmup_steps)
    lr *= (double)(iteration + 1) / (double)s->warmup_steps;
  if (s->decay_every)
    lr *= pow((double)s->decay, (double)(iteration / s->decay_every));
  return lr;
}

wagma_optim_config_t wagma_optim_defaults(int kind) {
  wagma_optim_config_t c;
  memset(&c, 0, sizeof(c));
  c.kind = kind;
  c.schedule.lr = kind == WAGMA_OPTIM_SGD ? 0.05f : 0.001f;
  c.schedule.decay = 0.1f;
  c.momentum = kind == WAGMA_OPTIM_SGD ? 0.9f : 0.0f;
  c.beta1 = 0.9f;
  c.beta2 = 0.999f;
  c.eps = 1e-8f;
  return c;
}

/* Ownership: on success *out is a new optimizer the caller frees with wagma_optim_destroy. */
int wagma_optim_create(const wagma_optim_config_t *cfg, size_t n_params, wagma_optim_t **out,
                       char *err, size_t err_len) {
  return wagma_optim_create_on(NULL, cfg, n_params, out, err, err_len);
}

int wagma_optim_create_on(wagma_backend_t *be, const wagma_optim_config_t *cfg, size_t n_params,
                          wagma_optim_t **out, char *err, size_t err_len) {
  int rc = WAGMA_EINVAL;
  wagma_optim_t *o = NULL;
  if (!cfg || !out || n_params == 0) {
    wg_errf(err, err_len, "missing optimizer config or zero parameters");
    return WAGMA_EINVAL;
  }
  *out = NULL;
  const wagma_lr_schedule_t *s = &cfg->schedule;
  if (cfg->kind < WAGMA_OPTIM_SGD || cfg->kind > WAGMA_OPTIM_ADAMW || !(s->lr >= 0.0f) ||
      !isfinite(s->lr) || !(s->decay > 0.0f && s->decay <= 1.0f) ||
      !(cfg->momentum >= 0.0f && cfg->momentum < 1.0f) || !(cfg->weight_decay >= 0.0f) ||
      (cfg->nesterov && (cfg->kind != WAGMA_OPTIM_SGD || cfg->momentum == 0.0f)) ||
      (cfg->kind != WAGMA_OPTIM_SGD &&
       !(cfg->beta1 >= 0.0f && cfg->beta1 < 1.0f && cfg->beta2 >= 0.0f && cfg->beta2 < 1.0f &&
         cfg->eps > 0.0f))) {
    wg_errf(err, err_len,
            "bad optimizer config: kind %d, lr %g (>= 0), decay %g (0 < d <= 1), momentum "
            "%g (0 <= m < 1), weight decay %g (>= 0), nesterov needs SGD with momentum, "
            "betas in [0, 1), eps > 0",
            cfg->kind, (double)s->lr, (double)s->decay, (double)cfg->momentum,
            (double)cfg->weight_decay);
    goto out;
  }
  rc = WAGMA_ENOMEM;
  o = calloc(1, sizeof(*o));
  if (!o)
    goto out;
  o->cfg = *cfg;
  o->be = be ? be : wagma_backend_cpu();
  o->n = n_params;
  if (cfg->kind == WAGMA_OPTIM_SGD)
    o->state_len = cfg->momentum > 0.0f ? n_params : 0;
  else
    o->state_len = 2 * n_params;
  if (o->state_len && !(o->state = o->be->ops->alloc(o->be, o->state_len * sizeof(float)))) {
    wg_errf(err, err_len, "out of %s memory for %zu optimizer state floats", o->be->ops->kind,
            o->state_len);
    goto out;
  }
  *out = o;
  o = NULL;
  rc = WAGMA_OK;
out:
  wagma_optim_destroy(o);
  return rc;
}

void wagma_optim_destroy(wagma_optim_t *o) {
  if (!o)
    return;
  if (o->state) {
    o->be->ops->sync(o->be);
    o->be->ops->free(o->be, o->state);
  }
  free(o);
}

static void adam_step(wagma_optim_t *o, float lr, float *w, const float *grad) {
  const double k = (double)(o->updates + 1);
  const wg_adam_consts_t c = {
      .lr = lr,
      .b1 = o->cfg.beta1,
      .b2 = o->cfg.beta2,
      .eps = o->cfg.eps,
      .wd = o->cfg.weight_decay,
      .c1 = (float)(1.0 / (1.0 - pow(o->cfg.beta1, k))),
      .c2 = (float)(1.0 / (1.0 - pow(o->cfg.beta2, k))),
      .decoupled = o->cfg.kind == WAGMA_OPTIM_ADAMW,
  };
  o->be->ops->adam(o->be, o->n, w, grad, o->state, o->state + o->n, &c);
}

void wagma_optim_step(wagma_optim_t *o, uint64_t iteration, float *params, const float *grads) {
  const float lr = (float)wagma_lr_at(&o->cfg.schedule, iteration);
  if (o->cfg.kind == WAGMA_OPTIM_SGD)
    o->be->ops->sgd(o->be, o->n, params, grads, o->state, lr, o->cfg.momentum, o->cfg.weight_decay,
                    o->cfg.nesterov);
  else
    adam_step(o, lr, params, grads);
  o->updates++;
}

wagma_backend_t *wagma_optim_backend(const wagma_optim_t *o) {
  return o->be;
}

float *wagma_optim_state(wagma_optim_t *o, size_t *len) {
  if (len)
    *len = o->state_len;
  return o->state;
}

int wagma_optim_get_state(wagma_optim_t *o, float *host) {
  if (!o->state_len)
    return WAGMA_OK;
  return o->be->ops->download(o->be, host, o->state, o->state_len * sizeof(float));
}

int wagma_optim_set_state(wagma_optim_t *o, const float *host) {
  if (!o->state_len)
    return WAGMA_OK;
  return o->be->ops->upload(o->be, o->state, host, o->state_len * sizeof(float));
}

uint64_t wagma_optim_updates(const wagma_optim_t *o) {
  return o->updates;
}

void wagma_optim_set_updates(wagma_optim_t *o, uint64_t updates) {
  o->updates = updates;
}

const wagma_optim_config_t *wagma_optim_config(const wagma_optim_t *o) {
  return &o->cfg;
}

void wagma_optim_reset(wagma_optim_t *o) {
  if (o->state)
    o->be->ops->zero(o->be, o->state, o->state_len * sizeof(float));
  o->updates = 0;
}
