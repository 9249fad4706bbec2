/* bench_etcd — libwagma_etcd throughput and watch latency against a private etcd, compared
 * with `etcdctl check perf` run against the same etcd in the same run.
 *
 * 1. puts/s: T threads (1, 8, and 64 = closer to etcdctl's 500 clients) share one handle and put
 * 256-byte values for D seconds.
 * 2. watch latency: one prefix watch; T writer threads put values that carry the send time;
 *    the watch callback records now - send time (put to callback), p50/p99/max.
 * 3. baseline: `etcdctl check perf --load=<L>` (Go client, etcd's own check) on the same
 *    etcd; its "Throughput is N writes/s" is parsed and the ratio printed.
 *
 * Environment: WAGMA_BENCH_SECONDS (default 5), WAGMA_BENCH_PERF_LOAD (s|m|l|xl, default l).
 * Not a test: run by bench/etcd/run.sh. */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "etcd_fixture.h"
#include "wagma/etcd.h"

#define KEY_SIZE 256 /* as etcdctl check perf: 256-byte keys, 1024-byte values */
#define VALUE_SIZE 1024
#define MAX_THREADS 64
#define MAX_SAMPLES 200000

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

struct put_worker {
  wagma_etcd_t *etcd;
  int id;
  int64_t until_ns;
  int64_t puts;
  int errors;
  int watch_mode; /* value carries the send time */
};

static void *put_main(void *arg) {
  struct put_worker *w = arg;
  char key[KEY_SIZE + 1], value[VALUE_SIZE];
  memset(value, 'v', sizeof value);
  while (now_ns() < w->until_ns) {
    if (w->watch_mode) {
      snprintf(key, sizeof key, "/bench/watch/%d/%" PRId64, w->id, w->puts % 1000);
      snprintf(value, sizeof value, "%" PRId64, now_ns());
    } else {
      /* a new 256-byte key per put, like check perf's random keys */
      int n = snprintf(key, sizeof key, "/bench/put/%d/%" PRId64 "/", w->id, w->puts);
      memset(key + n, 'k', KEY_SIZE - (size_t)n);
      key[KEY_SIZE] = '\0';
    }
    if (wagma_etcd_put(w->etcd, key, value, w->watch_mode ? strlen(value) : sizeof value, 0,
                       NULL) != 0)
      w->errors++;
    else
      w->puts++;
  }
  return NULL;
}

static double run_puts(wagma_etcd_t *etcd, int threads, double seconds, int watch_mode,
                       int *errors) {
  struct put_worker workers[MAX_THREADS];
  pthread_t tids[MAX_THREADS];
  int64_t start = now_ns(), total = 0;
  *errors = 0;
  for (int i = 0; i < threads; i++) {
    workers[i] = (struct put_worker){.etcd = etcd,
                                     .id = i,
                                     .until_ns = start + (int64_t)(seconds * 1e9),
                                     .watch_mode = watch_mode};
    pthread_create(&tids[i], NULL, put_main, &workers[i]);
  }
  for (int i = 0; i < threads; i++) {
    pthread_join(tids[i], NULL);
    total += workers[i].puts;
    *errors += workers[i].errors;
  }
  return (double)total / ((double)(now_ns() - start) / 1e9);
}

struct latencies {
  pthread_mutex_t lock;
  int64_t samples[MAX_SAMPLES];
  size_t n;
};

static void watch_fn(void *user, int status, const wagma_etcd_event_t *events, size_t n,
                     int64_t revision) {
  struct latencies *l = user;
  int64_t now = now_ns();
  (void)revision;
  if (status != 0)
    return;
  pthread_mutex_lock(&l->lock);
  for (size_t i = 0; i < n && l->n < MAX_SAMPLES; i++)
    if (events[i].type == WAGMA_ETCD_EVENT_PUT)
      l->samples[l->n++] = now - strtoll(events[i].kv.value, NULL, 10);
  pthread_mutex_unlock(&l->lock);
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

static double etcdctl_perf(const char *endpoints, const char *load) {
  char command[512], line[512];
  double writes = -1;
  FILE *pipe;
  snprintf(command, sizeof command,
           "ETCDCTL_API=3 etcdctl --endpoints=%s check perf --load=%s 2>&1", endpoints, load);
  pipe = popen(command, "r");
  if (pipe == NULL)
    return -1;
  while (fgets(line, sizeof line, pipe) != NULL) {
    /* "PASS: Throughput is 151 writes/s" or "FAIL: Throughput too low: 2543 writes/s" */
    char *unit = strstr(line, " writes/s");
    if (strstr(line, "PASS") != NULL || strstr(line, "FAIL") != NULL)
      printf("  etcdctl: %s", line);
    if (unit != NULL) {
      char *number = unit;
      while (number > line && number[-1] >= '0' && number[-1] <= '9')
        number--;
      writes = atof(number);
    }
  }
  pclose(pipe);
  return writes;
}

int main(void) {
  const char *env_seconds = getenv("WAGMA_BENCH_SECONDS");
  const char *load = getenv("WAGMA_BENCH_PERF_LOAD");
  double seconds = env_seconds != NULL ? atof(env_seconds) : 5.0;
  const int thread_counts[] = {1, 8, 64};
  double best_puts = 0;
  etcd_fixture_t *fixture = NULL;
  wagma_etcd_t *etcd = NULL;
  wagma_etcd_options_t options = {0};
  struct latencies *lat = calloc(1, sizeof *lat);
  int rc = 1;

  if (load == NULL || load[0] == '\0')
    load = "l";
  if (seconds <= 0)
    seconds = 5.0;
  pthread_mutex_init(&lat->lock, NULL);
  if (etcd_fixture_start(1, &fixture) != 0) {
    fprintf(stderr, "bench_etcd: cannot start etcd\n");
    goto out;
  }
  options.endpoints = etcd_fixture_endpoints(fixture);
  if (wagma_etcd_open(&options, &etcd) != 0)
    goto out;
  printf("etcd client benchmark: private etcd %s, puts of %d-byte keys + %d-byte values, "
         "%.0f s per run\n",
         options.endpoints, KEY_SIZE, VALUE_SIZE, seconds);
  printf("%-34s %8s %12s %10s %10s %10s\n", "run", "threads", "puts/s", "p50 ms", "p99 ms",
         "max ms");

  for (size_t t = 0; t < sizeof thread_counts / sizeof thread_counts[0]; t++) {
    int errors = 0;
    double rate = run_puts(etcd, thread_counts[t], seconds, 0, &errors);
    if (rate > best_puts)
      best_puts = rate;
    printf("%-34s %8d %12.0f %10s %10s %10s%s\n", "wagma_etcd_put", thread_counts[t], rate, "-",
           "-", "-", errors ? " (errors)" : "");
    fflush(stdout);
  }
  for (size_t t = 0; t < sizeof thread_counts / sizeof thread_counts[0]; t++) {
    wagma_etcd_watch_t *watch = NULL;
    wagma_etcd_watch_options_t wopts = {.prefix = 1};
    int errors = 0;
    double rate;
    lat->n = 0;
    if (wagma_etcd_watch_start(etcd, "/bench/watch/", &wopts, watch_fn, lat, &watch) != 0) {
      fprintf(stderr, "bench_etcd: watch: %s\n", wagma_etcd_errmsg(etcd));
      goto out;
    }
    rate = run_puts(etcd, thread_counts[t], seconds, 1, &errors);
    {
      int64_t wait_until = now_ns() + 2000000000LL;
      while (now_ns() < wait_until) {
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
      }
    }
    wagma_etcd_watch_stop(watch);
    qsort(lat->samples, lat->n, sizeof lat->samples[0], cmp_i64);
    if (lat->n > 0)
      printf("%-34s %8d %12.0f %10.2f %10.2f %10.2f  (%zu events)%s\n", "put -> watch callback",
             thread_counts[t], rate, lat->samples[lat->n / 2] / 1e6,
             lat->samples[lat->n * 99 / 100] / 1e6, lat->samples[lat->n - 1] / 1e6, lat->n,
             errors ? " (errors)" : "");
    fflush(stdout);
  }

  printf("baseline: etcdctl check perf --load=%s (Go clientv3, etcd's own check, 60 s) ...\n",
         load);
  fflush(stdout);
  {
    double baseline = etcdctl_perf(options.endpoints, load);
    if (baseline > 0) {
      printf("%-34s %8s %12.0f\n", "etcdctl check perf", "(load)", baseline);
      printf("ratio wagma_etcd_put (best of 1/8/64 threads) / etcdctl check perf = %.2f\n",
             best_puts / baseline);
    } else {
      printf("etcdctl check perf gave no throughput figure\n");
    }
  }
  rc = 0;
out:
  wagma_etcd_close(etcd);
  etcd_fixture_stop(fixture);
  pthread_mutex_destroy(&lat->lock);
  free(lat);
  return rc;
}
