/* worker/worker_internal.h — libwagma's handle and the helpers its files share (worker.c: the
 * agent's socket, epochs and the averaging algorithms libwagma runs; own.c: the calls for a
 * program that averages by an algorithm of its own). Private to libwagma. */
#ifndef WAGMA_WORKER_INTERNAL_H
#define WAGMA_WORKER_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_stage.h"
#include "wagma/api.h"
#include "wagma/collective.h"
#include "wagma/worker.h"

struct wagma_worker {
  int fd;      /* the agent's socket */
  int wake[2]; /* close() wakes the control thread */
  pthread_t thread;
  int thread_started;
  wagma_log_fn log;
  void *log_user;
  char err[512]; /* the last failed call's message (training thread) */

  pthread_mutex_t mu;
  pthread_cond_t cv; /* CLOCK_MONOTONIC; signalled on every change below */
  /* under mu, written by the control thread */
  int have_config;
  wagma_worker_config_t cfg;
  double progress_interval, connect_timeout, round_deadline, collective_timeout, linger;
  double create_retry; /* a communicator that cannot be created this long: "unavailable" */
  int encrypt;
  char *spec;        /* the job spec's JSON text ("{}" when the agent sent none) */
  uint64_t ck_every; /* spec checkpoint.every, 0 = none */
  int ck_dir;        /* the spec has a checkpoint.path */
  int have_plan;
  wagma_plan_t plan; /* the newest plan the agent sent */
  uint8_t secret[WAGMA_API_SECRET_LEN];
  size_t secret_len;
  char ck_path[WAGMA_API_CHECKPOINT_PATH_MAX]; /* the plan's checkpoint record, "" = none */
  uint64_t ck_iteration;
  int stop;
  char stop_reason[160];
  wagma_comm_t *comm; /* the training thread's, published for abort */

  /* training thread */
  int listen_fd; /* the agent's data-plane socket, -1 = bind per epoch */
  float *params; /* the registered parameters, or their page-locked mirror (device) */
  size_t n;
  /* device buffers (wagma_worker_use_cuda): the caller's device parameters and stream, the
   * runtime, and the gradients' page-locked mirror */
  int device;
  void *stream;
  wg_cuda_t cuda;
  float *dparams, *hgrads;
  wagma_worker_state_fns_t st;
  void *st_user;
  float *sync_buf;
  size_t sync_cap;
  wagma_plan_t cur; /* the plan of the current epoch */
  uint64_t epoch;   /* 0 = none entered */
  int rank;
  int has_model; /* the parameters hold the job's training (after a step or a sync) */
  int joined;
  uint64_t iteration, total;
  int finished; /* final average done */
  int fresh;    /* the current epoch began with no member holding the job's model */
  wagma_worker_restore_fn restore;
  void *restore_user;
  int ck_due;
  int nfp; /* the fingerprint of the parameters before the final average */
  double fp[WAGMA_API_FINGERPRINT_MAX];
  int done;
  double loss, accuracy, step_ema, last_step_at, last_report;
  uint64_t staleness;
  uint64_t alone; /* wagma: the last step's alone_rounds (wagma_round_stats_t) */
  int round_global, ngroup, group[64];
  wagma_comm_counters_t base;
  double last_warn;
  /* a program's own algorithm (own.c, wagma_worker_report_algorithm) */
  char role[16];
  uint64_t own_averaged, own_served, own_skipped;
};

/* The message of the failing call into w->err; returns e. */
int wg_worker_fail(wagma_worker_t *w, int e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A failed data-plane operation, logged at most every 2 s (the round goes on without it). */
void wg_worker_warn(wagma_worker_t *w, const char *what, int e);
/* Device parameters into the page-locked mirror, and back (0 on host buffers). */
int wg_worker_params_in(wagma_worker_t *w);
int wg_worker_params_out(wagma_worker_t *w);
/* Closes the communicator of the current epoch (its counters kept in base). */
void wg_worker_close_comm(wagma_worker_t *w);
/* An iteration boundary: the stop (WAGMA_ECANCELED), or a newer plan: its epoch entered. */
int wg_worker_boundary(wagma_worker_t *w);
/* The end of a step that counted the iterations from before to w->iteration: the step time,
 * whether a checkpoint is due, the progress report; WAGMA_ECANCELED when the agent said stop. */
int wg_worker_step_end(wagma_worker_t *w, uint64_t before);
/* 1 when libwagma runs the job's averaging (wagma, allreduce, local-sgd); 0 when the program
 * runs its own (wagma_worker_advance). */
int wg_worker_averages(const wagma_worker_t *w);

#endif
