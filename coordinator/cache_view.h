/* coordinator/cache_view.h — the read cache's insides, private to cache.c and cache_serve.c:
 * the view.
 *
 * The view is what etcd holds under <prefix>/jobs/, agents/, assignments/ and quarantine/ at
 * one revision (`applied`), as copies of the key-values, plus what is derived from them for
 * the readers: each job's REST bodies (rendered after every change), its decoded plan, its
 * timeline and its progress series. Keys elsewhere under the prefix (the leader key, the
 * data-plane secrets) are counted, never kept. One rwlock guards the view: the watch thread
 * and a reload write, readers (libmicrohttpd's threads, the workers) read. */
#ifndef WAGMA_COORD_CACHE_VIEW_H
#define WAGMA_COORD_CACHE_VIEW_H

#include <pthread.h>
#include <stdatomic.h>

#include "cache.h"
#include "coord.h"
#include "wagma/collective.h"

#define WG_CACHE_TIMELINE_MAX 256         /* timeline entries kept per job (the oldest go first) */
#define WG_CACHE_TIMELINE_BYTES (1 << 20) /* and at most this many bytes of them per job */
#define WG_CACHE_SERIES_MAX 1024 /* progress points kept per job (thinned by half when full) */
#define WG_CACHE_SERIES_AGENTS 256
#define WG_CACHE_NOTIFY_MAX 4            /* fronts (REST servers) that park reads */
#define WG_CACHE_HISTORY_EVENTS 4096     /* events kept for streams that resume */
#define WG_CACHE_HISTORY_BYTES (4 << 20) /* and at most this many bytes of them */

/* One published event, kept for a stream that resumes (Last-Event-ID). */
typedef struct hist_event {
  uint64_t seq;
  char job[WAGMA_API_NAME_MAX];
  int all_too; /* every-job streams get it too */
  char *bytes; /* the whole event as sent */
  size_t n;
} hist_event_t;

typedef struct kvarr {
  wagma_etcd_kv_t *kv; /* in key order; keys and values owned */
  size_t n, cap;
} kvarr_t;

typedef struct series_point {
  uint64_t iteration;
  float accuracy, loss; /* NaN = none */
  uint32_t agent;       /* index into cjob.agents */
} series_point_t;

typedef struct cjob {
  char id[WAGMA_API_NAME_MAX];
  kvarr_t kvs;  /* every key under <prefix>/jobs/<id>/, in key order */
  int dirty;    /* bodies to render again */
  int announce; /* spec, status or plan changed in this batch: a "job" event */
  int has_spec;
  wagma_job_state_t state;
  uint64_t iteration; /* as REST shows it (wg_job_record_iteration) */
  char *full;         /* GET /v1/jobs/{id}; NULL without a spec */
  size_t full_len;
  char *summary; /* its entry in GET /v1/jobs */
  size_t summary_len;
  int has_plan;
  wagma_plan_t plan;     /* the current plan, decoded */
  json_t *timeline;      /* array of entries (docs/api.md "Events") */
  size_t timeline_bytes; /* their JSON's bytes (tl_add, tl_recount) */
  series_point_t *points;
  size_t npoints, cappoints;
  char (*agents)[WAGMA_API_NAME_MAX];
  uint64_t *agent_last; /* the iteration of each agent's last point */
  uint32_t nagents;
  /* Answers the readers rendered and keep for the next reads (cache_serve.c), under memo_mu
   * (readers hold only the view's read lock): the groups of one round of the current plan
   * (the plan key's mod revision, the round) and the timeline at one view revision. */
  pthread_mutex_t memo_mu;
  char *groups_body;
  size_t groups_len;
  int64_t groups_rev;
  uint64_t groups_t;
  char *events_body;
  size_t events_len;
  int64_t events_rev;
} cjob_t;

struct wg_cache {
  wg_coord_t *c;
  pthread_rwlock_t rw;
  /* the view (rw) */
  int valid;       /* installed and its watch running: reads may be served */
  int64_t applied; /* every change up to this revision is in the view */
  int64_t count;   /* keys under <prefix>/ at applied (all kinds), for the sync check */
  cjob_t **jobs;   /* sorted by wg_job_key_cmp */
  size_t njobs, capjobs;
  kvarr_t agents, assigns, quars;
  /* The events published since the view was loaded (a ring, oldest at hist_head), for streams
   * that resume: ids are "<revision>.<seq>.<view_tag>"; events with seq <= hist_floor are not
   * kept. A load starts a new view_tag (ids of an earlier view or another replica get a
   * snapshot). Under the view's lock. */
  hist_event_t *hist;
  size_t hist_head, hist_n, hist_bytes;
  uint64_t seq, hist_floor;
  char view_tag[24];
  /* sync state (mu) */
  pthread_mutex_t mu;
  pthread_cond_t cv; /* CLOCK_MONOTONIC: a sync, a request for one, stop */
  double verified;   /* start (mono) of the latest sync that verified the view; 0 = none */
  int64_t pending_rev;
  double pending_t0; /* a sync waits for applied >= pending_rev to verify at pending_t0 */
  int want, stop, reload;
  int outside_writes;      /* the last sync found etcd's revision moved outside the prefix */
  int64_t seen_applied;    /* applied, as the watch thread last reported it */
  unsigned failures;       /* syncs that failed (etcd), to wake waiters */
  atomic_llong last_write; /* the highest revision this coordinator wrote */
  /* eventfds written when a sync or a watch batch may let parked reads go (the fronts'), once
   * per wg_cache_ready that asked; under mu */
  int notify_fd[WG_CACHE_NOTIFY_MAX];
  int nnotify;
  int notify_wanted;
  wagma_etcd_watch_t *watch;
  pthread_t thread;
  int thread_up;
};

/* The job id's entry, NULL when none. Under the view's lock. */
cjob_t *wg_cache_job(wg_cache_t *cache, const char *id);
/* The kv of key in a (NULL when absent). */
const wagma_etcd_kv_t *wg_kvarr_find(const kvarr_t *a, const char *key, size_t len);
/* The range of a's keys that start with prefix: [*lo, *hi). */
void wg_kvarr_prefix(const kvarr_t *a, const char *prefix, size_t *lo, size_t *hi);
/* The snapshot event of a job (its full body, timeline, series) or of every job. Ownership:
 * the caller frees. Under the view's lock. */
char *wg_cache_job_snapshot(wg_cache_t *cache, const cjob_t *j, size_t *len);
char *wg_cache_all_snapshot(wg_cache_t *cache, size_t *len);

/* The id of an event at revision rev, the last published one's sequence number and the view's
 * tag: "<rev>.<seq>.<tag>". Under the view's lock. */
void wg_cache_event_id(const wg_cache_t *cache, int64_t rev, char *buf, size_t len);

#endif
