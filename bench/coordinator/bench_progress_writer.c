/* bench_progress_writer — writes the progress records of a job's members into etcd, as that
 * many agents would (cached_reads.sh): <prefix>/jobs/JOB/progress/<AGENT_PREFIX><NN> for NN in
 * [0, MEMBERS), two digits, epoch 1, a running record with a round, its group of 4, loss,
 * accuracy and step time (wagma_progress_to_json, as agents write them).
 *
 *   bench_progress_writer ETCD_ENDPOINTS JOB MEMBERS RATE SECONDS AGENT_PREFIX
 *
 * RATE 0: one record per member, then exit. Else RATE records a second (round robin over the
 * members, each with a higher iteration) for SECONDS seconds or until killed. Single thread;
 * exits 1 when etcd refuses a write. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "wagma/api.h"
#include "wagma/etcd.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int write_one(wagma_etcd_t *etcd, const wagma_keys_t *keys, const char *job,
                     const char *agent, int member, uint64_t iteration) {
  wagma_progress_t p;
  wagma_progress_init(&p);
  p.epoch = 1;
  p.iteration = iteration;
  p.has_round = 1;
  p.round = iteration ? iteration - 1 : 0;
  p.ngroup = 4;
  for (int g = 0; g < 4; g++)
    p.group[g] = (member / 4) * 4 + g;
  p.loss = 2.0 / (1.0 + (double)iteration / 100.0);
  p.accuracy = 0.1 + 0.8 * (1.0 - p.loss / 2.0);
  p.step_time = 0.05;
  p.rounds_activated = p.rounds_joined = iteration;
  p.time = (double)time(NULL);
  char key[256], *json = NULL;
  if (wagma_key_job_progress(keys, job, agent, key, sizeof key) != 0 ||
      wagma_progress_to_json(&p, &json) != 0)
    return 1;
  int e = wagma_etcd_put(etcd, key, json, strlen(json), 0, NULL);
  free(json);
  return e != 0;
}

int main(int argc, char **argv) {
  if (argc != 7) {
    fprintf(stderr, "usage: bench_progress_writer ETCD_ENDPOINTS JOB MEMBERS RATE SECONDS "
                    "AGENT_PREFIX\n");
    return 2;
  }
  const char *job = argv[2], *agent_prefix = argv[6];
  int members = atoi(argv[3]);
  double rate = atof(argv[4]), seconds = atof(argv[5]);
  if (members < 1 || members > 100 || rate < 0) {
    fprintf(stderr, "bench_progress_writer: MEMBERS in [1, 100], RATE >= 0\n");
    return 2;
  }
  wagma_keys_t keys;
  wagma_etcd_t *etcd;
  wagma_etcd_options_t o = {.endpoints = argv[1], .call_timeout_ms = 5000};
  if (wagma_keys_init(&keys, NULL) != 0 || wagma_etcd_open(&o, &etcd) != 0)
    return 1;
  char agent[64];
  int rc = 0;
  if (rate == 0) {
    for (int m = 0; m < members && !rc; m++) {
      snprintf(agent, sizeof agent, "%s%02d", agent_prefix, m);
      rc = write_one(etcd, &keys, job, agent, m, 1);
    }
  } else {
    double t0 = now();
    for (long k = 0; !rc && now() - t0 < seconds; k++) {
      double due = t0 + (double)k / rate, wait = due - now();
      if (wait > 0) {
        struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
        nanosleep(&ts, NULL);
      }
      int m = (int)(k % members);
      snprintf(agent, sizeof agent, "%s%02d", agent_prefix, m);
      rc = write_one(etcd, &keys, job, agent, m, 2 + (uint64_t)(k / members));
    }
  }
  if (rc)
    fprintf(stderr, "bench_progress_writer: %s\n", wagma_etcd_errmsg(etcd));
  wagma_etcd_close(etcd);
  return rc;
}
