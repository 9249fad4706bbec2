/* coordinator/http_head.c — checks the head (request line and header fields) of one HTTP/1.x
 * request as it arrives on the wire, for the connection front (front.c), before
 * libmicrohttpd sees a byte of it.
 *
 * Why: libmicrohttpd answers the requests it cannot parse itself (414, 431, 505, a bad
 * Content-Length, ...) with fixed HTML bodies, and for a bad Content-Length 0.9.75 sends the
 * status line and headers twice. The front refuses such a request with the documented JSON
 * error instead, so libmicrohttpd only ever sees heads that this parser accepted: a request
 * line "METHOD SP target SP HTTP/1.d" within the line limit, header fields "name: value"
 * without folding or control characters, at most one Content-Length of decimal digits and no
 * Transfer-Encoding (bodies are framed by Content-Length only: 411 otherwise).
 *
 * Pure: no allocation, no state between calls (the front calls it again on the whole head
 * as more bytes arrive); thread-safe. Fuzzed by tests/fuzz/coordinator/fuzz_http_head.c. */
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "http.h"
#include "http_head.h"

/* RFC 9110 tchar: the characters of a method or a field name. */
static int tchar(uint8_t c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
    return 1;
  return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static int bad(wg_http_head_t *h, int status, const char *code, const char *why) {
  h->status = status;
  h->code = code;
  h->why = why;
  return WG_HEAD_BAD;
}

/* Checks the bytes of a request line seen so far (no LF yet, or the whole line without its
 * line end): 0 when they can still start a valid line, else the refusal. */
static int check_line(const uint8_t *p, size_t n, int complete, wg_http_head_t *h) {
  size_t i = 0, m = 0;
  while (i < n && tchar(p[i]))
    i++;
  m = i;
  if (i < n && (p[i] != ' ' || m == 0))
    return bad(h, 400, "bad_request", "malformed request line (method)");
  if (m >= sizeof h->method)
    return bad(h, 400, "bad_request", "malformed request line (method too long)");
  memcpy(h->method, p, m);
  h->method[m] = '\0';
  if (i == n)
    return complete ? bad(h, 400, "bad_request", "malformed request line") : 0;
  size_t t0 = ++i;
  while (i < n && p[i] > 0x20 && p[i] != 0x7f)
    i++;
  if (i < n && (p[i] != ' ' || i == t0))
    return bad(h, 400, "bad_request",
               p[i] == ' ' ? "malformed request line (empty target)"
                           : "malformed request line (a control character, space or NUL in "
                             "the request target)");
  if (i == n)
    return complete ? bad(h, 400, "bad_request", "malformed request line (no HTTP version)") : 0;
  i++;
  static const char proto[] = "HTTP/";
  size_t v = n - i; /* bytes of the version seen */
  if (!complete && v == 9 && p[n - 1] == '\r')
    v = 8; /* the CR of the line end, its LF still to come */
  for (size_t k = 0; k < v && k < 8; k++) {
    uint8_t c = p[i + k];
    int ok = k < 5 ? c == (uint8_t)proto[k] : k == 6 ? c == '.' : (c >= '0' && c <= '9');
    if (!ok)
      return bad(h, 400, "bad_request", "malformed request line (HTTP version)");
  }
  if (v > 8)
    return bad(h, 400, "bad_request", "malformed request line (after the HTTP version)");
  if (!complete)
    return 0;
  if (v != 8)
    return bad(h, 400, "bad_request", "malformed request line (HTTP version)");
  if (p[i + 5] != '1')
    return bad(h, 505, "http_version_not_supported", "only HTTP/1.0 and HTTP/1.1 are served");
  return 0;
}

/* Finds the next line end at or after *pos: LF, optionally preceded by CR. Returns the
 * line's length without its end and moves *pos past the end, or -1 when no LF came yet, or
 * -2 when a CR is not followed by LF. */
static long next_line(const uint8_t *p, size_t n, size_t *pos) {
  for (size_t i = *pos; i < n; i++) {
    if (p[i] == '\n') {
      long len = (long)(i - *pos);
      if (len > 0 && p[i - 1] == '\r')
        len--;
      *pos = i + 1;
      return len;
    }
    if (p[i] == '\r' && i + 1 < n && p[i + 1] != '\n')
      return -2;
  }
  return -1;
}

/* One header field line (without its end): name ":" OWS value OWS. */
static int check_field(const uint8_t *p, size_t n, wg_http_head_t *h, int *seen_length) {
  size_t i = 0;
  if (n > 0 && (p[0] == ' ' || p[0] == '\t'))
    return bad(h, 400, "bad_request", "folded header field (obs-fold) not accepted");
  while (i < n && tchar(p[i]))
    i++;
  if (i == 0 || i == n || p[i] != ':')
    return bad(h, 400, "bad_request", "malformed header field (want name: value)");
  size_t name_len = i++;
  while (i < n && (p[i] == ' ' || p[i] == '\t'))
    i++;
  size_t v0 = i, v1 = n;
  while (v1 > v0 && (p[v1 - 1] == ' ' || p[v1 - 1] == '\t'))
    v1--;
  for (size_t k = v0; k < v1; k++)
    if ((p[k] < 0x20 && p[k] != '\t') || p[k] == 0x7f)
      return bad(h, 400, "bad_request", "a control character in a header field");
  if (name_len == 17 && strncasecmp((const char *)p, "transfer-encoding", 17) == 0)
    return bad(h, 411, "length_required",
               "request bodies must have a Content-Length (no Transfer-Encoding)");
  if (name_len == 14 && strncasecmp((const char *)p, "content-length", 14) == 0) {
    if (*seen_length)
      return bad(h, 400, "bad_request", "more than one Content-Length");
    *seen_length = 1;
    if (v1 == v0)
      return bad(h, 400, "bad_request", "Content-Length is not a decimal number");
    uint64_t len = 0;
    for (size_t k = v0; k < v1; k++) {
      if (p[k] < '0' || p[k] > '9')
        return bad(h, 400, "bad_request", "Content-Length is not a decimal number");
      if (len > WG_HTTP_CONTENT_LENGTH_MAX / 10)
        return bad(h, 413, "too_large", "Content-Length is beyond any limit");
      len = len * 10 + (uint64_t)(p[k] - '0');
    }
    if (len > WG_HTTP_CONTENT_LENGTH_MAX)
      return bad(h, 413, "too_large", "Content-Length is beyond any limit");
    h->content_length = len;
  }
  return 0;
}

int wg_http_head_parse(const char *buf, size_t n, const wg_http_limits_t *lim, wg_http_head_t *h) {
  const uint8_t *p = (const uint8_t *)buf;
  size_t pos = 0, skip = 0;
  int seen_length = 0, nfields = 0, e;
  memset(h, 0, sizeof *h);
  /* Empty lines before the request line are ignored (RFC 9112 2.2), within the line limit. */
  while (skip < n && (p[skip] == '\n' || (p[skip] == '\r' && skip + 1 < n && p[skip + 1] == '\n')))
    skip += p[skip] == '\r' ? 2 : 1;
  if (skip > lim->max_line)
    return bad(h, 400, "bad_request", "too many empty lines before the request line");
  if (skip == n || (skip + 1 == n && p[skip] == '\r'))
    return WG_HEAD_MORE;
  pos = skip;
  long len = next_line(p, n, &pos);
  if (len == -2)
    return bad(h, 400, "bad_request", "a CR without LF in the request line");
  if (len == -1) {
    if ((e = check_line(p + skip, n - skip, 0, h)))
      return e;
    if (n - skip > lim->max_line + 1)
      return bad(h, 414, "uri_too_long", "the request line is longer than the limit");
    return WG_HEAD_MORE;
  }
  if ((size_t)len > lim->max_line)
    return bad(h, 414, "uri_too_long", "the request line is longer than the limit");
  if ((e = check_line(p + skip, (size_t)len, 1, h)))
    return e;
  for (;;) {
    size_t start = pos;
    len = next_line(p, n, &pos);
    if (len == -2)
      return bad(h, 400, "bad_request", "a CR without LF in a header field");
    if (len == -1) {
      if (n - skip > lim->max_head)
        return bad(h, 431, "headers_too_large", "the request head is larger than the limit");
      /* Refuse what is already wrong in the partial line (a slow client is told early). */
      if (n > start && (p[start] == ' ' || p[start] == '\t'))
        return bad(h, 400, "bad_request", "folded header field (obs-fold) not accepted");
      return WG_HEAD_MORE;
    }
    if (pos - skip > lim->max_head)
      return bad(h, 431, "headers_too_large", "the request head is larger than the limit");
    if (len == 0)
      break;
    if (++nfields > lim->max_fields)
      return bad(h, 431, "headers_too_large", "too many header fields");
    if ((e = check_field(p + start, (size_t)len, h, &seen_length)))
      return e;
  }
  h->skip = skip;
  h->len = pos - skip;
  return WG_HEAD_OK;
}
