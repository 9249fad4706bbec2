/* wagma/fingerprint_internal.h — a model's fingerprint, the same function in every process that
 * reports a final model (the agent's built-in trainer, libwagma): its projections on 4 fixed
 * pseudo-random +-1 vectors (one splitmix64 draw per parameter from a fixed seed; bit k is the
 * sign in projection k), then the L2 norm. Two members' models differ by about |x - y| in each
 * projection, so the spread of the fingerprints over the members measures how far apart the
 * models are (docs/api.md, progress "fingerprint"). Internal (wg_ prefix). Pure. */
#ifndef WAGMA_FINGERPRINT_INTERNAL_H
#define WAGMA_FINGERPRINT_INTERNAL_H

#include <stddef.h>

#define WG_FINGERPRINT_LEN 5

/* out: WG_FINGERPRINT_LEN values; *nout = WG_FINGERPRINT_LEN. */
void wg_fingerprint(const float *p, size_t n, double *out, int *nout);

#endif
