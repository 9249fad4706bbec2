/* wagma/worker.h — the only public header of libwagma, the worker library: what a training
 * process links to train in a wagma job. The agent of the node launches the process (the
 * user's program, named in the job spec) and talks to it over a local socket
 * (docs/programs.md); this library is the process's side of that: the job's configuration,
 * the plans of the epochs it is a member of, the communicator of the current epoch, joining and
 * leaving at iteration boundaries, the joiner's sync, progress reports, the stop signal and the
 * final average. The model averaging is the job's algorithm:
 *   wagma      after the optimizer step: one wait-avoiding group round (a global average every
 *              staleness_bound rounds);
 *   allreduce  before the optimizer step: the gradients averaged over every member;
 *   local-sgd  after the optimizer step: the model averaged over every member every
 *              staleness_bound iterations.
 *
 * Use (C; the Python package wraps the same calls):
 *
 *   wagma_worker_t *w;
 *   if (wagma_worker_open(NULL, NULL, NULL, &w)) ...            (reads $WAGMA_AGENT_SOCKET)
 *   wagma_worker_register(w, params, n, &state_fns, user);      (params: one flat buffer)
 *   while (!wagma_worker_should_stop(w)) {
 *     ... loss, gradients ...
 *     wagma_worker_average_gradients(w, grads);               (allreduce jobs; a no-op else)
 *     ... optimizer step on params ...
 *     wagma_worker_step(w);                                     (the algorithm's averaging)
 *     wagma_worker_report(w, loss, NAN);
 *   }
 *   wagma_worker_final_average(w);  ... evaluate ...  wagma_worker_done(w, loss, accuracy);
 *   wagma_worker_close(w);
 *
 * Buffers: float32 in host memory, or CUDA device memory with the caller's stream
 * (wagma_worker_use_cuda; staged through page-locked host memory). The
 * parameters are registered once and must stay at that address; whatever else a joiner needs
 * (the optimizer's state) travels through the state functions, called only on the training
 * thread inside wagma_worker_step / wagma_worker_register.
 *
 * Threads: one "training thread" makes every call but wagma_worker_last_error; the library runs
 * one control thread (the agent's socket) and the communicator's threads. Errors: every call
 * returns 0 or a negative WAGMA_E* status (wagma/status.h) and keeps a message
 * (wagma_worker_last_error). The library never prints: log lines go to the callback. */
#ifndef WAGMA_WORKER_H
#define WAGMA_WORKER_H

#include <stddef.h>
#include <stdint.h>

#include "wagma/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define WAGMA_WORKER_PROTOCOL 1 /* the agent <-> program protocol's version */

typedef struct wagma_worker wagma_worker_t;

/* The job as the agent configured it (fixed for the process's life). */
typedef struct wagma_worker_config {
  char job[64];        /* the job's id */
  char agent[64];      /* the agent that launched this process */
  char algorithm[16];  /* "wagma", "allreduce" or "local-sgd" (a program's job); the built-in
                          trainer also gets "adpsgd", "asgd", "dc-asgd" (below) */
  uint64_t iterations; /* the job's iterations; 0 when it counts epochs */
  uint64_t epochs;     /* the job's epochs over the data (0 when iterations is set): the
                          program decides what an epoch is; wagma_worker_set_iterations */
  int batch_size;      /* per member, as in the spec */
  int workers;         /* the spec's target number of members */
  uint64_t seed;       /* the same on every member: initialise the model with it */
  uint64_t eval_every; /* iterations between evaluations the spec asks for, 0 = none */
  int staleness_bound; /* tau */
  int group_size;
  char global_sync[16]; /* "barrier" or "wait-avoiding" */
  char device[8];       /* "cpu" or "cuda" */
  char transport[8];    /* the agent's data plane: "tcp" or "nccl" */
} wagma_worker_config_t;

/* Where the process stands (after the last call that returned). */
typedef struct wagma_worker_status {
  uint64_t epoch;     /* plan epoch of the current communicator, 0 = none yet */
  int rank, size;     /* in that epoch; -1 / 0 before the first */
  uint64_t iteration; /* iterations completed in the job (the next round) */
  int joined;         /* this epoch began with a joining sync that replaced the model */
  int round_global;   /* the last wagma round was a global round */
  int ngroup;         /* its group's ranks (0 when global or none) */
  int group[64];
  uint64_t staleness; /* the largest staleness of a contribution in the last round */
} wagma_worker_status_t;

/* The optimizer state a joiner receives with the parameters. size() is its length in floats
 * (constant for the job, may be 0), save(buf) writes it, load(buf) reads it back. Any may be
 * NULL when size is 0. */
typedef struct wagma_worker_state_fns {
  size_t (*size)(void *user);
  void (*save)(void *user, float *buf);
  void (*load)(void *user, const float *buf);
} wagma_worker_state_fns_t;

/* Connects to the agent at socket_path (NULL: $WAGMA_AGENT_SOCKET), says hello and waits for
 * the job's configuration (up to 30 s). log (may be NULL) receives the library's log lines.
 * Ownership: *out is the caller's, wagma_worker_close. WAGMA_EINVAL without a socket path,
 * WAGMA_EUNAVAIL when the agent cannot be reached, WAGMA_EPROTO on a protocol mismatch. */
int wagma_worker_open(const char *socket_path, wagma_log_fn log, void *log_user,
                      wagma_worker_t **out);

int wagma_worker_config(const wagma_worker_t *w, wagma_worker_config_t *out);

/* Device buffers (CUDA): call before wagma_worker_register. The parameters given to register
 * and the gradients given to wagma_worker_average_gradients are then device pointers (float32,
 * the current CUDA device), produced on stream (a cudaStream_t; NULL = the legacy default
 * stream). libwagma stages them through page-locked host memory of its own: it waits for stream
 * before it reads them (the caller's queued work is in), and queues what it writes on stream
 * (the caller's next work on it sees the result). No call blocks the device beyond that
 * stream. The optimizer state of the state functions stays in host buffers. The CUDA runtime
 * is loaded here ($WAGMA_CUDART, else libcudart.so.13 / .12: the process's own, e.g.
 * PyTorch's): WAGMA_ENOSYS without one. */
int wagma_worker_use_cuda(wagma_worker_t *w, void *stream);

/* Registers the parameters (n floats at params, kept: they must stay valid and at this address
 * until close) and the state functions (may be NULL: no state), then waits for the first plan
 * that lists this agent and enters its epoch: a joiner's parameters and state are replaced by
 * the survivors' (the state through load). Call once, after initialising the model from the
 * job's seed. */
int wagma_worker_register(wagma_worker_t *w, float *params, size_t n,
                          const wagma_worker_state_fns_t *state, void *state_user);

/* The number of iterations the job runs, for a job that counts epochs (iterations 0): the
 * program computes it from its data (epochs x samples / (batch_size x workers)). Call before
 * the first step; ignored when the spec gave iterations. */
int wagma_worker_set_iterations(wagma_worker_t *w, uint64_t iterations);

/* 1 when the training loop should end: the job's iterations are done, the agent said stop
 * (the job was stopped or this agent left it), or this member reported its end (failed,
 * unavailable). */
int wagma_worker_should_stop(wagma_worker_t *w);

/* allreduce jobs: replaces grads (n floats, the registered length) by their mean over the
 * members of the epoch; before the optimizer step. Other algorithms: 0, nothing done. */
int wagma_worker_average_gradients(wagma_worker_t *w, float *grads);

/* After the optimizer step of one iteration: the algorithm's averaging of the registered
 * parameters, the iteration count, the progress report (at most every progress interval),
 * and, at an iteration boundary, a newer plan: the communicator of the next epoch and its
 * joining sync. A peer that died or a missed deadline is not an error (the round goes on
 * without it); WAGMA_ECANCELED when the agent said stop. */
int wagma_worker_step(wagma_worker_t *w);

/* The latest training loss and test accuracy (NaN = unknown) for the progress reports. */
int wagma_worker_report(wagma_worker_t *w, double loss, double accuracy);

int wagma_worker_status(const wagma_worker_t *w, wagma_worker_status_t *out);

/* At the end: the parameters averaged over every member (the job's final model). */
int wagma_worker_final_average(wagma_worker_t *w);
/* The job's result from this member (the final model's loss and test accuracy): the progress
 * report "done". The agent's job completes when every member said done. */
int wagma_worker_done(wagma_worker_t *w, double loss, double accuracy);
/* This member cannot go on: reports "failed" with why (the job fails). */
int wagma_worker_fail(wagma_worker_t *w, const char *why);

/* After done: keeps the communicator for the peers still averaging, until the agent says stop
 * or linger seconds passed; then closes everything. NULL is a no-op. */
void wagma_worker_close(wagma_worker_t *w);

/* The job's spec as the coordinator stored it: JSON text (docs/api.md "Job spec"), so that a
 * program can read fields the configuration above leaves out. Borrowed, valid until close; "{}"
 * from an agent that does not send it. */
const char *wagma_worker_spec(const wagma_worker_t *w);

/* This member cannot serve the job (its data is missing, its device cannot run it): reports
 * "unavailable" with why, and the coordinator replans without it (the job goes on). The process
 * then closes the handle and exits 0. */
int wagma_worker_unavailable(wagma_worker_t *w, const char *why);

/* Checkpoints (the spec's checkpoint.every and checkpoint.path; docs/agent.md "Checkpoints").
 * Paths are relative to the agent's checkpoint root (--checkpoint-root), never absolute.
 *
 * restore: called on the training thread, inside wagma_worker_register or wagma_worker_step,
 * when this member enters an epoch that no member enters with the job's model (a restart of
 * the whole job) and the agent holds the job's checkpoint record: it loads the parameters
 * and state from path and sets *iteration; 0 on success (every member loads the same file),
 * else the member starts from its seed. Set it before wagma_worker_register. */
typedef int (*wagma_worker_restore_fn)(void *user, const char *path, uint64_t *iteration);
int wagma_worker_set_restore(wagma_worker_t *w, wagma_worker_restore_fn restore, void *user);

/* 1 after the wagma_worker_step that makes a checkpoint due on this member: rank 0 of the
 * epoch, checkpoint.every > 0 and a multiple of it crossed (or the job's last iteration). The
 * program then writes <checkpoint.path>/<job>.ckpt below the checkpoint root and calls
 * wagma_worker_checkpoint_saved. */
int wagma_worker_checkpoint_due(const wagma_worker_t *w);
/* The checkpoint at path (relative to the checkpoint root) holds iteration: the agent records
 * it in etcd as the job's checkpoint, from which a restart of the whole job resumes. */
int wagma_worker_checkpoint_saved(wagma_worker_t *w, const char *path, uint64_t iteration);

/* A program that averages by an algorithm of its own. libwagma runs the averaging of wagma,
 * allreduce and local-sgd; for any other algorithm in the configuration (the built-in
 * trainer's adpsgd, asgd and dc-asgd: a user's program job is refused one at submission)
 * wagma_worker_step only counts the iteration, and the program moves its models itself, over
 * endpoints of its own that it announces to its peers through wagma_worker_allreduce. */

/* The iteration boundary of such a program: a newer plan (its epoch entered, with the opening
 * sync of the registered parameters and state) or the stop (WAGMA_ECANCELED), then iterations
 * more are counted: 1 for a trained step (what wagma_worker_step does), 0 when nothing was
 * trained (a parameter server that did not answer), more when the program's iteration follows
 * others' (a parameter-server shard counts its workers' steps). WAGMA_EINVAL for the
 * algorithms libwagma averages. Compare wagma_worker_status's epoch before and after: a new
 * epoch has new members, and the program's first collective in it must be the same on all. */
int wagma_worker_advance(wagma_worker_t *w, uint64_t iterations);

typedef enum wagma_worker_reduce {
  WAGMA_WORKER_SUM = 0,
  WAGMA_WORKER_MEAN = 1
} wagma_worker_reduce_t;

/* buf (n float32 in host memory, any n) replaced by its sum or mean over every member of the
 * current epoch; every member calls it with the same n in the same order. It takes no newer
 * plan (WAGMA_ECANCELED when one arrived or the agent said stop: the next step enters it);
 * WAGMA_EUNAVAIL when no epoch is entered; a lost peer fails it (WAGMA_ETIMEDOUT, a status of
 * the data plane) on every member. */
int wagma_worker_allreduce(wagma_worker_t *w, float *buf, size_t n, wagma_worker_reduce_t op);

/* The data-plane address ("host:port") that member rank of the current epoch advertises, into
 * out (len bytes). WAGMA_EINVAL for a rank outside the epoch, WAGMA_ERANGE when it is longer. */
int wagma_worker_member_address(const wagma_worker_t *w, int rank, char *out, size_t len);

/* What the progress reports show of a program's own algorithm, replacing the last values:
 * the member's role ("worker", "active", "passive" or "server"; NULL or "" = "worker"), the
 * staleness of its latest update (in iterations), and its averagings so far: those it asked
 * for (shown as rounds activated), answered (rounds joined) and gave up (rounds skipped). */
typedef struct wagma_worker_algorithm_stats {
  const char *role;
  uint64_t staleness;
  uint64_t averaged, served, skipped;
} wagma_worker_algorithm_stats_t;
int wagma_worker_report_algorithm(wagma_worker_t *w, const wagma_worker_algorithm_stats_t *stats);

/* The message of the last failed call on this handle ("" if none). Borrowed. */
const char *wagma_worker_last_error(const wagma_worker_t *w);

#ifdef __cplusplus
}
#endif

#endif
