/* cluster.c — see cluster.h. Single-threaded test support; processes, the coordinator and HTTP
 * come from tests/support (process.h, coordinator_process.h, http_client.h). */
#include "cluster.h"

#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <curl/curl.h>

#include "http_client.h"
#include "process.h"

double cluster_now(void) {
  return proc_now();
}

void cluster_sleep(double s) {
  proc_sleep(s);
}

/* SIGCONT + SIGTERM (a frozen agent must see it), SIGKILL after a 10 s grace; reaped. */
static void stop_pid(pid_t pid) {
  proc_stop(pid, SIGTERM, 10.0);
}

/* The path of iproute2's ip, or NULL. */
static const char *ip_binary(void) {
  static const char *const paths[] = {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"};
  for (size_t k = 0; k < sizeof paths / sizeof paths[0]; k++)
    if (access(paths[k], X_OK) == 0)
      return paths[k];
  return NULL;
}

static int start_agent(cluster_t *c, int i, const char *const *extra) {
  char listen[96], log[320];
  const char *argv[72];
  int n = 0, port = proc_free_port_low();
  const char *bin = getenv("WAGMA_AGENT_BIN");
  const char *host = c->agent_host[i][0] ? c->agent_host[i] : c->listen_host;
  if (!bin || port < 0)
    return -1;
  snprintf(c->agent_name[i], sizeof c->agent_name[i], "agent-%d", i);
  snprintf(listen, sizeof listen, "%s:%d", host, port);
  c->agent_port[i] = port;
  snprintf(log, sizeof log, "%s/agent-%d.log", c->dir, i);
  if (c->agent_netns[i][0]) {
    if (!(argv[n++] = ip_binary()))
      return -1;
    argv[n++] = "netns";
    argv[n++] = "exec";
    argv[n++] = c->agent_netns[i];
  }
  argv[n++] = bin;
  argv[n++] = "--etcd";
  argv[n++] = c->agent_etcd[i][0] ? c->agent_etcd[i] : etcd_fixture_endpoints(c->etcd);
  argv[n++] = "--name";
  argv[n++] = c->agent_name[i];
  argv[n++] = "--listen";
  argv[n++] = listen;
  for (int k = 0; c->agent_args && c->agent_args[k] && n < 56; k++)
    argv[n++] = c->agent_args[k];
  for (int k = 0; extra && extra[k] && n < 68; k++)
    argv[n++] = extra[k];
  argv[n] = NULL;
  /* wagma-agent-fakenccl: the fake NCCL's listeners on the agent's own address, so that an
   * agent in a network namespace of its own meets its peers (other agents ignore it) */
  char fake_host[96];
  snprintf(fake_host, sizeof fake_host, "FAKE_NCCL_HOST=%s", host);
  const char *env[] = {fake_host, NULL};
  c->agent[i] = proc_spawn(argv, log, env);
  return c->agent[i] > 0 ? 0 : -1;
}

int cluster_start(cluster_t *c, int nagents, const char *const *agent_args) {
  return cluster_start_with(c, nagents, agent_args, NULL);
}

int cluster_start_with(cluster_t *c, int nagents, const char *const *agent_args,
                       const char *const *coordinator_args) {
  return cluster_start_net(c, nagents, agent_args, coordinator_args, NULL);
}

int cluster_start_net(cluster_t *c, int nagents, const char *const *agent_args,
                      const char *const *coordinator_args, const cluster_net_t *net) {
  char log[320];
  memset(c, 0, sizeof *c);
  c->agent_args = agent_args;
  snprintf(c->listen_host, sizeof c->listen_host, "%s",
           net && net->agent_host ? net->agent_host : "127.0.0.1");
  if (!getenv("WAGMA_COORDINATOR_BIN") || !getenv("WAGMA_AGENT_BIN")) {
    fprintf(stderr, "cluster: WAGMA_COORDINATOR_BIN / WAGMA_AGENT_BIN not set\n");
    return -1;
  }
  snprintf(c->dir, sizeof c->dir, "%s/wagma-agent-test.XXXXXX",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(c->dir))
    return -1;
  curl_global_init(CURL_GLOBAL_DEFAULT);
  etcd_fixture_options_t eo = {.extra_client_host = net ? net->etcd_extra_host : NULL};
  if (etcd_fixture_start_with(1, &eo, &c->etcd) != 0)
    return -1;
  snprintf(log, sizeof log, "%s/coordinator.log", c->dir);
  coordinator_options_t o = {.endpoints = etcd_fixture_endpoints(c->etcd),
                             .lease_ttl = 3,
                             .log = log,
                             .extra = coordinator_args};
  if (coordinator_process_start(&o, &c->coordinator) != 0)
    return -1;
  snprintf(c->api, sizeof c->api, "%s", c->coordinator.base);
  for (int i = 0; i < nagents; i++) {
    if (start_agent(c, i, NULL) != 0)
      return -1;
    c->nagents++;
  }
  return cluster_wait_agents(c, nagents, 30);
}

int cluster_group_setup(void **state, int nagents, const char *const *agent_args) {
  static cluster_t c;
  if (cluster_start(&c, nagents, agent_args) != 0) {
    cluster_dump_logs(&c);
    cluster_stop(&c);
    return -1;
  }
  *state = &c;
  return 0;
}

int cluster_group_teardown(void **state) {
  cluster_t *c = *state;
  if (c)
    cluster_stop(c);
  return 0;
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

int cluster_place_agent(cluster_t *c, int i, const char *netns, const char *host,
                        const char *etcd_endpoints) {
  if (i < 0 || i >= CLUSTER_MAX_AGENTS || (netns && !ip_binary()))
    return -1;
  snprintf(c->agent_netns[i], sizeof c->agent_netns[i], "%s", netns ? netns : "");
  snprintf(c->agent_host[i], sizeof c->agent_host[i], "%s", netns && host ? host : "");
  snprintf(c->agent_etcd[i], sizeof c->agent_etcd[i], "%s",
           netns && etcd_endpoints ? etcd_endpoints : "");
  return 0;
}

int cluster_restart_agent(cluster_t *c, int i, const char *const *extra) {
  if (i < 0 || i >= c->nagents)
    return -1;
  if (c->agent[i] > 0)
    stop_pid(c->agent[i]);
  c->agent[i] = 0;
  return start_agent(c, i, extra);
}

json_t *cluster_agent_get(const cluster_t *c, const char *name) {
  long st = 0;
  char *body = NULL;
  json_t *found = NULL, *a;
  size_t i;
  if (cluster_http(c, "GET", "/v1/agents", NULL, &st, &body) != 0 || st != 200) {
    free(body);
    return NULL;
  }
  json_t *o = json_loads(body, 0, NULL);
  free(body);
  json_array_foreach(json_object_get(o, "agents"), i, a) {
    if (strcmp(json_string_value(json_object_get(a, "name")) ?: "", name) == 0) {
      found = json_incref(a);
      break;
    }
  }
  json_decref(o);
  return found;
}

void cluster_stop(cluster_t *c) {
  for (int i = 0; i < c->nagents; i++)
    stop_pid(c->agent[i]);
  coordinator_process_stop(&c->coordinator, SIGTERM);
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

int cluster_http(const cluster_t *c, const char *method, const char *path, const char *json,
                 long *status, char **body) {
  char url[512];
  http_result_t r;
  snprintf(url, sizeof url, "%s%s", c->api, path);
  int rc = http_request(method, url, json, json ? strlen(json) : 0,
                        json ? "application/json" : NULL, NULL, &r);
  if (rc == 0) {
    *status = r.status;
    if (body) {
      *body = r.body;
      r.body = NULL;
    }
  }
  http_result_free(&r);
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
  snprintf(v->reason, sizeof v->reason, "%s",
           json_string_value(json_object_get(status, "reason")) ?: "");
  v->epoch = uint_of(status, "epoch");
  v->iteration = uint_of(status, "iteration");
  v->started = num_of(status, "started");
  v->finished = num_of(status, "finished");
  json_t *sum = json_object_get(status, "summary");
  v->summary.accuracy_mean = v->summary.accuracy_min = v->summary.accuracy_max = NAN;
  v->summary.loss_mean = NAN;
  if (json_is_object(sum)) {
    json_t *acc = json_object_get(sum, "accuracy"), *loss = json_object_get(sum, "loss");
    v->summary.members = (int)uint_of(sum, "members");
    v->summary.evaluated = (int)uint_of(sum, "evaluated");
    v->summary.iterations = uint_of(sum, "iterations");
    v->summary.wall_time = num_of(sum, "wall_time");
    if (json_is_object(acc)) {
      v->summary.accuracy_mean = num_of(acc, "mean");
      v->summary.accuracy_min = num_of(acc, "min");
      v->summary.accuracy_max = num_of(acc, "max");
    }
    if (json_is_object(loss))
      v->summary.loss_mean = num_of(loss, "mean");
  }
  v->nwarnings = (int)json_array_size(json_object_get(o, "warnings"));
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
      snprintf(jm->error, sizeof jm->error, "%s",
               json_string_value(json_object_get(p, "error")) ?: "");
      jm->iteration = uint_of(p, "iteration");
      jm->epoch = uint_of(p, "epoch");
      jm->loss = num_of(p, "loss");
      jm->accuracy = num_of(p, "accuracy");
      jm->rounds_activated = uint_of(p, "rounds_activated");
      jm->rounds_joined = uint_of(p, "rounds_joined");
      jm->rounds_skipped = uint_of(p, "rounds_skipped");
      jm->unreachable = (int)json_array_size(json_object_get(p, "unreachable"));
      jm->staleness = uint_of(p, "staleness");
      jm->has_round = json_is_integer(json_object_get(p, "round"));
      jm->round = uint_of(p, "round");
      jm->round_global =
          strcmp(json_string_value(json_object_get(p, "round_kind")) ?: "", "global") == 0;
      json_t *g = json_object_get(p, "group"), *x;
      size_t k;
      json_array_foreach(g, k, x) {
        if (jm->ngroup < JOB_MEMBER_GROUP_MAX)
          jm->group[jm->ngroup++] = (int)json_integer_value(x);
      }
      json_t *f = json_object_get(p, "fingerprint");
      json_array_foreach(f, k, x) {
        if (jm->nfingerprint < JOB_MEMBER_FINGERPRINT_MAX)
          jm->fingerprint[jm->nfingerprint++] = json_number_value(x);
      }
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

int cluster_job_submit(const cluster_t *c, const char *fmt, ...) {
  char json[2048], *body = NULL;
  long st = 0;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(json, sizeof json, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= sizeof json) {
    fprintf(stderr, "submit: the job spec is longer than %zu bytes\n", sizeof json - 1);
    return -1;
  }
  if (cluster_http(c, "POST", "/v1/jobs", json, &st, &body) != 0 || st != 201) {
    fprintf(stderr, "submit %s -> %ld %s\n", json, st, body ? body : "");
    free(body);
    return -1;
  }
  free(body);
  return 0;
}

int cluster_job_patch_workers(const cluster_t *c, const char *job, int workers) {
  char path[128], json[64], *body = NULL;
  long st = 0;
  snprintf(path, sizeof path, "/v1/jobs/%s", job);
  snprintf(json, sizeof json, "{\"workers\":%d}", workers);
  if (cluster_http(c, "PATCH", path, json, &st, &body) != 0 || st != 200) {
    fprintf(stderr, "PATCH %s %s -> %ld %s\n", path, json, st, body ? body : "");
    free(body);
    return -1;
  }
  free(body);
  return 0;
}

int cluster_job_stop(const cluster_t *c, const char *job, double timeout_s) {
  char path[128], *body = NULL;
  long st = 0;
  job_view_t v;
  snprintf(path, sizeof path, "/v1/jobs/%s", job);
  if (cluster_http(c, "DELETE", path, NULL, &st, &body) != 0 ||
      (st != 200 && st != 202 && st != 204)) {
    fprintf(stderr, "DELETE %s -> %ld %s\n", path, st, body ? body : "");
    free(body);
    return -1;
  }
  free(body);
  if (timeout_s > 0 && cluster_job_wait_state(c, job, "stopped", timeout_s, &v) != 0)
    return -1;
  return 0;
}

double job_fingerprint_spread(const job_view_t *v) {
  double spread = 0, norm = 0;
  for (int a = 0; a < v->nmembers; a++) {
    const job_member_t *x = &v->members[a];
    if (x->nfingerprint != 5)
      return -1;
    norm += x->fingerprint[4] / v->nmembers;
    for (int b = 0; b < a; b++)
      for (int k = 0; k < 4; k++) {
        double d = fabs(x->fingerprint[k] - v->members[b].fingerprint[k]);
        spread = d > spread ? d : spread;
      }
  }
  return norm > 0 ? spread / norm : -1;
}

uint64_t job_min_iteration(const job_view_t *v) {
  uint64_t m = UINT64_MAX;
  for (int i = 0; i < v->nmembers; i++)
    if (v->members[i].has_progress && v->members[i].iteration < m)
      m = v->members[i].iteration;
  return m == UINT64_MAX ? 0 : m;
}

double cluster_wait_training(cluster_t *c, const char *job, uint64_t after, int n, int steps,
                             double timeout_s, job_view_t *v) {
  double t0 = cluster_now();
  uint64_t first[CLUSTER_MAX_AGENTS] = {0};
  uint64_t epoch = 0;
  while (cluster_now() - t0 < timeout_s) {
    if (cluster_job_get(c, job, v) == 0 && v->epoch > after && v->nmembers == n) {
      if (v->epoch != epoch) {
        epoch = v->epoch;
        memset(first, 0, sizeof first);
      }
      int ok = 1;
      for (int i = 0; i < v->nmembers; i++) {
        const job_member_t *m = &v->members[i];
        if (!m->has_progress || m->epoch != v->epoch) {
          ok = 0;
          continue;
        }
        if (first[i] == 0)
          first[i] = m->iteration + 1;
        ok &= m->iteration + 1 >= first[i] + (uint64_t)steps;
      }
      if (ok)
        return cluster_now() - t0;
    }
    cluster_sleep(0.1);
  }
  fprintf(stderr,
          "job %s: no epoch > %llu training with %d members within %.0f s (epoch %llu, "
          "%d members)\n",
          job, (unsigned long long)after, n, timeout_s, (unsigned long long)v->epoch, v->nmembers);
  return -1;
}

int cluster_agent_index(const cluster_t *c, const char *name) {
  for (int i = 0; i < c->nagents; i++)
    if (strcmp(c->agent_name[i], name) == 0)
      return i;
  return -1;
}

int cluster_agent_log_count(const cluster_t *c, int i, const char *needle, const char *and_needle) {
  char path[320], line[2048];
  int found = 0;
  snprintf(path, sizeof path, "%s/agent-%d.log", c->dir, i);
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return 0;
  while (fgets(line, sizeof line, f) != NULL)
    found += strstr(line, needle) != NULL && (!and_needle || strstr(line, and_needle) != NULL);
  fclose(f);
  return found;
}

pid_t cluster_program_pid(const cluster_t *c, int i, const char *job) {
  char path[512], line[2048], needle[128];
  snprintf(path, sizeof path, "%s/agent-%d.log", c->dir, i);
  snprintf(needle, sizeof needle, "job %s: launched program", job);
  FILE *f = fopen(path, "r");
  pid_t pid = -1;
  while (f && fgets(line, sizeof line, f)) {
    const char *p = strstr(line, needle);
    const char *q = p ? strstr(p, "(pid ") : NULL;
    if (q)
      pid = (pid_t)atoi(q + 5);
  }
  if (f)
    fclose(f);
  return pid;
}

int cluster_signal_member(const cluster_t *c, int i, const char *job, int sig) {
  pid_t program = cluster_program_pid(c, i, job);
  if (program > 0)
    kill(-program, sig); /* (gone already: nothing to freeze) */
  return kill(c->agent[i], sig);
}

/* ---- network namespaces (cluster.h) ---------------------------------------------------- */

int cluster_sh(const char *fmt, ...) {
  char cmd[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= sizeof cmd - 16)
    return -1;
  strcat(cmd, " >/dev/null 2>&1");
  int st = system(cmd);
  return st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static cluster_netns_t *net_to_delete; /* for atexit: the namespace outlives no run */

static void net_close_at_exit(void) {
  cluster_netns_close(net_to_delete);
}

void cluster_netns_open(cluster_netns_t *n, const char *tag) {
  unsigned pid = (unsigned)getpid();
  n->agent = -1;
  if (geteuid() != 0) {
    snprintf(n->why_off, sizeof n->why_off, "not root (network namespaces need root)");
    return;
  }
  if (cluster_sh("ip -V") != 0) {
    snprintf(n->why_off, sizeof n->why_off, "no ip command (iproute2)");
    return;
  }
  snprintf(n->ns, sizeof n->ns, "%s%u", tag, pid);
  snprintf(n->link, sizeof n->link, "wgs%un", pid % 10000000u);
  char here_link[16];
  snprintf(here_link, sizeof here_link, "wgs%uh", pid % 10000000u);
  net_to_delete = n;
  atexit(net_close_at_exit);
  if (cluster_sh("ip netns add %s", n->ns) != 0) {
    snprintf(n->why_off, sizeof n->why_off, "cannot create the network namespace %s", n->ns);
    n->ns[0] = '\0';
    return;
  }
  for (unsigned k = 0; k < 250 && !n->on; k++) {
    unsigned third = (pid + k) % 250;
    char probe[64];
    snprintf(probe, sizeof probe, "10.213.%u.0/30", third);
    if (cluster_sh("ip -4 addr show to %s | grep -q inet", probe) == 0)
      continue; /* used here already (another run's veth) */
    snprintf(n->here, sizeof n->here, "10.213.%u.1", third);
    snprintf(n->there, sizeof n->there, "10.213.%u.2", third);
    n->on = cluster_sh("ip link add %s type veth peer name %s", here_link, n->link) == 0 &&
            cluster_sh("ip link set %s netns %s", n->link, n->ns) == 0 &&
            cluster_sh("ip addr add %s/30 dev %s", n->here, here_link) == 0 &&
            cluster_sh("ip link set %s up", here_link) == 0 &&
            cluster_sh("ip -n %s addr add %s/30 dev %s", n->ns, n->there, n->link) == 0 &&
            cluster_sh("ip -n %s link set %s up", n->ns, n->link) == 0 &&
            cluster_sh("ip -n %s link set lo up", n->ns) == 0;
    if (!n->on) {
      snprintf(n->why_off, sizeof n->why_off, "cannot set up the veth pair %s/%s", here_link,
               n->link);
      break;
    }
  }
  if (!n->on && !n->why_off[0])
    snprintf(n->why_off, sizeof n->why_off, "no free 10.213.K.0/30");
  if (!n->on)
    cluster_netns_close(n);
}

void cluster_netns_close(cluster_netns_t *n) {
  if (n && n->ns[0]) {
    if (cluster_sh("ip netns delete %s", n->ns) != 0)
      fprintf(stderr, "cluster: cannot delete the network namespace %s\n", n->ns);
    n->ns[0] = '\0';
    n->on = 0;
  }
}
