/* fuzz_frame.c — libFuzzer target: wg_frame_decode on arbitrary bytes, with parameters taken
 * from the input. Decode must never read past len, and a header it accepts must satisfy every
 * documented bound and re-encode to the same 64 bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "wagma/status.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint64_t epoch = 3, max_payload = 1u << 20;
  uint32_t nranks = 8;
  if (size >= 1) { /* the first byte picks the decoder's parameters */
    epoch = data[0] & 7u;
    nranks = 1u + (data[0] >> 3);
    max_payload = (uint64_t)1 << (data[0] & 31u);
    data++;
    size--;
  }
  uint8_t *copy = malloc(size ? size : 1); /* exact size: ASan sees any overread */
  if (copy == NULL)
    return 0;
  memcpy(copy, data, size);
  wg_frame_header_t h;
  int rc = wg_frame_decode(copy, size, epoch, nranks, max_payload, &h);
  if (rc == 0) {
    uint8_t again[WG_FRAME_HEADER_SIZE];
    wg_frame_encode(&h, again);
    if (memcmp(again, copy, WG_FRAME_HEADER_SIZE) != 0 || h.epoch != epoch || h.src >= nranks ||
        h.length > max_payload || h.reserved != 0 || h.kind < 1 || h.kind > WG_FRAME_KIND_MAX)
      abort();
  } else if (rc != WAGMA_EPROTO && rc != WAGMA_EEPOCH) {
    abort();
  }
  free(copy);
  return 0;
}
