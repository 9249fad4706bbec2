/* util.c — hashing shared by the wagma_train sources (detail messages use wg_errf).
 * No state, no threads. */

#include "agent/train/internal.h"

uint64_t wg_fnv1a(uint64_t h, const void *data, size_t len) {
  const unsigned char *p = data;
  for (size_t i = 0; i < len; i++)
    h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}
