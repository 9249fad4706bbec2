/* bench_schedule — scheduling latency of a running wagma-coordinator at scale: registers P
 * agents (leased keys, Txns of 100 puts), submits a job of P workers (spec + status written as
 * POST /v1/jobs does), and times (1) submit -> first plan (P assignments + plan + status),
 * (2) one agent's key deleted -> plan epoch 2. Named baseline: one etcd Txn round trip of 100
 * puts on the same etcd (the floor of any coordinator write); the ratio is latency / baseline.
 *   bench_schedule ETCD_ENDPOINTS P [P...]      (run.sh starts etcd and the coordinator) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "wagma/etcd.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Polls the plan key until its epoch is >= epoch; returns seconds or -1 after 60 s. */
static double wait_epoch(wagma_etcd_t *etcd, const char *key, long epoch, double t0) {
  while (now() - t0 < 60) {
    wagma_etcd_kv_t *kv = NULL;
    if (wagma_etcd_get(etcd, key, &kv, NULL) == 0) {
      const char *e = strstr(kv->value, "\"epoch\":");
      long got = e ? strtol(e + 8, NULL, 10) : 0;
      wagma_etcd_kv_free(kv);
      if (got >= epoch)
        return now() - t0;
    }
    usleep(2000);
  }
  return -1;
}

int main(int argc, char **argv) {
  wagma_etcd_t *etcd;
  if (argc < 3) {
    fprintf(stderr, "usage: bench_schedule ETCD_ENDPOINTS P [P...]\n");
    return 2;
  }
  wagma_etcd_options_t o = {.endpoints = argv[1], .call_timeout_ms = 20000};
  if (wagma_etcd_open(&o, &etcd))
    return 1;
  printf("| P | submit -> plan (s) | agent lost -> new plan (s) | baseline Txn of 100 puts (ms) "
         "| ratio (lost -> plan / baseline) |\n|---|---|---|---|---|\n");
  for (int a = 2; a < argc; a++) {
    int p = atoi(argv[a]);
    int64_t lease;
    char job[32], key[128], val[160];
    snprintf(job, sizeof job, "sched-%d", p);
    if (wagma_etcd_lease_grant(etcd, 600, &lease))
      return 1;
    static char keys[100][96], vals[100][96];
    wagma_etcd_op_t ops[100];
    double base = 1e9;
    for (int b = 0; b < p; b += 100) {
      int n = p - b < 100 ? p - b : 100;
      for (int k = 0; k < n; k++) {
        int i = b + k;
        snprintf(keys[k], sizeof keys[k], "/wagma/agents/%s-a%05d", job, i);
        snprintf(vals[k], sizeof vals[k], "{\"address\":\"10.%d.%d.%d:7000\"}", i / 65536,
                 (i / 256) % 256, i % 256);
        ops[k] = (wagma_etcd_op_t){.type = WAGMA_ETCD_OP_PUT,
                                   .key = keys[k],
                                   .value = vals[k],
                                   .value_len = strlen(vals[k]),
                                   .lease = lease};
      }
      double t = now();
      if (wagma_etcd_txn(etcd, NULL, 0, ops, (size_t)n, NULL, 0, NULL))
        return 1;
      if (n == 100 && now() - t < base)
        base = now() - t;
    }
    usleep(300000); /* let the coordinator settle on the new agents */
    char spec_key[128], status_key[128], plan_key[128];
    snprintf(spec_key, sizeof spec_key, "/wagma/jobs/%s/spec", job);
    snprintf(status_key, sizeof status_key, "/wagma/jobs/%s/status", job);
    snprintf(plan_key, sizeof plan_key, "/wagma/jobs/%s/plan", job);
    char spec[256], status[256];
    snprintf(spec, sizeof spec, "{\"name\":\"%s\",\"workers\":%d,\"iterations\":100}", job, p);
    snprintf(status, sizeof status,
             "{\"state\":\"pending\",\"reason\":\"\",\"epoch\":0,\"iteration\":0,"
             "\"created\":%ld,\"members\":[]}",
             (long)time(NULL));
    wagma_etcd_op_t sub[2] = {
        {.type = WAGMA_ETCD_OP_PUT, .key = spec_key, .value = spec, .value_len = strlen(spec)},
        {.type = WAGMA_ETCD_OP_PUT,
         .key = status_key,
         .value = status,
         .value_len = strlen(status)}};
    double t0 = now();
    if (wagma_etcd_txn(etcd, NULL, 0, sub, 2, NULL, 0, NULL))
      return 1;
    double first = wait_epoch(etcd, plan_key, 1, t0);
    snprintf(key, sizeof key, "/wagma/agents/%s-a%05d", job, p / 2);
    t0 = now();
    wagma_etcd_delete(etcd, key, 0, NULL, NULL);
    double lost = wait_epoch(etcd, plan_key, 2, t0);
    printf("| %d | %.3f | %.3f | %.2f | %.0fx |\n", p, first, lost, base * 1e3, lost / base);
    fflush(stdout);
    /* Stop the job so its agents do not count for the next size. */
    snprintf(val, sizeof val, "{\"state\":\"stopped\",\"reason\":\"bench\",\"members\":[]}");
    wagma_etcd_put(etcd, status_key, val, strlen(val), 0, NULL);
    wagma_etcd_lease_revoke(etcd, lease);
  }
  wagma_etcd_close(etcd);
  return 0;
}
