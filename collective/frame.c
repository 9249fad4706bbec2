/* frame.c — encoding and validation of the 64-byte frame header (frame.h).
 *
 * Owns nothing and has no state: pure functions, safe from any thread.
 * Layout (all little-endian, offsets in bytes):
 *   0 magic u32 | 4 version u16 | 6 kind u16 | 8 epoch u64 | 16 round u64 | 24 group u32 |
 *  28 src u32 | 32 seq u64 | 40 length u64 | 48 aux u64 | 56 flags u32 | 60 reserved u32
 * Invariant: wg_frame_decode fills *out only when every check passed, so a caller never sees
 * (or allocates for) a header that was not validated. */
#include "frame.h"

#include "wagma/status.h"

static void put_u16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}

static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get_u16(const uint8_t *p) {
  return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get_u32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--)
    v = (v << 8) | p[i];
  return v;
}

static uint64_t get_u64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = (v << 8) | p[i];
  return v;
}

void wg_frame_encode(const wg_frame_header_t *header, uint8_t out[WG_FRAME_HEADER_SIZE]) {
  put_u32(out + 0, header->magic);
  put_u16(out + 4, header->version);
  put_u16(out + 6, header->kind);
  put_u64(out + 8, header->epoch);
  put_u64(out + 16, header->round);
  put_u32(out + 24, header->group);
  put_u32(out + 28, header->src);
  put_u64(out + 32, header->seq);
  put_u64(out + 40, header->length);
  put_u64(out + 48, header->aux);
  put_u32(out + 56, header->flags);
  put_u32(out + 60, header->reserved);
}

int wg_frame_decode(const uint8_t *in, size_t len, uint64_t expected_epoch, uint32_t nranks,
                    uint64_t max_payload, wg_frame_header_t *out) {
  if (in == NULL || len < WG_FRAME_HEADER_SIZE)
    return WAGMA_EPROTO;
  wg_frame_header_t h;
  h.magic = get_u32(in + 0);
  h.version = get_u16(in + 4);
  h.kind = get_u16(in + 6);
  h.epoch = get_u64(in + 8);
  h.round = get_u64(in + 16);
  h.group = get_u32(in + 24);
  h.src = get_u32(in + 28);
  h.seq = get_u64(in + 32);
  h.length = get_u64(in + 40);
  h.aux = get_u64(in + 48);
  h.flags = get_u32(in + 56);
  h.reserved = get_u32(in + 60);

  if (h.magic != WG_FRAME_MAGIC || h.version != WG_FRAME_VERSION)
    return WAGMA_EPROTO;
  if (h.kind < WG_FRAME_HELLO || h.kind > WG_FRAME_KIND_MAX)
    return WAGMA_EPROTO;
  if (h.reserved != 0 || h.length > max_payload || h.src >= nranks)
    return WAGMA_EPROTO;
  if (h.epoch != expected_epoch)
    return WAGMA_EEPOCH;
  if (out != NULL)
    *out = h;
  return 0;
}
