/* engine_world.c — see engine_world.h. */
#include "engine_world.h"

#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "engine_internal.h"
#include "process.h"

typedef struct ew_shared {
  ew_scenario_t sc;
  int ports[EW_MAXP];
  volatile int victim_hit; /* the parent killed/stopped the victim */
  ew_result_t res[EW_MAXP];
} ew_shared_t;

void ew_scenario_init(ew_scenario_t *sc, int P, int S, int tau, wagma_global_sync_t mode) {
  memset(sc, 0, sizeof(*sc));
  sc->P = P;
  sc->S = S;
  sc->tau = tau;
  sc->mode = mode;
  sc->floor_s = 0.5;
  sc->rounds = 1;
  sc->seed = 1;
  sc->kill_rank = -1;
  sc->stop_rank = -1;
  sc->leave_rank = -1;
  sc->hard_timeout_s = 90;
  sc->settle_s = 0.1;
}

const uint8_t ew_secret[32] = "engine worlds' epoch secret 012";

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static unsigned next_rand(unsigned *s) {
  *s = *s * 1103515245u + 12345u;
  return (*s >> 16) & 0x7fff;
}

static void log_stderr(void *user, int level, const char *msg) {
  fprintf(stderr, "[rank %d] %s %s\n", *(int *)user, wagma_log_level_name(level), msg);
}

static void child(ew_shared_t *sh, int rank) {
  const ew_scenario_t *sc = &sh->sc;
  ew_result_t *res = &sh->res[rank];
  wagma_plan_t plan;
  wagma_comm_t *comm = NULL;
  if (wagma_plan_build(sc->P, sc->S, NULL, &plan) != 0) {
    res->errors++;
    return;
  }
  plan.epoch = 1;
  plan.staleness_bound = sc->tau;
  plan.global_sync = sc->mode;
  for (int i = 0; i < sc->P; i++) {
    snprintf(plan.members[i].name, WAGMA_NAME_MAX, "r%d", i);
    snprintf(plan.members[i].address, WAGMA_ADDRESS_MAX, "127.0.0.1:%d", sh->ports[i]);
  }
  wagma_comm_options_t o;
  wagma_comm_options_init(&o);
  o.plan = &plan;
  o.rank = rank;
  size_t count = sc->count > EW_COUNT ? sc->count : EW_COUNT;
  o.count = count;
  o.rounds = sc->rounds_path;
  o.connect_timeout_s = 20;
  o.round_deadline_floor_s = sc->floor_s;
  o.global_timeout_s = 30;
  o.secret = ew_secret;
  o.secret_len = sizeof ew_secret;
  if (getenv("EW_DEBUG")) {
    o.log = log_stderr;
    o.log_user = &rank;
  }
  int rc = wagma_comm_create(&o, &comm);
  wagma_plan_free(&plan);
  if (rc != 0) {
    res->errors++;
    return;
  }
  for (int i = 0; i < EW_COUNT; i++) {
    res->model[i] = (float)(rank * 100 + (i % 13));
    res->initial[i] = res->model[i];
  }
  /* a large model: the tracked prefix is res->model, mirrored around each call */
  float *big = count > EW_COUNT ? calloc(count, sizeof(float)) : NULL;
  float *model = big ? big : res->model;
  if (count > EW_COUNT && !big) {
    res->errors++;
    wagma_comm_destroy(comm);
    return;
  }
  res->started = 1;
  /* same delay draws in every loop kind: seeded by (seed, rank) */
  unsigned seed = sc->seed * 7919u + (unsigned)rank * 104729u;
  uint64_t sync_round = 0;
  double t0 = now_s();
  for (;;) {
    uint64_t r = sc->loop == EW_LOOP_SYNC ? sync_round : wagma_comm_round(comm);
    res->round = r;
    if (r >= (uint64_t)sc->rounds)
      break;
    if (rank == sc->leave_rank && r >= (uint64_t)sc->leave_round) {
      /* Leave while the others are already waiting in this round. */
      usleep((useconds_t)(sc->leave_delay_s * 1e6));
      res->final_round = r;
      res->finished = 1;
      sh->victim_hit = 1;
      wagma_comm_destroy(comm);
      free(big);
      res->exited_ok = 1;
      return;
    }
    for (int i = 0; i < EW_COUNT; i++) {
      float g = 0.01f * (float)((rank + 1) * ((i % 5) - 2));
      res->model[i] += g;
      res->added[i] += g;
    }
    double ms = sc->base_ms[rank];
    if (sc->slow_p > 0 && (double)next_rand(&seed) / 32768.0 < sc->slow_p)
      ms += sc->slow_ms;
    if (ms > 0)
      usleep((useconds_t)(ms * 1000));
    wagma_round_stats_t st;
    memset(&st, 0, sizeof(st));
    double ts = now_s();
    if (sc->loop == EW_LOOP_SYNC) {
      rc = wagma_comm_allreduce(comm, res->model, EW_COUNT, WAGMA_REDUCE_MEAN);
      sync_round++;
      st.wait_s = now_s() - ts;
    } else {
      float *before = sc->track_catchup ? malloc(sizeof(res->model)) : NULL;
      if (before)
        memcpy(before, res->model, sizeof(res->model));
      if (big)
        memcpy(big, res->model, sizeof(res->model));
      rc = wagma_comm_step(comm, model, &st);
      if (big)
        memcpy(res->model, big, sizeof(res->model));
      if (before && st.caught_up)
        for (int i = 0; i < EW_COUNT; i++)
          res->catchup[i] += (double)res->model[i] - (double)before[i];
      free(before);
    }
    if (rc != 0)
      res->errors++;
    if (getenv("EW_DEBUG"))
      fprintf(stderr, "[rank %d] round %llu rc %d wait %.3f contributors %d/%d\n", rank,
              (unsigned long long)st.round, rc, st.wait_s, st.contributors, st.members);
    if (res->steps == 0)
      res->first = st;
    res->steps++;
    if (st.wait_s > res->max_wait_s)
      res->max_wait_s = st.wait_s;
    if (sh->victim_hit && st.wait_s > res->max_wait_after_s)
      res->max_wait_after_s = st.wait_s;
    if (st.max_staleness > res->max_staleness)
      res->max_staleness = st.max_staleness;
    if (st.max_staleness > (uint64_t)sc->tau)
      res->bad_staleness++;
    res->caught_up |= st.caught_up;
    res->skipped += st.rounds_skipped;
  }
  res->elapsed_s = now_s() - t0;
  res->final_round = sc->loop == EW_LOOP_SYNC ? sync_round : wagma_comm_round(comm);
  res->finished = 1;
  /* Keep answering activations until every survivor finished, then settle and leave. */
  double until = now_s() + 30;
  for (;;) {
    int all = 1;
    for (int i = 0; i < sc->P; i++)
      if (i != sc->kill_rank && !sh->res[i].finished)
        all = 0;
    if (all || now_s() > until)
      break;
    usleep(5000);
  }
  /* Let every open round finish (nobody computes any more; round threads still answer). */
  double settle_until = now_s() + sc->settle_s;
  while (now_s() < settle_until ||
         (sc->settle_s > 0.5 && wg_comm_busy(comm) > 0 && now_s() < settle_until + 15))
    usleep(10000);
  if (big)
    memcpy(big, res->model, sizeof(res->model));
  wg_comm_apply_pending(comm, model);
  if (big)
    memcpy(res->model, big, sizeof(res->model));
  wagma_comm_counters(comm, &res->counters);
  wagma_comm_destroy(comm);
  free(big);
  res->exited_ok = 1;
}

int ew_run(const ew_scenario_t *sc, ew_result_t *results) {
  ew_shared_t *sh =
      mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED)
    return -1;
  memset(sh, 0, sizeof(*sh));
  sh->sc = *sc;
  int failed = 0;
  pid_t pids[EW_MAXP] = {0};
  if (sc->P > EW_MAXP || proc_free_ports(sc->P, sh->ports) != 0) {
    failed = 1;
    goto out;
  }
  fflush(NULL);
  for (int r = 0; r < sc->P; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      child(sh, r);
      exit(sh->res[r].errors ? 1 : 0);
    }
    if (pids[r] < 0) {
      failed = 1;
      goto reap;
    }
  }
  double t0 = now_s(), stopped_at = 0;
  int alive = sc->P, victim_done = 0;
  while (alive > 0) {
    if (now_s() - t0 > (sc->hard_timeout_s > 0 ? sc->hard_timeout_s : 90)) {
      fprintf(stderr, "engine world: hard timeout, killing children\n");
      failed = 1;
      break;
    }
    int victim = sc->kill_rank >= 0 ? sc->kill_rank : sc->stop_rank;
    if (victim >= 0 && !victim_done && pids[victim] > 0 && sh->res[victim].round >= 10) {
      if (sc->kill_rank >= 0) {
        kill(pids[victim], SIGKILL);
        victim_done = 1;
      } else if (stopped_at == 0) {
        kill(pids[victim], SIGSTOP);
        stopped_at = now_s();
      }
      sh->victim_hit = 1;
    }
    if (stopped_at > 0 && !victim_done && now_s() - stopped_at >= sc->stop_s) {
      kill(pids[victim], SIGCONT);
      victim_done = 1;
    }
    for (int r = 0; r < sc->P; r++) {
      if (pids[r] <= 0)
        continue;
      int status = 0;
      pid_t w = waitpid(pids[r], &status, WNOHANG);
      if (w == pids[r]) {
        int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!ok && r != sc->kill_rank) {
          fprintf(stderr, "engine world: rank %d exited badly (status 0x%x)\n", r, status);
          failed = 1;
        }
        pids[r] = 0;
        alive--;
      }
    }
    usleep(2000);
  }
reap:
  for (int r = 0; r < sc->P; r++) {
    if (pids[r] > 0) {
      kill(pids[r], SIGCONT);
      kill(pids[r], SIGKILL);
      waitpid(pids[r], NULL, 0);
    }
  }
out:
  memcpy(results, sh->res, (size_t)sc->P * sizeof(ew_result_t));
  munmap(sh, sizeof(*sh));
  return failed ? -1 : 0;
}
