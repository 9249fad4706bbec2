/* stub_worker.c — a stand-in for libwagma (worker/include/wagma/worker.h) for the Python
 * package's tests: every wagma_worker_* with the header's signatures, no agent and no peers.
 * The "job" comes from the environment, read at open:
 *   WAGMA_STUB_ITERATIONS (10)  WAGMA_STUB_EPOCHS (0)  WAGMA_STUB_ALGORITHM ("wagma")
 *   WAGMA_STUB_BATCH (32)  WAGMA_STUB_WORKERS (4)  WAGMA_STUB_SEED (7)  WAGMA_STUB_RANK (0)
 *   WAGMA_STUB_DEVICE ("cpu")
 *   WAGMA_STUB_GRAD_SCALE   allreduce: average_gradients multiplies the gradients by it (1)
 *   WAGMA_STUB_SAVE_TO, WAGMA_STUB_SAVE_AT   after that step: the parameters and the state
 *                           (through save) into that file, as a survivor sends them
 *   WAGMA_STUB_JOIN_FROM    a joiner: register (or step WAGMA_STUB_JOIN_AT) replaces the
 *                           parameters, the state (through load) and the iteration by the file's
 *   WAGMA_STUB_STOP_AT      step returns WAGMA_ECANCELED from that iteration on ("agent said stop")
 *   WAGMA_STUB_FINAL_CANCELED  final_average returns WAGMA_ECANCELED
 *   WAGMA_STUB_SPEC         what wagma_worker_spec returns ("{}")
 * open fails with WAGMA_EINVAL without a socket path, WAGMA_EUNAVAIL for the path "unreachable".
 * It logs through the callback, once from a thread of its own (as the real library's control
 * thread does). wagma_stub_stats and wagma_stub_layout are the tests' own. */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wagma/worker.h"

struct wagma_worker {
  wagma_log_fn log;
  void *log_user;
  wagma_worker_config_t cfg;
  wagma_worker_status_t st;
  float *params;
  size_t n;
  wagma_worker_state_fns_t fns;
  int has_fns;
  void *state_user;
  double grad_scale;
  uint64_t save_at, join_at, stop_at;
  int final_canceled, rank;
  char save_to[512], join_from[512];
  uint64_t n_average, n_step, n_report, n_done, n_fail, n_final, n_set_iterations;
  double last_loss, last_accuracy;
  char err[256];
};

static const char *env(const char *k, const char *dflt) {
  const char *v = getenv(k);
  return v && *v ? v : dflt;
}

static uint64_t env_u64(const char *k, uint64_t dflt) {
  const char *v = getenv(k);
  return v && *v ? strtoull(v, NULL, 10) : dflt;
}

static void logf_(wagma_worker_t *w, int level, const char *fmt, ...) {
  if (!w->log)
    return;
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  w->log(w->log_user, level, buf);
}

static int fail_(wagma_worker_t *w, int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(w->err, sizeof w->err, fmt, ap);
  va_end(ap);
  return status;
}

static void *log_thread(void *arg) {
  logf_(arg, WAGMA_LOG_INFO, "stub: hello from the control thread");
  return NULL;
}

int wagma_worker_open(const char *socket_path, wagma_log_fn log, void *log_user,
                      wagma_worker_t **out) {
  if (!out)
    return WAGMA_EINVAL;
  *out = NULL;
  if (!socket_path)
    socket_path = getenv("WAGMA_AGENT_SOCKET");
  if (!socket_path || !*socket_path)
    return WAGMA_EINVAL;
  if (strcmp(socket_path, "unreachable") == 0)
    return WAGMA_EUNAVAIL;
  wagma_worker_t *w = calloc(1, sizeof *w);
  if (!w)
    return WAGMA_ENOMEM;
  w->log = log;
  w->log_user = log_user;
  snprintf(w->cfg.job, sizeof w->cfg.job, "%s", "stub-job");
  snprintf(w->cfg.agent, sizeof w->cfg.agent, "%s", env("WAGMA_STUB_AGENT", "stub-agent"));
  snprintf(w->cfg.algorithm, sizeof w->cfg.algorithm, "%s", env("WAGMA_STUB_ALGORITHM", "wagma"));
  w->cfg.iterations = env_u64("WAGMA_STUB_ITERATIONS", 10);
  w->cfg.epochs = env_u64("WAGMA_STUB_EPOCHS", 0);
  w->cfg.batch_size = (int)env_u64("WAGMA_STUB_BATCH", 32);
  w->cfg.workers = (int)env_u64("WAGMA_STUB_WORKERS", 4);
  w->cfg.seed = env_u64("WAGMA_STUB_SEED", 7);
  w->cfg.eval_every = 0;
  w->cfg.staleness_bound = 4;
  w->cfg.group_size = 2;
  snprintf(w->cfg.global_sync, sizeof w->cfg.global_sync, "%s", "wait-avoiding");
  snprintf(w->cfg.device, sizeof w->cfg.device, "%s", env("WAGMA_STUB_DEVICE", "cpu"));
  snprintf(w->cfg.transport, sizeof w->cfg.transport, "%s", "tcp");
  w->st.rank = -1;
  w->rank = (int)env_u64("WAGMA_STUB_RANK", 0);
  w->grad_scale = strtod(env("WAGMA_STUB_GRAD_SCALE", "1"), NULL);
  w->save_at = env_u64("WAGMA_STUB_SAVE_AT", 0);
  w->join_at = env_u64("WAGMA_STUB_JOIN_AT", 0);
  w->stop_at = env_u64("WAGMA_STUB_STOP_AT", 0);
  w->final_canceled = env_u64("WAGMA_STUB_FINAL_CANCELED", 0) != 0;
  snprintf(w->save_to, sizeof w->save_to, "%s", env("WAGMA_STUB_SAVE_TO", ""));
  snprintf(w->join_from, sizeof w->join_from, "%s", env("WAGMA_STUB_JOIN_FROM", ""));
  logf_(w, WAGMA_LOG_INFO, "stub: open %s", socket_path);
  pthread_t t;
  if (pthread_create(&t, NULL, log_thread, w) == 0)
    pthread_join(t, NULL);
  *out = w;
  return 0;
}

int wagma_worker_config(const wagma_worker_t *w, wagma_worker_config_t *out) {
  if (!w || !out)
    return WAGMA_EINVAL;
  *out = w->cfg;
  return 0;
}

static size_t state_len(wagma_worker_t *w) {
  return w->has_fns && w->fns.size ? w->fns.size(w->state_user) : 0;
}

/* The survivor's side: parameters, state and iteration into save_to. */
static int save_file(wagma_worker_t *w) {
  size_t k = state_len(w);
  float *state = k ? calloc(k, sizeof *state) : NULL;
  if (k && !state)
    return fail_(w, WAGMA_ENOMEM, "save: no memory");
  if (k)
    w->fns.save(w->state_user, state);
  FILE *f = fopen(w->save_to, "wb");
  if (!f) {
    free(state);
    return fail_(w, WAGMA_EIO, "save: cannot open %s", w->save_to);
  }
  uint64_t hdr[3] = {w->n, k, w->st.iteration};
  int ok = fwrite(hdr, sizeof hdr, 1, f) == 1 &&
           fwrite(w->params, sizeof(float), w->n, f) == w->n &&
           (k == 0 || fwrite(state, sizeof(float), k, f) == k);
  ok = (fclose(f) == 0) && ok;
  free(state);
  return ok ? 0 : fail_(w, WAGMA_EIO, "save: short write to %s", w->save_to);
}

/* The joiner's side: the survivor's parameters, state and iteration from join_from. */
static int join_file(wagma_worker_t *w) {
  FILE *f = fopen(w->join_from, "rb");
  if (!f)
    return fail_(w, WAGMA_EIO, "join: cannot open %s", w->join_from);
  uint64_t hdr[3];
  size_t k = state_len(w);
  int rc = 0;
  float *state = NULL;
  if (fread(hdr, sizeof hdr, 1, f) != 1) {
    rc = fail_(w, WAGMA_EPROTO, "join: short file");
  } else if (hdr[0] != w->n) {
    rc = fail_(w, WAGMA_EPROTO, "join: %llu parameters, the survivor sent %llu",
               (unsigned long long)w->n, (unsigned long long)hdr[0]);
  } else if (hdr[1] != k) {
    rc = fail_(w, WAGMA_EPROTO, "join: state of %zu floats, the survivor sent %llu", k,
               (unsigned long long)hdr[1]);
  } else if (fread(w->params, sizeof(float), w->n, f) != w->n) {
    rc = fail_(w, WAGMA_EPROTO, "join: short parameters");
  } else if (k) {
    state = calloc(k, sizeof *state);
    if (!state)
      rc = fail_(w, WAGMA_ENOMEM, "join: no memory");
    else if (fread(state, sizeof(float), k, f) != k)
      rc = fail_(w, WAGMA_EPROTO, "join: short state");
    else
      w->fns.load(w->state_user, state);
  }
  fclose(f);
  free(state);
  if (rc == 0) {
    w->st.iteration = hdr[2];
    w->st.joined = 1;
    logf_(w, WAGMA_LOG_INFO, "stub: joined at iteration %llu", (unsigned long long)hdr[2]);
  }
  return rc;
}

int wagma_worker_register(wagma_worker_t *w, float *params, size_t n,
                          const wagma_worker_state_fns_t *state, void *state_user) {
  if (!w)
    return WAGMA_EINVAL;
  if (!params || n == 0)
    return fail_(w, WAGMA_EINVAL, "register: no parameters");
  if (w->params)
    return fail_(w, WAGMA_EINVAL, "register: called twice");
  w->params = params;
  w->n = n;
  if (state) {
    w->fns = *state;
    w->has_fns = 1;
  }
  w->state_user = state_user;
  w->st.epoch = 1;
  w->st.rank = w->rank;
  w->st.size = w->cfg.workers;
  if (w->join_from[0] && w->join_at == 0)
    return join_file(w);
  return 0;
}

int wagma_worker_set_iterations(wagma_worker_t *w, uint64_t iterations) {
  if (!w)
    return WAGMA_EINVAL;
  if (iterations == 0)
    return fail_(w, WAGMA_EINVAL, "set_iterations: 0");
  w->n_set_iterations++;
  if (w->cfg.iterations == 0)
    w->cfg.iterations = iterations;
  return 0;
}

int wagma_worker_should_stop(wagma_worker_t *w) {
  if (!w)
    return WAGMA_EINVAL;
  if (w->cfg.iterations == 0)
    return fail_(w, WAGMA_EINVAL,
                 "should_stop: the job counts epochs and set_iterations was "
                 "not called");
  if (w->stop_at && w->st.iteration >= w->stop_at)
    return 1;
  return w->st.iteration >= w->cfg.iterations;
}

int wagma_worker_average_gradients(wagma_worker_t *w, float *grads) {
  if (!w || !grads)
    return WAGMA_EINVAL;
  w->n_average++;
  if (strcmp(w->cfg.algorithm, "allreduce") != 0)
    return 0;
  for (size_t i = 0; i < w->n; i++) /* the registered length: all of it must be writable */
    grads[i] = (float)(grads[i] * w->grad_scale);
  return 0;
}

int wagma_worker_step(wagma_worker_t *w) {
  if (!w)
    return WAGMA_EINVAL;
  if (!w->params)
    return fail_(w, WAGMA_EINVAL, "step: not registered");
  if (w->stop_at && w->st.iteration >= w->stop_at)
    return fail_(w, WAGMA_ECANCELED, "the agent said stop");
  w->n_step++;
  w->st.iteration++;
  w->st.round_global = w->st.iteration % 4 == 0;
  w->st.ngroup = w->st.round_global ? 0 : 2;
  w->st.group[0] = w->st.rank;
  w->st.group[1] = w->st.size > 0 ? (w->st.rank + 1) % w->st.size : 0;
  w->st.staleness = w->st.iteration % 3;
  if (w->save_to[0] && w->save_at == w->st.iteration) {
    int rc = save_file(w);
    if (rc)
      return rc;
  }
  if (w->join_from[0] && w->join_at && w->join_at == w->st.iteration)
    return join_file(w);
  return 0;
}

int wagma_worker_report(wagma_worker_t *w, double loss, double accuracy) {
  if (!w)
    return WAGMA_EINVAL;
  w->n_report++;
  w->last_loss = loss;
  w->last_accuracy = accuracy;
  return 0;
}

int wagma_worker_status(const wagma_worker_t *w, wagma_worker_status_t *out) {
  if (!w || !out)
    return WAGMA_EINVAL;
  *out = w->st;
  return 0;
}

int wagma_worker_final_average(wagma_worker_t *w) {
  if (!w)
    return WAGMA_EINVAL;
  if (w->final_canceled)
    return fail_(w, WAGMA_ECANCELED, "final average: the agent said stop");
  w->n_final++;
  return 0;
}

int wagma_worker_done(wagma_worker_t *w, double loss, double accuracy) {
  if (!w)
    return WAGMA_EINVAL;
  w->n_done++;
  w->last_loss = loss;
  w->last_accuracy = accuracy;
  logf_(w, WAGMA_LOG_INFO, "stub: done loss=%g accuracy=%g", loss, accuracy);
  return 0;
}

int wagma_worker_fail(wagma_worker_t *w, const char *why) {
  if (!w)
    return WAGMA_EINVAL;
  w->n_fail++;
  logf_(w, WAGMA_LOG_ERROR, "stub: failed: %s", why ? why : "(null)");
  return 0;
}

int wagma_worker_use_cuda(wagma_worker_t *w, void *stream) {
  (void)stream;
  return w ? WAGMA_ENOSYS : WAGMA_EINVAL; /* the stub stages nothing */
}

const char *wagma_worker_spec(const wagma_worker_t *w) {
  (void)w;
  return env("WAGMA_STUB_SPEC", "{}");
}

int wagma_worker_unavailable(wagma_worker_t *w, const char *why) {
  if (!w)
    return WAGMA_EINVAL;
  w->n_fail++;
  logf_(w, WAGMA_LOG_ERROR, "stub: unavailable: %s", why ? why : "(null)");
  return 0;
}

int wagma_worker_set_restore(wagma_worker_t *w, wagma_worker_restore_fn restore, void *user) {
  (void)restore;
  (void)user;
  return w ? 0 : WAGMA_EINVAL;
}

int wagma_worker_checkpoint_due(const wagma_worker_t *w) {
  (void)w;
  return 0;
}

int wagma_worker_checkpoint_saved(wagma_worker_t *w, const char *path, uint64_t iteration) {
  if (!w)
    return WAGMA_EINVAL;
  logf_(w, WAGMA_LOG_INFO, "stub: checkpoint %s at %llu", path ? path : "(null)",
        (unsigned long long)iteration);
  return 0;
}

static wagma_worker_t last_closed; /* for wagma_stub_stats(NULL, ...) */

void wagma_worker_close(wagma_worker_t *w) {
  if (!w)
    return;
  logf_(w, WAGMA_LOG_DEBUG, "stub: close");
  last_closed = *w;
  free(w);
}

const char *wagma_worker_last_error(const wagma_worker_t *w) {
  return w ? w->err : "";
}

const char *wagma_strerror(int status) {
  switch (status) {
  case WAGMA_OK: return "ok";
  case WAGMA_EINVAL: return "invalid argument";
  case WAGMA_EUNAVAIL: return "unavailable";
  case WAGMA_ECANCELED: return "canceled";
  default: return "error";
  }
}

/* The tests' own: what the stub saw (w NULL: the last closed handle). counts: average, step,
 * report, done, fail, final, set_iterations; last: the last loss and accuracy. */
void wagma_stub_stats(const wagma_worker_t *w, uint64_t counts[7], double last[2]) {
  if (!w)
    w = &last_closed;
  counts[0] = w->n_average;
  counts[1] = w->n_step;
  counts[2] = w->n_report;
  counts[3] = w->n_done;
  counts[4] = w->n_fail;
  counts[5] = w->n_final;
  counts[6] = w->n_set_iterations;
  last[0] = w->last_loss;
  last[1] = w->last_accuracy;
}

/* The structs' layout as the C compiler sees worker.h: "name offset size" lines. */
size_t wagma_stub_layout(char *buf, size_t cap) {
  size_t used = 0;
#define F(T, f)                                                                                    \
  used += (size_t)snprintf(buf + (used < cap ? used : cap), used < cap ? cap - used : 0,           \
                           "%s.%s %zu %zu\n", #T, #f, offsetof(T, f), sizeof(((T *)0)->f))
#define S(T)                                                                                       \
  used += (size_t)snprintf(buf + (used < cap ? used : cap), used < cap ? cap - used : 0,           \
                           "%s %zu %zu\n", #T, (size_t)0, sizeof(T))
  S(wagma_worker_config_t);
  F(wagma_worker_config_t, job);
  F(wagma_worker_config_t, agent);
  F(wagma_worker_config_t, algorithm);
  F(wagma_worker_config_t, iterations);
  F(wagma_worker_config_t, epochs);
  F(wagma_worker_config_t, batch_size);
  F(wagma_worker_config_t, workers);
  F(wagma_worker_config_t, seed);
  F(wagma_worker_config_t, eval_every);
  F(wagma_worker_config_t, staleness_bound);
  F(wagma_worker_config_t, group_size);
  F(wagma_worker_config_t, global_sync);
  F(wagma_worker_config_t, device);
  F(wagma_worker_config_t, transport);
  S(wagma_worker_status_t);
  F(wagma_worker_status_t, epoch);
  F(wagma_worker_status_t, rank);
  F(wagma_worker_status_t, size);
  F(wagma_worker_status_t, iteration);
  F(wagma_worker_status_t, joined);
  F(wagma_worker_status_t, round_global);
  F(wagma_worker_status_t, ngroup);
  F(wagma_worker_status_t, group);
  F(wagma_worker_status_t, staleness);
  S(wagma_worker_state_fns_t);
  F(wagma_worker_state_fns_t, size);
  F(wagma_worker_state_fns_t, save);
  F(wagma_worker_state_fns_t, load);
#undef F
#undef S
  return used;
}
