/* wagma/api.h — the contracts shared by the coordinator, the agents and wagmactl:
 * JSON codecs (jansson) of the job spec, job status, progress, agent registration and
 * assignment records, the error body of the REST API, and the etcd key layout.
 *
 * All decoders validate fully and name the offending field in a wagma_api_error_t
 * ("optimizer.lr", "workers", ...). The job spec decoder rejects unknown fields; the decoders
 * of records that agents write (progress, agent registration) ignore unknown fields so that
 * newer agents can add fields. Encoders return a NUL-terminated string the caller frees with
 * free(), or write into a json_t the caller owns.
 *
 * Where things live (see docs/api.md for the full contract):
 *   <prefix>/agents/<agent>              agent registration, leased by the agent
 *   <prefix>/assignments/<agent>         {"job","epoch"}: the job an agent works on (coordinator)
 *   <prefix>/jobs/<job>/spec             the job spec with defaults filled in (coordinator)
 *   <prefix>/jobs/<job>/status           the job status (coordinator)
 *   <prefix>/jobs/<job>/plan             the averaging plan (coordinator; collective.h codec)
 *   <prefix>/jobs/<job>/plans/<epoch>    what each epoch's plan was (coordinator; the last
 *                                        WAGMA_API_PLAN_HISTORY epochs; epoch zero-padded)
 *   <prefix>/jobs/<job>/progress/<agent> progress, state "running" | "done" | "failed" |
 *                                        "unavailable" (agent)
 *   <prefix>/jobs/<job>/checkpoint       the last checkpoint (agent rank 0)
 *   <prefix>/quarantine/<agent>          an agent the scheduler does not assign until a time
 *                                        (coordinator)
 *   <prefix>/secrets/<job>/<epoch>       the data-plane secret of a plan epoch: 64 hex chars
 *                                        (coordinator, in the plan's Txn; agents read it; no
 *                                        REST endpoint reads this prefix)
 *   <prefix>/coordinator/leader          the leading coordinator, leased */
#ifndef WAGMA_API_H
#define WAGMA_API_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "wagma/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define WAGMA_API_NAME_MAX 64  /* job and agent names, including the NUL */
#define WAGMA_API_ADDR_MAX 64  /* "host:port", including the NUL */
#define WAGMA_API_PATH_MAX 256 /* checkpoint path, including the NUL */
/* a checkpoint file: the spec's checkpoint.path directory + '/' + file name, with the NUL */
#define WAGMA_API_CHECKPOINT_PATH_MAX 384
#define WAGMA_API_REASON_MAX 256 /* status reason, including the NUL */
#define WAGMA_API_MAX_WORKERS 10000
#define WAGMA_API_PREFIX_MAX 128
/* Plan history entries a job keeps (<prefix>/jobs/<job>/plans/<epoch>): the entry of epoch
 * E - WAGMA_API_PLAN_HISTORY is deleted in the Txn that writes epoch E. */
#define WAGMA_API_PLAN_HISTORY 32
/* Bytes of a plan epoch's data-plane secret (<prefix>/secrets/<job>/<epoch>, stored as twice
 * as many lowercase hex characters); the secrets of epochs E - 1 and E are kept, E - 2 is
 * deleted in the Txn that writes epoch E, and all go when the job ends or is purged. */
#define WAGMA_API_SECRET_LEN 32
/* Ranks of a round's group a progress record carries (larger groups are not listed). */
#define WAGMA_API_PROGRESS_GROUP_MAX 64
/* Numbers of a progress record's parameter fingerprint (4 projections + the L2 norm). */
#define WAGMA_API_FINGERPRINT_MAX 8
#define WAGMA_API_UNREACHABLE_MAX 32 /* peers a progress report lists as unreachable */

/* jansson dump flags of every wagma JSON document: compact, fields in order, 15 digits. */
#define WG_JSON_FLAGS (JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15))

/* A decoding or validation error: the field (dotted path, "" for the whole body) and why. */
typedef struct wagma_api_error {
  char field[96];
  char message[224];
} wagma_api_error_t;

/* ------------------------------------------------------------------------------------------
 * Names
 * ---------------------------------------------------------------------------------------- */

/* A valid job or agent name: 1..63 characters of [A-Za-z0-9._-], not starting with '.' or
 * '-'. Names are used verbatim inside etcd keys and URL paths. Returns 1 if valid. */
int wagma_api_name_valid(const char *name);

/* ------------------------------------------------------------------------------------------
 * Job spec
 * ---------------------------------------------------------------------------------------- */

typedef enum wagma_model_kind {
  WAGMA_MODEL_SOFTMAX = 0,
  WAGMA_MODEL_MLP,
  WAGMA_MODEL_LENET5
} wagma_model_kind_t;
typedef enum wagma_dataset_kind {
  WAGMA_DATASET_FASHION_MNIST = 0,
  WAGMA_DATASET_SYNTHETIC
} wagma_dataset_kind_t;
typedef enum wagma_algorithm {
  WAGMA_ALGO_WAGMA = 0,
  WAGMA_ALGO_ALLREDUCE,
  WAGMA_ALGO_LOCAL_SGD,
  WAGMA_ALGO_ADPSGD, /* AD-PSGD gossip: even ranks active, odd ranks passive */
  WAGMA_ALGO_ASGD,   /* parameter-server asynchronous SGD: the first ps_shards ranks serve */
  WAGMA_ALGO_DC_ASGD /* asgd with delay compensation (dc_lambda) */
} wagma_algorithm_t;
typedef enum wagma_sync { WAGMA_SYNC_BARRIER = 0, WAGMA_SYNC_WAIT_AVOIDING } wagma_sync_t;
typedef enum wagma_optimizer_type { WAGMA_OPT_SGD = 0, WAGMA_OPT_ADAM } wagma_optimizer_type_t;
typedef enum wagma_device { WAGMA_DEVICE_CPU = 0, WAGMA_DEVICE_CUDA } wagma_device_t;

typedef struct wagma_optimizer_spec {
  wagma_optimizer_type_t type; /* default sgd */
  double lr;                   /* (0, 10], default 0.05 */
  /* [0, 1); default 0.9 for sgd, 0 for sgd under asgd and dc-asgd (their asynchronous pushes
   * already act as momentum: docs/api.md), 0 for adam (ignored there) */
  double momentum;
  int nesterov;        /* default false; needs momentum > 0 */
  double weight_decay; /* [0, 1), default 0 */
  uint64_t warmup;     /* iterations of linear lr warmup, default 0 */
} wagma_optimizer_spec_t;

/* A program job: the agents launch the user's program (an executable in their --programs
 * directory, named by its file name) with these arguments as argv, never through a shell; the
 * program links the worker library. */
#define WAGMA_API_PROGRAM_NAME_MAX 64 /* a program's name, including the NUL */
#define WAGMA_API_PROGRAM_ARGS_MAX 32 /* argv entries after the name */
#define WAGMA_API_PROGRAM_ARG_MAX 256 /* one argument, including the NUL */
#define WAGMA_API_PROGRAM_RESTARTS_MAX 100
typedef struct wagma_program_spec {
  char name[WAGMA_API_PROGRAM_NAME_MAX]; /* "" = no program: a built-in model job */
  int nargs;                             /* 0..WAGMA_API_PROGRAM_ARGS_MAX */
  char args[WAGMA_API_PROGRAM_ARGS_MAX]
           [WAGMA_API_PROGRAM_ARG_MAX]; /* verbatim, any bytes but NUL */
  int max_restarts; /* restarts of a member's program that exits or dies, default 3, 0..100 */
} wagma_program_spec_t;

/* A valid program name: 1..63 bytes of [A-Za-z0-9._-], not "." or "..", not starting with '.'
 * or '-' (so no '/', no "..", no space or shell character: a file name inside the agents'
 * --programs directory). Returns 1 if valid. */
int wagma_program_name_valid(const char *name);

typedef struct wagma_checkpoint_spec {
  uint64_t every;                /* iterations between checkpoints, 0 = never (default) */
  char path[WAGMA_API_PATH_MAX]; /* directory; required when every > 0 */
} wagma_checkpoint_spec_t;

typedef struct wagma_job_spec {
  char name[WAGMA_API_NAME_MAX]; /* the job id; default "job-<8 hex>" chosen by the server */
  wagma_model_kind_t model;      /* default softmax; unused (and not encoded) with a program */
  wagma_dataset_kind_t dataset;  /* default fashion-mnist; likewise */
  wagma_algorithm_t algorithm;   /* default wagma; a program job: wagma, allreduce, local-sgd */
  int workers;                   /* target size, required, 1..10000 */
  int min_workers;               /* default = workers; 1 <= min_workers <= workers */
  int max_workers;               /* default = workers; workers <= max_workers <= 10000 */
  int group_size;                /* S, 2..1024, default 4 */
  int staleness_bound;           /* tau, 1..1000000, default 8 */
  wagma_sync_t global_sync;      /* default barrier */
  wagma_optimizer_spec_t optimizer;
  int batch_size;        /* 1..65536, default 64 */
  uint64_t iterations;   /* default 1000 when epochs is not given; 0 when epochs is */
  uint64_t epochs;       /* 0 unless given; exclusive with iterations */
  uint64_t eval_every;   /* iterations between evaluations, 0 = never, default 100 */
  uint64_t seed;         /* default 1 */
  wagma_device_t device; /* default cpu */
  wagma_checkpoint_spec_t checkpoint;
  /* Every worker applies its optimizer's gradients this many steps late (a FIFO of
   * gradients, agent/train's delay line), whatever the algorithm: the delayed-gradient
   * studies' staleness. 0..WAGMA_API_MAX_GRADIENT_DELAY, default 0 (none). */
  int gradient_delay;
  /* asgd / dc-asgd: parameter-server shards (the first ranks of each plan), 1..64, default 1;
   * must leave a worker: ps_shards < workers */
  int ps_shards;
  /* dc-asgd: lambda of the compensation g + lambda g.g.(w_now - w_pulled), [0, 1000],
   * default 0.04 */
  double dc_lambda;
  /* dc-asgd: the paper's adaptive variant (lambda / sqrt(mean square of g)), default false */
  int dc_adaptive;
  /* The user's program (program.name "" = none: the built-in model and dataset). A program
   * job gives neither model nor dataset, its algorithm is wagma, allreduce or local-sgd, its
   * gradient_delay 0 and checkpoint.every 0 (the program saves its own); it runs only on
   * agents that list the program in their registration. Immutable. */
  wagma_program_spec_t program;
} wagma_job_spec_t;
#define WAGMA_API_MAX_GRADIENT_DELAY 1024
#define WAGMA_API_MAX_PS_SHARDS 64

/* Sets every field to its default (name "", workers 0: the caller must set workers). */
void wagma_job_spec_init(wagma_job_spec_t *spec);

/* Decodes and validates a job spec. Unknown fields are rejected. name may be absent (spec->name
 * is then ""). On error fills *err (may be NULL) and returns WAGMA_EINVAL. */
int wagma_job_spec_from_json(const char *json, size_t len, wagma_job_spec_t *spec,
                             wagma_api_error_t *err);
int wagma_job_spec_from_value(const json_t *root, wagma_job_spec_t *spec, wagma_api_error_t *err);

/* Validates cross-field rules (ranges, min <= workers <= max, checkpoint path, a program
 * job's name, arguments and restrictions). */
int wagma_job_spec_validate(const wagma_job_spec_t *spec, wagma_api_error_t *err);

/* Warnings about a valid spec that is known to train badly (e.g. asgd whose step size, with
 * the momentum its asynchronous pushes already add, diverges or stalls; docs/api.md "Spec
 * warnings"): at most max messages into out, each NUL-terminated; returns how many. A pure
 * function of the spec: REST shows them with the job and in its "submitted" event. */
#define WAGMA_API_WARNING_MAX 320 /* one warning, including the NUL */
#define WAGMA_API_WARNINGS_MAX 4
int wagma_job_spec_warnings(const wagma_job_spec_t *spec, char (*out)[WAGMA_API_WARNING_MAX],
                            int max);
/* The warnings as a JSON array of strings (empty when none). Ownership: the caller's. */
json_t *wagma_job_spec_warnings_value(const wagma_job_spec_t *spec);

/* Encodes every field (defaults included). Ownership: the caller owns the result. */
json_t *wagma_job_spec_to_value(const wagma_job_spec_t *spec);
int wagma_job_spec_to_json(const wagma_job_spec_t *spec, char **json);

/* A PATCH body: only the mutable fields. Today: workers, min_workers, max_workers, eval_every.
 * Each has_* is 1 if the field was present. Unknown fields are rejected; known immutable spec
 * fields are rejected with message "immutable". */
typedef struct wagma_job_patch {
  int has_workers, has_min_workers, has_max_workers, has_eval_every;
  int workers, min_workers, max_workers;
  uint64_t eval_every;
} wagma_job_patch_t;

int wagma_job_patch_from_json(const char *json, size_t len, wagma_job_patch_t *patch,
                              wagma_api_error_t *err);

/* Applies the patch to a copy of spec and validates the result. */
int wagma_job_patch_apply(const wagma_job_patch_t *patch, wagma_job_spec_t *spec,
                          wagma_api_error_t *err);

/* Enum names as they appear in JSON ("softmax", "fashion-mnist", "wait-avoiding", ...). */
const char *wagma_model_name(wagma_model_kind_t v);
const char *wagma_dataset_name(wagma_dataset_kind_t v);
const char *wagma_algorithm_name(wagma_algorithm_t v);
const char *wagma_sync_name(wagma_sync_t v);
const char *wagma_optimizer_name(wagma_optimizer_type_t v);
const char *wagma_device_name(wagma_device_t v);

/* ------------------------------------------------------------------------------------------
 * Job status (written by the coordinator)
 * ---------------------------------------------------------------------------------------- */

typedef enum wagma_job_state {
  WAGMA_JOB_PENDING = 0,
  WAGMA_JOB_RUNNING,
  WAGMA_JOB_SUCCEEDED,
  WAGMA_JOB_FAILED,
  WAGMA_JOB_STOPPED,
} wagma_job_state_t;

const char *wagma_job_state_name(wagma_job_state_t s);
int wagma_job_state_from_name(const char *name, wagma_job_state_t *s);
/* 1 for succeeded, failed, stopped. */
int wagma_job_state_terminal(wagma_job_state_t s);

/* A finished job's result at a glance: taken when the job ends from its last members' final
 * reports (those that reported "done" when any did, else those of the last epoch). */
typedef struct wagma_job_summary {
  int members;                                      /* reports taken; 0 = no summary */
  int evaluated;                                    /* of them, with a test accuracy */
  double accuracy_mean, accuracy_min, accuracy_max; /* NaN when evaluated is 0 */
  int with_loss;                                    /* of them, with a training loss */
  double loss_mean, loss_min, loss_max;             /* NaN when with_loss is 0 */
  uint64_t iterations;                              /* the job's iteration at its end */
  double wall_time; /* seconds from its first plan to its end, 0 = it never started */
} wagma_job_summary_t;

typedef struct wagma_job_status {
  wagma_job_state_t state;
  char reason[WAGMA_API_REASON_MAX]; /* why the job is in this state, "" if nothing to say */
  uint64_t epoch;                    /* plan epoch, 0 = no plan yet */
  uint64_t iteration;                /* highest iteration reported by a member */
  uint64_t start_round;              /* start_round of the current plan */
  uint64_t regroupings;              /* plans published after the first */
  double created;                    /* unix seconds */
  double started;                    /* first plan, 0 = not yet */
  double finished;                   /* terminal state reached, 0 = not yet */
  int nmembers;
  char (*members)[WAGMA_API_NAME_MAX]; /* member names in rank order, nmembers entries */
  wagma_job_summary_t summary;         /* a finished job's result; members 0 = none (absent) */
} wagma_job_status_t;

/* Releases members and zeroes the status. */
void wagma_job_status_free(wagma_job_status_t *st);
/* Sets members (copied). */
int wagma_job_status_set_members(wagma_job_status_t *st, const char *const *names, int n);
json_t *wagma_job_status_to_value(const wagma_job_status_t *st);
int wagma_job_status_to_json(const wagma_job_status_t *st, char **json);
/* Ownership: on success *st owns members (wagma_job_status_free). */
int wagma_job_status_from_json(const char *json, size_t len, wagma_job_status_t *st,
                               wagma_api_error_t *err);

/* ------------------------------------------------------------------------------------------
 * Progress (written by an agent to <prefix>/jobs/<job>/progress/<agent>, at most ~1/s)
 * ---------------------------------------------------------------------------------------- */

typedef enum wagma_progress_state {
  WAGMA_PROGRESS_RUNNING = 0,
  WAGMA_PROGRESS_DONE,   /* reached the job's iterations (or epochs): completion signal */
  WAGMA_PROGRESS_FAILED, /* cannot continue (error holds why): the job fails */
  /* this agent cannot serve the job (error holds why: its data set, its --listen address):
   * the coordinator replans the job without it and may quarantine the agent */
  WAGMA_PROGRESS_UNAVAILABLE,
} wagma_progress_state_t;

const char *wagma_progress_state_name(wagma_progress_state_t s);

typedef struct wagma_progress {
  wagma_progress_state_t state; /* default running */
  uint64_t epoch;               /* plan epoch the agent runs */
  uint64_t iteration;           /* iterations completed = the round the agent runs next */
  /* wagma only: the round the agent last averaged in (in this epoch) and its group there.
   * has_round 0 = no round yet in this epoch (the fields below are then absent in JSON). */
  int has_round;
  uint64_t round;
  int round_global;                              /* the round was a global round */
  int ngroup;                                    /* ranks in group (0: not listed) */
  int group[WAGMA_API_PROGRESS_GROUP_MAX];       /* a group round's ranks, increasing */
  int nfingerprint;                              /* 0 = none */
  double fingerprint[WAGMA_API_FINGERPRINT_MAX]; /* see docs/api.md */
  double loss;                                   /* training loss (running mean), NaN = unknown */
  double accuracy;    /* last evaluation accuracy in [0,1], NaN = none yet */
  double step_time;   /* seconds per iteration (recent mean) */
  uint64_t staleness; /* max staleness seen in recent rounds */
  uint64_t rounds_activated;
  uint64_t rounds_joined;
  uint64_t rounds_left_out;
  uint64_t rounds_skipped;
  double time;                      /* unix seconds of this report */
  char error[WAGMA_API_REASON_MAX]; /* with state failed or unavailable */
  /* the member's role in its algorithm: "worker" (wagma, allreduce, local-sgd), "active" or
   * "passive" (adpsgd), "server" or "worker" (asgd, dc-asgd: a parameter-server shard or a
   * worker); "" = not reported (absent in JSON). One of WAGMA_API_ROLES. */
  char role[16];
  /* a restarted program (docs/programs.md): the member lost its model of this epoch and asks
   * the coordinator for a new epoch in which it is a joiner; 0 = none (absent in JSON) */
  uint64_t rejoin;
  /* the members of this epoch's plan this one cannot reach on the data plane (never
   * connected, or the connection went silent: wagma_comm_peer_unreachable), by plan rank,
   * each with how long it has been so ("for", seconds), at most WAGMA_API_UNREACHABLE_MAX of
   * them, the longest first; unreachable_total counts them all (>= nunreachable). Absent in
   * JSON when none. The coordinator plans around a member cut off from its peers (docs/design.md
   * §7.3). */
  int nunreachable;
  int unreachable_total;
  struct wagma_unreachable {
    int rank;
    double seconds;
  } unreachable[WAGMA_API_UNREACHABLE_MAX];
} wagma_progress_t;
#define WAGMA_API_ROLES "worker", "active", "passive", "server"

void wagma_progress_init(wagma_progress_t *p);
json_t *wagma_progress_to_value(const wagma_progress_t *p);
int wagma_progress_to_json(const wagma_progress_t *p, char **json);
/* Required: iteration. Unknown fields are ignored. "group" needs "round"; a group longer
 * than WAGMA_API_PROGRESS_GROUP_MAX or a fingerprint longer than WAGMA_API_FINGERPRINT_MAX is
 * refused. */
int wagma_progress_from_json(const char *json, size_t len, wagma_progress_t *p,
                             wagma_api_error_t *err);

/* One line for people: "test accuracy 0.8713 (0.8702-0.8731 over 4 members), loss 0.2913,
 * 1000 iterations in 12.3 s" ("no test accuracy reported" / "no loss reported" when none).
 * Writes at most len bytes (NUL included); returns what snprintf returns. */
int wagma_job_summary_format(const wagma_job_summary_t *s, char *buf, size_t len);
/* The summary of n final reports (NULL entries skipped), the job's iteration and wall time. */
void wagma_job_summary_of(wagma_job_summary_t *s, const wagma_progress_t *const *reports, int n,
                          uint64_t iterations, double wall_time);

/* ------------------------------------------------------------------------------------------
 * Checkpoint record (written by the job's rank 0 to <prefix>/jobs/<job>/checkpoint after each
 * checkpoint file it saved; read by every agent that (re)starts the job, to resume from it)
 * ---------------------------------------------------------------------------------------- */

typedef struct wagma_checkpoint_record {
  char path[WAGMA_API_CHECKPOINT_PATH_MAX]; /* the checkpoint file (required, non-empty) */
  uint64_t iteration;                       /* iterations the checkpoint holds (required) */
  uint64_t epoch;                           /* plan epoch it was saved in, default 0 */
  char agent[WAGMA_API_NAME_MAX];           /* the agent that wrote it, default "" */
  double time;                              /* unix seconds it was written, default 0 */
} wagma_checkpoint_record_t;

/* Ownership: the caller frees *json. Fails (WAGMA_EINVAL) on an empty path. */
int wagma_checkpoint_record_to_json(const wagma_checkpoint_record_t *r, char **json);
/* Required: path, iteration. Unknown fields are ignored (newer agents may add some), as for
 * progress; known fields are type- and range-checked. */
int wagma_checkpoint_record_from_json(const char *json, size_t len, wagma_checkpoint_record_t *r,
                                      wagma_api_error_t *err);

/* ------------------------------------------------------------------------------------------
 * Plan history entry (written by the coordinator to <prefix>/jobs/<job>/plans/<epoch> in the
 * Txn that publishes the plan of that epoch; read by GET /v1/jobs/{id}/groups?iteration=T).
 * It holds what the groups of the epoch follow from, not the plan itself (a plan of 10000
 * members is ~1 MiB, twice that would pass etcd's request limit): the groups are
 * wagma_plan_build(nmembers, group_size) in member order, checked against phases_hash.
 * ---------------------------------------------------------------------------------------- */

typedef struct wagma_plan_record {
  uint64_t epoch;
  uint64_t start_round;
  int group_size;
  int staleness_bound;
  wagma_sync_t global_sync;
  uint64_t phases_hash; /* FNV-1a 64 of the phases (coordinator/planner.c); 0 = unchecked */
  int nmembers;
  char (*members)[WAGMA_API_NAME_MAX]; /* member names in rank order, nmembers entries */
} wagma_plan_record_t;

/* Releases members and zeroes the record. */
void wagma_plan_record_free(wagma_plan_record_t *r);
/* {"epoch","start_round","group_size","staleness_bound","global_sync","phases_hash":"<16 hex>",
 *  "members":[names]}. Ownership: the caller frees *json. */
int wagma_plan_record_to_json(const wagma_plan_record_t *r, char **json);
/* Every field required and range-checked; unknown fields ignored. Ownership: on success *r
 * owns members (wagma_plan_record_free). */
int wagma_plan_record_from_json(const char *json, size_t len, wagma_plan_record_t *r,
                                wagma_api_error_t *err);

/* ------------------------------------------------------------------------------------------
 * Agent registration (written by the agent under its lease) and assignment (coordinator)
 * ---------------------------------------------------------------------------------------- */

#define WAGMA_API_AGENT_PROGRAMS_MAX 64 /* programs an agent's registration lists */

typedef struct wagma_agent_info {
  char address[WAGMA_API_ADDR_MAX]; /* "host:port" its collective listens on (required) */
  wagma_device_t device;            /* default cpu */
  int capacity;                     /* workers it can host, >= 1, default 1 */
  char version[32];                 /* wagma version, default "" */
  double started;                   /* unix seconds the agent started, default 0 */
  int nprograms;                    /* 0..WAGMA_API_AGENT_PROGRAMS_MAX, default 0 */
  /* the programs it can launch (--programs DIR), sorted by strcmp, no duplicates */
  char programs[WAGMA_API_AGENT_PROGRAMS_MAX][WAGMA_API_PROGRAM_NAME_MAX];
  /* the `since` of the quarantine for being unreachable (wagma_quarantine_t.nprobe > 0) after
   * which this agent connected to every address it had to probe; 0 = none (absent in JSON) */
  double reached;
} wagma_agent_info_t;

/* 1 when the registration lists program name (a binary search of the sorted list). */
int wagma_agent_has_program(const wagma_agent_info_t *a, const char *name);

/* "programs" is always encoded ([] when none). */
json_t *wagma_agent_info_to_value(const wagma_agent_info_t *a);
int wagma_agent_info_to_json(const wagma_agent_info_t *a, char **json);
/* Required: address. Unknown fields are ignored. "programs" (absent = none): an array of at
 * most WAGMA_API_AGENT_PROGRAMS_MAX distinct wagma_program_name_valid names, in any order
 * (decoded sorted); anything else refuses the record, naming "programs" or "programs[i]". */
int wagma_agent_info_from_json(const char *json, size_t len, wagma_agent_info_t *a,
                               wagma_api_error_t *err);

typedef struct wagma_assignment {
  char job[WAGMA_API_NAME_MAX]; /* the job the agent works on */
  uint64_t epoch;               /* the plan epoch that added it */
} wagma_assignment_t;

int wagma_assignment_to_json(const wagma_assignment_t *a, char **json);
int wagma_assignment_from_json(const char *json, size_t len, wagma_assignment_t *a,
                               wagma_api_error_t *err);

/* ------------------------------------------------------------------------------------------
 * Quarantine record (written by the leading coordinator to <prefix>/quarantine/<agent>): the
 * scheduler assigns no job to the agent while the record names the agent's current
 * registration (the create revision of <prefix>/agents/<agent>) and its `until` has not
 * passed; a new registration (the agent restarted) ends it at once. The record stays after
 * `until` (so that the same refusal does not quarantine the agent again) until the agent
 * registers anew, or, for an agent that is gone, until the scheduler deletes it.
 * ---------------------------------------------------------------------------------------- */

typedef struct wagma_quarantine {
  char reason[WAGMA_API_REASON_MAX]; /* why, e.g. "job j: setup failed: ..." */
  char job[WAGMA_API_NAME_MAX];      /* the job the agent could not serve, "" = none */
  double since, until;               /* unix seconds, coordinator's clock */
  int64_t registration;              /* create revision of the agent key it applies to (> 0) */
  int64_t refusal; /* mod revision of the agent's "unavailable" progress in job (0 = none) */
  /* A member cut off from its peers on the data plane (docs/design.md §7.3): nprobe > 0, the
   * data-plane addresses of job's members it must reach again ("probe"); the quarantine ends
   * early when the agent's registration says it reached them all (wagma_agent_info_t.reached
   * = since), and `reachable` is then when (unix seconds; 0 = not yet). */
  int nprobe;
  char probe[WAGMA_API_UNREACHABLE_MAX][WAGMA_API_ADDR_MAX];
  double reachable;
} wagma_quarantine_t;

json_t *wagma_quarantine_to_value(const wagma_quarantine_t *q);
/* Ownership: the caller frees *json. */
int wagma_quarantine_to_json(const wagma_quarantine_t *q, char **json);
/* Required: registration (> 0). Unknown fields are ignored. */
int wagma_quarantine_from_json(const char *json, size_t len, wagma_quarantine_t *q,
                               wagma_api_error_t *err);

/* ------------------------------------------------------------------------------------------
 * REST error body: {"error":{"code":"...","message":"...","field":"..."}}
 * ---------------------------------------------------------------------------------------- */

/* field may be NULL or "" (then omitted). Ownership: the caller frees the result. */
char *wagma_api_error_body(const char *code, const char *message, const char *field);

/* ------------------------------------------------------------------------------------------
 * etcd key layout
 * ---------------------------------------------------------------------------------------- */

typedef struct wagma_keys {
  char prefix[WAGMA_API_PREFIX_MAX]; /* no trailing '/', e.g. "/wagma" */
} wagma_keys_t;

/* prefix: NULL or "" = "/wagma". Must start with '/', no trailing '/' (one is stripped),
 * no "//", at most 100 characters. */
int wagma_keys_init(wagma_keys_t *keys, const char *prefix);

/* Each writes a NUL-terminated key into buf and returns 0, WAGMA_EINVAL for an invalid name
 * or WAGMA_ERANGE if buf is too small. */
int wagma_key_agent(const wagma_keys_t *k, const char *agent, char *buf, size_t len);
int wagma_key_agents_prefix(const wagma_keys_t *k, char *buf, size_t len); /* ".../agents/" */
int wagma_key_assignment(const wagma_keys_t *k, const char *agent, char *buf, size_t len);
int wagma_key_assignments_prefix(const wagma_keys_t *k, char *buf, size_t len);
int wagma_key_jobs_prefix(const wagma_keys_t *k, char *buf, size_t len); /* ".../jobs/" */
int wagma_key_job_prefix(const wagma_keys_t *k, const char *job, char *buf, size_t len);
int wagma_key_job_spec(const wagma_keys_t *k, const char *job, char *buf, size_t len);
int wagma_key_job_status(const wagma_keys_t *k, const char *job, char *buf, size_t len);
int wagma_key_job_plan(const wagma_keys_t *k, const char *job, char *buf, size_t len);
/* ".../jobs/<job>/plans/" and ".../jobs/<job>/plans/<epoch, 20 digits>" (keys sort by epoch). */
int wagma_key_job_plans_prefix(const wagma_keys_t *k, const char *job, char *buf, size_t len);
int wagma_key_job_plan_record(const wagma_keys_t *k, const char *job, uint64_t epoch, char *buf,
                              size_t len);
int wagma_key_job_checkpoint(const wagma_keys_t *k, const char *job, char *buf, size_t len);
int wagma_key_job_progress_prefix(const wagma_keys_t *k, const char *job, char *buf, size_t len);
int wagma_key_job_progress(const wagma_keys_t *k, const char *job, const char *agent, char *buf,
                           size_t len);
int wagma_key_leader(const wagma_keys_t *k, char *buf, size_t len);
int wagma_key_quarantine(const wagma_keys_t *k, const char *agent, char *buf, size_t len);
/* ".../quarantine/" */
int wagma_key_quarantine_prefix(const wagma_keys_t *k, char *buf, size_t len);
/* The whole tree: "<prefix>/". */
int wagma_key_root(const wagma_keys_t *k, char *buf, size_t len);
/* ".../secrets/", ".../secrets/<job>/" and ".../secrets/<job>/<epoch, 20 digits>": the data-plane
 * secrets, outside <prefix>/jobs/ so that no REST read of a job's keys ever meets them. */
int wagma_key_secrets_prefix(const wagma_keys_t *k, char *buf, size_t len);
int wagma_key_job_secrets_prefix(const wagma_keys_t *k, const char *job, char *buf, size_t len);
int wagma_key_secret(const wagma_keys_t *k, const char *job, uint64_t epoch, char *buf, size_t len);
/* The epoch of a secret key (WAGMA_KEY_SECRET), or WAGMA_EINVAL. */
int wagma_key_secret_epoch(const char *key, size_t len, uint64_t *epoch);

/* A secret's value: n bytes as 2n lowercase hex characters plus a NUL into hex (hex_len >=
 * 2n + 1), and back (exactly 2n hex characters, either case, into n bytes). 0 or
 * WAGMA_EINVAL / WAGMA_ERANGE. Neither keeps a copy. */
int wagma_secret_to_hex(const uint8_t *secret, size_t n, char *hex, size_t hex_len);
int wagma_secret_from_hex(const char *hex, size_t hex_len, uint8_t *secret, size_t n);

typedef enum wagma_key_kind {
  WAGMA_KEY_UNKNOWN = 0,
  WAGMA_KEY_AGENT,
  WAGMA_KEY_ASSIGNMENT,
  WAGMA_KEY_JOB_SPEC,
  WAGMA_KEY_JOB_STATUS,
  WAGMA_KEY_JOB_PLAN,
  WAGMA_KEY_JOB_PROGRESS,
  WAGMA_KEY_JOB_CHECKPOINT,
  WAGMA_KEY_LEADER,
  WAGMA_KEY_JOB_PLAN_RECORD, /* .../jobs/<job>/plans/<20 digits> */
  WAGMA_KEY_QUARANTINE,      /* .../quarantine/<agent> */
  WAGMA_KEY_SECRET,          /* .../secrets/<job>/<20 digits> (job filled) */
} wagma_key_kind_t;

/* Classifies a key (not NUL-terminated, len bytes). Fills job and agent (each
 * WAGMA_API_NAME_MAX bytes, may be NULL) when the key has them. Returns the kind;
 * WAGMA_KEY_UNKNOWN for keys outside the layout or with invalid names. */
wagma_key_kind_t wagma_key_parse(const wagma_keys_t *k, const char *key, size_t len, char *job,
                                 char *agent);

#ifdef __cplusplus
}
#endif
#endif
