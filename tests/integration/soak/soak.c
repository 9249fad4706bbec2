/* soak.c — wagma_soak: the soak driver (issue 9). A real etcd, a coordinator pair and 6
 * wagma-agent processes (tests/integration/agent/cluster) train jobs while the driver injects
 * random faults at bounded rates, and checks, continuously:
 *   - survivors never restart: every process the driver did not kill or restart keeps its PID
 *     (waitpid WNOHANG on each of them after every poll);
 *   - no hang: the job's progress (the largest iteration of its members, read from the
 *     coordinators' REST every POLL_S) advances within the bound after the later of its last
 *     advance and the last event: max(agent lease TTL, coordinator lease TTL) + 1 s + SLACK_S;
 *   - each job succeeds with a final accuracy (mean over its members) within 1 point of the
 *     same job run on the calm cluster before the faults start (the "clean" run); a job
 *     that succeeds without any member reporting a finished model is a failure.
 * The engine's sum-of-models invariant is internal to the agents and not observable from
 * outside; what is checked instead at each job's end is that the final models of the members
 * that finished agree (their fingerprint spread, docs/agent.md) within SPREAD_BOUND, when at
 * least two finished with one (a member that died before the end, or joined at the last
 * round, reports none).
 *
 * Events (weights in pick_event): SIGKILL of an agent (it stays down until a join), SIGSTOP of
 * an agent for 0.5-4 s then SIGCONT, restart of an agent (SIGTERM and start again), an agent
 * leaving (SIGTERM), an agent joining (a down one starts again under its name), an etcd restart
 * (SIGKILL and start on the same data dir), a SIGKILL of the coordinator leader (restarted
 * 1-3 s later), a network partition of one agent (its link cut for 0.5-6 s, then restored),
 * and a cut of that agent's data plane only for 0.5-8 s (issue 27: it still reaches etcd).
 * The first events take each kind once (as the state allows: a join needs an agent down, a
 * partition the namespaced agent up), so a short run covers every kind; later ones are drawn
 * by weight (pick_event). Rates: one event every GAP_MIN_S..GAP_MAX_S, at most one etcd restart and
 * one leader kill per RARE_GAP_S; at least MIN_LIVE agents stay up and running.
 *
 * Partitions: the last agent runs in a network namespace of its own (wgsoak<pid>), joined to
 * this one by a veth pair (10.213.K.1 here, 10.213.K.2 there, K from the pid). etcd listens on
 * 10.213.K.1 as well as 127.0.0.1, and every other agent listens on 10.213.K.1, so the agent
 * in the namespace reaches etcd and its peers only over the veth. A partition sets the link
 * down inside the namespace: its packets go nowhere (its own calls fail, its peers' time out,
 * as with a pulled cable), and its lease expires when the cut outlasts the TTL. The heal sets
 * the link up; it counts as a membership change (the stall bound runs from it). A data-plane
 * cut adds `ip rule ... blackhole` rules in the namespace for the data-plane ports instead
 * (docs/design.md §7.3: the coordinator plans around the agent and quarantines it until its
 * probe reaches its peers again); the heal deletes them. This needs
 * root and iproute2; without them the driver says why and runs without partitions. The
 * namespace (and with it the veth pair) is deleted at exit.
 *
 *   wagma_soak [--events N] [--duration S] [--seed N] [--iterations N] [--transport tcp|nccl]
 * Runs jobs back to back until N events were injected (default 40) and, with --duration, at
 * most S seconds of faults (the job under way then finishes in calm). Prints one line per event
 * and a summary (events, worst stall, accuracies); exit 0 when every check held, 1 otherwise
 * (a failed check is printed and the run goes on, up to 20 of them).
 * --transport nccl: the agents average over the NCCL transport, which needs $WAGMA_AGENT_BIN
 * to be wagma-agent-fakenccl (the fake NCCL; the cluster sets FAKE_NCCL_HOST to each agent's
 * listen address, so the agent in the partition namespace has a lane too); the summary adds
 * what the lanes did.
 * Needs $WAGMA_AGENT_BIN and $WAGMA_COORDINATOR_BIN. */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cluster.h"
#include "http_client.h"
#include "process.h"

#define NAGENTS 6
#define MIN_LIVE 3
#define AGENT_TTL_S 2.0
#define COORD_TTL_S 3.0
#define SLACK_S 3.0 /* REST polls, progress interval 0.2 s, etcd restart, 2 shared cores */
#define POLL_S 0.1
#define GAP_MIN_S 0.5
#define GAP_MAX_S 2.5
#define RARE_GAP_S 8.0
#define SPREAD_BOUND 0.05
#define ACCURACY_POINTS 0.01

static const char *const agent_args[] = {"--lease-ttl",
                                         "2",
                                         "--progress-interval",
                                         "0.2",
                                         "--round-deadline",
                                         "0.3",
                                         "--connect-timeout",
                                         "20",
                                         "--synthetic-train",
                                         "2048",
                                         "--synthetic-test",
                                         "512",
                                         "--eval-samples",
                                         "512",
                                         "--linger",
                                         "5",
                                         "--data-dir",
                                         "/nonexistent/wagma-test",
                                         NULL};
static const char *const coordinator_args[] = {"--read-staleness-ms", "500", NULL};

/* --transport nccl: agent_args and "--transport nccl" (the agents are then
 * wagma-agent-fakenccl, the agent built against tests/fake_nccl: bench/soak/run.sh). */
static const char *nccl_agent_args[sizeof agent_args / sizeof agent_args[0] + 2];

static const char *const *agents_with_nccl(void) {
  size_t n = 0;
  for (; agent_args[n]; n++)
    nccl_agent_args[n] = agent_args[n];
  nccl_agent_args[n++] = "--transport";
  nccl_agent_args[n++] = "nccl";
  nccl_agent_args[n] = NULL;
  return nccl_agent_args;
}

/* What the agents' NCCL lanes did over the run, from their logs (every run of each agent):
 * agent-epochs (one per member and epoch) whose lane came up, those without one, and the
 * transfers and lane failures of the epochs an agent closed (a SIGKILLed agent closes none:
 * its last epoch is not counted). */
static void report_lanes(const cluster_t *c) {
  long up = 0, none = 0;
  unsigned long long transfers = 0, failures = 0;
  for (int i = 0; i < c->nagents; i++) {
    char path[320], line[2048];
    snprintf(path, sizeof path, "%s/agent-%d.log", c->dir, i);
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof line, f)) {
      const char *p;
      unsigned long long t, fl;
      up += strstr(line, "nccl lane up in epoch") != NULL;
      none += strstr(line, "no nccl lane in epoch") != NULL;
      if ((p = strstr(line, " closed: ")) &&
          sscanf(p, " closed: %llu transfers on the nccl lane", &t) == 1) {
        transfers += t;
        if ((p = strstr(p, "MiB received), ")) && sscanf(p, "MiB received), %llu", &fl) == 1)
          failures += fl;
      }
    }
    if (f)
      fclose(f);
  }
  printf("soak: nccl lanes: %ld agent-epochs up, %ld without a lane (payloads on TCP), %llu "
         "transfers on the lanes, %llu lane failures (each a revoke, then TCP), in the epochs "
         "closed\n",
         up, none, transfers, failures);
}

enum agent_state { UP = 0, STOPPED, DOWN, CUT };

static const char *const kind_names[] = {"kill",        "stop",      "restart",
                                         "leave",       "join",      "etcd-restart",
                                         "leader-kill", "partition", "data-cut"};
enum {
  EV_KILL,
  EV_STOP,
  EV_RESTART,
  EV_LEAVE,
  EV_JOIN,
  EV_ETCD,
  EV_LEADER,
  EV_PARTITION,
  EV_DATA_CUT,
  EV_KINDS
};

typedef struct soak {
  cluster_t c;
  coordinator_process_t coord[2]; /* [0] is c.coordinator's copy, kept in sync */
  double coord_restart_at[2];
  enum agent_state state[CLUSTER_MAX_AGENTS];
  double cont_at[CLUSTER_MAX_AGENTS]; /* STOPPED: SIGCONT then; CUT: the link restored then */
  int data_cut; /* the CUT agent's cut is of its data plane only (rules, not the link) */
  /* the rules of that cut as added ("sport"/"dport" and the port): an agent that restarts
   * meanwhile may listen on another port, so the heal deletes these, not the ports of now */
  int ncut_rules;
  struct {
    const char *dir;
    int port;
  } cut_rules[CLUSTER_MAX_AGENTS];
  cluster_netns_t net;
  long events, by_kind[EV_KINDS];
  double last_event, last_etcd, last_leader_kill;
  double next_event; /* when the next event is due (across jobs) */
  double worst_stall;
  int failures;
  unsigned seed;
} soak_t;

static double uniform(soak_t *s, double lo, double hi) {
  return lo + (hi - lo) * ((double)rand_r(&s->seed) / RAND_MAX);
}

static void failure(soak_t *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void failure(soak_t *s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "SOAK FAILURE: ");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  s->failures++;
}

/* ---- processes ------------------------------------------------------------------------ */

/* 1 when pid has exited (reaped here; how, in how), 0 when it still runs. */
static int exited(pid_t pid, char *how, size_t len) {
  int status;
  if (pid <= 0 || waitpid(pid, &status, WNOHANG) != pid)
    return 0;
  if (WIFEXITED(status))
    snprintf(how, len, "exit status %d", WEXITSTATUS(status));
  else
    snprintf(how, len, "signal %d", WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return 1;
}

/* Survivors keep their PID: no process the driver believes alive has exited. */
static void check_survivors(soak_t *s) {
  char how[64];
  for (int i = 0; i < s->c.nagents; i++)
    if (s->state[i] != DOWN && exited(s->c.agent[i], how, sizeof how)) {
      failure(s, "%s (pid %d) exited on its own (%s)", s->c.agent_name[i], (int)s->c.agent[i], how);
      s->c.agent[i] = 0;
      s->state[i] = DOWN;
    }
  for (int k = 0; k < 2; k++)
    if (s->coord[k].pid > 0 && exited(s->coord[k].pid, how, sizeof how)) {
      failure(s, "coordinator %d (pid %d) exited on its own (%s)", k, (int)s->coord[k].pid, how);
      s->coord[k].pid = 0;
    }
  pid_t etcd = etcd_fixture_pid(s->c.etcd, 0);
  if (etcd > 0 && kill(etcd, 0) != 0)
    failure(s, "etcd (pid %d) is gone", (int)etcd);
}

static int live_agents(const soak_t *s) {
  int n = 0;
  for (int i = 0; i < s->c.nagents; i++)
    n += s->state[i] == UP;
  return n;
}

static int pick_agent(soak_t *s, enum agent_state want) {
  int candidates[CLUSTER_MAX_AGENTS], n = 0;
  for (int i = 0; i < s->c.nagents; i++)
    if (s->state[i] == want)
      candidates[n++] = i;
  return n ? candidates[rand_r(&s->seed) % n] : -1;
}

static int start_coordinator(soak_t *s, int k) {
  char log[320], id[32];
  snprintf(log, sizeof log, "%s/coordinator-%d.log", s->c.dir, k);
  snprintf(id, sizeof id, "coord-%d", k);
  coordinator_options_t o = {.endpoints = etcd_fixture_endpoints(s->c.etcd),
                             .id = id,
                             .lease_ttl = (int)COORD_TTL_S,
                             .log = log,
                             .extra = coordinator_args};
  return coordinator_process_start(&o, &s->coord[k]);
}

/* Points the cluster's REST calls at a running coordinator. */
static void use_live_coordinator(soak_t *s) {
  for (int k = 0; k < 2; k++)
    if (s->coord[k].pid > 0 && strcmp(s->c.api, s->coord[k].base) == 0)
      return;
  for (int k = 0; k < 2; k++)
    if (s->coord[k].pid > 0) {
      snprintf(s->c.api, sizeof s->c.api, "%s", s->coord[k].base);
      return;
    }
}

/* Index of the coordinator whose /healthz says leader, or -1. */
static int leader(soak_t *s) {
  for (int k = 0; k < 2; k++) {
    if (s->coord[k].pid <= 0)
      continue;
    char url[128];
    http_result_t r;
    snprintf(url, sizeof url, "%s/healthz", s->coord[k].base);
    int ok = http_request("GET", url, NULL, 0, NULL, NULL, &r) == 0 && r.status == 200 && r.body &&
             strstr(r.body, "\"leader\":true");
    http_result_free(&r);
    if (ok)
      return k;
  }
  return -1;
}

/* ---- the partitionable agent's network namespace -------------------------------------- */

/* Runs the shell command that printf(fmt, ...) makes, its output discarded: 0 when it exited 0. */
/* Cuts (up = 0) or restores (up = 1) the partitionable agent's link; 0 or -1. */
static int net_link(soak_t *s, int up) {
  return cluster_sh("ip -n %s link set %s %s", s->net.ns, s->net.link, up ? "up" : "down");
}

/* Cuts (on = 1) or restores the data plane of the partitionable agent only: blackhole rules
 * in its namespace for what it sends to the other agents' data-plane ports and from its own
 * (test_agent_partition does the same); etcd and the coordinators stay reachable. */
static int net_data_cut(soak_t *s, int on) {
  int rc = 0;
  if (on) {
    s->ncut_rules = 0;
    for (int k = 0; k < s->c.nagents; k++) {
      s->cut_rules[s->ncut_rules].dir = k == s->net.agent ? "sport" : "dport";
      s->cut_rules[s->ncut_rules++].port = s->c.agent_port[k];
    }
  }
  for (int k = 0; k < s->ncut_rules; k++)
    rc |= cluster_sh("ip -n %s rule %s to %s ipproto tcp %s %d blackhole", s->net.ns,
                     on ? "add" : "del", s->net.here, s->cut_rules[k].dir, s->cut_rules[k].port);
  if (!on)
    s->ncut_rules = 0;
  return rc;
}

/* ---- events --------------------------------------------------------------------------- */

static void note_event(soak_t *s, int kind, const char *what) {
  s->events++;
  s->by_kind[kind]++;
  s->last_event = cluster_now();
  printf("%8.2f event %ld %s %s\n", s->last_event, s->events, kind_names[kind], what);
  fflush(stdout);
}

/* Tries one event of kind; 1 when it happened. */
static int inject(soak_t *s, int kind) {
  double now = cluster_now();
  char what[96];
  int i;
  switch (kind) {
  case EV_KILL:
  case EV_STOP:
  case EV_RESTART:
  case EV_LEAVE:
    if (live_agents(s) <= MIN_LIVE || (i = pick_agent(s, UP)) < 0)
      return 0;
    snprintf(what, sizeof what, "%s pid %d", s->c.agent_name[i], (int)s->c.agent[i]);
    if (kind == EV_KILL) {
      kill(s->c.agent[i], SIGKILL);
      proc_wait(s->c.agent[i], 5);
      s->c.agent[i] = 0;
      s->state[i] = DOWN;
    } else if (kind == EV_STOP) {
      kill(s->c.agent[i], SIGSTOP);
      s->state[i] = STOPPED;
      s->cont_at[i] = now + uniform(s, 0.5, 4.0);
    } else if (kind == EV_RESTART) {
      if (cluster_restart_agent(&s->c, i, NULL) != 0)
        failure(s, "cannot restart %s", s->c.agent_name[i]);
      s->state[i] = UP;
    } else {
      proc_stop(s->c.agent[i], SIGTERM, 10);
      s->c.agent[i] = 0;
      s->state[i] = DOWN;
    }
    break;
  case EV_JOIN:
    if ((i = pick_agent(s, DOWN)) >= 0) {
      if (cluster_restart_agent(&s->c, i, NULL) != 0)
        failure(s, "cannot start %s", s->c.agent_name[i]);
    } else if (s->c.nagents < CLUSTER_MAX_AGENTS) {
      i = cluster_add_agent(&s->c, NULL);
      if (i < 0) {
        failure(s, "cannot add an agent");
        return 0;
      }
    } else {
      return 0;
    }
    s->state[i] = UP;
    snprintf(what, sizeof what, "%s pid %d", s->c.agent_name[i], (int)s->c.agent[i]);
    break;
  case EV_ETCD:
    if (now - s->last_etcd < RARE_GAP_S)
      return 0;
    etcd_fixture_kill(s->c.etcd, 0);
    if (etcd_fixture_restart(s->c.etcd, 0) != 0)
      failure(s, "etcd did not come back");
    s->last_etcd = now;
    snprintf(what, sizeof what, "pid %d", (int)etcd_fixture_pid(s->c.etcd, 0));
    break;
  case EV_LEADER: {
    int k;
    if (now - s->last_leader_kill < RARE_GAP_S || s->coord[0].pid <= 0 || s->coord[1].pid <= 0 ||
        (k = leader(s)) < 0)
      return 0;
    snprintf(what, sizeof what, "coord-%d pid %d", k, (int)s->coord[k].pid);
    coordinator_process_stop(&s->coord[k], SIGKILL);
    s->coord_restart_at[k] = now + uniform(s, 1.0, 3.0);
    s->last_leader_kill = now;
    use_live_coordinator(s);
    break;
  }
  case EV_PARTITION:
    i = s->net.agent;
    if (!s->net.on || i < 0 || s->state[i] != UP || live_agents(s) <= MIN_LIVE)
      return 0;
    if (net_link(s, 0) != 0) {
      failure(s, "cannot cut the link of %s", s->c.agent_name[i]);
      return 0;
    }
    s->state[i] = CUT;
    s->data_cut = 0;
    s->cont_at[i] = now + uniform(s, 0.5, 6.0);
    snprintf(what, sizeof what, "%s pid %d for %.1f s", s->c.agent_name[i], (int)s->c.agent[i],
             s->cont_at[i] - now);
    break;
  case EV_DATA_CUT:
    i = s->net.agent;
    if (!s->net.on || i < 0 || s->state[i] != UP || live_agents(s) <= MIN_LIVE)
      return 0;
    if (net_data_cut(s, 1) != 0) {
      net_data_cut(s, 0);
      failure(s, "cannot cut the data plane of %s", s->c.agent_name[i]);
      return 0;
    }
    s->state[i] = CUT;
    s->data_cut = 1;
    s->cont_at[i] = now + uniform(s, 0.5, 8.0);
    snprintf(what, sizeof what, "%s pid %d, data plane only, for %.1f s", s->c.agent_name[i],
             (int)s->c.agent[i], s->cont_at[i] - now);
    break;
  default: return 0;
  }
  note_event(s, kind, what);
  return 1;
}

static int pick_event(soak_t *s) {
  static const int weights[EV_KINDS] = {3, 3, 2, 1, 3, 1, 1, 2, 2};
  int total = 0, r;
  for (int k = 0; k < EV_KINDS; k++)
    total += weights[k];
  r = (int)(rand_r(&s->seed) % (unsigned)total);
  for (int k = 0; k < EV_KINDS; k++)
    if ((r -= weights[k]) < 0)
      return k;
  return EV_KILL;
}

/* Due SIGCONTs and coordinator restarts (part of the events that scheduled them). */
static void housekeeping(soak_t *s) {
  double now = cluster_now();
  for (int i = 0; i < s->c.nagents; i++)
    if (s->state[i] == STOPPED && now >= s->cont_at[i]) {
      kill(s->c.agent[i], SIGCONT);
      s->state[i] = UP;
    } else if (s->state[i] == CUT && now >= s->cont_at[i]) {
      if ((s->data_cut ? net_data_cut(s, 0) : net_link(s, 1)) != 0)
        failure(s, "cannot restore the link of %s", s->c.agent_name[i]);
      s->state[i] = UP;
      s->last_event = now; /* it rejoins: a membership change like a join */
      printf("%8.2f heal %s\n", now, s->c.agent_name[i]);
      fflush(stdout);
    }
  for (int k = 0; k < 2; k++)
    if (s->coord[k].pid <= 0 && s->coord_restart_at[k] > 0 && now >= s->coord_restart_at[k]) {
      if (start_coordinator(s, k) != 0)
        failure(s, "cannot restart coordinator %d", k);
      s->coord_restart_at[k] = 0;
    }
  use_live_coordinator(s);
}

/* ---- jobs ----------------------------------------------------------------------------- */

static int submit(soak_t *s, const char *name, long iterations) {
  char json[512], *body = NULL;
  long st = 0;
  snprintf(json, sizeof json,
           "{\"name\":\"%s\",\"model\":\"softmax\",\"dataset\":\"synthetic\","
           "\"algorithm\":\"wagma\",\"workers\":4,\"min_workers\":2,\"group_size\":2,"
           "\"staleness_bound\":4,\"batch_size\":32,\"iterations\":%ld,"
           "\"eval_every\":100000}",
           name, iterations);
  for (double t0 = cluster_now(); cluster_now() - t0 < 30; cluster_sleep(0.5)) {
    use_live_coordinator(s);
    if (cluster_http(&s->c, "POST", "/v1/jobs", json, &st, &body) == 0 && st == 201) {
      free(body);
      return 0;
    }
    free(body);
    body = NULL;
  }
  fprintf(stderr, "cannot submit %s (last status %ld)\n", name, st);
  return -1;
}

/* Mean final accuracy of the members that finished; -1 when none did. */
static double final_accuracy(const job_view_t *v) {
  double sum = 0;
  int n = 0;
  for (int m = 0; m < v->nmembers; m++)
    if (strcmp(v->members[m].state, "done") == 0) {
      sum += v->members[m].accuracy;
      n++;
    }
  return n ? sum / n : -1;
}

/* How far apart the final models of the members that finished are (job_fingerprint_spread
 * over them: a member that died before the end reports none); -1 when fewer than 2 finished
 * with a fingerprint (one that joined at the last round trained none and reports none). */
static double finished_spread(const job_view_t *v) {
  static job_view_t done; /* (large: not on the stack) */
  done.nmembers = 0;
  for (int m = 0; m < v->nmembers; m++)
    if (strcmp(v->members[m].state, "done") == 0 && v->members[m].nfingerprint == 5)
      done.members[done.nmembers++] = v->members[m];
  return done.nmembers >= 2 ? job_fingerprint_spread(&done) : -1;
}

static uint64_t max_iteration(const job_view_t *v) {
  uint64_t it = v->iteration;
  for (int m = 0; m < v->nmembers; m++)
    if (v->members[m].has_progress && v->members[m].iteration > it)
      it = v->members[m].iteration;
  return it;
}

/* Runs one job to its end; with faults, injects events until events_left is 0 or faults_until
 * passes. Returns the final accuracy, or -1 on failure. */
static double run_job(soak_t *s, const char *name, long iterations, int faults, long events_left,
                      double faults_until, double *seconds) {
  const double bound = (AGENT_TTL_S > COORD_TTL_S ? AGENT_TTL_S : COORD_TTL_S) + 1.0 + SLACK_S;
  double t0 = cluster_now(), last_advance = t0;
  uint64_t last_iteration = 0;
  job_view_t v;
  long injected = 0;
  if (submit(s, name, iterations) != 0)
    return -1;
  for (;;) {
    double now = cluster_now();
    housekeeping(s);
    check_survivors(s);
    if (cluster_job_get(&s->c, name, &v) == 0) {
      uint64_t it = max_iteration(&v);
      if (it > last_iteration) {
        last_iteration = it;
        last_advance = now;
      }
      if (!strcmp(v.state, "succeeded") || !strcmp(v.state, "failed") ||
          !strcmp(v.state, "stopped"))
        break;
    }
    /* Training: started and not yet at its last iteration (the final evaluation and the
     * members' last reports that follow are not training). */
    int training = last_iteration > 0 && last_iteration < (uint64_t)iterations;
    double since = now - (last_advance > s->last_event ? last_advance : s->last_event);
    if (training && since > s->worst_stall)
      s->worst_stall = since;
    if (training && since > bound) {
      failure(s,
              "job %s: no progress for %.1f s after the last event or advance (bound %.1f s, "
              "iteration %llu)",
              name, since, bound, (unsigned long long)last_iteration);
      last_advance = now; /* report each stall once */
    }
    if (now - t0 > 600) {
      failure(s, "job %s did not finish within 600 s", name);
      return -1;
    }
    if (faults && injected < events_left && now < faults_until && now >= s->next_event &&
        training) {
      int done = 0;
      /* every kind once first (a short run covers each), then drawn by weight */
      for (int k = 0; k < EV_KINDS && !done; k++)
        done = !s->by_kind[k] && inject(s, k);
      for (int tries = 0; tries < 8 && !done; tries++)
        done = inject(s, pick_event(s));
      injected += done;
      s->next_event = now + uniform(s, GAP_MIN_S, GAP_MAX_S);
    }
    cluster_sleep(POLL_S);
  }
  *seconds = cluster_now() - t0;
  double accuracy = final_accuracy(&v);
  double spread = finished_spread(&v);
  printf("%8.2f job %s %s in %.1f s, iteration %llu, accuracy %.4f, model spread %.4f (%s)\n",
         cluster_now(), name, v.state, *seconds, (unsigned long long)max_iteration(&v), accuracy,
         spread, v.reason);
  if (strcmp(v.state, "succeeded") != 0) {
    failure(s, "job %s ended %s: %s", name, v.state, v.reason);
    return -1;
  }
  if (accuracy < 0) {
    failure(s, "job %s succeeded at iteration %llu but no member reported a finished model (%s)",
            name, (unsigned long long)max_iteration(&v), v.reason);
    return -1;
  }
  if (spread > SPREAD_BOUND)
    failure(s, "job %s: the members' final models differ (spread %.4f > %.2f)", name, spread,
            SPREAD_BOUND);
  return accuracy;
}

/* ---- main ----------------------------------------------------------------------------- */

int main(int argc, char **argv) {
  static soak_t s;
  static const struct option longs[] = {
      {"events", required_argument, 0, 'e'},    {"duration", required_argument, 0, 'd'},
      {"seed", required_argument, 0, 's'},      {"iterations", required_argument, 0, 'i'},
      {"transport", required_argument, 0, 't'}, {0, 0, 0, 0}};
  int nccl = 0;
  long target = 40, iterations = 4000;
  double duration = 0;
  int opt;
  s.seed = (unsigned)getpid();
  while ((opt = getopt_long(argc, argv, "", longs, NULL)) != -1) {
    switch (opt) {
    case 'e': target = atol(optarg); break;
    case 'd': duration = atof(optarg); break;
    case 's': s.seed = (unsigned)atol(optarg); break;
    case 'i': iterations = atol(optarg); break;
    case 't':
      if (strcmp(optarg, "nccl") == 0 || strcmp(optarg, "tcp") == 0) {
        nccl = strcmp(optarg, "nccl") == 0;
        break;
      }
      /* fall through */
    default:
      fprintf(stderr, "usage: wagma_soak [--events N] [--duration S] [--seed N] "
                      "[--iterations N] [--transport tcp|nccl]\n");
      return 2;
    }
  }
  printf("soak: seed %u, %ld events, %.0f s of faults at most (0 = no limit), jobs of %ld "
         "iterations, transport %s\n",
         s.seed, target, duration, iterations, nccl ? "nccl" : "tcp");
  signal(SIGPIPE, SIG_IGN);
  cluster_netns_open(&s.net, "wgsoak");
  if (s.net.on)
    printf("soak: partitions on: agent-%d in network namespace %s (%s), the others on %s\n",
           NAGENTS - 1, s.net.ns, s.net.there, s.net.here);
  else
    printf("soak: partitions off: %s\n", s.net.why_off);
  cluster_net_t net = {.agent_host = s.net.on ? s.net.here : NULL,
                       .etcd_extra_host = s.net.on ? s.net.here : NULL};
  int started =
      cluster_start_net(&s.c, s.net.on ? NAGENTS - 1 : NAGENTS,
                        nccl ? agents_with_nccl() : agent_args, coordinator_args, &net) == 0;
  if (started && s.net.on) { /* the last agent, inside the namespace */
    started = cluster_place_agent(&s.c, NAGENTS - 1, s.net.ns, s.net.there,
                                  etcd_fixture_endpoints_on_extra_host(s.c.etcd)) == 0 &&
              cluster_add_agent(&s.c, NULL) == NAGENTS - 1 &&
              cluster_wait_agents(&s.c, NAGENTS, 30) == 0;
    s.net.agent = NAGENTS - 1;
  }
  if (!started) {
    cluster_dump_logs(&s.c);
    cluster_stop(&s.c);
    cluster_netns_close(&s.net);
    return 1;
  }
  s.coord[0] = s.c.coordinator;
  if (start_coordinator(&s, 1) != 0 || coordinator_process_wait_healthy(&s.coord[1], 20) != 0) {
    fprintf(stderr, "the second coordinator did not start\n");
    s.failures++;
  }

  double clean_s = 0, seconds = 0, worst_accuracy_gap = 0;
  double clean = run_job(&s, "clean", iterations, 0, 0, 0, &clean_s);
  double faults_until = duration > 0 ? cluster_now() + duration : 1e300;
  int jobs = 0;
  while (clean >= 0 && s.events < target && cluster_now() < faults_until && s.failures < 20) {
    char name[32];
    snprintf(name, sizeof name, "soak-%d", jobs++);
    double acc = run_job(&s, name, iterations, 1, target - s.events, faults_until, &seconds);
    if (acc < 0)
      break;
    double gap = clean - acc > 0 ? clean - acc : acc - clean;
    if (gap > worst_accuracy_gap)
      worst_accuracy_gap = gap;
    if (gap > ACCURACY_POINTS)
      failure(&s, "job %s: accuracy %.4f vs %.4f clean (more than 1 point apart)", name, acc,
              clean);
  }
  printf("soak: %ld events (", s.events);
  for (int k = 0; k < EV_KINDS; k++)
    printf("%s%s %ld", k ? ", " : "", kind_names[k], s.by_kind[k]);
  printf("), %d jobs, worst stall %.2f s (bound %.1f s), clean accuracy %.4f in %.1f s, worst "
         "accuracy gap %.4f, %d failures\n",
         jobs, s.worst_stall,
         (AGENT_TTL_S > COORD_TTL_S ? AGENT_TTL_S : COORD_TTL_S) + 1.0 + SLACK_S, clean, clean_s,
         worst_accuracy_gap, s.failures);
  if (nccl)
    report_lanes(&s.c);
  if (s.failures)
    cluster_dump_logs(&s.c);
  for (int i = 0; i < s.c.nagents; i++)
    if (s.state[i] == STOPPED)
      kill(s.c.agent[i], SIGCONT);
    else if (s.state[i] == CUT && s.data_cut)
      net_data_cut(&s, 0);
    else if (s.state[i] == CUT)
      net_link(&s, 1);
  coordinator_process_stop(&s.coord[1], SIGTERM);
  s.c.coordinator = s.coord[0];
  cluster_stop(&s.c);
  cluster_netns_close(&s.net);
  return s.failures || clean < 0 ? 1 : 0;
}
