/* raw_http.c — see raw_http.h. */
#define _GNU_SOURCE /* strcasestr, memmem */
#include "raw_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

double raw_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int raw_connect(const char *src, int port, double timeout_s) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  struct timeval tv = {.tv_sec = (time_t)timeout_s,
                       .tv_usec = (suseconds_t)((timeout_s - (double)(time_t)timeout_s) * 1e6)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (src) {
    struct sockaddr_in me = {.sin_family = AF_INET};
    inet_pton(AF_INET, src, &me.sin_addr);
    if (bind(fd, (struct sockaddr *)&me, sizeof me) != 0) {
      close(fd);
      return -1;
    }
  }
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static void header_value(const char *head, const char *hdr_end, const char *name, char *out,
                         size_t len) {
  char pat[64];
  snprintf(pat, sizeof pat, "\r\n%s:", name);
  const char *p = strcasestr(head, pat);
  out[0] = '\0';
  if (!p || p > hdr_end)
    return;
  p += strlen(pat);
  while (*p == ' ')
    p++;
  size_t n = strcspn(p, "\r\n");
  snprintf(out, len, "%.*s", (int)(n < len ? n : len - 1), p);
}

int raw_exchange(const char *src, int port, const void *bytes, size_t len, raw_answer_t *a, int max,
                 int *status_lines, double timeout_s) {
  int fd = raw_connect(src, port, timeout_s);
  if (status_lines)
    *status_lines = 0;
  if (fd < 0)
    return 0;
  for (size_t off = 0; off < len;) {
    ssize_t n = send(fd, (const char *)bytes + off, len - off, MSG_NOSIGNAL);
    if (n <= 0)
      break;
    off += (size_t)n;
  }
  size_t cap = 1 << 20, got = 0;
  char *buf = malloc(cap + 1);
  double deadline = raw_now() + timeout_s;
  while (buf && got < cap && raw_now() < deadline) {
    ssize_t n = recv(fd, buf + got, cap - got, 0);
    if (n <= 0)
      break;
    got += (size_t)n;
  }
  close(fd);
  if (!buf)
    return 0;
  buf[got] = '\0';
  /* Status lines anywhere in the stream (an answer's body may be followed directly by the
   * next status line), as "HTTP/1.x NNN ". */
  if (status_lines)
    for (const char *p = buf; (p = memmem(p, got - (size_t)(p - buf), "HTTP/1.", 7)); p += 7)
      if ((size_t)(p - buf) + 13 <= got && p[8] == ' ' && p[9] >= '1' && p[9] <= '5' &&
          p[12] == ' ')
        ++*status_lines;
  int count = 0;
  const char *p = buf, *end = buf + got;
  while (count < max && end - p > 12 && strncmp(p, "HTTP/1.", 7) == 0) {
    raw_answer_t *r = &a[count++];
    memset(r, 0, sizeof *r);
    r->status = atoi(p + 9);
    const char *hdr_end = strstr(p, "\r\n\r\n");
    if (!hdr_end)
      break;
    char cl[32];
    header_value(p, hdr_end, "Content-Length", cl, sizeof cl);
    header_value(p, hdr_end, "Content-Type", r->content_type, sizeof r->content_type);
    header_value(p, hdr_end, "Retry-After", r->retry_after, sizeof r->retry_after);
    size_t clen = strtoul(cl, NULL, 10);
    const char *body = hdr_end + 4;
    if (clen > (size_t)(end - body))
      clen = (size_t)(end - body);
    r->body_len = clen;
    snprintf(r->body, sizeof r->body, "%.*s", (int)clen, body);
    p = body + clen;
  }
  free(buf);
  return count;
}

double raw_get_timed(const char *src, int port, const char *path, int *status, double timeout_s) {
  char req[512];
  int n = snprintf(req, sizeof req,
                   "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", path);
  double t0 = raw_now();
  *status = 0;
  int fd = raw_connect(src, port, timeout_s);
  if (fd < 0)
    return timeout_s;
  if (send(fd, req, (size_t)n, MSG_NOSIGNAL) != n) {
    close(fd);
    return timeout_s;
  }
  char buf[16384];
  size_t got = 0;
  while (got < sizeof buf - 1 && raw_now() - t0 < timeout_s) {
    ssize_t r = recv(fd, buf + got, sizeof buf - 1 - got, 0);
    if (r <= 0)
      break;
    got += (size_t)r;
    buf[got] = '\0';
    const char *he = strstr(buf, "\r\n\r\n");
    if (he) {
      char cl[32];
      header_value(buf, he, "Content-Length", cl, sizeof cl);
      if ((size_t)(he + 4 - buf) + strtoul(cl, NULL, 10) <= got)
        break;
    }
  }
  close(fd);
  double dt = raw_now() - t0;
  if (got > 12 && strncmp(buf, "HTTP/1.", 7) == 0)
    *status = atoi(buf + 9);
  return *status ? dt : timeout_s;
}
