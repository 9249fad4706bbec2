/* agent/peer_io.h — blocking TCP helpers with deadlines for the agent's own peer endpoints
 * (adpsgd.c, ps.c): an ephemeral listening socket, a connect, and whole-buffer send / receive,
 * each bounded by a deadline on the wg_mono() clock. Private to wagma-agent. */
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

#endif
