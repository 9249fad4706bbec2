/* coordinator/http.c — the libmicrohttpd glue.
 *
 * Owns the MHD daemon (an epoll thread pool of c->threads threads). Per request it keeps a copy
 * of the raw request target (MHD's URI log callback runs before MHD decodes anything; the copy
 * lives in the request's conn_ctx_t, which the callback allocates), accumulates the body up to
 * c->max_body bytes (beyond that the rest is read and discarded and the request is answered
 * 413), collects headers and query arguments into a wg_request_t, calls wg_handle and queues
 * the response. Handlers run on the pool threads.
 *
 * Why the raw target: MHD hands the handler the percent-decoded path as a C string, so a %00
 * or a raw NUL byte cuts it short ("/v1/jobs/x%00/../y" would reach job x). wg_handle checks
 * the raw bytes (wg_route_target_check) before routing. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <errno.h>
#include <microhttpd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coord.h"
#include "wagma/log_internal.h"

typedef struct conn_ctx {
  char *target;        /* the raw request target, copied by on_uri before MHD decodes it in place */
  int started_handler; /* on_request has seen this request once */
  char *body;
  size_t len, cap;
  int too_large;
  double started;
  wg_request_t req;
} conn_ctx_t;

/* MHD's URI log callback: called once per request with the raw target (path and query, not
 * yet decoded; a raw NUL byte on the wire ends the string early). Its result becomes the
 * request's *con_cls. NULL (out of memory) makes on_request refuse the request. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *conn) {
  (void)cls;
  (void)conn;
  conn_ctx_t *ctx = calloc(1, sizeof *ctx);
  if (!ctx)
    return NULL;
  ctx->target = strdup(uri ? uri : "");
  if (!ctx->target) {
    free(ctx);
    return NULL;
  }
  return ctx;
}

/* 1 when a raw NUL byte sat inside the target on the request line. MHD before 1.0 parses
 * the request line in place: the handler's url starts where the target started, and the
 * version ("HTTP/1.1") follows the target after one byte that MHD set to NUL; when the span
 * between them is longer than the copy on_uri took, the copy was cut short by a raw NUL.
 * MHD 1.0 and later close such connections themselves, before any callback. */
static int raw_nul_in_target(const char *target, const char *url, const char *version) {
#if MHD_VERSION < 0x01000000
  uintptr_t u = (uintptr_t)url, v = (uintptr_t)version;
  if (!url || !version || v <= u || v - u > ((size_t)1 << 20) || strncmp(version, "HTTP/", 5) != 0)
    return 0;
  return version[-1] == '\0' && v - u - 1 > strlen(target);
#else
  (void)target;
  (void)url;
  (void)version;
  return 0;
#endif
}

static enum MHD_Result collect_query(void *cls, enum MHD_ValueKind kind, const char *key,
                                     const char *value) {
  (void)kind;
  wg_request_t *req = cls;
  if (req->nquery < WG_MAX_QUERY && key) {
    req->query_key[req->nquery] = key;
    req->query_value[req->nquery] = value;
    req->nquery++;
  }
  return MHD_YES;
}

static void add_body(conn_ctx_t *ctx, const char *data, size_t n, size_t max) {
  if (ctx->too_large)
    return;
  if (ctx->len + n > max) {
    ctx->too_large = 1;
    free(ctx->body);
    ctx->body = NULL;
    ctx->len = ctx->cap = 0;
    return;
  }
  if (ctx->len + n + 1 > ctx->cap) {
    size_t cap = ctx->cap ? ctx->cap : 1024;
    while (cap < ctx->len + n + 1)
      cap *= 2;
    char *nb = realloc(ctx->body, cap);
    if (!nb) {
      ctx->too_large = 1; /* answered 413: we cannot hold it */
      free(ctx->body);
      ctx->body = NULL;
      ctx->len = ctx->cap = 0;
      return;
    }
    ctx->body = nb;
    ctx->cap = cap;
  }
  memcpy(ctx->body + ctx->len, data, n);
  ctx->len += n;
  ctx->body[ctx->len] = '\0';
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls) {
  wg_coord_t *c = cls;
  conn_ctx_t *ctx = *con_cls;
  if (!ctx)
    return MHD_NO; /* on_uri ran out of memory: without the raw target, refuse */
  if (!ctx->started_handler) {
    ctx->started_handler = 1;
    ctx->started = wg_mono();
    const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
    if (cl && strtoull(cl, NULL, 10) > c->max_body)
      ctx->too_large = 1;
    /* With a raw NUL inside the target, pass the bytes up to and including it (the copy's
     * own terminator), so wg_handle sees the NUL. */
    ctx->req.target = ctx->target;
    ctx->req.target_len =
        strlen(ctx->target) + (raw_nul_in_target(ctx->target, url, version) ? 1 : 0);
    return MHD_YES;
  }
  if (*upload_data_size) {
    add_body(ctx, upload_data, *upload_data_size, c->max_body);
    *upload_data_size = 0;
    return MHD_YES;
  }
  wg_request_t *req = &ctx->req;
  req->method = method;
  req->path = url;
  req->content_type = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Type");
  req->authorization = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
  req->body = ctx->body;
  req->body_len = ctx->len;
  req->body_too_large = ctx->too_large;
  req->max_body = c->max_body;
  MHD_get_connection_values(conn, MHD_GET_ARGUMENT_KIND, collect_query, req);

  wg_response_t res = {0};
  wg_handle(c, req, &res);
  wg_route_t r;
  wg_route(method, url, &r);
  if (wg_route_target_check(req->target, req->target_len, NULL) != 0)
    r.label = "other"; /* refused before routing: the decoded path may name a real route */
  wg_metrics_http(c->metrics, method, r.label, res.status, wg_mono() - ctx->started);

  struct MHD_Response *mr =
      MHD_create_response_from_buffer(res.body_len, res.body ? res.body : (void *)"",
                                      res.body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
  if (!mr) {
    wg_response_free(&res);
    return MHD_NO;
  }
  res.body = NULL; /* owned by MHD now */
  if (res.content_type && res.status != 204)
    MHD_add_response_header(mr, MHD_HTTP_HEADER_CONTENT_TYPE, res.content_type);
  if (res.location[0])
    MHD_add_response_header(mr, MHD_HTTP_HEADER_LOCATION, res.location);
  if (res.allow[0])
    MHD_add_response_header(mr, MHD_HTTP_HEADER_ALLOW, res.allow);
  if (res.www_authenticate)
    MHD_add_response_header(mr, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"wagma\"");
  if (res.status == 413)
    MHD_add_response_header(mr, MHD_HTTP_HEADER_CONNECTION, "close");
  enum MHD_Result ret = MHD_queue_response(conn, (unsigned)res.status, mr);
  MHD_destroy_response(mr);
  return ret;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  (void)cls;
  (void)conn;
  (void)toe;
  conn_ctx_t *ctx = *con_cls;
  if (ctx) {
    free(ctx->target);
    free(ctx->body);
    free(ctx);
  }
  *con_cls = NULL;
}

/* Binds and listens on c->listen_host:c->listen_port (port 0: any free one, written back to
 * c->listen_port). Ownership: *fd is the caller's until wg_http_start takes it. */
int wg_http_bind(wg_coord_t *c, int *fd_out) {
  struct sockaddr_in sa;
  socklen_t len = sizeof sa;
  int one = 1, fd = -1;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)c->listen_port);
  if (inet_pton(AF_INET, c->listen_host, &sa.sin_addr) != 1) {
    wg_logf(c->log, c->log_user, WAGMA_LOG_ERROR, "listen: %s is not an IPv4 address",
            c->listen_host);
    return WAGMA_EINVAL;
  }
  fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 512) != 0 ||
      getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
    wg_logf(c->log, c->log_user, WAGMA_LOG_ERROR, "cannot listen on %s:%d: %s", c->listen_host,
            c->listen_port, strerror(errno));
    if (fd >= 0)
      close(fd);
    return WAGMA_EIO;
  }
  c->listen_port = ntohs(sa.sin_port);
  *fd_out = fd;
  return 0;
}

/* Starts the daemon on a socket from wg_http_bind (taken over: closed by wg_http_stop, or
 * here on failure). Ownership: the caller stops the daemon with wg_http_stop. */
int wg_http_start(wg_coord_t *c, int fd, struct MHD_Daemon **out) {
  struct MHD_Daemon *d = MHD_start_daemon(
      MHD_USE_EPOLL_INTERNAL_THREAD | MHD_USE_ERROR_LOG, 0, NULL, NULL, on_request, c,
      MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_THREAD_POOL_SIZE, (unsigned)c->threads,
      MHD_OPTION_URI_LOG_CALLBACK, on_uri, c, MHD_OPTION_NOTIFY_COMPLETED, on_completed, c,
      MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)30, MHD_OPTION_END);
  if (!d) {
    wg_logf(c->log, c->log_user, WAGMA_LOG_ERROR, "cannot start the HTTP server");
    close(fd);
    return WAGMA_EIO;
  }
  *out = d;
  return 0;
}

void wg_http_stop(struct MHD_Daemon *d) {
  if (d)
    MHD_stop_daemon(d);
}
