/* etcd_fixture.c — starts, kills, restarts and stops real etcd processes for tests.
 *
 * Owns: the member processes (by PID) and one temp dir holding each member's data dir and
 * log. No threads. Invariants: pid[i] != 0 exactly while member i runs and is unreaped;
 * stop() kills and reaps every running member before removing the temp dir. */
#define _GNU_SOURCE
#include "etcd_fixture.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct etcd_fixture {
  int members;
  char dir[256]; /* temp dir: m<i>/ data dirs and m<i>.log */
  char token[64];
  int client_port[ETCD_FIXTURE_MAX_MEMBERS];
  int peer_port[ETCD_FIXTURE_MAX_MEMBERS];
  pid_t pid[ETCD_FIXTURE_MAX_MEMBERS];
  char endpoint[ETCD_FIXTURE_MAX_MEMBERS][32];
  char endpoints[ETCD_FIXTURE_MAX_MEMBERS * 32];
  char initial_cluster[ETCD_FIXTURE_MAX_MEMBERS * 64];
  int metrics_port[ETCD_FIXTURE_MAX_MEMBERS]; /* TLS: /health over plain HTTP here */
  int tls;
  char cert_file[256], key_file[256], trusted_ca_file[256];
  int client_cert_auth;
  char extra_args[8][128];
  char etcdctl_args[1024];
  char extra_client_host[64];                          /* "" = 127.0.0.1 only */
  char extra_endpoints[ETCD_FIXTURE_MAX_MEMBERS * 96]; /* on extra_client_host */
};

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* A port the kernel considers free right now on 127.0.0.1 (bind to 0, read, close). Ports
 * already handed out in this fixture are skipped. */
static int free_port(const etcd_fixture_t *f) {
  for (int attempt = 0; attempt < 50; attempt++) {
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof addr;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), port, taken = 0;
    if (fd < 0)
      return -1;
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 ||
        getsockname(fd, (struct sockaddr *)&addr, &len) != 0) {
      close(fd);
      return -1;
    }
    close(fd);
    port = ntohs(addr.sin_port);
    for (int i = 0; i < ETCD_FIXTURE_MAX_MEMBERS; i++)
      taken |= f->client_port[i] == port || f->peer_port[i] == port || f->metrics_port[i] == port;
    if (!taken)
      return port;
  }
  return -1;
}

static const char *etcd_binary(void) {
  const char *bin = getenv("WAGMA_ETCD_BIN");
  return bin != NULL && bin[0] != '\0' ? bin : "/usr/bin/etcd";
}

static void print_log_tail(const etcd_fixture_t *f, int member) {
  char path[320], line[512];
  FILE *log;
  long size;
  snprintf(path, sizeof path, "%s/m%d.log", f->dir, member);
  log = fopen(path, "r");
  if (log == NULL)
    return;
  fseek(log, 0, SEEK_END);
  size = ftell(log);
  fseek(log, size > 4000 ? size - 4000 : 0, SEEK_SET);
  fprintf(stderr, "---- etcd member %d log tail (%s) ----\n", member, path);
  while (fgets(line, sizeof line, log) != NULL)
    fputs(line, stderr);
  fclose(log);
}

static int spawn(etcd_fixture_t *f, int m) {
  char name[16], data[300], log_path[320], client[160], peer[64], metrics[64];
  char cert[300], key[300], ca[300];
  const char *argv[48];
  int argc = 0;
  pid_t parent = getpid(), pid;
  snprintf(name, sizeof name, "m%d", m);
  snprintf(data, sizeof data, "%s/m%d", f->dir, m);
  snprintf(log_path, sizeof log_path, "%s/m%d.log", f->dir, m);
  snprintf(client, sizeof client, "%s://127.0.0.1:%d", f->tls ? "https" : "http",
           f->client_port[m]);
  char listen_client[340];
  if (f->extra_client_host[0])
    snprintf(listen_client, sizeof listen_client, "%s,%s://%s:%d", client,
             f->tls ? "https" : "http", f->extra_client_host, f->client_port[m]);
  else
    snprintf(listen_client, sizeof listen_client, "%s", client);
  snprintf(peer, sizeof peer, "http://127.0.0.1:%d", f->peer_port[m]);
  snprintf(metrics, sizeof metrics, "http://127.0.0.1:%d", f->metrics_port[m]);
  snprintf(cert, sizeof cert, "--cert-file=%s", f->cert_file);
  snprintf(key, sizeof key, "--key-file=%s", f->key_file);
  snprintf(ca, sizeof ca, "--trusted-ca-file=%s", f->trusted_ca_file);
  {
    const char *base[] = {"etcd",
                          "--name",
                          name,
                          "--data-dir",
                          data,
                          "--listen-client-urls",
                          listen_client,
                          "--advertise-client-urls",
                          client,
                          "--listen-peer-urls",
                          peer,
                          "--initial-advertise-peer-urls",
                          peer,
                          "--initial-cluster",
                          f->initial_cluster,
                          "--initial-cluster-state",
                          "new",
                          "--initial-cluster-token",
                          f->token,
                          "--logger",
                          "zap",
                          "--log-level",
                          "warn"};
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++)
      argv[argc++] = base[i];
  }
  if (f->tls) {
    argv[argc++] = "--listen-metrics-urls";
    argv[argc++] = metrics;
    argv[argc++] = cert;
    argv[argc++] = key;
  }
  if (f->trusted_ca_file[0])
    argv[argc++] = ca;
  if (f->client_cert_auth)
    argv[argc++] = "--client-cert-auth";
  for (int i = 0; i < 8 && f->extra_args[i][0]; i++)
    argv[argc++] = f->extra_args[i];
  argv[argc] = NULL;
  pid = fork();
  if (pid < 0) {
    perror("etcd_fixture: fork");
    return -1;
  }
  if (pid == 0) {
    int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
      _exit(127);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      close(fd);
    }
    /* The test process may hold sockets and epoll fds (gRPC): etcd must not inherit them. */
    for (int other = 3; other < 1024; other++)
      close(other);
    execv(etcd_binary(), (char *const *)argv);
    _exit(127);
  }
  f->pid[m] = pid;
  return 0;
}

/* One HTTP GET /health on the member's client port; 1 when it says healthy. */
static int healthy_once(const etcd_fixture_t *f, int member) {
  struct sockaddr_in addr = {
      .sin_family = AF_INET,
      .sin_port = htons((uint16_t)(f->tls ? f->metrics_port[member] : f->client_port[member])),
      .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  struct timeval tv = {1, 0};
  static const char request[] = "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  char answer[1024];
  size_t got = 0;
  ssize_t n;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), ok = 0;
  if (fd < 0)
    return 0;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0 ||
      write(fd, request, sizeof request - 1) != (ssize_t)(sizeof request - 1))
    goto out;
  while (got < sizeof answer - 1 && (n = read(fd, answer + got, sizeof answer - 1 - got)) > 0)
    got += (size_t)n;
  answer[got] = '\0';
  ok = strstr(answer, "\"health\":\"true\"") != NULL;
out:
  close(fd);
  return ok;
}

int etcd_fixture_wait_healthy(etcd_fixture_t *f, int member, int timeout_ms) {
  long long deadline = now_ms() + timeout_ms;
  if (f == NULL || member < 0 || member >= f->members)
    return -1;
  while (now_ms() < deadline) {
    int status;
    if (f->pid[member] != 0 && waitpid(f->pid[member], &status, WNOHANG) == f->pid[member]) {
      fprintf(stderr, "etcd_fixture: member %d exited during start (status %d)\n", member, status);
      f->pid[member] = 0;
      print_log_tail(f, member);
      return -1;
    }
    if (healthy_once(f, member))
      return 0;
    sleep_ms(50);
  }
  fprintf(stderr, "etcd_fixture: member %d not healthy within %d ms\n", member, timeout_ms);
  print_log_tail(f, member);
  return -1;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

void etcd_fixture_stop(etcd_fixture_t *f) {
  if (f == NULL)
    return;
  for (int m = 0; m < f->members; m++)
    etcd_fixture_kill(f, m);
  if (f->dir[0] != '\0' && getenv("WAGMA_KEEP_ETCD_DIR") == NULL)
    nftw(f->dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  free(f);
}

int etcd_fixture_start(int members, etcd_fixture_t **out) {
  return etcd_fixture_start_with(members, NULL, out);
}

void etcd_fixture_set_etcdctl_args(etcd_fixture_t *f, const char *args) {
  snprintf(f->etcdctl_args, sizeof f->etcdctl_args, "%s", args != NULL ? args : "");
}

int etcd_fixture_start_with(int members, const etcd_fixture_options_t *options,
                            etcd_fixture_t **out) {
  etcd_fixture_t *f;
  const char *tmp = getenv("TMPDIR");
  size_t used = 0, used_cluster = 0;
  *out = NULL;
  if (members < 1 || members > ETCD_FIXTURE_MAX_MEMBERS)
    return -1;
  if (access(etcd_binary(), X_OK) != 0) {
    fprintf(stderr, "etcd_fixture: %s is not executable (install etcd-server)\n", etcd_binary());
    return -1;
  }
  f = calloc(1, sizeof *f);
  if (f == NULL)
    return -1;
  f->members = members;
  if (options != NULL) {
    f->tls = options->cert_file != NULL;
    snprintf(f->cert_file, sizeof f->cert_file, "%s", options->cert_file ? options->cert_file : "");
    snprintf(f->key_file, sizeof f->key_file, "%s", options->key_file ? options->key_file : "");
    snprintf(f->trusted_ca_file, sizeof f->trusted_ca_file, "%s",
             options->trusted_ca_file ? options->trusted_ca_file : "");
    f->client_cert_auth = options->client_cert_auth;
    for (int i = 0; i < 8 && options->extra_args[i] != NULL; i++)
      snprintf(f->extra_args[i], sizeof f->extra_args[i], "%s", options->extra_args[i]);
    etcd_fixture_set_etcdctl_args(f, options->etcdctl_args);
    snprintf(f->extra_client_host, sizeof f->extra_client_host, "%s",
             options->extra_client_host ? options->extra_client_host : "");
  }
  snprintf(f->dir, sizeof f->dir, "%s/wagma-etcd-XXXXXX", tmp != NULL && tmp[0] ? tmp : "/tmp");
  if (mkdtemp(f->dir) == NULL) {
    perror("etcd_fixture: mkdtemp");
    f->dir[0] = '\0';
    etcd_fixture_stop(f);
    return -1;
  }
  snprintf(f->token, sizeof f->token, "wagma-test-%d-%lld", (int)getpid(), now_ms());
  for (int m = 0; m < members; m++) {
    f->client_port[m] = free_port(f);
    f->peer_port[m] = free_port(f);
    f->metrics_port[m] = f->tls ? free_port(f) : 0;
    if (f->client_port[m] < 0 || f->peer_port[m] < 0 || f->metrics_port[m] < 0) {
      etcd_fixture_stop(f);
      return -1;
    }
    snprintf(f->endpoint[m], sizeof f->endpoint[m], "127.0.0.1:%d", f->client_port[m]);
    used += (size_t)snprintf(f->endpoints + used, sizeof f->endpoints - used, "%s%s", m ? "," : "",
                             f->endpoint[m]);
    used_cluster += (size_t)snprintf(f->initial_cluster + used_cluster,
                                     sizeof f->initial_cluster - used_cluster,
                                     "%sm%d=http://127.0.0.1:%d", m ? "," : "", m, f->peer_port[m]);
    if (f->extra_client_host[0]) {
      size_t len = strlen(f->extra_endpoints);
      snprintf(f->extra_endpoints + len, sizeof f->extra_endpoints - len, "%s%s:%d", m ? "," : "",
               f->extra_client_host, f->client_port[m]);
    }
  }
  for (int m = 0; m < members; m++) {
    if (spawn(f, m) != 0) {
      etcd_fixture_stop(f);
      return -1;
    }
  }
  for (int m = 0; m < members; m++) {
    if (etcd_fixture_wait_healthy(f, m, ETCD_FIXTURE_START_TIMEOUT_MS) != 0) {
      etcd_fixture_stop(f);
      return -1;
    }
  }
  *out = f;
  return 0;
}

const char *etcd_fixture_endpoints(const etcd_fixture_t *f) {
  return f->endpoints;
}

const char *etcd_fixture_endpoint(const etcd_fixture_t *f, int member) {
  return member >= 0 && member < f->members ? f->endpoint[member] : "";
}

const char *etcd_fixture_endpoints_on_extra_host(const etcd_fixture_t *f) {
  return f->extra_client_host[0] ? f->extra_endpoints : NULL;
}

int etcd_fixture_members(const etcd_fixture_t *f) {
  return f->members;
}

pid_t etcd_fixture_pid(const etcd_fixture_t *f, int member) {
  return member >= 0 && member < f->members ? f->pid[member] : 0;
}

int etcd_fixture_kill(etcd_fixture_t *f, int member) {
  if (f == NULL || member < 0 || member >= f->members)
    return -1;
  if (f->pid[member] == 0)
    return 0;
  kill(f->pid[member], SIGKILL);
  while (waitpid(f->pid[member], NULL, 0) < 0 && errno == EINTR) {
  }
  f->pid[member] = 0;
  return 0;
}

int etcd_fixture_restart(etcd_fixture_t *f, int member) {
  if (f == NULL || member < 0 || member >= f->members || f->pid[member] != 0)
    return -1;
  if (spawn(f, member) != 0)
    return -1;
  return etcd_fixture_wait_healthy(f, member, ETCD_FIXTURE_START_TIMEOUT_MS);
}

int etcd_fixture_etcdctl(const etcd_fixture_t *f, const char *args) {
  char command[3072], endpoints[ETCD_FIXTURE_MAX_MEMBERS * 40];
  size_t used = 0;
  int status;
  for (int m = 0; m < f->members; m++)
    used += (size_t)snprintf(endpoints + used, sizeof endpoints - used, "%s%s://%s", m ? "," : "",
                             f->tls ? "https" : "http", f->endpoint[m]);
  snprintf(
      command, sizeof command,
      "ETCDCTL_API=3 etcdctl --dial-timeout=3s --command-timeout=10s --endpoints=%s %s %s 1>&2",
      endpoints, f->etcdctl_args, args);
  status = system(command);
  if (status == -1 || !WIFEXITED(status))
    return -1;
  return WEXITSTATUS(status);
}
