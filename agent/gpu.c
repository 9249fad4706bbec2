/* gpu.c — which CUDA_VISIBLE_DEVICES names the agent's GPU (gpu.h). Owns nothing; no threads. */
#include "agent/gpu.h"

#include <stdio.h>
#include <string.h>

int wg_gpu_visible_devices(const char *inherited, int index, char *out, size_t out_len, char *err,
                           size_t err_len) {
  if (index < 0 || index > WG_GPU_MAX) {
    snprintf(err, err_len, "--gpu must be 0..%d (got %d)", WG_GPU_MAX, index);
    return -1;
  }
  if (!inherited) {
    if ((size_t)snprintf(out, out_len, "%d", index) >= out_len) {
      snprintf(err, err_len, "--gpu %d: no room for its name", index);
      return -1;
    }
    return 0;
  }
  int n = 0;
  const char *p = inherited;
  for (;;) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    while (len > 0 && (*p == ' ' || *p == '\t')) {
      p++;
      len--;
    }
    while (len > 0 && (p[len - 1] == ' ' || p[len - 1] == '\t'))
      len--;
    if (len == 0 && (end || n > 0 || *inherited)) {
      snprintf(err, err_len, "--gpu %d: CUDA_VISIBLE_DEVICES='%s' has an empty entry", index,
               inherited);
      return -1;
    }
    if (len == 0) {
      snprintf(err, err_len, "--gpu %d: CUDA_VISIBLE_DEVICES is empty: no GPU is visible", index);
      return -1;
    }
    if (n == index) {
      if (len + 1 > out_len) {
        snprintf(err, err_len, "--gpu %d: its entry in CUDA_VISIBLE_DEVICES is too long", index);
        return -1;
      }
      memcpy(out, p, len);
      out[len] = '\0';
      return 0;
    }
    n++;
    if (!end)
      break;
    p = end + 1;
  }
  snprintf(err, err_len, "--gpu %d: CUDA_VISIBLE_DEVICES='%s' lists %d device%s", index, inherited,
           n, n == 1 ? "" : "s");
  return -1;
}
