/* agent/runner.c — the runner thread of wagma-agent: it runs the assigned job's program.
 *
 * Every job trains in a program the agent launches and supervises (launcher.c): the user's
 * program (the spec's program.name, from --programs), or for a built-in job wagma-train, the
 * built-in trainer over libwagma (agent/trainer/, beside the agent's binary). The runner
 * follows what the control thread publishes in wg_shared_t (assignment -> job config, plan with
 * its data-plane secret, checkpoint record) and hands it to the launcher: a launch for a new
 * assignment, every newer plan, a release when the assignment goes, a stop when the agent
 * stops. The program's progress and checkpoints reach the control thread through the launcher.
 *
 * Owns: the launcher (made at the first job) and its copy of the shared state. Invariants: the
 * secret moves from wg_shared_t into the launcher and is wiped behind it (OPENSSL_cleanse);
 * every wait is bounded (50 ms launcher turns, 200 ms waits on the shared condition variable),
 * so stop requests and new plans are seen promptly. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/crypto.h>

#include "agent/launcher.h"
#include "wagma/log_internal.h"

struct wg_runner {
  const wg_agent_options_t *opt;
  wg_shared_t *shared;
  wg_launcher_t *launcher;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int finished;
};

static void wait_shared(struct wg_runner *r, uint64_t gen, double seconds) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts); /* shared->cv uses CLOCK_MONOTONIC (wg_shared_init) */
  long ns = ts.tv_nsec + (long)(seconds * 1e9);
  ts.tv_sec += ns / 1000000000L;
  ts.tv_nsec = ns % 1000000000L;
  pthread_mutex_lock(&r->shared->mu);
  if (!r->shared->stop && r->shared->generation == gen)
    pthread_cond_timedwait(&r->shared->cv, &r->shared->mu, &ts);
  pthread_mutex_unlock(&r->shared->mu);
}

static void *runner_main(void *arg) {
  struct wg_runner *r = arg;
  uint64_t seen = UINT64_MAX;
  int assigned = 0, have_plan = 0, have_ck = 0;
  wg_job_config_t cfg;
  wagma_plan_t plan;
  wg_checkpoint_rec_t ck;
  uint8_t secret[WAGMA_API_SECRET_LEN]; /* the plan's epoch secret, taken from shared with it */
  size_t secret_len = 0;
  memset(&plan, 0, sizeof plan);
  memset(&cfg, 0, sizeof cfg);
  for (;;) {
    pthread_mutex_lock(&r->shared->mu);
    int stop = r->shared->stop;
    uint64_t gen = r->shared->generation;
    if (gen != seen) {
      assigned = r->shared->assigned;
      cfg = r->shared->job;
      have_plan = r->shared->have_plan;
      wagma_plan_free(&plan);
      if (have_plan && wagma_plan_copy(&plan, &r->shared->plan) != 0)
        have_plan = 0;
      /* the secret moves here with the plan (wiped in shared; a newer plan brings its own) */
      OPENSSL_cleanse(secret, sizeof secret);
      secret_len = 0;
      if (have_plan && r->shared->secret_len <= sizeof secret) {
        secret_len = r->shared->secret_len;
        memcpy(secret, r->shared->secret, secret_len);
      }
      OPENSSL_cleanse(r->shared->secret, sizeof r->shared->secret);
      r->shared->secret_len = 0;
      have_ck = r->shared->have_checkpoint;
      ck = r->shared->checkpoint;
      seen = gen;
    }
    pthread_mutex_unlock(&r->shared->mu);
    if (stop)
      break;
    if (!assigned) {
      wg_launcher_release(r->launcher, "released");
      wait_shared(r, gen, 0.2);
      continue;
    }
    if (!r->launcher && wg_launcher_new(r->opt, r->shared, &r->launcher) != 0) {
      wait_shared(r, gen, 1.0);
      continue;
    }
    wg_launcher_turn(r->launcher, &cfg, have_plan ? &plan : NULL, secret, secret_len,
                     have_ck ? &ck : NULL, 0.05);
    have_plan = 0; /* the launcher keeps it, with the secret, until the program has it */
    OPENSSL_cleanse(secret, sizeof secret);
    secret_len = 0;
  }
  wg_launcher_free(r->launcher); /* stops a program still running */
  r->launcher = NULL;
  wagma_plan_free(&plan);
  OPENSSL_cleanse(secret, sizeof secret);
  pthread_mutex_lock(&r->mu);
  r->finished = 1;
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
  return NULL;
}

int wg_runner_start(const wg_agent_options_t *opt, wg_shared_t *shared, wg_runner_t **out) {
  struct wg_runner *r = calloc(1, sizeof *r);
  *out = NULL;
  if (!r)
    return WAGMA_ENOMEM;
  r->opt = opt;
  r->shared = shared;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* a wall-clock step must not stretch join */
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (pthread_create(&r->thread, NULL, runner_main, r) != 0) {
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
    return WAGMA_EIO;
  }
  *out = r;
  return 0;
}

int wg_runner_join(wg_runner_t *r, double timeout_s) {
  struct timespec ts;
  int finished;
  if (!r)
    return 0;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_sec += (time_t)timeout_s;
  pthread_mutex_lock(&r->mu);
  while (!r->finished)
    if (pthread_cond_timedwait(&r->cv, &r->mu, &ts) != 0)
      break;
  finished = r->finished;
  pthread_mutex_unlock(&r->mu);
  if (!finished)
    return WAGMA_ETIMEDOUT;
  pthread_join(r->thread, NULL);
  pthread_mutex_destroy(&r->mu);
  pthread_cond_destroy(&r->cv);
  free(r);
  return 0;
}
