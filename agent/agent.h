/* agent/agent.h — private header of wagma-agent: its options, the job configuration a job's
 * program gets, and the state shared between the control thread (etcd side) and the runner
 * thread (the program's side).
 *
 *   main.c        options, logging, signals, start / stop order
 *   ckroot.c      the checkpoint root: checkpoints are written and read only below it, no
 *                 symbolic link followed (relative paths from the spec and the record)
 *   registry.c    the control thread: lease + agent key, assignment and plan watches, job spec,
 *                 progress and checkpoint records (the only code that talks to etcd)
 *   jobconf.c     job spec (wagma/api.h) -> wg_job_config_t, progress and checkpoint records
 *   runner.c      the runner thread: the assigned job's program, through the launcher
 *   probe.c       whether this node reaches its peers' data-plane addresses (probe.h): what an
 *                 agent quarantined for being cut off checks before it says it can rejoin
 *   launcher.c    a job's program (the user's, or wagma-train for a built-in job) launched,
 *                 supervised and talked to (launcher.h, worker/proto.h)
 * Beside them, linked by wagma-train (agent/trainer/): model_host.c (a model as host memory),
 * adpsgd.c, ps.c and peer_io.c (AD-PSGD's and the parameter server's endpoints, their own
 * headers).
 *
 * The job config carries the api's kinds as they are (wagma_model_kind_t, wagma_dataset_kind_t,
 * wagma_algorithm_t, wagma_optimizer_type_t); wagma-train maps them to the training library's.
 *
 * Threads: the main thread waits for signals; the control thread owns the etcd handle; the
 * runner thread owns the launcher and its program. They meet only in wg_shared_t, under its
 * mutex. */
#ifndef WAGMA_AGENT_H
#define WAGMA_AGENT_H

#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "agent/ckroot.h"
#include "wagma/api.h"
#include "wagma/clock_internal.h"
#include "wagma/collective.h"
#include "wagma/etcd.h"
#include "wagma/status.h"

#define WG_AGENT_VERSION "0.1.0"

/* ---- checkpoint root: agent/ckroot.h (wagma-train links it too) ------------------------ */

/* ---- options ----------------------------------------------------------------------------- */

typedef struct wg_agent_options {
  wagma_etcd_cli_t etcd; /* --etcd and the --etcd-* options (the etcd library parses them) */
  char name[WAGMA_NAME_MAX];
  char listen[WAGMA_ADDRESS_MAX];    /* "host:port" the collective binds */
  char advertise[WAGMA_ADDRESS_MAX]; /* "host:port" peers dial (registered, in plans); default
                                        listen */
  char prefix[128];
  int device_cuda;        /* 0 = cpu */
  int gpu;                /* --gpu N (-1: none): the agent's CUDA_VISIBLE_DEVICES is set to */
  char gpu_devices[128];  /* ...this (agent/gpu.h), inherited by its programs */
  int transport_nccl;     /* --transport nccl (needs --device cuda): averaging over NCCL */
  int encrypt_data_plane; /* --encrypt-data-plane: TCP frames sealed (AES-256-GCM) */
  int capacity;
  int lease_ttl_s;
  double listen_timeout_s; /* a program retries a plan's communicator this long (libwagma),
                              then reports unavailable */
  double slow_factor;      /* >= 1: compute takes F x longer */
  double sleep_prob;       /* transient imbalance: probability of a pause per iteration */
  double sleep_ms;
  char data_dir[256];                 /* Fashion-MNIST directory, "" = the Debian package's */
  char checkpoint_root_arg[PATH_MAX]; /* --checkpoint-root as given, "" = the current dir */
  wg_ckroot_t checkpoint_root;        /* opened by main before the threads start */
  size_t synthetic_train, synthetic_test;
  size_t eval_samples; /* test samples of the periodic evaluation (0 = all) */
  int threads;         /* BLAS threads */
  double connect_timeout_s;
  double collective_timeout_s;
  double round_deadline_s;
  double progress_interval_s;
  double linger_s; /* how long a finished agent keeps its communicator for its peers */
  int log_level;
  /* programs (launcher.c): --programs DIR, the executables found there at start (sorted,
   * valid names, registered), --program-env NAME=VALUE (strings of argv), --program-grace,
   * --program-connect-timeout */
  char programs_dir[PATH_MAX];
  int nprograms;
  char programs[WAGMA_API_AGENT_PROGRAMS_MAX][WAGMA_API_PROGRAM_NAME_MAX];
  int nprogram_env;
  const char *program_env[32];
  double program_grace_s;
  double program_connect_timeout_s;
  /* wagma-train beside the agent's binary: built-in jobs train in it, launched like a user's
   * program (launcher.c) */
  char trainer_path[PATH_MAX];
  /* the data plane's socket, bound to --listen at start (a port in use fails the start) and
   * inherited by every program, whose communicators accept on it */
  int listen_fd;
} wg_agent_options_t;

void wg_agent_log(void *user, int level, const char *msg); /* stderr with a timestamp */
extern int wg_agent_log_level;

/* ---- job configuration (decoded from the job spec by jobconf.c) -------------------------- */

typedef struct wg_job_config {
  char job[WAGMA_NAME_MAX];
  wagma_model_kind_t model;
  wagma_dataset_kind_t dataset;
  wagma_algorithm_t algorithm;
  wagma_device_t device; /* the job's device: trained by agents of that device only */
  wagma_optimizer_type_t optimizer;
  double lr, momentum, weight_decay;
  int nesterov;
  uint64_t warmup;
  int batch_size;
  int workers;         /* spec.workers: an epochs job runs epochs x n / (batch x workers) */
  uint64_t iterations; /* 0 when epochs is given */
  uint64_t epochs;
  uint64_t eval_every;
  uint64_t seed;
  int staleness_bound; /* local-sgd: model mean every tau iterations */
  int gradient_delay;  /* optimizer steps take the gradient of this many steps ago */
  int ps_shards;       /* asgd, dc-asgd: parameter-server shards wanted */
  double dc_lambda;    /* dc-asgd: the delay compensation's lambda */
  int dc_adaptive;     /* dc-asgd: lambda / sqrt(mean square of g) */
  uint64_t checkpoint_every;
  char checkpoint_dir[256];     /* spec checkpoint.path: relative to the checkpoint root */
  wagma_program_spec_t program; /* program.name "" = a built-in model job (wagma-train) */
  wagma_job_spec_t spec;        /* the whole spec as decoded: a program's "config" carries it */
} wg_job_config_t;

/* ---- runner -> control: progress and checkpoint records ---------------------------------- */

/* failed: the job cannot run (the job fails); unavailable: this agent cannot serve it (its
 * data, its --listen address): the coordinator replans without it (docs/agent.md) */
enum { WG_STATE_RUNNING = 0, WG_STATE_DONE = 1, WG_STATE_FAILED = 2, WG_STATE_UNAVAILABLE = 3 };

typedef struct wg_progress_snap {
  char job[WAGMA_NAME_MAX];
  int state;
  uint64_t epoch, iteration;
  int has_round; /* wagma: round, its kind and my group there (see wagma_progress_t) */
  uint64_t round;
  int round_global;
  int ngroup;
  int group[WAGMA_API_PROGRESS_GROUP_MAX];
  int nfingerprint; /* the final report's parameter fingerprint, 0 = none */
  double fingerprint[WAGMA_API_FINGERPRINT_MAX];
  double loss, accuracy, step_time; /* NaN = unknown */
  uint64_t staleness;
  uint64_t rounds_activated, rounds_joined, rounds_left_out, rounds_skipped;
  char error[256];
  char role[16];   /* "worker", "active", "passive"; "" before the first epoch */
  uint64_t rejoin; /* a restarted program asks to rejoin as a joiner (launcher.c); 0 = no */
  int nunreachable, unreachable_total; /* peers it cannot reach (wagma_progress_t) */
  struct wagma_unreachable unreachable[WAGMA_API_UNREACHABLE_MAX];
} wg_progress_snap_t;

typedef struct wg_checkpoint_rec {
  char job[WAGMA_NAME_MAX];
  char path[WAGMA_API_CHECKPOINT_PATH_MAX]; /* relative to the checkpoint root */
  uint64_t iteration, epoch;
} wg_checkpoint_rec_t;

/* ---- shared state ------------------------------------------------------------------------ */

typedef struct wg_shared {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* signalled on every change below */
  int stop;

  /* control -> runner */
  uint64_t generation; /* bumped at every change of the fields below */
  int assigned;        /* an assignment exists and its spec was read */
  wg_job_config_t job;
  int have_plan;
  wagma_plan_t plan; /* the latest valid plan of the assigned job */
  int have_checkpoint;
  wg_checkpoint_rec_t checkpoint; /* the job's checkpoint record as last read */
  /* the data-plane secret of plan.epoch (<prefix>/secrets/<job>/<epoch>), secret_len 0 =
   * none; the runner takes it with the plan and wipes it here (OPENSSL_cleanse) */
  uint8_t secret[WAGMA_API_SECRET_LEN];
  size_t secret_len;

  /* runner -> control */
  int progress_dirty, progress_urgent;
  wg_progress_snap_t progress;
  int checkpoint_dirty;
  wg_checkpoint_rec_t checkpoint_out;
} wg_shared_t;

int wg_shared_init(wg_shared_t *s);
void wg_shared_destroy(wg_shared_t *s);
/* Sets stop and wakes every waiter. */
void wg_shared_request_stop(wg_shared_t *s);
int wg_shared_stopping(wg_shared_t *s);

/* ---- control thread (registry.c) --------------------------------------------------------- */

typedef struct wg_control wg_control_t;
/* Opens the etcd handle and starts the control thread, which first waits for etcd (up to
 * opt->etcd.startup_timeout_s) and registers, then follows assignments and plans (and
 * registers again whenever the lease is lost, retrying while etcd is down). The registration
 * creates <prefix>/agents/<name> only if it is absent (one Txn): when another process holds
 * the name, its lease is watched for one keepalive period; a lease that is kept alive is a
 * live agent (startup fails with WAGMA_EEXIST), one that is not (a crashed previous run of
 * this name) is revoked and the name taken. Returns 0 or an error with err (err_len bytes)
 * saying why. Ownership: *out is the caller's (wg_control_stop). */
int wg_control_start(const wg_agent_options_t *opt, wg_shared_t *shared, wg_control_t **out,
                     char *err, size_t err_len);
/* The startup's outcome so far: 1 while waiting for etcd or registering, 0 once registered,
 * or the error that ended it (WAGMA_EUNAVAIL: etcd did not answer in time; WAGMA_EEXIST: the
 * name is held by a live agent; ...) with why in err. Any thread. */
int wg_control_state(wg_control_t *c, char *err, size_t err_len);
/* Revokes the lease (the agent key goes at once), publishes the last progress if any, stops
 * the thread and frees. NULL is a no-op. */
void wg_control_stop(wg_control_t *c);

/* jobconf.c (api.h side) */
int wg_job_config_from_spec_json(const char *json, size_t len, const char *job,
                                 wg_job_config_t *cfg, char *err, size_t err_len);
/* Encodes a progress record (caller frees). */
char *wg_progress_snap_to_json(const wg_progress_snap_t *p);
/* The record a program reported (launcher.c) as the snapshot of job the control thread writes
 * (role "" becomes "worker"). */
void wg_progress_snap_from_progress(wg_progress_snap_t *s, const wagma_progress_t *p,
                                    const char *job);
/* Checkpoint record {"path","iteration","epoch","agent","time"} (caller frees) and back. */
char *wg_checkpoint_rec_to_json(const wg_checkpoint_rec_t *r, const char *agent);
int wg_checkpoint_rec_from_json(const char *json, size_t len, wg_checkpoint_rec_t *r);
/* Registration record of this agent (caller frees). */
char *wg_agent_info_json(const wg_agent_options_t *opt, double started, double reached);
/* Job name of an assignment record, "" on a bad record. Returns 0 or WAGMA_EINVAL. */
int wg_assignment_job(const char *json, size_t len, char *job, size_t job_len);

/* ---- runner thread (runner.c) ------------------------------------------------------------ */

typedef struct wg_runner wg_runner_t;
int wg_runner_start(const wg_agent_options_t *opt, wg_shared_t *shared, wg_runner_t **out);
/* Joins the runner (the caller has requested stop) within timeout_s; returns WAGMA_ETIMEDOUT
 * and leaves it running when it did not finish (the process then exits anyway). */
int wg_runner_join(wg_runner_t *r, double timeout_s);

#endif
