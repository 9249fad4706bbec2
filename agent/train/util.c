/* util.c — error-message formatting and hashing shared by the wagma_train sources.
 * No state, no threads. */
#include <stdarg.h>
#include <stdio.h>

#include "agent/train/internal.h"

void wg_train_errf(char *err, size_t err_len, const char *fmt, ...) {
  if (!err || !err_len)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, err_len, fmt, ap);
  va_end(ap);
}

uint64_t wg_fnv1a(uint64_t h, const void *data, size_t len) {
  const unsigned char *p = data;
  for (size_t i = 0; i < len; i++)
    h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}
