/* watch.c — watches of a key or prefix, delivered in order to a callback, that survive
 * connection loss and etcd restarts; also the engine behind election observe.
 *
 * Owns: one thread per watch, one Watch stream at a time (one watcher per stream).
 * Thread: opens a stream on an endpoint, sends the create request from next_rev, delivers
 * events; when the stream breaks it backs off (100 ms doubling to 2 s), moves to the next
 * endpoint and resumes from next_rev. stop() sets `stopping` and cancels the stream in
 * flight (etcd never ends a watch stream on its own).
 * Invariants: next_rev = last delivered revision + 1 (or the revision after the created
 * answer when the caller gave no start revision), so nothing is delivered twice or lost;
 * callbacks run only on the watch thread, never after stop() returns. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "etcd_internal.h"

#define WATCH_METHOD "/etcdserverpb.Watch/Watch"
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 2000

enum watch_state { STARTING = 0, CREATED = 1 };

struct wagma_etcd_watch {
  wagma_etcd_t *etcd;
  char *key;
  uint8_t *end; /* prefix range end, or NULL */
  size_t end_len;
  int prev_kv;
  wagma_etcd_watch_fn fn;
  void *user;
  /* observe mode (election): fn is NULL and leader_fn set */
  wagma_etcd_leader_fn leader_fn;
  char *election;
  int leader_known;       /* leader_fn called at least once */
  char *leader_key;       /* last reported leader key (NULL = none) */
  int64_t leader_mod_rev; /* and its mod revision */

  int64_t next_rev; /* watch thread only */
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t cond; /* CLOCK_MONOTONIC; state changes and stop */
  int stopping;        /* guarded by lock */
  enum watch_state state;
  char start_error[WG_ETCD_ERRMSG_MAX];
  wg_etcd_cancel_t cancel;
};

static int is_stopping(wagma_etcd_watch_t *w) {
  int stopping;
  pthread_mutex_lock(&w->lock);
  stopping = w->stopping;
  pthread_mutex_unlock(&w->lock);
  return stopping;
}

static void abs_time(struct timespec *ts, int64_t ms) {
  clock_gettime(CLOCK_MONOTONIC, ts);
  ts->tv_sec += ms / 1000;
  ts->tv_nsec += (ms % 1000) * 1000000;
  if (ts->tv_nsec >= 1000000000) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000;
  }
}

/* Sleeps ms or until stop; returns nonzero when stopping. */
static int backoff_or_stop(wagma_etcd_watch_t *w, int64_t ms) {
  struct timespec until;
  int stopping;
  abs_time(&until, ms);
  pthread_mutex_lock(&w->lock);
  while (!w->stopping && pthread_cond_timedwait(&w->cond, &w->lock, &until) != ETIMEDOUT) {
  }
  stopping = w->stopping;
  pthread_mutex_unlock(&w->lock);
  return stopping;
}

static void set_state(wagma_etcd_watch_t *w, enum watch_state state) {
  pthread_mutex_lock(&w->lock);
  if (w->state == STARTING) {
    w->state = state;
    pthread_cond_broadcast(&w->cond);
  }
  pthread_mutex_unlock(&w->lock);
}

/* ---- observe (election) ------------------------------------------------------------- */

/* Asks etcd who leads and calls leader_fn when that changed. Failures are retried at the
 * next event or reconnection. */
static void observe_check(wagma_etcd_watch_t *w) {
  wagma_etcd_kv_t *leader = NULL;
  int rc = wagma_etcd_election_leader(w->etcd, w->election, &leader);
  int changed;
  if (rc != 0 && rc != WAGMA_ENOTFOUND)
    return;
  if (leader == NULL)
    changed = !w->leader_known || w->leader_key != NULL;
  else
    changed = !w->leader_known || w->leader_key == NULL ||
              strcmp(w->leader_key, leader->key) != 0 || w->leader_mod_rev != leader->mod_revision;
  if (changed) {
    free(w->leader_key);
    w->leader_key = leader == NULL ? NULL : strdup(leader->key);
    w->leader_mod_rev = leader == NULL ? 0 : leader->mod_revision;
    w->leader_known = 1;
    w->leader_fn(w->user, leader);
  }
  wagma_etcd_kv_free(leader);
}

/* ---- event delivery ----------------------------------------------------------------- */

static void free_events(wagma_etcd_event_t *events, wagma_etcd_kv_t *prevs, size_t n) {
  for (size_t i = 0; i < n; i++) {
    wg_etcd_kv_clear(&events[i].kv);
    wg_etcd_kv_clear(&prevs[i]);
  }
  free(events);
  free(prevs);
}

/* Delivers the events of one answer that are at or after next_rev, then advances it.
 * Returns WAGMA_ENOMEM when the copy failed (the stream is then restarted from next_rev). */
static int deliver(wagma_etcd_watch_t *w, const Etcdserverpb__WatchResponse *response) {
  wagma_etcd_event_t *events = calloc(response->n_events, sizeof *events);
  wagma_etcd_kv_t *prevs = calloc(response->n_events, sizeof *prevs);
  size_t n = 0;
  int64_t last = 0;
  if (events == NULL || prevs == NULL) {
    free(events);
    free(prevs);
    return WAGMA_ENOMEM;
  }
  for (size_t i = 0; i < response->n_events; i++) {
    const Etcdserverpb__Event *e = response->events[i];
    if (e->kv == NULL || e->kv->mod_revision < w->next_rev)
      continue; /* already delivered before a reconnection */
    events[n].type = e->type == ETCDSERVERPB__EVENT__EVENT_TYPE__DELETE ? WAGMA_ETCD_EVENT_DELETE
                                                                        : WAGMA_ETCD_EVENT_PUT;
    if (wg_etcd_kv_copy(&events[n].kv, e->kv) != 0) {
      free_events(events, prevs, n);
      return WAGMA_ENOMEM;
    }
    if (e->prev_kv != NULL) {
      if (wg_etcd_kv_copy(&prevs[n], e->prev_kv) != 0) {
        wg_etcd_kv_clear(&events[n].kv);
        free_events(events, prevs, n);
        return WAGMA_ENOMEM;
      }
      events[n].prev_kv = &prevs[n];
    }
    last = e->kv->mod_revision;
    n++;
  }
  if (n > 0) {
    if (w->fn != NULL)
      w->fn(w->user, 0, events, n, last);
    w->next_rev = last + 1;
  }
  free_events(events, prevs, n);
  if (n > 0 && w->leader_fn != NULL)
    observe_check(w);
  return 0;
}

/* ---- the thread --------------------------------------------------------------------- */

/* Runs one stream until it breaks. Returns 0 when it broke (retry), WAGMA_ECOMPACTED when
 * etcd compacted next_rev (*compact_rev set). */
static int run_stream(wagma_etcd_watch_t *w, size_t endpoint, int64_t *compact_rev, int *created) {
  Etcdserverpb__WatchRequest request = ETCDSERVERPB__WATCH_REQUEST__INIT;
  Etcdserverpb__WatchCreateRequest create = ETCDSERVERPB__WATCH_CREATE_REQUEST__INIT;
  wg_etcd_stream_t stream;
  int rc, result = 0;

  *created = 0;
  create.key.data = (uint8_t *)w->key;
  create.key.len = strlen(w->key);
  if (w->end != NULL) {
    create.range_end.data = w->end;
    create.range_end.len = w->end_len;
  }
  create.start_revision = w->next_rev;
  create.prev_kv = w->prev_kv != 0;
  create.progress_notify = 1;
  request.request_union_case = ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_CREATE_REQUEST;
  request.create_request = &create;

  rc = wg_etcd_stream_open(&stream, w->etcd, endpoint, WATCH_METHOD, &request.base, &w->cancel);
  while (rc == 0) {
    Etcdserverpb__WatchResponse *response = NULL;
    rc = wg_etcd_stream_recv(&stream, &etcdserverpb__watch_response__descriptor,
                             (ProtobufCMessage **)&response, -1);
    if (rc != 0)
      break;
    if (response->created) {
      *created = 1;
      if (w->next_rev == 0 && response->header != NULL)
        w->next_rev = response->header->revision + 1;
      wg_etcd_set_preferred(w->etcd, endpoint);
      set_state(w, CREATED);
      if (w->leader_fn != NULL)
        observe_check(w);
    }
    if (response->compact_revision > 0) {
      *compact_rev = response->compact_revision;
      result = WAGMA_ECOMPACTED;
      rc = WAGMA_ECOMPACTED;
    } else if (response->canceled) {
      wg_etcd_set_error(w->etcd, "etcd %s watch canceled by etcd: %s", w->etcd->endpoints[endpoint],
                        response->cancel_reason != NULL ? response->cancel_reason : "");
      /* etcd checks the stream's token only when a watch is created, and cancels the
       * watch for a stale one ("invalid auth token"; older etcds say "permission denied"):
       * the next stream authenticates again. */
      if (response->cancel_reason != NULL &&
          (wg_etcd_token_rejected(GRPC_STATUS_OK, response->cancel_reason) ||
           strstr(response->cancel_reason, "permission denied") != NULL))
        wg_etcd_token_reject(w->etcd, stream.token_gen);
      rc = WAGMA_EIO;
    } else if (response->n_events > 0) {
      rc = deliver(w, response);
    } else if (!response->created && response->header != NULL &&
               response->header->revision >= w->next_rev) {
      /* Progress notification: every event up to header.revision has been sent, so a
       * quiet watch resumes after it (and not from a revision compaction may remove). */
      w->next_rev = response->header->revision + 1;
    }
    protobuf_c_message_free_unpacked(&response->base, NULL);
  }
  if (wg_etcd_stream_close(&stream, WATCH_METHOD, &w->cancel) == 0 && rc == WAGMA_EUNAVAIL &&
      !is_stopping(w))
    wg_etcd_set_error(w->etcd, "etcd %s watch stream ended", w->etcd->endpoints[endpoint]);
  return result;
}

static void *watch_main(void *arg) {
  wagma_etcd_watch_t *w = arg;
  size_t endpoint = wg_etcd_preferred(w->etcd);
  int64_t backoff = BACKOFF_MIN_MS;

  while (!is_stopping(w)) {
    int64_t compact_rev = 0;
    int created = 0;
    int rc = run_stream(w, endpoint, &compact_rev, &created);
    if (is_stopping(w))
      break;
    if (rc == WAGMA_ECOMPACTED) {
      if (w->leader_fn != NULL) { /* observe: just watch from now on */
        w->next_rev = 0;
        continue;
      }
      set_state(w, CREATED);
      w->fn(w->user, WAGMA_ECOMPACTED, NULL, 0, compact_rev);
      backoff_or_stop(w, INT32_MAX); /* the watch is over: wait for stop */
      break;
    }
    wg_etcd_note_failure(w->etcd);
    pthread_mutex_lock(&w->lock);
    snprintf(w->start_error, sizeof w->start_error, "%s", wagma_etcd_errmsg(w->etcd));
    pthread_mutex_unlock(&w->lock);
    wg_logf(w->etcd->log_fn, w->etcd->log_user, WAGMA_LOG_INFO,
            "etcd watch %s: reconnecting from revision %lld: %s", w->key, (long long)w->next_rev,
            wagma_etcd_errmsg(w->etcd));
    if (created)
      backoff = BACKOFF_MIN_MS;
    endpoint = (endpoint + 1) % w->etcd->n_endpoints;
    if (backoff_or_stop(w, backoff))
      break;
    backoff = backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : backoff * 2;
  }
  return NULL;
}

/* ---- public ------------------------------------------------------------------------- */

static void watch_free(wagma_etcd_watch_t *w) {
  wg_etcd_cancel_destroy(&w->cancel);
  pthread_cond_destroy(&w->cond);
  pthread_mutex_destroy(&w->lock);
  free(w->key);
  free(w->end);
  free(w->election);
  free(w->leader_key);
  free(w);
}

void wagma_etcd_watch_stop(wagma_etcd_watch_t *w) {
  if (w == NULL)
    return;
  pthread_mutex_lock(&w->lock);
  w->stopping = 1;
  pthread_cond_broadcast(&w->cond);
  pthread_mutex_unlock(&w->lock);
  wg_etcd_cancel_fire(&w->cancel);
  pthread_join(w->thread, NULL);
  watch_free(w);
}

int wg_etcd_watch_begin(wagma_etcd_t *etcd, const char *key, int prefix, int64_t start_rev,
                        int prev_kv, wagma_etcd_watch_fn fn, wagma_etcd_leader_fn leader_fn,
                        const char *election, void *user, wagma_etcd_watch_t **out) {
  wagma_etcd_watch_t *w = calloc(1, sizeof *w);
  pthread_condattr_t attr;
  struct timespec until;
  enum watch_state state;
  int rc = 0;

  if (w == NULL)
    return WAGMA_ENOMEM;
  w->etcd = etcd;
  w->fn = fn;
  w->leader_fn = leader_fn;
  w->user = user;
  w->prev_kv = prev_kv;
  w->next_rev = start_rev;
  w->key = strdup(key);
  w->election = election != NULL ? strdup(election) : NULL;
  pthread_mutex_init(&w->lock, NULL);
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&w->cond, &attr);
  pthread_condattr_destroy(&attr);
  wg_etcd_cancel_init(&w->cancel);
  if (w->key == NULL || (election != NULL && w->election == NULL) ||
      (prefix && wg_etcd_prefix_end(key, &w->end, &w->end_len) != 0)) {
    watch_free(w);
    return WAGMA_ENOMEM;
  }
  if (pthread_create(&w->thread, NULL, watch_main, w) != 0) {
    watch_free(w);
    return WAGMA_ENOMEM;
  }
  /* Wait for etcd to confirm the watch, within the handle's deadline. */
  abs_time(&until, etcd->call_timeout_ms);
  pthread_mutex_lock(&w->lock);
  while (w->state == STARTING && pthread_cond_timedwait(&w->cond, &w->lock, &until) != ETIMEDOUT) {
  }
  state = w->state;
  pthread_mutex_unlock(&w->lock);
  if (state != CREATED) {
    char why[WG_ETCD_ERRMSG_MAX];
    pthread_mutex_lock(&w->lock);
    snprintf(why, sizeof why, "%s", w->start_error);
    pthread_mutex_unlock(&w->lock);
    wagma_etcd_watch_stop(w);
    wg_etcd_set_error(etcd, "etcd watch %s: not confirmed within %d ms; last: %s", key,
                      etcd->call_timeout_ms, why[0] != '\0' ? why : "no answer");
    rc = why[0] != '\0' ? WAGMA_EUNAVAIL : WAGMA_ETIMEDOUT;
    w = NULL;
  }
  *out = w;
  return rc;
}

int wagma_etcd_watch_start(wagma_etcd_t *etcd, const char *key,
                           const wagma_etcd_watch_options_t *options, wagma_etcd_watch_fn fn,
                           void *user, wagma_etcd_watch_t **out) {
  wagma_etcd_watch_options_t none = {0};
  if (out != NULL)
    *out = NULL;
  if (etcd == NULL || key == NULL || key[0] == '\0' || fn == NULL || out == NULL)
    return WAGMA_EINVAL;
  if (options == NULL)
    options = &none;
  if (options->start_revision < 0) {
    wg_etcd_set_error(etcd, "etcd watch %s: negative start revision", key);
    return WAGMA_EINVAL;
  }
  return wg_etcd_watch_begin(etcd, key, options->prefix, options->start_revision, options->prev_kv,
                             fn, NULL, NULL, user, out);
}
