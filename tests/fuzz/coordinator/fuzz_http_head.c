/* libFuzzer target: the connection front's request head check (http_head.c) and the list's
 * continue token decoder (pages.c) on arbitrary bytes. Invariants: no crash and no read past
 * the input; a result is MORE, OK or BAD; OK means a head within the limits, no longer than
 * the input, ending in a blank line, with a method; BAD comes with a documented status, code
 * and reason; every proper prefix of an accepted head is MORE (a head is never accepted or
 * refused before its bytes say so); a decoded token names a valid job id at a level within
 * it, and encodes back to the same token. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coord.h"
#include "http_head.h"
#include "pages.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const wg_http_limits_t lim = {.max_line = 96, .max_head = 512, .max_fields = 8};
  char *buf = malloc(size ? size : 1); /* exactly size bytes: ASan sees any overread */
  if (!buf)
    return 0;
  memcpy(buf, data, size);
  wg_http_head_t h;
  int r = wg_http_head_parse(buf, size, &lim, &h);
  if (r != WG_HEAD_MORE && r != WG_HEAD_OK && r != WG_HEAD_BAD)
    abort();
  if (r == WG_HEAD_OK) {
    if (h.skip + h.len > size || h.len > lim.max_head || h.len < 4 || !h.method[0])
      abort();
    const char *end = buf + h.skip + h.len;
    if (end[-1] != '\n')
      abort();
    for (size_t n = h.skip + 1; n < h.skip + h.len; n++) {
      wg_http_head_t p;
      if (wg_http_head_parse(buf, n, &lim, &p) != WG_HEAD_MORE)
        abort();
    }
  }
  if (r == WG_HEAD_BAD) {
    static const int ok[] = {400, 411, 413, 414, 431, 505};
    int found = 0;
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
      found |= h.status == ok[i];
    if (!found || !h.code || !h.why)
      abort();
  }
  if (size < 256) {
    char tok[256];
    memcpy(tok, data, size);
    tok[size] = '\0';
    wg_walk_pos_t pos;
    if (wg_list_token_decode(tok, &pos) == 0) {
      char again[WG_LIST_TOKEN_MAX];
      if (!wagma_api_name_valid(pos.last) || pos.level < 0 || pos.level > (int)strlen(pos.last) ||
          wg_list_token_encode(&pos, again, sizeof again) != 0 || strcmp(again, tok) != 0)
        abort();
    }
  }
  free(buf);
  return 0;
}
