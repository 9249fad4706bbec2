/* tcp_seal.c — sealed frames of the TCP transport (wagma_comm_options_t.encrypt): AES-256-GCM
 * from OpenSSL's libcrypto over each frame after the handshake.
 *
 * Keys: one per direction of a connection, derived from the epoch's secret and the two fresh
 * nonces of that connection's handshake (wg_tcp_hello_mac under the label "wagma-seal-v1",
 * side D for the dialer's frames and A for the acceptor's), so no two connections, directions
 * or epochs share a key, and a key never travels. Nonce: 4 zero bytes, then the direction's
 * frame counter (64-bit little-endian, from 0): frames arrive in the order they were sent
 * (one TCP stream per direction), so both sides count alike, and a frame replayed, dropped,
 * reordered or moved to another connection fails to open. Each frame: its 64-byte header in
 * clear (it says the payload's length) and authenticated as additional data, the payload
 * encrypted (same length), then the 16-byte tag.
 *
 * Owns: the two EVP_CIPHER_CTX of a peer, keyed once at open; per frame only the IV changes.
 * Threads: none. The sending context is used under the peer's out_lock (tcp.c), the receiving
 * one by the holder of its reader role, so neither is ever used by two threads at once. */
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "tcp_internal.h"

static EVP_CIPHER_CTX *keyed_context(const uint8_t key[WG_SEAL_KEY_LEN], int encrypt) {
  EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
  if (ctx == NULL)
    return NULL;
  if (EVP_CipherInit_ex(ctx, EVP_aes_256_gcm(), NULL, key, NULL, encrypt) != 1) {
    EVP_CIPHER_CTX_free(ctx);
    return NULL;
  }
  return ctx;
}

int wg_seal_init(wg_seal_t *seal, const uint8_t tx_key[WG_SEAL_KEY_LEN],
                 const uint8_t rx_key[WG_SEAL_KEY_LEN]) {
  wg_seal_free(seal);
  seal->tx = keyed_context(tx_key, 1);
  seal->rx = keyed_context(rx_key, 0);
  seal->tx_count = seal->rx_count = 0;
  if (seal->tx == NULL || seal->rx == NULL) {
    wg_seal_free(seal);
    return WAGMA_EIO;
  }
  return 0;
}

void wg_seal_free(wg_seal_t *seal) {
  EVP_CIPHER_CTX_free(seal->tx); /* the context wipes its key */
  EVP_CIPHER_CTX_free(seal->rx);
  seal->tx = seal->rx = NULL;
}

/* Runs frame number count through ctx (keyed for encrypt or decrypt): the header as
 * additional data, then length bytes of in into out (may be the same buffer). EVP takes int
 * lengths: long payloads go through in pieces. 0 or WAGMA_EIO. */
static int run_cipher(EVP_CIPHER_CTX *ctx, int encrypt, uint64_t count,
                      const uint8_t header[WG_FRAME_HEADER_SIZE], const uint8_t *in, uint8_t *out,
                      size_t length) {
  const size_t piece_max = (size_t)1 << 30;
  uint8_t iv[12] = {0}; /* 4 zero bytes, then the frame counter */
  int n = 0;
  wg_le_put_u64(iv + 4, count);
  if (EVP_CipherInit_ex(ctx, NULL, NULL, NULL, iv, encrypt) != 1 ||
      EVP_CipherUpdate(ctx, NULL, &n, header, WG_FRAME_HEADER_SIZE) != 1)
    return WAGMA_EIO;
  for (size_t off = 0; off < length; off += piece_max) {
    size_t piece = length - off < piece_max ? length - off : piece_max;
    if (EVP_CipherUpdate(ctx, out + off, &n, in + off, (int)piece) != 1)
      return WAGMA_EIO;
  }
  return 0;
}

int wg_seal_frame(wg_seal_t *seal, const uint8_t header[WG_FRAME_HEADER_SIZE],
                  const uint8_t *payload, size_t length, uint8_t *out,
                  uint8_t tag[WG_SEAL_TAG_LEN]) {
  int n = 0;
  if (run_cipher(seal->tx, 1, seal->tx_count, header, payload, out, length) != 0 ||
      EVP_CipherFinal_ex(seal->tx, out + length, &n) != 1 ||
      EVP_CIPHER_CTX_ctrl(seal->tx, EVP_CTRL_GCM_GET_TAG, WG_SEAL_TAG_LEN, tag) != 1)
    return WAGMA_EIO;
  seal->tx_count++;
  return 0;
}

int wg_seal_open_frame(wg_seal_t *seal, const uint8_t header[WG_FRAME_HEADER_SIZE],
                       uint8_t *payload, size_t length, const uint8_t tag[WG_SEAL_TAG_LEN]) {
  uint8_t tag_copy[WG_SEAL_TAG_LEN], final[16];
  int n = 0;
  memcpy(tag_copy, tag, sizeof tag_copy);
  if (run_cipher(seal->rx, 0, seal->rx_count, header, payload, payload, length) != 0 ||
      EVP_CIPHER_CTX_ctrl(seal->rx, EVP_CTRL_GCM_SET_TAG, WG_SEAL_TAG_LEN, tag_copy) != 1)
    return WAGMA_EIO;
  if (EVP_CipherFinal_ex(seal->rx, final, &n) != 1) {
    OPENSSL_cleanse(payload, length); /* what did not authenticate is not handed on */
    return WAGMA_EPROTO;
  }
  seal->rx_count++;
  return 0;
}
