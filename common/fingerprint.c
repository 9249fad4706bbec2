/* common/fingerprint.c — wg_fingerprint (wagma/fingerprint_internal.h). Pure, no state. */
#include "wagma/fingerprint_internal.h"

#include <math.h>
#include <stdint.h>

void wg_fingerprint(const float *p, size_t n, double *out, int *nout) {
  uint64_t s = 0x5741474d41465031ull; /* fixed: "WAGMAFP1" */
  double d[4] = {0, 0, 0, 0}, sq = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    double x = p[i];
    for (int k = 0; k < 4; k++)
      d[k] += (z >> k) & 1u ? x : -x;
    sq += x * x;
  }
  for (int k = 0; k < 4; k++)
    out[k] = d[k];
  out[4] = sqrt(sq);
  *nout = WG_FINGERPRINT_LEN;
}
