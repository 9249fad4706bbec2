/* agent/model_host.c — the model as host memory for the collective (model_host.h): the model's
 * own buffers on the CPU backend, page-locked mirrors filled by downloads on a device backend
 * (the parameters on the backend's transfer stream, wagma_model_params_download_async).
 *
 * Threads: none of its own; the model's owner (the runner thread, or wagma-train's only
 * training thread) makes every call. */
#include <string.h>

#include "agent/model_host.h"
#include "wagma/status.h"

static int on_host(const wg_model_host_t *h) {
  return wagma_backend_host_memory(wagma_model_backend(h->model));
}

int wg_model_host_init(wg_model_host_t *h, wagma_model_t *m, wagma_optim_t *o) {
  memset(h, 0, sizeof *h);
  h->model = m;
  h->optim = o;
  h->nparams = wagma_model_param_count(m);
  wagma_optim_state(o, &h->nstate);
  if (on_host(h))
    return 0;
  wagma_backend_t *b = wagma_model_backend(m);
  size_t bytes = h->nparams * sizeof(float);
  h->params = wagma_backend_host_alloc(b, bytes);
  h->grads = wagma_backend_host_alloc(b, bytes);
  return h->params && h->grads ? 0 : WAGMA_ENOMEM;
}

void wg_model_host_free(wg_model_host_t *h) {
  if (!h->model)
    return;
  wagma_backend_t *b = wagma_model_backend(h->model);
  if (h->params)
    wagma_backend_host_free(b, h->params);
  if (h->grads)
    wagma_backend_host_free(b, h->grads);
  memset(h, 0, sizeof *h);
}

float *wg_model_host_params(wg_model_host_t *h, int *status) {
  *status = 0;
  if (on_host(h))
    return wagma_model_params(h->model);
  if ((*status = wagma_model_params_download_async(h->model, h->params)) == 0)
    *status = wagma_model_params_download_wait(h->model);
  return *status ? NULL : h->params;
}

int wg_model_host_params_back(wg_model_host_t *h) {
  return on_host(h) ? 0 : wagma_model_set_params(h->model, h->params);
}

float *wg_model_host_grads(wg_model_host_t *h, int *status) {
  *status = 0;
  if (on_host(h))
    return wagma_model_grads(h->model);
  *status = wagma_model_get_grads(h->model, h->grads);
  return *status ? NULL : h->grads;
}

int wg_model_host_grads_back(wg_model_host_t *h) {
  return on_host(h) ? 0 : wagma_model_set_grads(h->model, h->grads);
}

int wg_model_host_state_save(wg_model_host_t *h, float *buf) {
  int e = wagma_model_get_params(h->model, buf);
  if (e == 0 && h->nstate)
    e = wagma_optim_get_state(h->optim, buf + h->nparams);
  return e;
}

int wg_model_host_state_load(wg_model_host_t *h, const float *buf) {
  int e = wagma_model_set_params(h->model, buf);
  if (e == 0 && h->nstate)
    e = wagma_optim_set_state(h->optim, buf + h->nparams);
  return e;
}
