/* process.c — see process.h. Owns nothing beyond the call: each child is the caller's to stop.
 * No threads. The spawned child closes no descriptors (same as the tests did before). */
#define _GNU_SOURCE
#include "process.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

double proc_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void proc_sleep(double s) {
  struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
  }
}

int proc_free_ports(int n, int *ports) {
  int fds[PROC_MAX_FREE_PORTS], opened = 0, rc = -1;
  if (n < 1 || n > PROC_MAX_FREE_PORTS)
    return -1;
  /* Every socket stays bound until all ports are read, so the n ports are distinct. */
  for (; opened < n; opened++) {
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    fds[opened] = socket(AF_INET, SOCK_STREAM, 0);
    if (fds[opened] < 0)
      goto out;
    if (bind(fds[opened], (struct sockaddr *)&sa, sizeof sa) != 0 ||
        getsockname(fds[opened], (struct sockaddr *)&sa, &len) != 0) {
      opened++;
      goto out;
    }
    ports[opened] = ntohs(sa.sin_port);
  }
  rc = 0;
out:
  for (int i = 0; i < opened; i++)
    close(fds[i]);
  return rc;
}

int proc_free_port(void) {
  int port;
  return proc_free_ports(1, &port) == 0 ? port : -1;
}

int proc_free_port_low(void) {
  static unsigned seed;
  if (!seed)
    seed = (unsigned)getpid() ^ (unsigned)time(NULL);
  for (int attempt = 0; attempt < 200; attempt++) {
    int port = 20000 + (int)(rand_r(&seed) % 12000), ok = 0;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                            .sin_port = htons((uint16_t)port)};
    if (fd < 0)
      return -1;
    ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    if (ok)
      return port;
  }
  return -1;
}

pid_t proc_spawn(const char *const argv[], const char *log, const char *const env[]) {
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid != 0)
    return pid < 0 ? -1 : pid;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent)
    _exit(127);
  if (log) {
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
  }
  for (int i = 0; env && env[i]; i++) {
    const char *eq = strchr(env[i], '=');
    if (eq) {
      char name[128];
      size_t n = (size_t)(eq - env[i]) < sizeof name - 1 ? (size_t)(eq - env[i]) : sizeof name - 1;
      memcpy(name, env[i], n);
      name[n] = '\0';
      setenv(name, eq + 1, 1);
    } else {
      unsetenv(env[i]);
    }
  }
  execv(argv[0], (char *const *)argv);
  _exit(127);
}

int proc_wait(pid_t pid, double timeout_s) {
  double end = proc_now() + timeout_s;
  int status = 0;
  for (;;) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid)
      return status;
    if (r < 0 && errno != EINTR)
      return -1;
    if (proc_now() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    proc_sleep(0.01);
  }
}

int proc_stop(pid_t pid, int sig, double grace_s) {
  if (pid <= 0)
    return 0;
  kill(pid, SIGCONT);
  kill(pid, sig);
  return proc_wait(pid, grace_s);
}
