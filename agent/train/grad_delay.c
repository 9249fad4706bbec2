/* grad_delay.c — the gradient delay line: a FIFO that hands back, at each push, the gradient
 * pushed d pushes earlier, so that any optimizer applies gradients d steps late (the
 * delayed-gradient studies: SGD, Adam fed g(t - d) at step t).
 *
 * Owns: d + 1 gradient buffers of n floats in the backend's memory (alloc(), so host memory on
 * the CPU and device memory on CUDA; the copies into them are the backend's stream-ordered
 * copy()). No threads; one thread uses a delay line at a time. Invariants: after k pushes the
 * buffer (k - 1) mod (d + 1) holds the newest gradient and the buffers of pushes k - d .. k - 1
 * are intact; the one returned by push() stays valid until the next push(). With d = 0 the
 * line owns no buffer and push() returns its argument. */
#include <stdlib.h>

#include "agent/train/backend.h"
#include "agent/train/internal.h"
#include "agent/train/train.h"

struct wagma_grad_delay {
  wagma_backend_t *be;
  size_t n;
  unsigned delay;
  float **slots; /* delay + 1 buffers, NULL when delay == 0 */
  uint64_t pushed;
};

/* Ownership: on success *out is a new delay line the caller frees with
 * wagma_grad_delay_destroy; be must outlive it. */
int wagma_grad_delay_create_on(wagma_backend_t *be, size_t n_params, unsigned delay,
                               wagma_grad_delay_t **out, char *err, size_t err_len) {
  int rc = WAGMA_EINVAL;
  wagma_grad_delay_t *q = NULL;
  if (!out || n_params == 0 || delay > WAGMA_GRAD_DELAY_MAX) {
    wg_errf(err, err_len, "bad gradient delay line: %zu parameters (> 0), delay %u (0..%u)",
            n_params, delay, (unsigned)WAGMA_GRAD_DELAY_MAX);
    goto out;
  }
  *out = NULL;
  rc = WAGMA_ENOMEM;
  if (!(q = calloc(1, sizeof(*q))))
    goto out;
  q->be = be ? be : wagma_backend_cpu();
  q->n = n_params;
  q->delay = delay;
  if (delay > 0) {
    if (!(q->slots = calloc((size_t)delay + 1, sizeof(*q->slots))))
      goto out;
    for (unsigned i = 0; i <= delay; i++)
      if (!(q->slots[i] = q->be->ops->alloc(q->be, n_params * sizeof(float)))) {
        wg_errf(err, err_len, "out of %s memory for %u delayed gradients of %zu floats",
                q->be->ops->kind, delay + 1, n_params);
        goto out;
      }
  }
  *out = q;
  q = NULL;
  rc = WAGMA_OK;
out:
  wagma_grad_delay_destroy(q);
  return rc;
}

void wagma_grad_delay_destroy(wagma_grad_delay_t *q) {
  if (!q)
    return;
  if (q->slots) {
    q->be->ops->sync(q->be);
    for (unsigned i = 0; i <= q->delay; i++)
      if (q->slots[i])
        q->be->ops->free(q->be, q->slots[i]);
    free(q->slots);
  }
  free(q);
}

const float *wagma_grad_delay_push(wagma_grad_delay_t *q, const float *grads) {
  if (q->delay == 0) {
    q->pushed++;
    return grads;
  }
  const uint64_t slots = (uint64_t)q->delay + 1;
  q->be->ops->copy(q->be, q->slots[q->pushed % slots], grads, q->n * sizeof(float));
  q->pushed++;
  if (q->pushed <= q->delay)
    return NULL; /* the first d steps have no gradient old enough */
  return q->slots[(q->pushed - 1 - q->delay) % slots];
}

unsigned wagma_grad_delay_length(const wagma_grad_delay_t *q) {
  return q->delay;
}

uint64_t wagma_grad_delay_pushed(const wagma_grad_delay_t *q) {
  return q->pushed;
}

void wagma_grad_delay_clear(wagma_grad_delay_t *q) {
  q->pushed = 0;
}

int wagma_optim_step_delayed(wagma_optim_t *o, wagma_grad_delay_t *q, uint64_t iteration,
                             float *params, const float *grads) {
  const float *g = wagma_grad_delay_push(q, grads);
  if (!g)
    return 0;
  wagma_optim_step(o, iteration, params, g);
  return 1;
}
