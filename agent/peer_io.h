/* agent/peer_io.h — blocking TCP helpers with deadlines for the agent's own peer endpoints
 * (adpsgd.c, ps.c): an ephemeral listening socket, a connect, and whole-buffer send / receive,
 * each bounded by a deadline on the wg_mono() clock (peer_io.c); the accepting side with a
 * thread per connection (peer_server.c). Private to wagma-agent. */
#ifndef WAGMA_AGENT_PEER_IO_H
#define WAGMA_AGENT_PEER_IO_H

#include <stddef.h>
#include <stdint.h>

/* Listens on an ephemeral port of host (NULL or "" = every address): 0 with *fd and *port, or
 * WAGMA_EINVAL (unknown host) / WAGMA_EIO (errno says why). */
int wg_peer_listen(const char *host, int *fd, uint16_t *port);
/* Connects to host:port before deadline: 0 with *fd (TCP_NODELAY, non-blocking), or
 * WAGMA_ETIMEDOUT / WAGMA_EPEER. */
int wg_peer_connect(const char *host, uint16_t port, double deadline, int *fd);
/* Sends / receives exactly len bytes before deadline (recv: deadline < 0 = none, for a
 * blocking socket). 0, WAGMA_ETIMEDOUT, WAGMA_EPEER (closed, reset) or WAGMA_EIO. */
int wg_peer_send(int fd, const void *buf, size_t len, double deadline);
int wg_peer_recv(int fd, void *buf, size_t len, double deadline);

/* peer_server.c: the accepting side of an endpoint. An accept thread on listen_fd (which stays
 * the caller's) and one thread per accepted connection (TCP_NODELAY) that runs
 * serve(user, fd) until it returns; the connection is closed after. At most max_conns at once:
 * more are closed at accept. 0, WAGMA_ENOMEM or WAGMA_EIO. Ownership: *out is the caller's,
 * released with wg_peer_server_stop. */
typedef struct wg_peer_server wg_peer_server_t;
int wg_peer_server_start(int listen_fd, int max_conns, void (*serve)(void *user, int fd),
                         void *user, wg_peer_server_t **out);
/* Stops accepting, shuts every connection down (a serve blocked on its socket returns), joins
 * every thread and frees the server. serve must return once its socket is shut down. NULL is
 * a no-op. */
void wg_peer_server_stop(wg_peer_server_t *s);

#endif
