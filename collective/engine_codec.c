/* engine_codec.c — the byte layout of the engine's payloads, little-endian like the frame
 * header (frame.c), so the wire format does not depend on the host.
 *
 * Owns: nothing (pure functions). Threads: any. */
#include <string.h>

#include "engine_internal.h"

static int host_is_le(void) {
  const uint16_t one = 1;
  uint8_t b;
  memcpy(&b, &one, 1);
  return b == 1;
}

void wg_codec_put_floats(uint8_t *out, const float *in, size_t n) {
  if (host_is_le()) {
    memcpy(out, in, n * sizeof(float));
    return;
  }
  for (size_t i = 0; i < n; i++) {
    uint32_t v;
    memcpy(&v, &in[i], 4);
    wg_le_put_u32(out + 4 * i, v);
  }
}

void wg_codec_get_floats(float *out, const uint8_t *in, size_t n) {
  if (host_is_le()) {
    memcpy(out, in, n * sizeof(float));
    return;
  }
  for (size_t i = 0; i < n; i++) {
    uint32_t v = wg_le_get_u32(in + 4 * i);
    memcpy(&out[i], &v, 4);
  }
}

const float *wg_codec_floats_view(const uint8_t *in) {
  if (!host_is_le() || ((uintptr_t)in % _Alignof(float)) != 0)
    return NULL;
  return (const float *)(const void *)in;
}

size_t wg_codec_list_size(int n) {
  return (size_t)n * (sizeof(int32_t) + sizeof(uint64_t));
}

void wg_codec_list_encode(uint8_t *out, int n, const int *ranks, const uint64_t *versions) {
  for (int i = 0; i < n; i++)
    wg_le_put_u32(out + 4 * (size_t)i, (uint32_t)(int32_t)ranks[i]);
  out += 4 * (size_t)n;
  for (int i = 0; i < n; i++)
    wg_le_put_u64(out + 8 * (size_t)i, versions[i]);
}

int wg_codec_list_decode(const uint8_t *in, int n, int nranks, int *ranks, uint64_t *versions) {
  for (int i = 0; i < n; i++) {
    int32_t r = (int32_t)wg_le_get_u32(in + 4 * (size_t)i);
    if (r < 0 || r >= nranks)
      return WAGMA_EPROTO;
    ranks[i] = r;
  }
  in += 4 * (size_t)n;
  for (int i = 0; i < n; i++)
    versions[i] = wg_le_get_u64(in + 8 * (size_t)i);
  return 0;
}

size_t wg_codec_result_size(size_t count, int n) {
  return count * sizeof(float) + wg_codec_list_size(n);
}

void wg_codec_result_encode(uint8_t *out, const float *mean, size_t count, int n, const int *ranks,
                            const uint64_t *versions) {
  wg_codec_put_floats(out, mean, count);
  wg_codec_list_encode(out + count * sizeof(float), n, ranks, versions);
}

int wg_codec_result_decode(const uint8_t *in, size_t count, int n, int nranks, float *mean,
                           int *ranks, uint64_t *versions) {
  if (wg_codec_list_decode(in + count * sizeof(float), n, nranks, ranks, versions) != 0)
    return WAGMA_EPROTO;
  if (mean)
    wg_codec_get_floats(mean, in, count);
  return 0;
}
