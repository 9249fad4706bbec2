/* coordinator/front.h — the connection front (front.c: one thread relaying every connection) and
 * the reads it answers itself from the read cache (front_reads.c). */
#ifndef WAGMA_COORD_FRONT_H
#define WAGMA_COORD_FRONT_H

#include <stddef.h>

#include "coord.h"
#include "request.h"
#include "router.h"

struct MHD_Daemon;
typedef struct wg_front wg_front_t;
/* Starts the front thread on a listening socket (taken over: closed by wg_front_stop, or
 * left to the caller on failure), handing connections to mhd (MHD_USE_NO_LISTEN_SOCKET).
 * Ownership: *out is the caller's (wg_front_stop, then wg_front_free). */
int wg_front_start(wg_coord_t *c, int listen_fd, struct MHD_Daemon *mhd, wg_front_t **out);
/* Stops the thread, closes every connection and the listening socket (every client then reads
 * as gone). NULL: no-op. */
void wg_front_stop(wg_front_t *f);
/* Frees a stopped front, once nothing calls wg_front_client_gone, wg_front_conn_gen or
 * wg_front_mhd_done any more (the workers joined, libmicrohttpd stopped). NULL: no-op. */
void wg_front_free(wg_front_t *f);
/* The generation of the connection whose libmicrohttpd end is mhd_fd (0 = unknown), read
 * while libmicrohttpd holds that end; then whether that connection's client has left: 1, 0,
 * or -1 when the front cannot tell. Thread-safe (atomics per descriptor number). */
unsigned wg_front_conn_gen(const wg_front_t *f, int mhd_fd);
int wg_front_client_gone(const wg_front_t *f, int mhd_fd, unsigned gen);
/* libmicrohttpd completed a request on its end mhd_fd of generation gen (http.c's completion
 * callback): the front counts the requests it handed over, and answers cached reads itself
 * only on connections where none is left. Thread-safe. */
void wg_front_mhd_done(wg_front_t *f, int mhd_fd, unsigned gen);

/* The reads the front answers itself (front_reads.c). */
#define WG_FAST_TARGET_MAX 512
typedef struct wg_fast_read {
  char target[WG_FAST_TARGET_MAX]; /* the path, then the query's pieces (req points here) */
  wg_request_t req;
  wg_route_t route;
} wg_fast_read_t;
/* 1 when the request head (len bytes, accepted by wg_http_head_parse, no body) is a read the
 * front may answer from the read cache with the same bytes libmicrohttpd would send; *out then
 * holds the request and its route (not to be copied: req points into it). Pure. */
int wg_fast_read_parse(const wg_coord_t *c, const char *head, size_t len, wg_fast_read_t *out);
/* The status line and header fields of an answer with a body of body_len bytes, into buf:
 * their length, or 0 (a status it has no reason phrase for, or cap too small). Front thread
 * only (it keeps the Date of the current second). */
size_t wg_fast_read_head(int status, const char *content_type, size_t body_len, char *buf,
                         size_t cap);

#endif
