/* agent/model_host.c — the job's model as the collective sees it: host memory.
 *
 * The collective (wagma_comm_step, _allreduce, _average) reads and writes host buffers; the
 * TCP transport sends from them. On the CPU backend the model's own buffers are host memory
 * and are used in place (no copy). On a device backend (cuda) the job owns page-locked host
 * mirrors of the parameters and of the gradients (wagma_backend_host_alloc): a collective call
 * is bracketed by a download of the device buffer (the parameters on the backend's transfer
 * stream, wagma_model_params_download_async) and an upload of what the collective wrote back.
 *
 * Threads: the runner thread only (the job's owner). */
#include <string.h>

#include "agent/runner.h"

static int on_host(const wg_job_t *j) {
  return wagma_backend_host_memory(wagma_model_backend(j->model));
}

int wg_job_host_alloc(wg_job_t *j) {
  if (on_host(j))
    return 0;
  wagma_backend_t *b = wagma_model_backend(j->model);
  size_t bytes = j->nparams * sizeof(float);
  j->host_params = wagma_backend_host_alloc(b, bytes);
  j->host_grads = wagma_backend_host_alloc(b, bytes);
  if (!j->host_params || !j->host_grads)
    return WAGMA_ENOMEM;
  return 0;
}

void wg_job_host_free(wg_job_t *j) {
  if (!j->model)
    return;
  wagma_backend_t *b = wagma_model_backend(j->model);
  if (j->host_params)
    wagma_backend_host_free(b, j->host_params);
  if (j->host_grads)
    wagma_backend_host_free(b, j->host_grads);
  j->host_params = j->host_grads = NULL;
}

float *wg_job_params_to_host(wg_job_t *j, int *status) {
  *status = 0;
  if (on_host(j))
    return wagma_model_params(j->model);
  if ((*status = wagma_model_params_download_async(j->model, j->host_params)) == 0)
    *status = wagma_model_params_download_wait(j->model);
  return *status ? NULL : j->host_params;
}

int wg_job_params_from_host(wg_job_t *j) {
  return on_host(j) ? 0 : wagma_model_set_params(j->model, j->host_params);
}

float *wg_job_grads_to_host(wg_job_t *j, int *status) {
  *status = 0;
  if (on_host(j))
    return wagma_model_grads(j->model);
  *status = wagma_model_get_grads(j->model, j->host_grads);
  return *status ? NULL : j->host_grads;
}

int wg_job_grads_from_host(wg_job_t *j) {
  return on_host(j) ? 0 : wagma_model_set_grads(j->model, j->host_grads);
}

int wg_job_state_to_host(wg_job_t *j, float *buf) {
  int e = wagma_model_get_params(j->model, buf);
  if (e == 0 && j->nstate)
    e = wagma_optim_get_state(j->optim, buf + j->nparams);
  return e;
}

int wg_job_state_from_host(wg_job_t *j, const float *buf) {
  int e = wagma_model_set_params(j->model, buf);
  if (e == 0 && j->nstate)
    e = wagma_optim_set_state(j->optim, buf + j->nparams);
  return e;
}
