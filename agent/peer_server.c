/* agent/peer_server.c — the accepting side of the agent's peer endpoints (adpsgd.c, ps.c): an
 * accept thread on the endpoint's listening socket and one thread per accepted connection,
 * which runs the endpoint's serve function until it returns (the peer closed, a protocol
 * error, or stop shut the socket down). Declared in peer_io.h.
 *
 * Owns: the accept thread, the accepted connections (fd and thread each) and their list, under
 * mu. The listening socket stays the endpoint's. Threads: the accept thread (polls every
 * 200 ms for stop, joins the connections that ended), one thread per connection; start and
 * stop are called from one thread of the endpoint, count from any.
 * Invariants: every accepted socket has TCP_NODELAY and keepalive (wg_peer_keepalive); the
 * limit counts the connections not yet joined, and the ended ones are joined before each
 * accept, so a connection whose serve returned frees its slot for the next one. The serve
 * functions bound their own waits (peer_io.h); stop shuts the sockets down to end them. */
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent/peer_io.h"
#include "wagma/status.h"

typedef struct server_conn {
  struct server_conn *next;
  wg_peer_server_t *server;
  int fd;
  pthread_t thread;
  int done; /* serve returned (under mu) */
} server_conn_t;

struct wg_peer_server {
  int listen_fd;
  int max_conns;
  void (*serve)(void *user, int fd);
  void *user;
  pthread_t accept_thread;
  pthread_mutex_t mu;
  int stopping;
  server_conn_t *conns;
  int nconns;
};

static void *conn_main(void *arg) {
  server_conn_t *c = arg;
  wg_peer_server_t *s = c->server;
  s->serve(s->user, c->fd);
  pthread_mutex_lock(&s->mu);
  c->done = 1;
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* Joins and frees the connections whose serve returned. Accept thread. */
static void reap(wg_peer_server_t *s) {
  for (;;) {
    server_conn_t *dead = NULL;
    pthread_mutex_lock(&s->mu);
    for (server_conn_t **pp = &s->conns; *pp; pp = &(*pp)->next)
      if ((*pp)->done) {
        dead = *pp;
        *pp = dead->next;
        s->nconns--;
        break;
      }
    pthread_mutex_unlock(&s->mu);
    if (!dead)
      return;
    pthread_join(dead->thread, NULL);
    close(dead->fd);
    free(dead);
  }
}

static void *accept_main(void *arg) {
  wg_peer_server_t *s = arg;
  for (;;) {
    struct pollfd pfd = {.fd = s->listen_fd, .events = POLLIN};
    int r = poll(&pfd, 1, 200);
    pthread_mutex_lock(&s->mu);
    int stopping = s->stopping;
    pthread_mutex_unlock(&s->mu);
    if (stopping)
      break;
    reap(s); /* before the limit is checked: an ended connection's slot is free */
    if (r <= 0)
      continue;
    int fd = accept(s->listen_fd, NULL, NULL);
    if (fd < 0)
      continue;
    pthread_mutex_lock(&s->mu);
    int full = s->nconns >= s->max_conns;
    pthread_mutex_unlock(&s->mu);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    wg_peer_keepalive(fd); /* a peer whose host vanished ends its serve's wait */
    server_conn_t *c = full ? NULL : calloc(1, sizeof *c);
    if (!c) { /* over the limit (or out of memory): the peer sees the connection close */
      close(fd);
      continue;
    }
    c->server = s;
    c->fd = fd;
    pthread_mutex_lock(&s->mu);
    if (pthread_create(&c->thread, NULL, conn_main, c) != 0) {
      pthread_mutex_unlock(&s->mu);
      close(fd);
      free(c);
      continue;
    }
    c->next = s->conns;
    s->conns = c;
    s->nconns++;
    pthread_mutex_unlock(&s->mu);
  }
  return NULL;
}

int wg_peer_server_start(int listen_fd, int max_conns, void (*serve)(void *user, int fd),
                         void *user, wg_peer_server_t **out) {
  *out = NULL;
  wg_peer_server_t *s = calloc(1, sizeof *s);
  if (!s)
    return WAGMA_ENOMEM;
  s->listen_fd = listen_fd;
  s->max_conns = max_conns;
  s->serve = serve;
  s->user = user;
  pthread_mutex_init(&s->mu, NULL);
  if (pthread_create(&s->accept_thread, NULL, accept_main, s) != 0) {
    pthread_mutex_destroy(&s->mu);
    free(s);
    return WAGMA_EIO;
  }
  *out = s;
  return 0;
}

int wg_peer_server_count(wg_peer_server_t *s) {
  pthread_mutex_lock(&s->mu);
  int n = s->nconns;
  pthread_mutex_unlock(&s->mu);
  return n;
}

void wg_peer_server_stop(wg_peer_server_t *s) {
  if (!s)
    return;
  pthread_mutex_lock(&s->mu);
  s->stopping = 1;
  for (server_conn_t *c = s->conns; c; c = c->next)
    shutdown(c->fd, SHUT_RDWR); /* its serve returns */
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->accept_thread, NULL);
  for (server_conn_t *c = s->conns, *next; c; c = next) {
    next = c->next;
    shutdown(c->fd, SHUT_RDWR); /* accepted after the first pass */
    pthread_join(c->thread, NULL);
    close(c->fd);
    free(c);
  }
  pthread_mutex_destroy(&s->mu);
  free(s);
}
