/* coordinator/http_head.h — request heads checked before libmicrohttpd sees them (http_head.c,
 * pure; fuzzed). */
#ifndef WAGMA_COORD_HTTP_HEAD_H
#define WAGMA_COORD_HTTP_HEAD_H

#include <stddef.h>
#include <stdint.h>

typedef struct wg_http_limits {
  size_t max_line; /* request line without its end; longer: 414 */
  size_t max_head; /* everything from the request line to the blank line; larger: 431 */
  int max_fields;  /* header fields; more: 431 */
} wg_http_limits_t;

enum { WG_HEAD_MORE = 0, WG_HEAD_OK = 1, WG_HEAD_BAD = 2 };

typedef struct wg_http_head {
  size_t skip;             /* WG_HEAD_OK: empty lines before the request line (not forwarded) */
  size_t len;              /* WG_HEAD_OK: the head after them, blank line included */
  uint64_t content_length; /* WG_HEAD_OK: body bytes that follow (0 without Content-Length) */
  char method[16];         /* the method when the request line got that far, else "" */
  int status;              /* WG_HEAD_BAD: 400, 411, 413, 414, 431 or 505 */
  const char *code;        /* WG_HEAD_BAD: the error code (docs/api.md) */
  const char *why;         /* WG_HEAD_BAD: static text */
} wg_http_head_t;

/* Checks the n bytes of one request head at the start of buf (what arrived so far):
 * WG_HEAD_MORE (nothing wrong yet, need more bytes), WG_HEAD_OK or WG_HEAD_BAD (*h says
 * why). Pure. */
int wg_http_head_parse(const char *buf, size_t n, const wg_http_limits_t *lim, wg_http_head_t *h);

#endif
