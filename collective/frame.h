/* frame.h — the wire format of the collective's messages (private to collective/).
 *
 * A frame is a fixed 64-byte header, little-endian, followed by `length` payload bytes.
 * The header is validated (magic, version, kind, epoch, src, length, reserved bits) before
 * any payload buffer is allocated or touched. */
#ifndef WAGMA_COLLECTIVE_FRAME_H
#define WAGMA_COLLECTIVE_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define WG_FRAME_MAGIC 0x414d4757u /* "WGMA" read as little-endian u32 */
#define WG_FRAME_VERSION 1u
#define WG_FRAME_HEADER_SIZE 64u

typedef enum wg_frame_kind {
  WG_FRAME_HELLO = 1,       /* connection handshake: epoch, src rank */
  WG_FRAME_ACTIVATE = 2,    /* round (epoch, round, group) activated: send your snapshot */
  WG_FRAME_CONTRIB = 3,     /* a member's snapshot for a round; aux = snapshot version */
  WG_FRAME_RESULT = 4,      /* a round's mean and who contributed */
  WG_FRAME_COLL = 5,        /* data of a blocking collective; seq orders its steps */
  WG_FRAME_CATCHUP_REQ = 6, /* a member behind asks for the latest global mean */
  WG_FRAME_CATCHUP_REP = 7, /* the latest global mean; round = its global round */
  WG_FRAME_BYE = 8,         /* orderly close */
  WG_FRAME_KIND_MAX = 8,
} wg_frame_kind_t;

typedef struct wg_frame_header {
  uint32_t magic;
  uint16_t version;
  uint16_t kind; /* wg_frame_kind_t */
  uint64_t epoch;
  uint64_t round;
  uint32_t group;
  uint32_t src;      /* sender's rank */
  uint64_t seq;      /* kind-specific ordering (collective step, request id) */
  uint64_t length;   /* payload bytes that follow */
  uint64_t aux;      /* kind-specific: snapshot version, contributor count, ... */
  uint32_t flags;    /* kind-specific flag bits */
  uint32_t reserved; /* must be 0 */
} wg_frame_header_t;

/* Little-endian stores and loads, for the header and the engine's payloads (engine_codec.c). */
static inline void wg_le_put_u16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}

static inline void wg_le_put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

static inline void wg_le_put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint16_t wg_le_get_u16(const uint8_t *p) {
  return (uint16_t)(p[0] | (p[1] << 8));
}

static inline uint32_t wg_le_get_u32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--)
    v = (v << 8) | p[i];
  return v;
}

static inline uint64_t wg_le_get_u64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = (v << 8) | p[i];
  return v;
}

/* Writes the 64-byte little-endian encoding of *header into out. */
void wg_frame_encode(const wg_frame_header_t *header, uint8_t out[WG_FRAME_HEADER_SIZE]);

/* Decodes and validates a header from len bytes at in.
 * Returns 0, WAGMA_EPROTO (len < 64, bad magic/version/kind/reserved, length > max_payload,
 * src >= nranks) or WAGMA_EEPOCH (epoch != expected_epoch). *out is filled only on success. */
int wg_frame_decode(const uint8_t *in, size_t len, uint64_t expected_epoch, uint32_t nranks,
                    uint64_t max_payload, wg_frame_header_t *out);

#endif
