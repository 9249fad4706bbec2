/* recorder.h — collects watch events / leader changes from library threads for the etcd
 * integration tests, and lets the test thread wait for them with a deadline. */
#ifndef WAGMA_TEST_ETCD_RECORDER_H
#define WAGMA_TEST_ETCD_RECORDER_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "wagma/etcd.h"

#define RECORDER_MAX 4096

typedef struct recorded_event {
  int type;
  char key[96];
  char value[96];
  char prev_value[96];
  int has_prev;
  int64_t mod_revision;
} recorded_event_t;

typedef struct recorder {
  pthread_mutex_t lock;
  pthread_cond_t changed;
  recorded_event_t events[RECORDER_MAX];
  size_t n;
  size_t callbacks;
  int bad_order; /* a callback's revision was not after the previous one */
  int compacted; /* ECOMPACTED seen */
  int64_t compact_revision;
  int leader_changes;    /* observe */
  char leader_value[96]; /* "" = no leader */
} recorder_t;

static inline void recorder_init(recorder_t *r) {
  memset(r, 0, sizeof *r);
  pthread_mutex_init(&r->lock, NULL);
  pthread_cond_init(&r->changed, NULL);
}

static inline void recorder_destroy(recorder_t *r) {
  pthread_cond_destroy(&r->changed);
  pthread_mutex_destroy(&r->lock);
}

static inline void recorder_watch_fn(void *user, int status, const wagma_etcd_event_t *events,
                                     size_t n, int64_t revision) {
  recorder_t *r = user;
  pthread_mutex_lock(&r->lock);
  r->callbacks++;
  if (status == WAGMA_ECOMPACTED) {
    r->compacted++;
    r->compact_revision = revision;
  }
  for (size_t i = 0; i < n && r->n < RECORDER_MAX; i++) {
    recorded_event_t *e = &r->events[r->n];
    if (r->n > 0 && events[i].kv.mod_revision < r->events[r->n - 1].mod_revision)
      r->bad_order = 1;
    e->type = (int)events[i].type;
    snprintf(e->key, sizeof e->key, "%s", events[i].kv.key);
    snprintf(e->value, sizeof e->value, "%s", events[i].kv.value);
    e->has_prev = events[i].prev_kv != NULL;
    if (e->has_prev)
      snprintf(e->prev_value, sizeof e->prev_value, "%s", events[i].prev_kv->value);
    e->mod_revision = events[i].kv.mod_revision;
    r->n++;
  }
  if (n > 0 && revision != events[n - 1].kv.mod_revision)
    r->bad_order = 1;
  pthread_cond_broadcast(&r->changed);
  pthread_mutex_unlock(&r->lock);
}

static inline void recorder_leader_fn(void *user, const wagma_etcd_kv_t *leader) {
  recorder_t *r = user;
  pthread_mutex_lock(&r->lock);
  r->leader_changes++;
  snprintf(r->leader_value, sizeof r->leader_value, "%s", leader != NULL ? leader->value : "");
  pthread_cond_broadcast(&r->changed);
  pthread_mutex_unlock(&r->lock);
}

/* The absolute CLOCK_REALTIME time timeout_ms from now (the condvar's default clock). */
static inline void recorder_deadline(int timeout_ms, struct timespec *until) {
  clock_gettime(CLOCK_REALTIME, until);
  until->tv_sec += timeout_ms / 1000;
  until->tv_nsec += (timeout_ms % 1000) * 1000000L;
  if (until->tv_nsec >= 1000000000L) {
    until->tv_sec++;
    until->tv_nsec -= 1000000000L;
  }
}

/* Waits until at least n events were recorded; returns the count seen. */
static inline size_t recorder_wait_events(recorder_t *r, size_t n, int timeout_ms) {
  struct timespec until;
  size_t have;
  recorder_deadline(timeout_ms, &until);
  pthread_mutex_lock(&r->lock);
  while (r->n < n && pthread_cond_timedwait(&r->changed, &r->lock, &until) == 0) {
  }
  have = r->n;
  pthread_mutex_unlock(&r->lock);
  return have;
}

/* Waits until the observed leader value equals value ("" = none); returns 1 on success. */
static inline int recorder_wait_leader(recorder_t *r, const char *value, int timeout_ms) {
  struct timespec until;
  int ok;
  recorder_deadline(timeout_ms, &until);
  pthread_mutex_lock(&r->lock);
  while (!(r->leader_changes > 0 && strcmp(r->leader_value, value) == 0) &&
         pthread_cond_timedwait(&r->changed, &r->lock, &until) == 0) {
  }
  ok = r->leader_changes > 0 && strcmp(r->leader_value, value) == 0;
  pthread_mutex_unlock(&r->lock);
  return ok;
}

static inline int recorder_wait_compacted(recorder_t *r, int timeout_ms) {
  struct timespec until;
  int compacted;
  recorder_deadline(timeout_ms, &until);
  pthread_mutex_lock(&r->lock);
  while (!r->compacted && pthread_cond_timedwait(&r->changed, &r->lock, &until) == 0) {
  }
  compacted = r->compacted;
  pthread_mutex_unlock(&r->lock);
  return compacted;
}

static inline int64_t test_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline void test_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

#endif
