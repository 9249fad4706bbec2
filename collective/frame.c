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

void wg_frame_encode(const wg_frame_header_t *header, uint8_t out[WG_FRAME_HEADER_SIZE]) {
  wg_le_put_u32(out + 0, header->magic);
  wg_le_put_u16(out + 4, header->version);
  wg_le_put_u16(out + 6, header->kind);
  wg_le_put_u64(out + 8, header->epoch);
  wg_le_put_u64(out + 16, header->round);
  wg_le_put_u32(out + 24, header->group);
  wg_le_put_u32(out + 28, header->src);
  wg_le_put_u64(out + 32, header->seq);
  wg_le_put_u64(out + 40, header->length);
  wg_le_put_u64(out + 48, header->aux);
  wg_le_put_u32(out + 56, header->flags);
  wg_le_put_u32(out + 60, header->reserved);
}

int wg_frame_decode(const uint8_t *in, size_t len, uint64_t expected_epoch, uint32_t nranks,
                    uint64_t max_payload, wg_frame_header_t *out) {
  if (in == NULL || len < WG_FRAME_HEADER_SIZE)
    return WAGMA_EPROTO;
  wg_frame_header_t h;
  h.magic = wg_le_get_u32(in + 0);
  h.version = wg_le_get_u16(in + 4);
  h.kind = wg_le_get_u16(in + 6);
  h.epoch = wg_le_get_u64(in + 8);
  h.round = wg_le_get_u64(in + 16);
  h.group = wg_le_get_u32(in + 24);
  h.src = wg_le_get_u32(in + 28);
  h.seq = wg_le_get_u64(in + 32);
  h.length = wg_le_get_u64(in + 40);
  h.aux = wg_le_get_u64(in + 48);
  h.flags = wg_le_get_u32(in + 56);
  h.reserved = wg_le_get_u32(in + 60);

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
