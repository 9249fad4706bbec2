/* agent/runner.h — private to runner.c and algorithms.c: the state of the job the runner
 * trains (model, data, communicator of the current epoch, statistics). Includes the training
 * library next to wagma/api.h (via agent.h); their names are distinct. */
#ifndef WAGMA_AGENT_RUNNER_H
#define WAGMA_AGENT_RUNNER_H

#include "agent/adpsgd.h"
#include "agent/agent.h"
#include "agent/model_host.h"
#include "agent/ps.h"
#include "agent/train/train.h"
#include "wagma/collective.h"

typedef struct wg_job {
  wg_job_config_t cfg;
  int active; /* set up (data loaded, model built) */
  int broken; /* setup failed: wait for another job */
  wagma_dataset_t train, test;
  wagma_model_t *model;
  wagma_optim_t *optim;
  wagma_grad_delay_t *delay; /* spec gradient_delay > 0: the optimizer's gradient FIFO */
  wg_adpsgd_t *gossip;       /* adpsgd: my pairwise averaging endpoint (for the whole job) */
  wagma_rng_t gossip_rng;    /* adpsgd: which passive an active asks */
  wg_ps_t *ps;               /* asgd, dc-asgd: my parameter-server endpoint (whole job) */
  int ps_shards;             /* asgd, dc-asgd: shards of the current epoch */
  int ps_done_sent;          /* asgd worker: told the shards it reached the end */
  wagma_sampler_t sampler;
  wagma_batch_t batch;
  size_t nparams, nstate;
  float *sync_buf;      /* params | optimizer state: the epoch's opening global sync */
  wg_model_host_t host; /* the model as host memory for the collective (model_host.h) */
  int have_model;       /* the model holds this job's training (not just an init) */

  /* the current epoch */
  uint64_t epoch;    /* plan epoch entered, 0 = none */
  double entered_at; /* when its opening sync ended (wg_mono) */
  wagma_plan_t plan;
  int rank; /* -1 when not a member */
  wagma_comm_t *comm;
  int need_connect; /* a member of the adopted plan without its communicator yet */
  double connect_at;
  int connect_failures;
  double connect_first_failure; /* when wagma_comm_create first failed in this epoch */
  int unavailable; /* reported "unavailable" for this epoch: gave up creating the communicator */
  int have_ck;
  wg_checkpoint_rec_t ck; /* the job's checkpoint record when the plan was adopted */
  /* the epoch's data-plane secret while the communicator is not created yet (wiped once it is,
   * or when the epoch is given up), secret_len 0 = none; authenticated: the communicator of
   * this epoch was created with one */
  uint8_t secret[WAGMA_API_SECRET_LEN];
  size_t secret_len;
  int authenticated;
  /* iterations completed = the next round; set to the plan's start_round at the start of
   * every epoch (round == iteration, docs/agent.md) */
  uint64_t iteration, total_iterations;
  /* wagma: the round of the last wagma_comm_step of this epoch and my group in it */
  int have_round;
  uint64_t last_round;
  int last_round_global;
  int last_ngroup; /* 0 for a global round or a group larger than the record takes */
  int last_group[WAGMA_API_PROGRESS_GROUP_MAX];
  /* fingerprint of the parameters before the final model average (finish) */
  int nfingerprint;
  double fingerprint[WAGMA_API_FINGERPRINT_MAX];
  int done;
  double done_at;

  /* statistics */
  double loss_ema, step_ema, accuracy;
  uint64_t staleness_window, staleness_shown;
  double window_start, last_share;
  wagma_comm_counters_t base; /* counters of the communicators of earlier epochs */
  wagma_rng_t straggler_rng;
  double last_comm_warn;
  int comm_errors;
} wg_job_t;

typedef struct wg_runner_ctx {
  const wg_agent_options_t *opt;
  wagma_backend_t *backend; /* --device: the CPU, or the CUDA device opened at start */
  wg_shared_t *shared;
  wg_job_t job;
  /* the communicators' last error-level log line, under comm_log_mu (their threads log too):
   * why wagma_comm_create failed, for the progress record */
  pthread_mutex_t comm_log_mu;
  char comm_error[200];
  struct wg_launcher *launcher; /* a program job's (launcher.h), made at the first one */
} wg_runner_ctx_t;

/* algorithms.c: one iteration of the job's algorithm (compute, straggler delay, averaging).
 * Returns 0 or the communicator's error (the caller decides what to do about it). */
int wg_algo_iteration(wg_runner_ctx_t *r);
/* algorithms.c: the algorithm's part of job setup (the gradient delay line; adpsgd's endpoint
 * on the --listen host) and teardown, 0 or a status with err saying why; and of entering an
 * epoch once the communicator exists and the opening sync is done (adpsgd: ports and tokens
 * exchanged over the communicator, the endpoint set to the epoch). The member's role. */
int wg_algo_setup(wg_runner_ctx_t *r, char *err, size_t err_len);
void wg_algo_teardown(wg_runner_ctx_t *r);
void wg_algo_enter_epoch(wg_runner_ctx_t *r);
const char *wg_algo_role(const wg_job_t *j);
/* The final model at the job's end, into params (host, every member calls it): the mean of
 * the members' models, or for asgd / dc-asgd the shards' slices. 0 or the collective's
 * error. */
int wg_algo_final_model(wg_runner_ctx_t *r, float *params);

/* runner.c helpers used by algorithms.c */
/* Logs a failed data-plane operation (what) at most every 2 s and counts it; detail says
 * what it met (NULL: the communicator's last error). WAGMA_ECANCELED is not a fault: ignored. */
void wg_runner_warn(wg_runner_ctx_t *r, const char *what, int status, const char *detail);
/* wg_runner_warn of a communicator operation (the detail is its last error). */
void wg_runner_warn_comm(wg_runner_ctx_t *r, const char *what, int status);

#endif
