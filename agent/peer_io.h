/* agent/peer_io.h — blocking TCP helpers with deadlines for the agent's own peer endpoints
 * (adpsgd.c, ps.c): an ephemeral listening socket, a connect, and whole-buffer send / receive,
 * each bounded by a deadline on the wg_mono() clock (peer_io.c); the accepting side with a
 * thread per connection (peer_server.c), and the bounds every served connection lives under.
 * Private to wagma-agent. */
#ifndef WAGMA_AGENT_PEER_IO_H
#define WAGMA_AGENT_PEER_IO_H

#include <stddef.h>
#include <stdint.h>

#include "wagma/status.h"

/* The bounds of a served connection (the serve functions of adpsgd.c and ps.c):
 * - a request, from its first byte to its last, and a new connection's first request, from
 *   the accept: the FRAME bound, wg_peer_frame_bound(the epoch's exchange deadline), at least
 *   WG_PEER_FRAME_MIN_S (the client gave up after its deadline anyway);
 * - between two requests: WG_PEER_IDLE_S (an idle client is normal; one idle longer finds the
 *   connection closed and connects afresh, wg_peer_stale);
 * - a reply, header to last byte: WG_PEER_REPLY_S;
 * - a peer whose host vanished: TCP keepalive (wg_peer_keepalive) ends the connection
 *   WG_PEER_KEEPIDLE_S + WG_PEER_KEEPCNT * WG_PEER_KEEPINTVL_S seconds after its last sign of
 *   life, and TCP_USER_TIMEOUT as long after data it did not acknowledge.
 * A connection that misses one is closed (its thread exits, its buffers are freed, its slot is
 * free for the next accept) with a log line naming the peer and the bound.
 * At most WG_PEER_MAX_CONNS connections at once per endpoint: more are closed at accept. */
#define WG_PEER_MAX_CONNS 1024
#define WG_PEER_FRAME_MIN_S 2.0
#define WG_PEER_IDLE_S 60.0
#define WG_PEER_REPLY_S 5.0
#define WG_PEER_KEEPIDLE_S 5
#define WG_PEER_KEEPINTVL_S 2
#define WG_PEER_KEEPCNT 3

/* The frame bound for an epoch whose exchanges have exchange_deadline_s seconds:
 * max(WG_PEER_FRAME_MIN_S, 2 * exchange_deadline_s). */
double wg_peer_frame_bound(double exchange_deadline_s);

/* Listens on an ephemeral port of host (NULL or "" = every address): 0 with *fd and *port, or
 * WAGMA_EINVAL (unknown host) / WAGMA_EIO (errno says why). */
int wg_peer_listen(const char *host, int *fd, uint16_t *port);
/* Connects to host:port before deadline: 0 with *fd (TCP_NODELAY, keepalive, non-blocking), or
 * WAGMA_ETIMEDOUT / WAGMA_EPEER. */
int wg_peer_connect(const char *host, uint16_t port, double deadline, int *fd);
/* Sends / receives exactly len bytes before deadline (wg_mono), whether fd blocks or not.
 * 0, WAGMA_ETIMEDOUT, WAGMA_EPEER (closed: errno 0; lost: errno says why, ETIMEDOUT when
 * keepalive gave up) or WAGMA_EIO. */
int wg_peer_send(int fd, const void *buf, size_t len, double deadline);
int wg_peer_recv(int fd, void *buf, size_t len, double deadline);

/* Turns on TCP keepalive with the short probes above and TCP_USER_TIMEOUT on fd. 0 or
 * WAGMA_EIO (errno says why). */
int wg_peer_keepalive(int fd);
/* Waits until fd has something to read (a byte, the peer's close or an error) before
 * deadline: 0, WAGMA_ETIMEDOUT or WAGMA_EIO. */
int wg_peer_wait_readable(int fd, double deadline);
/* 1 when a client connection that expects nothing now has something to read (the server
 * closed it, e.g. after WG_PEER_IDLE_S, or it broke): it cannot carry a request; 0 otherwise. */
int wg_peer_stale(int fd);
/* The peer of fd as "host:port" (or "?") into buf, for log lines. */
#define WG_PEER_NAME_MAX 64
void wg_peer_name(int fd, char *buf, size_t len);

/* A served connection's wait for its next request: until fd is readable, at most wait_s (the
 * frame bound before a connection's first request, WG_PEER_IDLE_S after), then the header
 * (hdr_len bytes) within frame_s of its first byte; *frame_deadline = that deadline, which the
 * request's payload must meet too (0 when the wait for the first byte failed). 0, or
 * wg_peer_recv's statuses. */
int wg_peer_next_request(int fd, void *hdr, size_t hdr_len, double wait_s, double frame_s,
                         double *frame_deadline);
/* What the n-th wait (from 0) of a served connection missed when wg_peer_next_request
 * failed, for wg_peer_log_drop: its description, *bound_s its bound and *idle 1 when it was
 * only an idle connection's wait (not a fault). */
const char *wg_peer_missed(int n, double frame_deadline, double wait_s, double frame_s,
                           double *bound_s, int *idle);
/* The log line (at level) of a served connection that ends with e, naming endpoint ("adpsgd",
 * "ps"), the peer and, for WAGMA_ETIMEDOUT, what did not come (what) within bound_s; why =
 * errno as the failing call left it. Nothing for a peer that closed (WAGMA_EPEER, why 0). */
void wg_peer_log_drop(wagma_log_fn log, void *log_user, int level, const char *endpoint,
                      const char *peer, int e, int why, const char *what, double bound_s);

/* peer_server.c: the accepting side of an endpoint. An accept thread on listen_fd (which stays
 * the caller's) and one thread per accepted connection (TCP_NODELAY, wg_peer_keepalive) that
 * runs serve(user, fd) until it returns; the connection is closed after. At most max_conns at
 * once: more are closed at accept. 0, WAGMA_ENOMEM or WAGMA_EIO. Ownership: *out is the
 * caller's, released with wg_peer_server_stop. */
typedef struct wg_peer_server wg_peer_server_t;
int wg_peer_server_start(int listen_fd, int max_conns, void (*serve)(void *user, int fd),
                         void *user, wg_peer_server_t **out);
/* Connections held now: accepted and not yet joined (a serve that returned is joined within
 * 200 ms, before the next accept). Any thread. */
int wg_peer_server_count(wg_peer_server_t *s);
/* Stops accepting, shuts every connection down (a serve blocked on its socket returns), joins
 * every thread and frees the server. serve must return once its socket is shut down. NULL is
 * a no-op. */
void wg_peer_server_stop(wg_peer_server_t *s);

#endif
