/* coordinator_process.c — see coordinator_process.h. Owns the process it starts (by PID) until
 * coordinator_process_stop. No threads; /healthz is asked over a plain socket (HTTP/1.0). */
#include "coordinator_process.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "process.h"

#define COORD_MAX_ARGS 48

int coordinator_process_start(const coordinator_options_t *o, coordinator_process_t *p) {
  char listen[64], ttl[16];
  const char *argv[COORD_MAX_ARGS];
  const char *bin = o->bin ? o->bin : getenv("WAGMA_COORDINATOR_BIN");
  int n = 0;
  memset(p, 0, sizeof *p);
  if (!bin || !o->endpoints) {
    fprintf(stderr, "coordinator_process: no binary ($WAGMA_COORDINATOR_BIN) or endpoints\n");
    return -1;
  }
  p->port = proc_free_port();
  if (p->port < 0)
    return -1;
  snprintf(listen, sizeof listen, "127.0.0.1:%d", p->port);
  snprintf(p->base, sizeof p->base, "http://127.0.0.1:%d", p->port);
  snprintf(p->log, sizeof p->log, "%s", o->log ? o->log : "");
  snprintf(ttl, sizeof ttl, "%d", o->lease_ttl);
  argv[n++] = bin;
  argv[n++] = "--etcd";
  argv[n++] = o->endpoints;
  argv[n++] = "--listen";
  argv[n++] = listen;
  if (o->id) {
    argv[n++] = "--id";
    argv[n++] = o->id;
  }
  if (o->lease_ttl > 0) {
    argv[n++] = "--lease-ttl";
    argv[n++] = ttl;
  }
  for (int i = 0; o->extra && o->extra[i] && n < COORD_MAX_ARGS - 1; i++)
    argv[n++] = o->extra[i];
  argv[n] = NULL;
  p->pid = proc_spawn(argv, o->log, o->env);
  if (p->pid <= 0) {
    p->pid = 0;
    return -1;
  }
  return 0;
}

/* One GET /healthz; 1 when the status line says 200. */
static int healthy_once(int port) {
  struct sockaddr_in sa = {.sin_family = AF_INET,
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                           .sin_port = htons((uint16_t)port)};
  struct timeval tv = {2, 0};
  static const char request[] = "GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  char answer[64];
  size_t got = 0;
  int fd = socket(AF_INET, SOCK_STREAM, 0), ok = 0;
  if (fd < 0)
    return 0;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
      send(fd, request, sizeof request - 1, MSG_NOSIGNAL) == (ssize_t)(sizeof request - 1)) {
    ssize_t r;
    while (got < sizeof answer - 1 && (r = recv(fd, answer + got, sizeof answer - 1 - got, 0)) > 0)
      got += (size_t)r;
    answer[got] = '\0';
    ok = strncmp(answer, "HTTP/1.", 7) == 0 && strncmp(answer + 8, " 200", 4) == 0;
  }
  close(fd);
  return ok;
}

int coordinator_process_wait_healthy(coordinator_process_t *p, double timeout_s) {
  double deadline = proc_now() + timeout_s;
  while (proc_now() < deadline) {
    if (healthy_once(p->port))
      return 0;
    if (p->pid > 0 && waitpid(p->pid, NULL, WNOHANG) == p->pid) {
      p->pid = 0;
      fprintf(stderr, "coordinator exited at start (log %s)\n", p->log);
      return -1;
    }
    proc_sleep(0.05);
  }
  fprintf(stderr, "coordinator did not answer /healthz within %.0f s (log %s)\n", timeout_s,
          p->log);
  return -1;
}

void coordinator_process_stop(coordinator_process_t *p, int sig) {
  if (p->pid <= 0)
    return;
  proc_stop(p->pid, sig, 10.0);
  p->pid = 0;
}
