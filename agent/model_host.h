/* agent/model_host.h — a model as host memory for the collective (model_host.c), shared by the
 * agent's runner and wagma-train.
 *
 * The collective (and libwagma) reads and writes host buffers. On the CPU backend the model's
 * own buffers are host memory and are used in place (no copy). On a device backend (cuda) the
 * owner keeps page-locked host mirrors of the parameters and gradients
 * (wagma_backend_host_alloc): a collective call is bracketed by a download of the device buffer
 * and an upload of what the collective wrote back. Threads: the model's owner only. */
#ifndef WAGMA_AGENT_MODEL_HOST_H
#define WAGMA_AGENT_MODEL_HOST_H

#include <stddef.h>

#include "agent/train/train.h"

typedef struct wg_model_host {
  wagma_model_t *model;
  wagma_optim_t *optim;
  size_t nparams, nstate;
  float *params, *grads; /* page-locked mirrors on a device backend; NULL on the CPU */
} wg_model_host_t;

/* Binds h to m and o and allocates the mirrors a device backend needs: 0 or WAGMA_ENOMEM.
 * wg_model_host_free before the model is destroyed (a zeroed h is a no-op). */
int wg_model_host_init(wg_model_host_t *h, wagma_model_t *m, wagma_optim_t *o);
void wg_model_host_free(wg_model_host_t *h);
/* The parameters (gradients) as host memory: the model's own buffer on the CPU, else the
 * mirror after a download (NULL and *status on failure). *_back writes the mirror to the device
 * after the collective changed it (0 on the CPU). */
float *wg_model_host_params(wg_model_host_t *h, int *status);
int wg_model_host_params_back(wg_model_host_t *h);
float *wg_model_host_grads(wg_model_host_t *h, int *status);
int wg_model_host_grads_back(wg_model_host_t *h);
/* params | optimizer state through buf (nparams + nstate floats), on any backend. */
int wg_model_host_state_save(wg_model_host_t *h, float *buf);
int wg_model_host_state_load(wg_model_host_t *h, const float *buf);

#endif
