/* agent/trainer/trainer.h — wagma-train's state and the parts its files share: main.c (options,
 * the job's setup, the loop of the algorithms libwagma averages) and own.c (adpsgd, asgd and
 * dc-asgd, which average over endpoints of wagma-train's own, agent/adpsgd.h and agent/ps.h).
 * Private to wagma-train; one thread (main) touches it. */
#ifndef WAGMA_TRAINER_H
#define WAGMA_TRAINER_H

#include <limits.h>
#include <stdint.h>

#include "agent/adpsgd.h"
#include "agent/ckroot.h"
#include "agent/model_host.h"
#include "agent/ps.h"
#include "agent/train/train.h"
#include "wagma/api.h"
#include "wagma/worker.h"

typedef struct wg_trainer_opts {
  int cuda;
  char checkpoint_root[PATH_MAX];
  char data_dir[PATH_MAX];
  size_t synthetic_train, synthetic_test, eval_samples;
  int threads;
  double slow_factor, sleep_prob, sleep_ms;
  int log_level;
  char listen_host[256]; /* the host part of the agent's --listen ("" = any) */
  double round_deadline; /* the agent's --round-deadline: one peer exchange */
} wg_trainer_opts_t;

typedef struct wg_trainer {
  wg_trainer_opts_t o;
  wagma_worker_t *w;
  wagma_worker_config_t cfg;
  wagma_job_spec_t spec;
  wagma_backend_t *backend;
  wg_ckroot_t root;
  wagma_dataset_t train, test;
  wagma_model_t *model;
  wagma_optim_t *optim;
  wagma_grad_delay_t *delay;
  wg_model_host_t host;
  wagma_sampler_t sampler;
  wagma_batch_t batch;
  wagma_rng_t straggler_rng;
  double loss_ema, accuracy;
  uint64_t total; /* the job's iterations */
  uint64_t epoch; /* the libwagma epoch the optimizer and sampler were set for */
  int rank, size; /* in that epoch */
  /* own.c: adpsgd's endpoint or the parameter server's, and what the reports show */
  wg_adpsgd_t *gossip;
  wagma_rng_t gossip_rng;
  wg_ps_t *ps;
  int ps_shards, ps_done_sent;
  uint64_t ps_pushed;     /* a worker's pushes its shards applied; a shard's pushes applied */
  double entered_at;      /* when the epoch was entered (wg_mono) */
  uint64_t staleness_max; /* the largest staleness in the current 1 s window, and the last */
  uint64_t staleness_shown;
  double window_start, last_warn;
} wg_trainer_t;

/* main.c */
void wg_trainer_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* --slow-factor / --sleep-prob: the straggler's pause after compute_s of compute */
void wg_trainer_straggle(wg_trainer_t *t, double compute_s);
/* After libwagma counted an iteration from it_before: a new epoch followed, the evaluation
 * when eval_every was crossed, the reports, a due checkpoint. */
void wg_trainer_after_step(wg_trainer_t *t, uint64_t it_before);

/* own.c: the host part of "host:port" or "[v6]:port" into out ("" for ":port") */
void wg_trainer_host_of(const char *address, char *out, size_t len);
/* own.c: 1 when the job's algorithm is one of wagma-train's own (adpsgd, asgd, dc-asgd) */
int wg_own_algorithm(const wg_trainer_t *t);
/* Opens the algorithm's endpoint on the --listen host: 0, or a status with why (the failure
 * is this agent's: "unavailable"). */
int wg_own_setup(wg_trainer_t *t, char *why, size_t len);
void wg_own_teardown(wg_trainer_t *t);
/* A new epoch was entered (its opening sync done): the endpoints of its members exchanged
 * over libwagma's allreduce, the first collective of the epoch on every member. */
void wg_own_enter_epoch(wg_trainer_t *t);
/* One iteration of the parameter server's (shard or worker; an epoch with shards, t->ps_shards
 * > 0; alone in a plan, a member takes local steps): 0, WAGMA_ECANCELED, a failure. */
int wg_own_ps_iteration(wg_trainer_t *t);
/* adpsgd, after the optimizer step: the pairwise averaging of model (host, the registered
 * parameters) with a peer; skipped averagings leave it as it was. */
void wg_own_gossip(wg_trainer_t *t, float *model);
/* The progress reports' role, staleness and averaging counters. */
void wg_own_report(wg_trainer_t *t);
/* The job's final model into the registered parameters: the mean over every member, or, for
 * the parameter server, the shards' slices. 0 or a status. */
int wg_own_final_model(wg_trainer_t *t);
/* The staleness of an update seen now, kept as the largest of a 1 s window for the reports. */
void wg_own_note_staleness(wg_trainer_t *t, uint64_t staleness);

#endif
