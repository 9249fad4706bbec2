/* cluster.h — a real wagma cluster on 127.0.0.1 for the agent's integration tests: one etcd
 * (tests/support/etcd_fixture), one wagma-coordinator and N wagma-agent processes, all on free
 * ports, all stopped BY PID (children also get PR_SET_PDEATHSIG). The agents may listen on
 * another address of this host and run in network namespaces the test made
 * (cluster_start_net, cluster_place_agent: the soak's partitions). Logs go to files in a temp
 * dir, printed when a test fails (cluster_dump_logs). Binaries come from $WAGMA_AGENT_BIN and
 * $WAGMA_COORDINATOR_BIN (set by CMake). REST calls go through libcurl, JSON through jansson.
 * Test code: functions return 0 / -1 and print why on stderr. */
#ifndef WAGMA_TEST_AGENT_CLUSTER_H
#define WAGMA_TEST_AGENT_CLUSTER_H

#include <stdint.h>
#include <sys/types.h>

#include <jansson.h>

#include "coordinator_process.h"
#include "etcd_fixture.h"

#define CLUSTER_MAX_AGENTS 8

typedef struct cluster {
  etcd_fixture_t *etcd;
  char dir[256];
  char api[64]; /* "http://127.0.0.1:<port>" */
  coordinator_process_t coordinator;
  int nagents;
  pid_t agent[CLUSTER_MAX_AGENTS];
  char agent_name[CLUSTER_MAX_AGENTS][32];
  int agent_port[CLUSTER_MAX_AGENTS]; /* the port of its --listen <host>:<port> */
  const char *const *agent_args;      /* extra flags of every agent (NULL-terminated) */
  char listen_host[64];               /* the agents' --listen host: 127.0.0.1 by default */
  /* where agent i runs (cluster_place_agent); "" = this namespace, listen_host, etcd's
   * 127.0.0.1 endpoints */
  char agent_netns[CLUSTER_MAX_AGENTS][32];
  char agent_host[CLUSTER_MAX_AGENTS][64];
  char agent_etcd[CLUSTER_MAX_AGENTS][256];
} cluster_t;

/* Addresses of a cluster whose agents are not all on loopback (cluster_start_net). */
typedef struct cluster_net {
  const char *agent_host;      /* every agent's --listen host (NULL: 127.0.0.1) */
  const char *etcd_extra_host; /* etcd's client port listens here too (NULL: none) */
} cluster_net_t;

/* A network namespace of its own joined to this one by a veth pair (cluster_netns_open): an
 * agent placed inside (cluster_place_agent, at `there`) reaches etcd and its peers only over
 * the veth, through `here`. */
typedef struct cluster_netns {
  int on;
  char why_off[160];     /* why on is 0 */
  char ns[32], link[16]; /* the namespace and the veth end inside it */
  char here[20], there[20];
  int agent; /* the index of the agent inside (the caller's), -1 before it is placed */
} cluster_netns_t;

/* Makes namespace <tag><pid> and the veth pair on a 10.213.K.0/30 no interface of this host
 * uses yet (10.213.K.1 here, .2 there). Needs root and iproute2; on failure n->on stays 0 and
 * n->why_off says why. The namespace is deleted at exit if cluster_netns_close was not
 * called (one namespace per process). */
void cluster_netns_open(cluster_netns_t *n, const char *tag);
/* Deletes the namespace (and the veth pair with it). Idempotent. */
void cluster_netns_close(cluster_netns_t *n);
/* Runs a shell command (printf format, output discarded): 0 when it exited 0, else -1. */
int cluster_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Starts etcd, the coordinator and nagents agents (agent-0 ...), each with agent_args (may be
 * NULL) plus its own extra[i] flags (extra may be NULL). Waits until all agents registered. */
int cluster_start(cluster_t *c, int nagents, const char *const *agent_args);
/* cluster_start with extra flags of the coordinator (NULL-terminated, may be NULL). */
int cluster_start_with(cluster_t *c, int nagents, const char *const *agent_args,
                       const char *const *coordinator_args);
/* cluster_start_with on the addresses of net (may be NULL). */
int cluster_start_net(cluster_t *c, int nagents, const char *const *agent_args,
                      const char *const *coordinator_args, const cluster_net_t *net);
/* From its next (re)start, agent i runs inside network namespace netns (through
 * `ip netns exec`, which execs the agent: the pid is the agent's), listens on host and dials
 * etcd at etcd_endpoints. NULL netns: back to this namespace and the cluster's addresses.
 * 0, or -1 when i is not an agent or `ip` is missing. */
int cluster_place_agent(cluster_t *c, int i, const char *netns, const char *host,
                        const char *etcd_endpoints);
/* cmocka group setup / teardown: one static cluster of nagents agents with agent_args (logs
 * dumped when it fails to start); *state becomes the cluster. */
int cluster_group_setup(void **state, int nagents, const char *const *agent_args);
int cluster_group_teardown(void **state);
/* Starts one more agent (agent-<n>) with extra flags (NULL-terminated, may be NULL); returns
 * its index or -1. */
int cluster_add_agent(cluster_t *c, const char *const *extra);
/* Stops agent i (SIGTERM) if it runs and starts it again under the same name, on a new port,
 * with extra flags (NULL-terminated, may be NULL); 0 or -1. */
int cluster_restart_agent(cluster_t *c, int i, const char *const *extra);
/* The entry of agent name in GET /v1/agents, or NULL. Ownership: the caller json_decref's it. */
json_t *cluster_agent_get(const cluster_t *c, const char *name);
/* Stops every process (SIGTERM, then SIGKILL after a grace period), removes the temp dir. */
void cluster_stop(cluster_t *c);
void cluster_dump_logs(const cluster_t *c);
/* Waits until n agents are registered (GET /v1/agents). */
int cluster_wait_agents(cluster_t *c, int n, double timeout_s);

/* One REST call: *status = HTTP status, *body (may be NULL) = the response (caller frees). */
int cluster_http(const cluster_t *c, const char *method, const char *path, const char *json,
                 long *status, char **body);

/* POST /v1/jobs of the JSON that printf(fmt, ...) makes: 0 on 201, else -1 with the status
 * and the answer on stderr. */
int cluster_job_submit(const cluster_t *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* PATCH /v1/jobs/{job} {"workers": workers}: 0 on 200, else -1 (printed). */
int cluster_job_patch_workers(const cluster_t *c, const char *job, int workers);
/* DELETE /v1/jobs/{job}: 0 when it was accepted (200, 202, 204) and, with timeout_s > 0, the
 * job reached "stopped" within timeout_s; else -1 (printed). */
int cluster_job_stop(const cluster_t *c, const char *job, double timeout_s);

/* A snapshot of GET /v1/jobs/{id}. */
#define JOB_MEMBER_GROUP_MAX 64
#define JOB_MEMBER_FINGERPRINT_MAX 8

typedef struct job_member {
  char name[64];
  int has_progress;
  char state[16];
  uint64_t iteration, epoch;
  double loss, accuracy;
  uint64_t rounds_activated, rounds_joined, rounds_skipped;
  int unreachable; /* peers its progress lists as unreachable */
  uint64_t staleness;
  int has_round; /* wagma: the round last averaged in, its kind and my group there */
  uint64_t round;
  int round_global;
  int ngroup;
  int group[JOB_MEMBER_GROUP_MAX];
  int nfingerprint; /* the final report's parameter fingerprint */
  double fingerprint[JOB_MEMBER_FINGERPRINT_MAX];
  char error[256]; /* progress "error" */
} job_member_t;

/* status.summary of a finished job (docs/api.md); members 0 = none */
typedef struct job_summary {
  int members, evaluated;
  double accuracy_mean, accuracy_min, accuracy_max, loss_mean; /* NaN when absent */
  uint64_t iterations;
  double wall_time;
} job_summary_t;

typedef struct job_view {
  char state[16];
  char reason[256];
  uint64_t epoch, iteration;
  double started, finished;
  job_summary_t summary;
  int nwarnings; /* the job's "warnings" (spec known to train badly) */
  int nmembers;
  job_member_t members[CLUSTER_MAX_AGENTS];
} job_view_t;

int cluster_job_get(const cluster_t *c, const char *job, job_view_t *v);
/* Polls the job until state is want (or a terminal state, which fails unless wanted). */
int cluster_job_wait_state(const cluster_t *c, const char *job, const char *want, double timeout_s,
                           job_view_t *v);
/* The member named name in v, or NULL. */
const job_member_t *job_member(const job_view_t *v, const char *name);
/* How far apart the members' models ended: the largest difference of one fingerprint
 * projection between two members, over the mean L2 norm (~ |x_a - x_b| / |x|); -1 when a
 * member reported no fingerprint (or the norm is 0). */
double job_fingerprint_spread(const job_view_t *v);
/* Smallest iteration over the members with progress (0 when none). */
uint64_t job_min_iteration(const job_view_t *v);

/* Polls until the job has an epoch > after with n members, each of which reported progress of
 * that epoch at least `steps` iterations past the first report it made there (a newer epoch
 * starts the count again). Returns the seconds waited, or -1 (printed) after timeout_s. */
double cluster_wait_training(cluster_t *c, const char *job, uint64_t after, int n, int steps,
                             double timeout_s, job_view_t *v);
/* The index of the agent named name, or -1. */
int cluster_agent_index(const cluster_t *c, const char *name);
/* Lines of agent i's log (all its runs) that contain needle, and also `and_needle` when it is
 * not NULL; 0 when the log cannot be read. */
int cluster_agent_log_count(const cluster_t *c, int i, const char *needle, const char *and_needle);

/* The pid of the last program agent i launched for job (its log line "job J: launched program
 * P (pid N"), or -1. */
pid_t cluster_program_pid(const cluster_t *c, int i, const char *job);

/* Sends sig (SIGSTOP, SIGCONT, ...) to agent i and, when it launched a program for job (a
 * user's, or wagma-train for a built-in job), to that program's process group:
 * the member freezes as a whole. 0 or -1 (as kill). */
int cluster_signal_member(const cluster_t *c, int i, const char *job, int sig);

double cluster_now(void);
void cluster_sleep(double s);

#endif
