/* cluster.c — see cluster.h. Single-threaded test support. */
#include "cluster.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

double cluster_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void cluster_sleep(double s) {
  struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
    ;
}

/* A port nobody listens on, below the ephemeral range (32768+): an agent binds its collective
 * port only when a plan arrives, and an ephemeral port could be taken by then by some
 * process's outgoing connection. */
static int free_port(void) {
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

/* fork + exec argv with stdout/stderr to log; the child dies with the test. */
static pid_t spawn(char *const argv[], const char *log) {
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0)
    return -1;
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
      _exit(127);
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    execv(argv[0], argv);
    _exit(127);
  }
  return pid;
}

static void stop_pid(pid_t pid) {
  if (pid <= 0)
    return;
  kill(pid, SIGCONT);
  kill(pid, SIGTERM);
  for (int i = 0; i < 100; i++) { /* 10 s grace */
    if (waitpid(pid, NULL, WNOHANG) == pid)
      return;
    cluster_sleep(0.1);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

static int start_agent(cluster_t *c, int i, const char *const *extra) {
  char listen[64], log[320], *argv[64];
  int n = 0, port = free_port();
  const char *bin = getenv("WAGMA_AGENT_BIN");
  if (!bin || port < 0)
    return -1;
  snprintf(c->agent_name[i], sizeof c->agent_name[i], "agent-%d", i);
  snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
  snprintf(log, sizeof log, "%s/agent-%d.log", c->dir, i);
  argv[n++] = (char *)bin;
  argv[n++] = "--etcd";
  argv[n++] = (char *)etcd_fixture_endpoints(c->etcd);
  argv[n++] = "--name";
  argv[n++] = c->agent_name[i];
  argv[n++] = "--listen";
  argv[n++] = listen;
  for (int k = 0; c->agent_args && c->agent_args[k] && n < 50; k++)
    argv[n++] = (char *)c->agent_args[k];
  for (int k = 0; extra && extra[k] && n < 62; k++)
    argv[n++] = (char *)extra[k];
  argv[n] = NULL;
  c->agent[i] = spawn(argv, log);
  return c->agent[i] > 0 ? 0 : -1;
}

int cluster_start(cluster_t *c, int nagents, const char *const *agent_args) {
  char listen[64], log[320];
  const char *bin = getenv("WAGMA_COORDINATOR_BIN");
  memset(c, 0, sizeof *c);
  c->agent_args = agent_args;
  if (!bin || !getenv("WAGMA_AGENT_BIN")) {
    fprintf(stderr, "cluster: WAGMA_COORDINATOR_BIN / WAGMA_AGENT_BIN not set\n");
    return -1;
  }
  snprintf(c->dir, sizeof c->dir, "%s/wagma-agent-test.XXXXXX",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(c->dir))
    return -1;
  curl_global_init(CURL_GLOBAL_DEFAULT);
  if (etcd_fixture_start(1, &c->etcd) != 0)
    return -1;
  int port = free_port();
  snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
  snprintf(c->api, sizeof c->api, "http://127.0.0.1:%d", port);
  snprintf(log, sizeof log, "%s/coordinator.log", c->dir);
  char *cargv[] = {(char *)bin, "--etcd", (char *)etcd_fixture_endpoints(c->etcd),
                   "--listen",  listen,   "--lease-ttl",
                   "3",         NULL};
  c->coordinator = spawn(cargv, log);
  if (c->coordinator <= 0)
    return -1;
  for (int i = 0; i < nagents; i++) {
    if (start_agent(c, i, NULL) != 0)
      return -1;
    c->nagents++;
  }
  return cluster_wait_agents(c, nagents, 30);
}

int cluster_add_agent(cluster_t *c, const char *const *extra) {
  if (c->nagents >= CLUSTER_MAX_AGENTS)
    return -1;
  int i = c->nagents;
  if (start_agent(c, i, extra) != 0)
    return -1;
  c->nagents++;
  return i;
}

void cluster_stop(cluster_t *c) {
  for (int i = 0; i < c->nagents; i++)
    stop_pid(c->agent[i]);
  stop_pid(c->coordinator);
  etcd_fixture_stop(c->etcd);
  c->etcd = NULL;
  if (c->dir[0] && getenv("WAGMA_TEST_KEEP_LOGS")) {
    fprintf(stderr, "cluster: logs kept in %s\n", c->dir);
  } else if (c->dir[0]) {
    char cmd[320];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", c->dir);
    if (system(cmd) != 0)
      fprintf(stderr, "cluster: cannot remove %s\n", c->dir);
  }
  curl_global_cleanup();
}

void cluster_dump_logs(const cluster_t *c) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "for f in '%s'/*.log; do echo \"---- $f\"; tail -n 40 \"$f\"; done >&2",
           c->dir);
  if (system(cmd) != 0)
    fprintf(stderr, "cluster: cannot print the logs\n");
}

/* ---- REST --------------------------------------------------------------------------------- */

typedef struct buf {
  char *p;
  size_t n;
} buf_t;

static size_t on_data(char *data, size_t size, size_t nmemb, void *user) {
  buf_t *b = user;
  size_t add = size * nmemb;
  char *p = realloc(b->p, b->n + add + 1);
  if (!p)
    return 0;
  memcpy(p + b->n, data, add);
  b->p = p;
  b->n += add;
  b->p[b->n] = '\0';
  return add;
}

int cluster_http(const cluster_t *c, const char *method, const char *path, const char *json,
                 long *status, char **body) {
  char url[512];
  buf_t b = {0};
  struct curl_slist *h = NULL;
  CURL *curl = curl_easy_init();
  int rc = -1;
  if (!curl)
    return -1;
  snprintf(url, sizeof url, "%s%s", c->api, path);
  curl_easy_setopt(curl, CURLOPT_URL, url);
  curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, 10000L);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &b);
  if (json) {
    h = curl_slist_append(h, "Content-Type: application/json");
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, json);
  }
  if (curl_easy_perform(curl) == CURLE_OK) {
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, status);
    rc = 0;
  }
  curl_slist_free_all(h);
  curl_easy_cleanup(curl);
  if (body && rc == 0) {
    *body = b.p ? b.p : strdup("");
    b.p = NULL;
  }
  free(b.p);
  return rc;
}

int cluster_wait_agents(cluster_t *c, int n, double timeout_s) {
  double deadline = cluster_now() + timeout_s;
  while (cluster_now() < deadline) {
    long st = 0;
    char *body = NULL;
    if (cluster_http(c, "GET", "/v1/agents", NULL, &st, &body) == 0 && st == 200) {
      json_t *o = json_loads(body, 0, NULL);
      json_t *agents = json_is_array(o) ? o : json_object_get(o, "agents");
      size_t have = json_is_array(agents) ? json_array_size(agents) : 0;
      json_decref(o);
      free(body);
      if ((int)have >= n)
        return 0;
    } else {
      free(body);
    }
    cluster_sleep(0.2);
  }
  fprintf(stderr, "cluster: %d agents did not register within %.0f s\n", n, timeout_s);
  return -1;
}

static uint64_t uint_of(json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  return json_is_integer(v) && json_integer_value(v) > 0 ? (uint64_t)json_integer_value(v) : 0;
}

static double num_of(json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  return json_is_number(v) ? json_number_value(v) : -1.0;
}

int cluster_job_get(const cluster_t *c, const char *job, job_view_t *v) {
  char path[128], *body = NULL;
  long st = 0;
  memset(v, 0, sizeof *v);
  snprintf(path, sizeof path, "/v1/jobs/%s", job);
  if (cluster_http(c, "GET", path, NULL, &st, &body) != 0 || st != 200) {
    free(body);
    return -1;
  }
  json_t *o = json_loads(body, 0, NULL);
  free(body);
  if (!o)
    return -1;
  json_t *status = json_object_get(o, "status");
  snprintf(v->state, sizeof v->state, "%s",
           json_string_value(json_object_get(status, "state")) ?: "");
  v->epoch = uint_of(status, "epoch");
  v->iteration = uint_of(status, "iteration");
  json_t *members = json_object_get(o, "members"), *m;
  size_t i;
  json_array_foreach(members, i, m) {
    if (v->nmembers >= CLUSTER_MAX_AGENTS)
      break;
    job_member_t *jm = &v->members[v->nmembers++];
    snprintf(jm->name, sizeof jm->name, "%s", json_string_value(json_object_get(m, "name")) ?: "");
    json_t *p = json_object_get(m, "progress");
    if (json_is_object(p)) {
      jm->has_progress = 1;
      snprintf(jm->state, sizeof jm->state, "%s",
               json_string_value(json_object_get(p, "state")) ?: "");
      jm->iteration = uint_of(p, "iteration");
      jm->epoch = uint_of(p, "epoch");
      jm->loss = num_of(p, "loss");
      jm->accuracy = num_of(p, "accuracy");
      jm->rounds_activated = uint_of(p, "rounds_activated");
      jm->rounds_joined = uint_of(p, "rounds_joined");
    }
  }
  json_decref(o);
  return 0;
}

int cluster_job_wait_state(const cluster_t *c, const char *job, const char *want, double timeout_s,
                           job_view_t *v) {
  double deadline = cluster_now() + timeout_s;
  while (cluster_now() < deadline) {
    if (cluster_job_get(c, job, v) == 0) {
      if (strcmp(v->state, want) == 0)
        return 0;
      if (!strcmp(v->state, "failed") || !strcmp(v->state, "succeeded") ||
          !strcmp(v->state, "stopped")) {
        fprintf(stderr, "cluster: job %s is %s, wanted %s\n", job, v->state, want);
        return -1;
      }
    }
    cluster_sleep(0.25);
  }
  fprintf(stderr, "cluster: job %s not %s within %.0f s (state %s, iteration %llu)\n", job, want,
          timeout_s, v->state, (unsigned long long)v->iteration);
  return -1;
}

const job_member_t *job_member(const job_view_t *v, const char *name) {
  for (int i = 0; i < v->nmembers; i++)
    if (strcmp(v->members[i].name, name) == 0)
      return &v->members[i];
  return NULL;
}

uint64_t job_min_iteration(const job_view_t *v) {
  uint64_t m = UINT64_MAX;
  for (int i = 0; i < v->nmembers; i++)
    if (v->members[i].has_progress && v->members[i].iteration < m)
      m = v->members[i].iteration;
  return m == UINT64_MAX ? 0 : m;
}
