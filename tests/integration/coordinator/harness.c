/* harness.c — see harness.h. Processes are started with fork/exec and stopped by PID; each
 * child gets PR_SET_PDEATHSIG so a crashed test leaves nothing running. */
#include "harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>

#ifndef WAGMA_COORDINATOR_BIN
#error "WAGMA_COORDINATOR_BIN must be defined"
#endif

double harness_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void harness_sleep(double s) {
  struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
  }
}

int harness_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof sa;
  assert_true(fd >= 0);
  assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
  close(fd);
  return ntohs(sa.sin_port);
}

void harness_coord_start(coord_proc_t *p, const char *endpoints, const char *id, int ttl,
                         const char *token, const char *const *extra) {
  char listen[64], ttls[16];
  const char *argv[32];
  int n = 0;
  memset(p, 0, sizeof *p);
  p->port = harness_free_port();
  snprintf(listen, sizeof listen, "127.0.0.1:%d", p->port);
  snprintf(p->base, sizeof p->base, "http://127.0.0.1:%d", p->port);
  snprintf(ttls, sizeof ttls, "%d", ttl);
  snprintf(p->log, sizeof p->log, "%s/wagma-coord-%s-%d.log",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", id, (int)getpid());
  argv[n++] = WAGMA_COORDINATOR_BIN;
  argv[n++] = "--etcd";
  argv[n++] = endpoints;
  argv[n++] = "--listen";
  argv[n++] = listen;
  argv[n++] = "--id";
  argv[n++] = id;
  argv[n++] = "--lease-ttl";
  argv[n++] = ttls;
  argv[n++] = "--log-level";
  argv[n++] = "debug";
  for (int i = 0; extra && extra[i] && n < 30; i++)
    argv[n++] = extra[i];
  argv[n] = NULL;
  pid_t parent = getpid();
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
      _exit(127);
    int fd = open(p->log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    if (token)
      setenv("WAGMA_TOKEN", token, 1);
    else
      unsetenv("WAGMA_TOKEN");
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  p->pid = pid;
  char url[128];
  snprintf(url, sizeof url, "%s/healthz", p->base);
  double deadline = harness_now() + 10;
  while (harness_now() < deadline) {
    http_result_t r;
    harness_http("GET", url, NULL, 0, NULL, NULL, &r);
    long st = r.status;
    harness_http_free(&r);
    if (st == 200)
      return;
    int status;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      p->pid = 0;
      fail_msg("coordinator exited at start (log %s)", p->log);
    }
    harness_sleep(0.05);
  }
  fail_msg("coordinator did not answer /healthz within 10 s (log %s)", p->log);
}

void harness_coord_stop(coord_proc_t *p, int sig) {
  if (p->pid <= 0)
    return;
  kill(p->pid, sig);
  double deadline = harness_now() + 10;
  int status;
  while (waitpid(p->pid, &status, WNOHANG) == 0) {
    if (harness_now() > deadline) {
      kill(p->pid, SIGKILL);
      waitpid(p->pid, &status, 0);
      break;
    }
    harness_sleep(0.02);
  }
  p->pid = 0;
}

/* ---- HTTP ---------------------------------------------------------------------------------- */

typedef struct buf {
  char *p;
  size_t len;
} buf_t;

static size_t on_body(char *data, size_t size, size_t nmemb, void *user) {
  buf_t *b = user;
  size_t n = size * nmemb;
  char *np = realloc(b->p, b->len + n + 1);
  if (!np)
    return 0;
  memcpy(np + b->len, data, n);
  b->p = np;
  b->len += n;
  b->p[b->len] = '\0';
  return n;
}

static size_t on_header(char *data, size_t size, size_t nmemb, void *user) {
  http_result_t *r = user;
  size_t n = size * nmemb;
  char line[512];
  size_t l = n < sizeof line - 1 ? n : sizeof line - 1;
  memcpy(line, data, l);
  line[l] = '\0';
  line[strcspn(line, "\r\n")] = '\0';
  if (strncasecmp(line, "Allow: ", 7) == 0)
    snprintf(r->allow, sizeof r->allow, "%.120s", line + 7);
  else if (strncasecmp(line, "Content-Type: ", 14) == 0)
    snprintf(r->content_type, sizeof r->content_type, "%.120s", line + 14);
  else if (strncasecmp(line, "Location: ", 10) == 0)
    snprintf(r->location, sizeof r->location, "%.180s", line + 10);
  else if (strncasecmp(line, "WWW-Authenticate: ", 18) == 0)
    r->www_authenticate = 1;
  return n;
}

void harness_http(const char *method, const char *url, const char *body, size_t body_len,
                  const char *content_type, const char *token, http_result_t *r) {
  CURL *h = curl_easy_init();
  struct curl_slist *hdrs = NULL;
  buf_t b = {0};
  char line[512];
  memset(r, 0, sizeof *r);
  assert_non_null(h);
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
  if (strcmp(method, "HEAD") == 0)
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 10000L);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
  hdrs = curl_slist_append(hdrs, "Expect:");
  if (content_type) {
    snprintf(line, sizeof line, "Content-Type: %s", content_type);
    hdrs = curl_slist_append(hdrs, line);
  } else if (body) {
    hdrs = curl_slist_append(hdrs, "Content-Type:");
  }
  if (token) {
    snprintf(line, sizeof line, "Authorization: Bearer %s", token);
    hdrs = curl_slist_append(hdrs, line);
  }
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
  if (body) {
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
  }
  if (curl_easy_perform(h) == CURLE_OK)
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
  r->body = b.p ? b.p : strdup("");
  r->len = b.len;
  curl_slist_free_all(hdrs);
  curl_easy_cleanup(h);
}

void harness_http_free(http_result_t *r) {
  free(r->body);
  r->body = NULL;
}

json_t *harness_get_json(const char *url, long *status) {
  http_result_t r;
  harness_http("GET", url, NULL, 0, NULL, NULL, &r);
  if (status)
    *status = r.status;
  json_t *v = json_loads(r.body, 0, NULL);
  harness_http_free(&r);
  return v;
}

/* ---- fake agents ----------------------------------------------------------------------- */

void harness_agent_start(wagma_etcd_t *etcd, fake_agent_t *a, const char *name, int port, int ttl) {
  char key[128], val[160];
  memset(a, 0, sizeof *a);
  snprintf(a->name, sizeof a->name, "%s", name);
  assert_int_equal(wagma_etcd_lease_grant(etcd, ttl, &a->lease), 0);
  snprintf(key, sizeof key, "/wagma/agents/%s", name);
  snprintf(val, sizeof val,
           "{\"address\":\"127.0.0.1:%d\",\"device\":\"cpu\",\"capacity\":1,"
           "\"version\":\"test\",\"started\":1700000000}",
           port);
  assert_int_equal(wagma_etcd_put(etcd, key, val, strlen(val), a->lease, NULL), 0);
  assert_int_equal(wagma_etcd_keepalive_start(etcd, a->lease, NULL, NULL, &a->ka), 0);
}

void harness_agent_freeze(fake_agent_t *a) {
  wagma_etcd_keepalive_stop(a->ka);
  a->ka = NULL;
}

void harness_agent_kill(wagma_etcd_t *etcd, fake_agent_t *a) {
  harness_agent_freeze(a);
  if (a->lease)
    wagma_etcd_lease_revoke(etcd, a->lease);
  a->lease = 0;
}

void harness_progress(wagma_etcd_t *etcd, const char *job, const char *agent, uint64_t iteration,
                      const char *state, double loss) {
  char key[192], val[256];
  snprintf(key, sizeof key, "/wagma/jobs/%s/progress/%s", job, agent);
  snprintf(val, sizeof val,
           "{\"state\":\"%s\",\"epoch\":1,\"iteration\":%llu,\"loss\":%g,\"accuracy\":null,"
           "\"step_time\":0.01,\"staleness\":1,\"rounds_activated\":3,\"rounds_joined\":4}",
           state, (unsigned long long)iteration, loss);
  assert_int_equal(wagma_etcd_put(etcd, key, val, strlen(val), 0, NULL), 0);
}

/* ---- job polling --------------------------------------------------------------------------- */

static json_t *get_job(const char *base, const char *job) {
  char url[256];
  snprintf(url, sizeof url, "%s/v1/jobs/%s", base, job);
  long st = 0;
  json_t *v = harness_get_json(url, &st);
  if (st != 200) {
    json_decref(v);
    return NULL;
  }
  return v;
}

long long harness_job_epoch(const char *base, const char *job) {
  json_t *v = get_job(base, job);
  long long e = v ? json_integer_value(json_object_get(json_object_get(v, "status"), "epoch")) : -1;
  json_decref(v);
  return e;
}

const char *harness_job_state(const char *base, const char *job, char *buf, size_t len) {
  json_t *v = get_job(base, job);
  const char *s =
      v ? json_string_value(json_object_get(json_object_get(v, "status"), "state")) : NULL;
  snprintf(buf, len, "%s", s ? s : "");
  json_decref(v);
  return buf;
}

double harness_wait_epoch(const char *base, const char *job, long long epoch, double timeout) {
  double t0 = harness_now();
  while (harness_now() - t0 < timeout) {
    if (harness_job_epoch(base, job) >= epoch)
      return harness_now() - t0;
    harness_sleep(0.05);
  }
  return -1;
}

double harness_wait_state(const char *base, const char *job, const char *state, double timeout) {
  double t0 = harness_now();
  char buf[32];
  while (harness_now() - t0 < timeout) {
    if (strcmp(harness_job_state(base, job, buf, sizeof buf), state) == 0)
      return harness_now() - t0;
    harness_sleep(0.05);
  }
  return -1;
}
