/* coordinator/cache.c — the read cache: an in-memory view of the jobs, plans (and their
 * history), progress, agents, assignments and quarantine records, fed by ONE etcd watch on
 * <prefix>/, as the Kubernetes API server's watch cache is (docs/design.md §10.2).
 *
 * Threads:
 *   - the watch thread (libwagma_etcd's, on_watch) applies each batch of events to the view
 *     under the write lock, renders the REST bodies of the jobs it changed, derives the
 *     timeline entries and publishes the events to the hub (hub.c) before releasing the lock;
 *   - the sync thread (sync_main) loads the view (one Range of <prefix>/, at start, after a
 *     compaction or when a check finds it wrong), starts the watch from the revision after,
 *     and runs the SYNCS that tell how current the view is;
 *   - readers (cache_serve.c) take the read lock: libmicrohttpd's threads, the workers and the
 *     connection front (front.c), which parks its reads without blocking: wg_cache_ready
 *     asks for a sync and the cache writes the front's eventfd once one completes.
 *
 * A sync, started at mono time t0: one linearizable count-only Range of a single key
 * (wagma_etcd_ping) tells etcd's current revision R, which is at least that of every write
 * committed before t0. Once the watch has delivered R, the view holds every change committed
 * before t0 — VERIFIED at t0. etcd's revision also moves with writes outside the prefix, which
 * the watch never delivers: when the watch has not reached R within SYNC_WATCH_WAIT_S (or the
 * last sync found such writes), the FULL CHECK runs: with the view at revision A holding C
 * keys under the prefix, one Range of <prefix>/ asks for the keys modified after A (keys only,
 * min_mod_revision A + 1, limit 1) and counts all keys. None modified and C keys: the tree at
 * its revision is the view's, verified at t0; else verified once the watch delivered that
 * Range's revision. (etcd reads every key of the prefix for the full check, so the one-key
 * Range comes first: it costs the same whatever the size of the tree.) So a read that arrived
 * at time a and is served after a sync verified at t0 >= a sees every write committed before
 * it arrived: consistent (linearizable) reads from memory, one etcd round trip shared by every
 * read that waits for the same sync. With --read-staleness-ms S > 0 a read is served at once when
 * the view was verified within S (bounded staleness), and after a write through this coordinator
 * only once the view has that write's revision (read your writes). While the view is not valid
 * (loading, watch lost) or a sync fails (etcd away), reads go to etcd (http.c).
 *
 * Keys outside jobs/, agents/, assignments/ and quarantine/ (the leader key, the data-plane
 * secrets under secrets/) are only counted: their values are never copied; the load's copy of
 * a secret is wiped before it is freed.
 *
 * Timelines: each job's entries (submitted, state changes, epochs with who joined and left and
 * why, scaling, deletion) are derived from the order of the watch's events: a member that left
 * is explained by what the view held just before the plan that dropped it (its registration
 * gone, registered again elsewhere, its progress "unavailable" or "failed", a lower workers).
 * What happened before this coordinator's watch started is rebuilt from the plan history and
 * the status, without reasons. Every replica derives the same entries with the same ids
 * ("<revision>.<kind>") from the same etcd history. */
#define _DEFAULT_SOURCE /* explicit_bzero */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "store.h"
#include "sse.h"
#include "pages.h"
#include "metrics.h"
#include "cache_view.h"
#include "wagma/log_internal.h"

#define SYNC_IDLE_S 1.0 /* syncs without waiting reads (--read-staleness-ms 0) */
#define RELOAD_BACKOFF_S 0.5
#define SYNC_WATCH_WAIT_S 0.005 /* a sync waits this long for the watch before its full check */

/* ---- key-value arrays ----------------------------------------------------------------------- */

static int key_cmp(const char *a, size_t al, const char *b, size_t bl) {
  int d = memcmp(a, b, al < bl ? al : bl);
  return d ? d : (al < bl ? -1 : al > bl);
}

static size_t kvarr_lower(const kvarr_t *a, const char *key, size_t len) {
  size_t lo = 0, hi = a->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (key_cmp(a->kv[mid].key, a->kv[mid].key_len, key, len) < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

const wagma_etcd_kv_t *wg_kvarr_find(const kvarr_t *a, const char *key, size_t len) {
  size_t i = kvarr_lower(a, key, len);
  return i < a->n && key_cmp(a->kv[i].key, a->kv[i].key_len, key, len) == 0 ? &a->kv[i] : NULL;
}

void wg_kvarr_prefix(const kvarr_t *a, const char *prefix, size_t *lo, size_t *hi) {
  size_t pl = strlen(prefix);
  *lo = kvarr_lower(a, prefix, pl);
  size_t i = *lo;
  while (i < a->n && a->kv[i].key_len >= pl && memcmp(a->kv[i].key, prefix, pl) == 0)
    i++;
  *hi = i;
}

static void kv_clear(wagma_etcd_kv_t *kv) {
  free(kv->key);
  free(kv->value);
  memset(kv, 0, sizeof *kv);
}

static void kvarr_free(kvarr_t *a) {
  for (size_t i = 0; i < a->n; i++)
    kv_clear(&a->kv[i]);
  free(a->kv);
  memset(a, 0, sizeof *a);
}

static int kv_copy(wagma_etcd_kv_t *dst, const wagma_etcd_kv_t *src) {
  *dst = *src;
  dst->key = malloc(src->key_len + 1);
  dst->value = malloc(src->value_len + 1);
  if (!dst->key || !dst->value) {
    free(dst->key);
    free(dst->value);
    memset(dst, 0, sizeof *dst);
    return WAGMA_ENOMEM;
  }
  memcpy(dst->key, src->key, src->key_len);
  dst->key[src->key_len] = '\0';
  if (src->value_len)
    memcpy(dst->value, src->value, src->value_len);
  dst->value[src->value_len] = '\0';
  return 0;
}

/* Puts (copy) or deletes kv. */
static int kvarr_apply(kvarr_t *a, const wagma_etcd_kv_t *kv, int del) {
  size_t i = kvarr_lower(a, kv->key, kv->key_len);
  int found = i < a->n && key_cmp(a->kv[i].key, a->kv[i].key_len, kv->key, kv->key_len) == 0;
  if (del) {
    if (found) {
      kv_clear(&a->kv[i]);
      memmove(&a->kv[i], &a->kv[i + 1], (a->n - i - 1) * sizeof *a->kv);
      a->n--;
    }
    return 0;
  }
  wagma_etcd_kv_t copy;
  if (kv_copy(&copy, kv))
    return WAGMA_ENOMEM;
  if (found) {
    kv_clear(&a->kv[i]);
    a->kv[i] = copy;
    return 0;
  }
  if (a->n == a->cap) {
    size_t cap = a->cap ? 2 * a->cap : 8;
    wagma_etcd_kv_t *nk = realloc(a->kv, cap * sizeof *nk);
    if (!nk) {
      kv_clear(&copy);
      return WAGMA_ENOMEM;
    }
    a->kv = nk;
    a->cap = cap;
  }
  memmove(&a->kv[i + 1], &a->kv[i], (a->n - i) * sizeof *a->kv);
  a->kv[i] = copy;
  a->n++;
  return 0;
}

/* ---- jobs ------------------------------------------------------------------------------------ */

static void cjob_free(cjob_t *j) {
  if (!j)
    return;
  kvarr_free(&j->kvs);
  free(j->full);
  free(j->summary);
  wagma_plan_free(&j->plan);
  json_decref(j->timeline);
  free(j->points);
  free(j->agents);
  free(j->agent_last);
  free(j->groups_body);
  free(j->events_body);
  pthread_mutex_destroy(&j->memo_mu);
  free(j);
}

static size_t job_lower(const wg_cache_t *c, const char *id) {
  size_t lo = 0, hi = c->njobs;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (wg_job_key_cmp(c->jobs[mid]->id, id) < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

cjob_t *wg_cache_job(wg_cache_t *c, const char *id) {
  size_t i = job_lower(c, id);
  return i < c->njobs && strcmp(c->jobs[i]->id, id) == 0 ? c->jobs[i] : NULL;
}

static cjob_t *job_get_or_add(wg_cache_t *c, const char *id) {
  size_t i = job_lower(c, id);
  if (i < c->njobs && strcmp(c->jobs[i]->id, id) == 0)
    return c->jobs[i];
  if (c->njobs == c->capjobs) {
    size_t cap = c->capjobs ? 2 * c->capjobs : 16;
    cjob_t **nj = realloc(c->jobs, cap * sizeof *nj);
    if (!nj)
      return NULL;
    c->jobs = nj;
    c->capjobs = cap;
  }
  cjob_t *j = calloc(1, sizeof *j);
  if (!j || !(j->timeline = json_array())) {
    free(j);
    return NULL;
  }
  snprintf(j->id, sizeof j->id, "%s", id);
  pthread_mutex_init(&j->memo_mu, NULL);
  memmove(&c->jobs[i + 1], &c->jobs[i], (c->njobs - i) * sizeof *c->jobs);
  c->jobs[i] = j;
  c->njobs++;
  return j;
}

static void job_remove(wg_cache_t *c, const char *id) {
  size_t i = job_lower(c, id);
  if (i < c->njobs && strcmp(c->jobs[i]->id, id) == 0) {
    cjob_free(c->jobs[i]);
    memmove(&c->jobs[i], &c->jobs[i + 1], (c->njobs - i - 1) * sizeof *c->jobs);
    c->njobs--;
  }
}

static void hist_reset(wg_cache_t *c);

static void view_free(wg_cache_t *c) {
  for (size_t i = 0; i < c->njobs; i++)
    cjob_free(c->jobs[i]);
  free(c->jobs);
  c->jobs = NULL;
  c->njobs = c->capjobs = 0;
  kvarr_free(&c->agents);
  kvarr_free(&c->assigns);
  kvarr_free(&c->quars);
  hist_reset(c);
  free(c->hist);
  c->hist = NULL;
}

/* The job's kv of a kind (spec, status, plan), NULL when absent. */
static const wagma_etcd_kv_t *job_kv(wg_cache_t *c, const cjob_t *j, wagma_key_kind_t kind) {
  char key[256];
  int e = kind == WAGMA_KEY_JOB_SPEC     ? wagma_key_job_spec(&c->c->keys, j->id, key, sizeof key)
          : kind == WAGMA_KEY_JOB_STATUS ? wagma_key_job_status(&c->c->keys, j->id, key, sizeof key)
                                         : wagma_key_job_plan(&c->c->keys, j->id, key, sizeof key);
  return e ? NULL : wg_kvarr_find(&j->kvs, key, strlen(key));
}

static const wagma_etcd_kv_t *progress_kv(wg_cache_t *c, const cjob_t *j, const char *agent) {
  char key[256];
  if (wagma_key_job_progress(&c->c->keys, j->id, agent, key, sizeof key))
    return NULL;
  return wg_kvarr_find(&j->kvs, key, strlen(key));
}

/* A joiner whose quarantine for being cut off ended this recently is "reachable again". */
#define REACHABLE_AGAIN_S 60.0

/* The quarantine record of agent for being cut off from its peers in job j (nprobe > 0), as
 * the view holds it, into *q: 1, else 0. */
static int unreachable_record(wg_cache_t *c, const cjob_t *j, const char *agent,
                              wagma_quarantine_t *q) {
  char key[256];
  wagma_api_error_t err;
  const wagma_etcd_kv_t *kv = NULL;
  if (wagma_key_quarantine(&c->c->keys, agent, key, sizeof key) == 0)
    kv = wg_kvarr_find(&c->quars, key, strlen(key));
  return kv && wagma_quarantine_from_json(kv->value, kv->value_len, q, &err) == 0 &&
         q->nprobe > 0 && strcmp(q->job, j->id) == 0;
}

/* Renders the job's REST bodies from its keys, as the etcd handlers do (store.c): the full
 * view of GET /v1/jobs/{id}, and its entry in GET /v1/jobs (spec and status, and the progress
 * of at most WG_LIST_PROGRESS_MAX members unless it is finished). */
static void job_render(wg_cache_t *c, cjob_t *j) {
  wg_job_record_t rec;
  free(j->full);
  free(j->summary);
  j->full = j->summary = NULL;
  j->full_len = j->summary_len = 0;
  j->has_spec = 0;
  if (wg_job_record_from_kvs(c->c, j->id, j->kvs.kv, j->kvs.n, &rec) != 0)
    return;
  j->has_spec = rec.has_spec;
  j->state = rec.status.state;
  j->iteration = wg_job_record_iteration(&rec);
  if (rec.has_spec) {
    json_t *v = wg_job_record_to_value(&rec, 1);
    j->full = v ? json_dumps(v, WG_JSON_FLAGS) : NULL;
    j->full_len = j->full ? strlen(j->full) : 0;
    json_decref(v);
  }
  int terminal = wagma_job_state_terminal(rec.status.state);
  wg_job_record_free(&rec);
  if (!j->has_spec)
    return;
  /* The list's entry: spec, status, and (unless finished) the first progress records. */
  wagma_etcd_kv_t *sub = malloc((j->kvs.n ? j->kvs.n : 1) * sizeof *sub);
  size_t n = 0, nprog = 0;
  for (size_t i = 0; sub && i < j->kvs.n; i++) {
    wagma_key_kind_t k =
        wagma_key_parse(&c->c->keys, j->kvs.kv[i].key, j->kvs.kv[i].key_len, NULL, NULL);
    if (k == WAGMA_KEY_JOB_SPEC || k == WAGMA_KEY_JOB_STATUS ||
        (k == WAGMA_KEY_JOB_PROGRESS && !terminal && nprog++ < WG_LIST_PROGRESS_MAX))
      sub[n++] = j->kvs.kv[i];
  }
  if (sub && wg_job_record_from_kvs(c->c, j->id, sub, n, &rec) == 0) {
    json_t *v = wg_job_record_to_value(&rec, 0);
    j->summary = v ? json_dumps(v, WG_JSON_FLAGS) : NULL;
    j->summary_len = j->summary ? strlen(j->summary) : 0;
    json_decref(v);
    wg_job_record_free(&rec);
  }
  free(sub);
}

/* ---- timelines ----------------------------------------------------------------------------- */

enum { TL_SUBMITTED = 0, TL_STATE = 1, TL_EPOCH = 2, TL_SCALED = 3, TL_DELETED = 4 };
static const char *const tl_names[] = {"submitted", "state", "epoch", "scaled", "deleted"};

/* A new timeline entry {"id","job","revision","time","type",...}. */
static json_t *tl_entry(const cjob_t *j, int64_t rev, int type, double when) {
  char id[48];
  snprintf(id, sizeof id, "%lld.%d", (long long)rev, type);
  return json_pack("{s:s,s:s,s:I,s:f,s:s}", "id", id, "job", j->id, "revision", (json_int_t)rev,
                   "time", when, "type", tl_names[type]);
}

/* A "state" entry to a terminal state: its "summary" (the status', when it has one) and the
 * message "<msg> (<summary line>)". */
static void tl_state_set(json_t *e, const wagma_job_status_t *st, const char *msg) {
  char line[1024];
  if (st->summary.members > 0) {
    char sum[320];
    wagma_job_summary_format(&st->summary, sum, sizeof sum);
    snprintf(line, sizeof line, "%s (%s)", msg, sum);
    json_t *v = wagma_job_status_to_value(st);
    json_object_set(e, "summary", json_object_get(v, "summary"));
    json_decref(v);
  } else {
    snprintf(line, sizeof line, "%s", msg);
  }
  json_object_set_new(e, "message", json_string(line));
}

/* A "submitted" entry of spec: "warnings" (wagma_job_spec_warnings) when the spec is known to
 * train badly, each also in the message after msg. */
static void tl_submitted_set(json_t *e, const wagma_job_spec_t *spec, const char *msg) {
  char line[1600];
  json_t *w = wagma_job_spec_warnings_value(spec);
  int n = snprintf(line, sizeof line, "%s", msg);
  size_t i;
  json_t *x;
  json_array_foreach(w, i, x) {
    if (n > 0 && (size_t)n < sizeof line)
      n += snprintf(line + n, sizeof line - (size_t)n, "; warning: %s", json_string_value(x));
  }
  if (json_array_size(w))
    json_object_set(e, "warnings", w);
  json_decref(w);
  json_object_set_new(e, "message", json_string(line));
}

/* The bytes of one timeline entry as REST and the streams show it. */
static size_t tl_entry_bytes(const json_t *e) {
  return json_dumpb(e, NULL, 0, WG_JSON_FLAGS) + 1;
}

/* Sets j->timeline_bytes from the entries (after the timeline was replaced). */
static void tl_recount(cjob_t *j) {
  size_t k;
  json_t *x;
  j->timeline_bytes = 0;
  json_array_foreach(j->timeline, k, x) j->timeline_bytes += tl_entry_bytes(x);
}

/* Appends e to the job's timeline (in revision order), unless an entry with its id is there;
 * then drops the oldest entries beyond WG_CACHE_TIMELINE_MAX entries or
 * WG_CACHE_TIMELINE_BYTES bytes (the newest stays). Takes e. Returns e (borrowed), or NULL
 * when it was there already or is the one dropped. */
static json_t *tl_add(cjob_t *j, json_t *e) {
  if (!e)
    return NULL;
  /* Ordered by id: (revision, kind), so entries of one Txn come in one order everywhere. */
  const char *id = json_string_value(json_object_get(e, "id"));
  json_int_t rev = json_integer_value(json_object_get(e, "revision"));
  const char *dot = id ? strchr(id, '.') : NULL;
  int kind = dot ? atoi(dot + 1) : 0;
  size_t n = json_array_size(j->timeline), at = n;
  for (size_t i = n; i-- > 0;) {
    json_t *o = json_array_get(j->timeline, i);
    json_int_t orev = json_integer_value(json_object_get(o, "revision"));
    const char *oid = json_string_value(json_object_get(o, "id"));
    const char *odot = oid ? strchr(oid, '.') : NULL;
    int okind = odot ? atoi(odot + 1) : 0;
    if (orev < rev || (orev == rev && okind < kind))
      break;
    if (orev == rev && okind == kind) {
      json_decref(e);
      return NULL;
    }
    at = i;
  }
  json_array_insert_new(j->timeline, at, e);
  j->timeline_bytes += tl_entry_bytes(e);
  while (json_array_size(j->timeline) > 1 &&
         (json_array_size(j->timeline) > WG_CACHE_TIMELINE_MAX ||
          j->timeline_bytes > WG_CACHE_TIMELINE_BYTES)) {
    json_t *old = json_array_get(j->timeline, 0);
    size_t b = tl_entry_bytes(old);
    j->timeline_bytes = j->timeline_bytes > b ? j->timeline_bytes - b : 0;
    if (old == e)
      e = NULL;
    json_array_remove(j->timeline, 0);
  }
  return e;
}

/* The member of plan p named name, or NULL. */
static const wagma_member_t *member_named(const wagma_plan_t *p, const char *name) {
  for (int r = 0; p && r < p->nranks; r++)
    if (strcmp(p->members[r].name, name) == 0)
      return &p->members[r];
  return NULL;
}

static int names_has(const wagma_plan_t *p, const char *name) {
  return member_named(p, name) != NULL;
}

/* A member of both plans that np marks a joiner: its program restarted (a "rejoin"). */
static int rejoined(const wagma_plan_t *old, const wagma_plan_t *np, const char *name) {
  const wagma_member_t *m = member_named(np, name);
  return old && m && m->joiner && names_has(old, name);
}

static void add_person(json_t *arr, const char *agent, const char *reason) {
  json_array_append_new(arr, json_pack("{s:s,s:s}", "agent", agent, "reason", reason));
}

/* Why agent (rank in the plan of the epoch that ends, at address) is not in the next one: what
 * the view holds just before the new plan. */
static void leave_reason(wg_cache_t *c, const cjob_t *j, const wagma_member_t *m, int rank,
                         int workers, uint64_t old_epoch, char *out, size_t len) {
  char key[256];
  wagma_api_error_t err;
  const wagma_etcd_kv_t *akv = NULL;
  if (wagma_key_agent(&c->c->keys, m->name, key, sizeof key) == 0)
    akv = wg_kvarr_find(&c->agents, key, strlen(key));
  const wagma_etcd_kv_t *pkv = progress_kv(c, j, m->name);
  wagma_progress_t p;
  int has_p = pkv && wagma_progress_from_json(pkv->value, pkv->value_len, &p, &err) == 0;
  wagma_agent_info_t info;
  wagma_quarantine_t q;
  if (!akv) {
    snprintf(out, len,
             "its registration ended (the agent stopped, crashed or lost etcd: its "
             "lease expired or was revoked)");
  } else if (wagma_agent_info_from_json(akv->value, akv->value_len, &info, &err) == 0 &&
             strcmp(info.address, m->address) != 0) {
    snprintf(out, len, "it registered again at %s", info.address);
  } else if (has_p && p.rejoin != 0 && p.rejoin == old_epoch) {
    snprintf(out, len, "its program restarted (it rejoins with the survivors' model)");
  } else if (has_p && p.state == WAGMA_PROGRESS_UNAVAILABLE) {
    snprintf(out, len, "it cannot serve the job: %.200s", p.error);
  } else if (has_p && p.state == WAGMA_PROGRESS_FAILED) {
    snprintf(out, len, "it failed: %.200s", p.error);
  } else if (unreachable_record(c, j, m->name, &q) && q.reachable == 0 && akv &&
             q.registration == akv->create_revision) {
    const char *why = strstr(q.reason, ": ");
    snprintf(out, len, "%.240s; quarantined until it reaches them again", why ? why + 2 : q.reason);
  } else if (rank >= workers) {
    snprintf(out, len, "scaled down to %d workers", workers);
  } else {
    snprintf(out, len, "left the plan");
  }
}

/* The timeline entry of a new plan epoch: who joined, who left and why. old (may be NULL):
 * the plan it replaces, as the view held it. */
static json_t *epoch_entry(wg_cache_t *c, const cjob_t *j, const wagma_plan_t *old,
                           const wagma_plan_t *np, int64_t rev, double when, int observed) {
  json_t *e = tl_entry(j, rev, TL_EPOCH, when);
  json_t *joined = json_array(), *left = json_array();
  char why[320];
  int workers = 0;
  const wagma_etcd_kv_t *skv = job_kv(c, j, WAGMA_KEY_JOB_SPEC);
  wagma_job_spec_t spec;
  wagma_api_error_t err;
  if (skv && wagma_job_spec_from_json(skv->value, skv->value_len, &spec, &err) == 0)
    workers = spec.workers;
  int survivors = 0;
  for (int r = 0; old && r < old->nranks; r++) {
    if (names_has(np, old->members[r].name) && !rejoined(old, np, old->members[r].name)) {
      survivors++;
      continue;
    }
    if (observed)
      leave_reason(c, j, &old->members[r], r, workers, old->epoch, why, sizeof why);
    else
      snprintf(why, sizeof why, "not observed (before this coordinator watched)");
    add_person(left, old->members[r].name, why);
  }
  for (int r = 0; r < np->nranks; r++) {
    int back = rejoined(old, np, np->members[r].name);
    wagma_quarantine_t q;
    if (old && names_has(old, np->members[r].name) && !back)
      continue;
    const char *reason =
        back                     ? "rejoined after its program restarted"
        : !old && np->epoch <= 1 ? "first plan"
        : !observed              ? "not observed (before this coordinator watched)"
        : survivors == 0         ? "fresh start (no member survived)"
        : unreachable_record(c, j, np->members[r].name, &q) && q.reachable > 0 &&
                when - q.reachable < REACHABLE_AGAIN_S
            ? "reachable again (it reaches its peers on the data plane)"
        : old && workers > old->nranks && r >= old->nranks - (int)json_array_size(left)
            ? "scaled up"
            : "free agent joined";
    add_person(joined, np->members[r].name, reason);
  }
  char msg[512];
  int n = snprintf(msg, sizeof msg, "epoch %llu from round %llu: %d members",
                   (unsigned long long)np->epoch, (unsigned long long)np->start_round, np->nranks);
  size_t i;
  json_t *x;
  json_array_foreach(left, i, x) {
    if (n > 0 && (size_t)n < sizeof msg)
      n += snprintf(msg + n, sizeof msg - (size_t)n, "; %s left: %s",
                    json_string_value(json_object_get(x, "agent")),
                    json_string_value(json_object_get(x, "reason")));
  }
  if (json_array_size(joined) && n > 0 && (size_t)n < sizeof msg)
    snprintf(msg + n, sizeof msg - (size_t)n, "; %zu joined", json_array_size(joined));
  json_object_set_new(e, "epoch", json_integer((json_int_t)np->epoch));
  json_object_set_new(e, "start_round", json_integer((json_int_t)np->start_round));
  json_object_set_new(e, "members", json_integer(np->nranks));
  json_object_set_new(e, "joined", joined);
  json_object_set_new(e, "left", left);
  json_object_set_new(e, "message", json_string(msg));
  return e;
}

/* The timeline of a job loaded (not watched): submitted, the kept plan history (or the current
 * plan), and a final state. */
static void seed_timeline(wg_cache_t *c, cjob_t *j) {
  wagma_api_error_t err;
  const wagma_etcd_kv_t *skv = job_kv(c, j, WAGMA_KEY_JOB_SPEC);
  const wagma_etcd_kv_t *stkv = job_kv(c, j, WAGMA_KEY_JOB_STATUS);
  wagma_job_status_t st;
  int has_st = stkv && wagma_job_status_from_json(stkv->value, stkv->value_len, &st, &err) == 0;
  if (skv) {
    json_t *e = tl_entry(j, skv->create_revision, TL_SUBMITTED, has_st ? st.created : 0);
    wagma_job_spec_t spec;
    if (wagma_job_spec_from_json(skv->value, skv->value_len, &spec, &err) == 0)
      tl_submitted_set(e, &spec, "submitted");
    else
      json_object_set_new(e, "message", json_string("submitted"));
    tl_add(j, e);
  }
  char prefix[256];
  size_t lo = 0, hi = 0;
  if (wagma_key_job_plans_prefix(&c->c->keys, j->id, prefix, sizeof prefix) == 0)
    wg_kvarr_prefix(&j->kvs, prefix, &lo, &hi);
  wagma_plan_t prev;
  int has_prev = 0;
  memset(&prev, 0, sizeof prev);
  for (size_t i = lo; i < hi; i++) {
    wagma_plan_record_t rec;
    wagma_plan_t p;
    if (wagma_plan_record_from_json(j->kvs.kv[i].value, j->kvs.kv[i].value_len, &rec, &err))
      continue;
    memset(&p, 0, sizeof p);
    p.epoch = rec.epoch;
    p.start_round = rec.start_round;
    p.nranks = rec.nmembers;
    p.members = calloc((size_t)(rec.nmembers ? rec.nmembers : 1), sizeof *p.members);
    for (int r = 0; p.members && r < rec.nmembers; r++)
      snprintf(p.members[r].name, sizeof p.members[r].name, "%s", rec.members[r]);
    if (p.members)
      tl_add(j, epoch_entry(c, j, has_prev ? &prev : NULL, &p, j->kvs.kv[i].mod_revision, 0, 0));
    free(prev.members);
    prev = p;
    has_prev = p.members != NULL;
    wagma_plan_record_free(&rec);
  }
  free(prev.members);
  if (lo == hi && j->has_plan) {
    const wagma_etcd_kv_t *pkv = job_kv(c, j, WAGMA_KEY_JOB_PLAN);
    tl_add(j, epoch_entry(c, j, NULL, &j->plan, pkv ? pkv->mod_revision : 0, 0, 0));
  }
  if (has_st && wagma_job_state_terminal(st.state)) {
    json_t *e = tl_entry(j, stkv->mod_revision, TL_STATE, st.finished);
    char msg[512];
    snprintf(msg, sizeof msg, "%s%s%.400s", wagma_job_state_name(st.state),
             st.reason[0] ? ": " : "", st.reason);
    json_object_set_new(e, "to", json_string(wagma_job_state_name(st.state)));
    json_object_set_new(e, "reason", json_string(st.reason));
    tl_state_set(e, &st, msg);
    tl_add(j, e);
  }
  if (has_st)
    wagma_job_status_free(&st);
}

/* ---- series ---------------------------------------------------------------------------------- */

static void series_add(cjob_t *j, const char *agent, const wagma_progress_t *p) {
  uint32_t a = 0;
  while (a < j->nagents && strcmp(j->agents[a], agent) != 0)
    a++;
  if (a == j->nagents) {
    if (j->nagents >= WG_CACHE_SERIES_AGENTS)
      return;
    char(*na)[WAGMA_API_NAME_MAX] = realloc(j->agents, (j->nagents + 1) * sizeof *na);
    if (!na)
      return;
    j->agents = na;
    uint64_t *nl = realloc(j->agent_last, (j->nagents + 1) * sizeof *nl);
    if (!nl)
      return;
    j->agent_last = nl;
    snprintf(j->agents[a], sizeof j->agents[a], "%s", agent);
    j->agent_last[a] = UINT64_MAX;
    j->nagents++;
  }
  if (j->agent_last[a] == p->iteration || (isnan(p->accuracy) && isnan(p->loss)))
    return; /* nothing new */
  j->agent_last[a] = p->iteration;
  if (j->npoints == WG_CACHE_SERIES_MAX) { /* keep the whole run, at half the resolution */
    size_t k = 0;
    for (size_t i = 0; i < j->npoints; i += 2)
      j->points[k++] = j->points[i];
    j->npoints = k;
  }
  if (j->npoints == j->cappoints) {
    size_t cap = j->cappoints ? 2 * j->cappoints : 64;
    series_point_t *np = realloc(j->points, cap * sizeof *np);
    if (!np)
      return;
    j->points = np;
    j->cappoints = cap;
  }
  j->points[j->npoints++] = (series_point_t){.iteration = p->iteration,
                                             .accuracy = (float)p->accuracy,
                                             .loss = (float)p->loss,
                                             .agent = a};
}

static json_t *real_or_null(float v) {
  return isnan(v) || isinf(v) ? json_null() : json_real(v);
}

static json_t *series_value(const cjob_t *j) {
  json_t *agents = json_array(), *points = json_array();
  for (uint32_t a = 0; a < j->nagents; a++)
    json_array_append_new(agents, json_string(j->agents[a]));
  for (size_t i = 0; i < j->npoints; i++) {
    const series_point_t *p = &j->points[i];
    json_array_append_new(points, json_pack("[I,o,o,i]", (json_int_t)p->iteration,
                                            real_or_null(p->accuracy), real_or_null(p->loss),
                                            (int)p->agent));
  }
  return json_pack("{s:o,s:o}", "agents", agents, "points", points);
}

/* ---- snapshots (the first event of a stream) ------------------------------------------------ */

char *wg_cache_job_snapshot(wg_cache_t *c, const cjob_t *j, size_t *len) {
  json_t *tl = json_deep_copy(j->timeline);
  json_t *series = series_value(j);
  char *tls = tl ? json_dumps(tl, WG_JSON_FLAGS) : NULL;
  char *ss = series ? json_dumps(series, WG_JSON_FLAGS) : NULL;
  json_decref(tl);
  json_decref(series);
  char *out = NULL;
  if (j->full && tls && ss) {
    size_t n = strlen(j->full) + strlen(tls) + strlen(ss) + 96;
    out = malloc(n);
    if (out)
      *len =
          (size_t)snprintf(out, n, "{\"revision\":%lld,\"job\":%s,\"timeline\":%s,\"series\":%s}",
                           (long long)c->applied, j->full, tls, ss);
  }
  free(tls);
  free(ss);
  return out;
}

char *wg_cache_all_snapshot(wg_cache_t *c, size_t *len) {
  size_t cap = 64, n;
  for (size_t i = 0; i < c->njobs; i++)
    cap += c->jobs[i]->summary_len + 1;
  char *out = malloc(cap);
  if (!out)
    return NULL;
  n = (size_t)snprintf(out, cap, "{\"revision\":%lld,\"jobs\":[", (long long)c->applied);
  int first = 1;
  for (size_t i = 0; i < c->njobs; i++) {
    const cjob_t *j = c->jobs[i];
    if (!j->summary)
      continue;
    if (!first)
      out[n++] = ',';
    first = 0;
    memcpy(out + n, j->summary, j->summary_len);
    n += j->summary_len;
  }
  memcpy(out + n, "]}", 3);
  *len = n + 2;
  return out;
}

/* ---- publishing --------------------------------------------------------------------------------
 */

/* Forgets the kept events (a new view: ids of the old one get a snapshot). */
static void hist_reset(wg_cache_t *c) {
  static unsigned loads;
  for (size_t i = 0; i < c->hist_n; i++)
    free(c->hist[(c->hist_head + i) % WG_CACHE_HISTORY_EVENTS].bytes);
  c->hist_head = c->hist_n = c->hist_bytes = 0;
  c->hist_floor = c->seq;
  snprintf(c->view_tag, sizeof c->view_tag, "%x%x",
           (unsigned)getpid() * 2654435761u ^ (unsigned)(wg_wall() * 1000), ++loads);
}

/* Keeps a published event (takes bytes), dropping the oldest beyond the bounds. */
static void hist_add(wg_cache_t *c, const char *job, int all_too, char *bytes, size_t n) {
  if (!c->hist && !(c->hist = calloc(WG_CACHE_HISTORY_EVENTS, sizeof *c->hist))) {
    free(bytes);
    c->hist_floor = c->seq; /* what is not kept cannot be resumed from */
    return;
  }
  while (c->hist_n > 0 &&
         (c->hist_n == WG_CACHE_HISTORY_EVENTS || c->hist_bytes + n > WG_CACHE_HISTORY_BYTES)) {
    hist_event_t *o = &c->hist[c->hist_head];
    c->hist_floor = o->seq;
    c->hist_bytes -= o->n;
    free(o->bytes);
    c->hist_head = (c->hist_head + 1) % WG_CACHE_HISTORY_EVENTS;
    c->hist_n--;
  }
  hist_event_t *e = &c->hist[(c->hist_head + c->hist_n) % WG_CACHE_HISTORY_EVENTS];
  e->seq = c->seq;
  snprintf(e->job, sizeof e->job, "%s", job);
  e->all_too = all_too;
  e->bytes = bytes;
  e->n = n;
  c->hist_n++;
  c->hist_bytes += n;
}

void wg_cache_event_id(const wg_cache_t *c, int64_t rev, char *buf, size_t len) {
  snprintf(buf, len, "%lld.%llu.%s", (long long)rev, (unsigned long long)c->seq, c->view_tag);
}

static void publish(wg_cache_t *c, const char *job, int all_too, int64_t rev, const char *event,
                    const char *data) {
  if (!c->c->hub || !data)
    return;
  char id[64];
  size_t n;
  c->seq++;
  wg_cache_event_id(c, rev, id, sizeof id);
  char *bytes = wg_sse_event(id, event, data, &n);
  if (!bytes) {
    c->hist_floor = c->seq; /* lost: no resume across it */
    return;
  }
  wg_hub_publish_locked(c->c->hub, job, all_too, bytes, n);
  hist_add(c, job, all_too, bytes, n);
}

static void publish_value(wg_cache_t *c, const char *job, int all_too, int64_t rev,
                          const char *event, json_t *v) {
  char *s = v ? json_dumps(v, WG_JSON_FLAGS) : NULL;
  publish(c, job, all_too, rev, event, s);
  free(s);
  json_decref(v);
}

static json_t *plan_event_value(const cjob_t *j) {
  json_t *members = json_array();
  for (int r = 0; r < j->plan.nranks; r++)
    json_array_append_new(members,
                          json_pack("{s:i,s:s,s:b}", "rank", r, "name", j->plan.members[r].name,
                                    "joiner", j->plan.members[r].joiner));
  return json_pack("{s:s,s:I,s:I,s:i,s:i,s:s,s:i,s:o}", "job", j->id, "epoch",
                   (json_int_t)j->plan.epoch, "start_round", (json_int_t)j->plan.start_round,
                   "group_size", j->plan.group_size, "staleness_bound", j->plan.staleness_bound,
                   "global_sync",
                   j->plan.global_sync == WAGMA_GLOBAL_WAIT_AVOIDING ? "wait-avoiding" : "barrier",
                   "phases", j->plan.nphases, "members", members);
}

/* ---- applying changes ------------------------------------------------------------------------ */

typedef struct change {
  wg_cache_t *c;
  int64_t rev;  /* of the batch */
  int observed; /* 1: from the watch (derive reasons); 0: a load */
} change_t;

/* Applies one kv put/delete to the view; derives and publishes (when observed) what it means.
 * Under the write lock. */
static void apply(change_t *ch, const wagma_etcd_kv_t *kv, int del) {
  wg_cache_t *c = ch->c;
  wg_coord_t *co = c->c;
  char job[WAGMA_API_NAME_MAX] = "", agent[WAGMA_API_NAME_MAX] = "";
  wagma_key_kind_t kind = wagma_key_parse(&co->keys, kv->key, kv->key_len, job, agent);
  wagma_api_error_t err;
  double now = wg_wall();
  switch (kind) {
  case WAGMA_KEY_AGENT: kvarr_apply(&c->agents, kv, del); return;
  case WAGMA_KEY_ASSIGNMENT: kvarr_apply(&c->assigns, kv, del); return;
  case WAGMA_KEY_QUARANTINE: kvarr_apply(&c->quars, kv, del); return;
  case WAGMA_KEY_JOB_SPEC:
  case WAGMA_KEY_JOB_STATUS:
  case WAGMA_KEY_JOB_PLAN:
  case WAGMA_KEY_JOB_PROGRESS:
  case WAGMA_KEY_JOB_CHECKPOINT:
  case WAGMA_KEY_JOB_PLAN_RECORD: break;
  default: return; /* the leader key, the secrets, anything else: counted only */
  }
  char jprefix[256];
  if (!job[0] || wagma_key_job_prefix(&co->keys, job, jprefix, sizeof jprefix) != 0 ||
      kv->key_len < strlen(jprefix) || memcmp(kv->key, jprefix, strlen(jprefix)) != 0)
    return; /* not under <prefix>/jobs/<job>/ */
  cjob_t *j = del ? wg_cache_job(c, job) : job_get_or_add(c, job);
  if (!j)
    return;
  const wagma_etcd_kv_t *old = wg_kvarr_find(&j->kvs, kv->key, kv->key_len);
  j->dirty = 1;
  if (ch->observed && !del) {
    if (kind == WAGMA_KEY_JOB_SPEC) {
      wagma_job_spec_t ns, os;
      if (wagma_job_spec_from_json(kv->value, kv->value_len, &ns, &err) == 0) {
        if (!old) {
          json_t *e = tl_entry(j, kv->mod_revision, TL_SUBMITTED, now);
          char msg[160];
          /* "..., wagma lenet5" or, for a program job, "..., wagma program fmnist_cnn" */
          snprintf(msg, sizeof msg, "submitted: %d workers (min %d, max %d), %s %s%s", ns.workers,
                   ns.min_workers, ns.max_workers, wagma_algorithm_name(ns.algorithm),
                   ns.program.name[0] ? "program " : "",
                   ns.program.name[0] ? ns.program.name : wagma_model_name(ns.model));
          tl_submitted_set(e, &ns, msg);
          if ((e = tl_add(j, e)))
            publish_value(c, j->id, 1, kv->mod_revision, "timeline", json_incref(e));
        } else if (wagma_job_spec_from_json(old->value, old->value_len, &os, &err) == 0 &&
                   (os.workers != ns.workers || os.min_workers != ns.min_workers ||
                    os.max_workers != ns.max_workers)) {
          json_t *e = tl_entry(j, kv->mod_revision, TL_SCALED, now);
          char msg[160];
          snprintf(msg, sizeof msg, "scaled: workers %d -> %d (min %d, max %d)", os.workers,
                   ns.workers, ns.min_workers, ns.max_workers);
          json_object_set_new(e, "from", json_integer(os.workers));
          json_object_set_new(e, "to", json_integer(ns.workers));
          json_object_set_new(e, "message", json_string(msg));
          if ((e = tl_add(j, e)))
            publish_value(c, j->id, 1, kv->mod_revision, "timeline", json_incref(e));
        }
      }
      j->announce = 1;
    } else if (kind == WAGMA_KEY_JOB_STATUS) {
      wagma_job_status_t ns, os;
      if (wagma_job_status_from_json(kv->value, kv->value_len, &ns, &err) == 0) {
        int had = old && wagma_job_status_from_json(old->value, old->value_len, &os, &err) == 0;
        if (had && os.state != ns.state) {
          json_t *e = tl_entry(j, kv->mod_revision, TL_STATE, now);
          char msg[512];
          snprintf(msg, sizeof msg, "%s -> %s%s%.400s", wagma_job_state_name(os.state),
                   wagma_job_state_name(ns.state), ns.reason[0] ? ": " : "", ns.reason);
          json_object_set_new(e, "from", json_string(wagma_job_state_name(os.state)));
          json_object_set_new(e, "to", json_string(wagma_job_state_name(ns.state)));
          json_object_set_new(e, "reason", json_string(ns.reason));
          tl_state_set(e, &ns, msg);
          if ((e = tl_add(j, e)))
            publish_value(c, j->id, 1, kv->mod_revision, "timeline", json_incref(e));
        }
        if (had)
          wagma_job_status_free(&os);
        wagma_job_status_free(&ns);
      }
      j->announce = 1;
    } else if (kind == WAGMA_KEY_JOB_PROGRESS && agent[0]) {
      wagma_progress_t p;
      if (wagma_progress_from_json(kv->value, kv->value_len, &p, &err) == 0) {
        series_add(j, agent, &p);
        if (co->hub) /* kept for streams that resume, even with none following now */
          publish_value(c, j->id, 0, kv->mod_revision, "progress",
                        json_pack("{s:s,s:s,s:o}", "job", j->id, "agent", agent, "progress",
                                  wagma_progress_to_value(&p)));
      }
    }
  }
  if (!ch->observed && !del && kind == WAGMA_KEY_JOB_PROGRESS && agent[0]) {
    wagma_progress_t p;
    if (wagma_progress_from_json(kv->value, kv->value_len, &p, &err) == 0)
      series_add(j, agent, &p);
  }
  if (kind == WAGMA_KEY_JOB_PLAN) {
    wagma_plan_t np;
    char perr[128];
    memset(&np, 0, sizeof np);
    if (!del && wagma_plan_from_json(kv->value, kv->value_len, &np, perr, sizeof perr) == 0) {
      if (ch->observed && (!j->has_plan || j->plan.epoch != np.epoch)) {
        json_t *e = epoch_entry(c, j, j->has_plan ? &j->plan : NULL, &np, kv->mod_revision, now, 1);
        if ((e = tl_add(j, e)))
          publish_value(c, j->id, 1, kv->mod_revision, "timeline", json_incref(e));
      }
      wagma_plan_free(&j->plan);
      j->plan = np;
      j->has_plan = 1;
    } else {
      wagma_plan_free(&j->plan);
      j->has_plan = 0;
    }
    j->announce = 1;
  }
  kvarr_apply(&j->kvs, kv, del);
}

/* After a batch: renders the changed jobs, announces them, drops the ones left without keys. */
static void settle(change_t *ch) {
  wg_cache_t *c = ch->c;
  for (size_t i = 0; i < c->njobs;) {
    cjob_t *j = c->jobs[i];
    if (!j->dirty) {
      i++;
      continue;
    }
    j->dirty = 0;
    if (j->kvs.n == 0) { /* purged */
      if (ch->observed) {
        json_t *e = tl_entry(j, ch->rev, TL_DELETED, wg_wall());
        json_object_set_new(e, "message", json_string("deleted (purged)"));
        publish_value(c, j->id, 1, ch->rev, "timeline", e);
        publish_value(c, j->id, 1, ch->rev, "deleted", json_pack("{s:s}", "job", j->id));
      }
      job_remove(c, j->id);
      continue;
    }
    job_render(c, j);
    if (ch->observed && j->announce && j->summary)
      publish(c, j->id, 1, ch->rev, "job", j->summary);
    if (ch->observed && j->announce && j->has_plan && j->plan.epoch && j->plan.nranks > 0)
      publish_value(c, j->id, 0, ch->rev, "plan", plan_event_value(j));
    j->announce = 0;
    i++;
  }
}

/* ---- the watch ----------------------------------------------------------------------------- */

/* Wakes whoever waits on the sync state: the waiters on cv, and the fronts that parked reads
 * (their eventfds, only when a wg_cache_ready asked since the last wake-up). Under mu. */
static void wake_locked(wg_cache_t *c) {
  pthread_cond_broadcast(&c->cv);
  if (!c->notify_wanted)
    return;
  c->notify_wanted = 0;
  uint64_t one = 1;
  for (int i = 0; i < c->nnotify; i++)
    (void)!write(c->notify_fd[i], &one, sizeof one);
}

static void request_reload(wg_cache_t *c, const char *why) {
  wg_logf(c->c->log, c->c->log_user, WAGMA_LOG_INFO, "read cache: reloading (%s)", why);
  pthread_rwlock_wrlock(&c->rw);
  c->valid = 0;
  pthread_rwlock_unlock(&c->rw);
  pthread_mutex_lock(&c->mu);
  c->reload = 1;
  c->failures++;
  wake_locked(c);
  pthread_mutex_unlock(&c->mu);
}

static void on_watch(void *user, int status, const wagma_etcd_event_t *events, size_t n,
                     int64_t revision) {
  wg_cache_t *c = user;
  if (status != 0) {
    request_reload(c, status == WAGMA_ECOMPACTED ? "the watch's revision was compacted"
                                                 : "the watch ended");
    return;
  }
  pthread_rwlock_wrlock(&c->rw);
  if (c->c->hub)
    wg_hub_lock(c->c->hub);
  change_t ch = {.c = c, .rev = revision, .observed = 1};
  for (size_t i = 0; i < n; i++) {
    const wagma_etcd_event_t *ev = &events[i];
    if (ev->kv.mod_revision <= c->applied)
      continue; /* in the view already (the load read it) */
    int del = ev->type == WAGMA_ETCD_EVENT_DELETE;
    if (del)
      c->count--;
    else if (ev->kv.version == 1)
      c->count++;
    apply(&ch, &ev->kv, del);
  }
  settle(&ch);
  if (revision > c->applied)
    c->applied = revision;
  int64_t applied = c->applied;
  if (c->c->hub)
    wg_hub_unlock(c->c->hub);
  pthread_rwlock_unlock(&c->rw);
  pthread_mutex_lock(&c->mu);
  c->seen_applied = applied;
  if (c->pending_rev && applied >= c->pending_rev) {
    if (c->pending_t0 > c->verified)
      c->verified = c->pending_t0;
    c->pending_rev = 0;
  }
  wake_locked(c);
  pthread_mutex_unlock(&c->mu);
}

/* ---- load ------------------------------------------------------------------------------------ */

typedef struct resnap_ctx {
  wg_cache_t *c;
} resnap_ctx_t;

/* After a load every stream gets a new snapshot: what it missed meanwhile is in it. */
static void resnap(void *user, wg_sse_client_t *cl) {
  resnap_ctx_t *r = user;
  const char *job = wg_hub_client_job(cl);
  size_t n = 0;
  char *data = NULL;
  if (job[0]) {
    cjob_t *j = wg_cache_job(r->c, job);
    data = j && j->full ? wg_cache_job_snapshot(r->c, j, &n) : strdup("{\"deleted\":true}");
  } else {
    data = wg_cache_all_snapshot(r->c, &n);
  }
  if (!data)
    return;
  char id[64];
  wg_cache_event_id(r->c, r->c->applied, id, sizeof id);
  char *bytes = wg_sse_event(id, "snapshot", data, &n);
  if (bytes)
    wg_hub_send_locked(r->c->c->hub, cl, bytes, n);
  free(bytes);
  free(data);
}

/* Reads <prefix>/ with one Range and installs it as the view (not valid until the watch runs).
 * Timelines of jobs still present carry over (their reasons were observed). */
static int load(wg_cache_t *c) {
  char root[256];
  wagma_etcd_range_t range = {0};
  wagma_etcd_range_options_t opt = {.prefix = 1};
  wagma_key_root(&c->c->keys, root, sizeof root);
  int e = wagma_etcd_range(c->c->etcd, root, &opt, &range);
  if (e) {
    wg_logf(c->c->log, c->c->log_user, WAGMA_LOG_DEBUG, "read cache: load: %s",
            wagma_etcd_errmsg(c->c->etcd));
    return e;
  }
  wg_metrics_cache(c->c->metrics, WG_METRIC_CACHE_RELOAD);
  wg_cache_t fresh;
  memset(&fresh, 0, sizeof fresh);
  fresh.c = c->c;
  change_t ch = {.c = &fresh, .rev = range.revision, .observed = 0};
  for (size_t i = 0; i < range.n; i++) {
    apply(&ch, &range.kvs[i], 0);
    /* Only the view's kinds were copied; whatever else was read (the secrets) is wiped. */
    wagma_key_kind_t k =
        wagma_key_parse(&c->c->keys, range.kvs[i].key, range.kvs[i].key_len, NULL, NULL);
    if (k == WAGMA_KEY_UNKNOWN || k == WAGMA_KEY_LEADER || k > WAGMA_KEY_QUARANTINE)
      explicit_bzero(range.kvs[i].value, range.kvs[i].value_len);
  }
  for (size_t i = 0; i < fresh.njobs; i++)
    fresh.jobs[i]->dirty = 1;
  settle(&ch);
  int64_t count = (int64_t)range.n, rev = range.revision;
  wagma_etcd_range_free(&range);

  pthread_rwlock_wrlock(&c->rw);
  if (c->c->hub)
    wg_hub_lock(c->c->hub);
  for (size_t i = 0; i < fresh.njobs; i++) {
    cjob_t *nj = fresh.jobs[i], *oj = wg_cache_job(c, nj->id);
    if (oj && json_array_size(oj->timeline)) { /* keep what was observed, add what is new */
      seed_timeline(&fresh, nj);
      json_t *seeded = nj->timeline;
      nj->timeline = json_deep_copy(oj->timeline);
      tl_recount(nj);
      size_t k;
      json_t *x;
      json_array_foreach(seeded, k, x) tl_add(nj, json_incref(x));
      json_decref(seeded);
    } else {
      seed_timeline(&fresh, nj);
    }
    if (oj && oj->npoints && !nj->npoints) { /* the series only grows from progress reports */
      nj->points = oj->points;
      nj->npoints = oj->npoints;
      nj->cappoints = oj->cappoints;
      nj->agents = oj->agents;
      nj->agent_last = oj->agent_last;
      nj->nagents = oj->nagents;
      oj->points = NULL;
      oj->agents = NULL;
      oj->agent_last = NULL;
      oj->npoints = oj->cappoints = 0;
      oj->nagents = 0;
    }
  }
  view_free(c);
  c->jobs = fresh.jobs;
  c->njobs = fresh.njobs;
  c->capjobs = fresh.capjobs;
  c->agents = fresh.agents;
  c->assigns = fresh.assigns;
  c->quars = fresh.quars;
  c->applied = rev;
  c->count = count;
  if (c->c->hub) {
    resnap_ctx_t r = {.c = c};
    wg_hub_foreach_locked(c->c->hub, resnap, &r);
    wg_hub_unlock(c->c->hub);
  }
  pthread_rwlock_unlock(&c->rw);
  pthread_mutex_lock(&c->mu);
  c->seen_applied = rev;
  pthread_mutex_unlock(&c->mu);
  return 0;
}

/* Loads the view and starts its watch after the load's revision. 0: the view is valid. */
static int reload(wg_cache_t *c) {
  wagma_etcd_watch_stop(c->watch);
  c->watch = NULL;
  int e = load(c);
  if (e)
    return e;
  char root[256];
  wagma_key_root(&c->c->keys, root, sizeof root);
  pthread_rwlock_rdlock(&c->rw);
  wagma_etcd_watch_options_t opt = {.prefix = 1, .start_revision = c->applied + 1};
  pthread_rwlock_unlock(&c->rw);
  e = wagma_etcd_watch_start(c->c->etcd, root, &opt, on_watch, c, &c->watch);
  if (e) {
    wg_logf(c->c->log, c->c->log_user, WAGMA_LOG_DEBUG, "read cache: watch: %s",
            wagma_etcd_errmsg(c->c->etcd));
    c->watch = NULL;
    return e;
  }
  pthread_rwlock_wrlock(&c->rw);
  c->valid = 1;
  pthread_rwlock_unlock(&c->rw);
  return 0;
}

/* ---- syncs ----------------------------------------------------------------------------------- */

static void timed_wait(wg_cache_t *c, double seconds);

/* The full check of a sync (see the top of the file): the keys modified since the view's
 * revision and the number of keys, one keys-only Range of the prefix (etcd reads every key of
 * it). Verifies at t0, or leaves the revision the watch must deliver; ping_rev is the
 * revision the one-key Range saw. Under mu, released during the call. */
static void sync_full(wg_cache_t *c, double t0, int64_t ping_rev) {
  char root[256];
  pthread_mutex_unlock(&c->mu);
  pthread_rwlock_rdlock(&c->rw);
  int valid = c->valid;
  int64_t a = c->applied, count = c->count;
  pthread_rwlock_unlock(&c->rw);
  if (!valid) {
    pthread_mutex_lock(&c->mu);
    return;
  }
  wagma_key_root(&c->c->keys, root, sizeof root);
  wagma_etcd_range_t r = {0};
  wagma_etcd_range_options_t opt = {
      .prefix = 1, .keys_only = 1, .limit = 1, .min_mod_revision = a + 1};
  int e = wagma_etcd_range(c->c->etcd, root, &opt, &r);
  pthread_mutex_lock(&c->mu);
  if (e) {
    c->failures++;
  } else if (r.n == 0 && r.count == count) {
    if (t0 > c->verified)
      c->verified = t0;
    if (a < ping_rev) /* etcd's revision moved past the view with no change here */
      c->outside_writes = 1;
  } else if (c->seen_applied >= r.revision) { /* the watch delivered R already */
    if (t0 > c->verified)
      c->verified = t0;
  } else if (!c->pending_rev || r.revision >= c->pending_rev) {
    c->pending_rev = r.revision;
    c->pending_t0 = t0;
  }
  wake_locked(c);
  wagma_etcd_range_free(&r);
}

/* One sync (see the top of the file). First etcd's current revision R (wagma_etcd_ping: a
 * linearizable count-only Range of one key, whatever the size of the tree): when the watch
 * has delivered R, the view holds every change committed before t0. Else the watch gets
 * SYNC_WATCH_WAIT_S to deliver R (a write it has not passed on yet), and then, or at once
 * when etcd's revision recently moved without a change under the prefix (writes of other
 * users of etcd, which the watch never delivers), the full check. Under mu, released while it
 * calls etcd. */
static void sync_once(wg_cache_t *c) {
  double t0 = wg_mono();
  pthread_mutex_unlock(&c->mu);
  int64_t rev = 0;
  int e = wagma_etcd_ping(c->c->etcd, &rev);
  pthread_mutex_lock(&c->mu);
  if (e) {
    c->failures++;
    wake_locked(c);
    return;
  }
  double until = wg_mono() + SYNC_WATCH_WAIT_S;
  while (!c->stop && !c->reload && c->seen_applied < rev && !c->outside_writes && wg_mono() < until)
    timed_wait(c, until - wg_mono());
  if (c->seen_applied >= rev) {
    if (t0 > c->verified)
      c->verified = t0;
    c->outside_writes = 0;
    wake_locked(c);
    return;
  }
  if (!c->stop && !c->reload)
    sync_full(c, t0, rev);
}

static void timed_wait(wg_cache_t *c, double seconds) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  long ns = ts.tv_nsec + (long)((seconds - (long)seconds) * 1e9);
  ts.tv_sec += (time_t)seconds + ns / 1000000000L;
  ts.tv_nsec = ns % 1000000000L;
  pthread_cond_timedwait(&c->cv, &c->mu, &ts);
}

static void *sync_main(void *arg) {
  wg_cache_t *c = arg;
  double period = c->c->read_staleness_s > 0 ? c->c->read_staleness_s / 2 : SYNC_IDLE_S;
  if (period < 0.005)
    period = 0.005;
  double next = 0;
  pthread_mutex_lock(&c->mu);
  while (!c->stop) {
    if (c->reload) {
      pthread_mutex_unlock(&c->mu);
      int e = reload(c);
      pthread_mutex_lock(&c->mu);
      if (e == 0) {
        c->reload = 0;
        c->verified = 0;
        c->pending_rev = 0;
      } else {
        c->failures++;
        wake_locked(c);
        timed_wait(c, RELOAD_BACKOFF_S);
      }
      continue;
    }
    double now = wg_mono();
    if (!c->want && now < next) {
      timed_wait(c, next - now);
      continue;
    }
    c->want = 0;
    next = wg_mono() + period;
    sync_once(c);
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

/* ---- public -------------------------------------------------------------------------------- */

int wg_cache_start(wg_coord_t *co, wg_cache_t **out) {
  wg_cache_t *c = calloc(1, sizeof *c);
  if (!c)
    return WAGMA_ENOMEM;
  c->c = co;
  pthread_rwlock_init(&c->rw, NULL);
  pthread_mutex_init(&c->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&c->cv, &ca);
  pthread_condattr_destroy(&ca);
  c->reload = reload(c) != 0; /* the thread retries */
  if (pthread_create(&c->thread, NULL, sync_main, c) != 0) {
    wg_cache_stop(c);
    return WAGMA_EIO;
  }
  c->thread_up = 1;
  *out = c;
  return 0;
}

wg_cache_t *wg_cache_detached(wg_coord_t *co) {
  wg_cache_t *c = calloc(1, sizeof *c);
  if (!c)
    return NULL;
  c->c = co;
  pthread_rwlock_init(&c->rw, NULL);
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  c->valid = 1;
  return c;
}

void wg_cache_feed(wg_cache_t *c, int status, const wagma_etcd_event_t *events, size_t n,
                   int64_t rev) {
  on_watch(c, status, events, n, rev);
}

void wg_cache_stop(wg_cache_t *c) {
  if (!c)
    return;
  pthread_mutex_lock(&c->mu);
  c->stop = 1;
  wake_locked(c);
  pthread_mutex_unlock(&c->mu);
  if (c->thread_up)
    pthread_join(c->thread, NULL);
  wagma_etcd_watch_stop(c->watch);
  view_free(c);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  pthread_rwlock_destroy(&c->rw);
  free(c);
}

void wg_cache_note_write(wg_cache_t *c, int64_t rev) {
  if (!c)
    return;
  long long cur = atomic_load(&c->last_write);
  while (rev > cur && !atomic_compare_exchange_weak(&c->last_write, &cur, rev)) {
  }
}

void wg_cache_notify(wg_cache_t *c, int efd) {
  if (!c)
    return;
  pthread_mutex_lock(&c->mu);
  int i = 0;
  while (i < c->nnotify && c->notify_fd[i] != efd)
    i++;
  if (efd >= 0 && i == c->nnotify && c->nnotify < WG_CACHE_NOTIFY_MAX)
    c->notify_fd[c->nnotify++] = efd;
  else if (efd < 0) /* -1 - fd: unregister fd */
    for (i = 0; i < c->nnotify; i++)
      if (c->notify_fd[i] == -1 - efd)
        c->notify_fd[i] = c->notify_fd[--c->nnotify];
  pthread_mutex_unlock(&c->mu);
}

int wg_cache_ready(wg_cache_t *c, double arrival, unsigned *failures, int first) {
  if (!c)
    return -1;
  pthread_mutex_lock(&c->mu);
  if (first)
    *failures = c->failures;
  int r;
  int wrote_seen = c->seen_applied >= atomic_load(&c->last_write);
  if (c->reload || c->stop || c->failures - *failures >= 2) {
    r = -1; /* reloading, or etcd does not answer: the caller reads etcd */
  } else if (c->verified > 0 && wrote_seen &&
             (c->verified >= arrival ||
              (c->c->read_staleness_s > 0 && c->verified >= arrival - c->c->read_staleness_s))) {
    r = 1;
  } else {
    r = 0; /* a sync after arrival, then the eventfd */
    c->notify_wanted = 1;
    if (!c->want) {
      c->want = 1;
      pthread_cond_broadcast(&c->cv);
    }
  }
  pthread_mutex_unlock(&c->mu);
  return r;
}

int wg_cache_fresh(wg_cache_t *c, double arrival) {
  if (!c || c->c->read_staleness_s <= 0)
    return 0;
  pthread_mutex_lock(&c->mu);
  int fresh = !c->reload && c->verified > 0 && c->verified >= arrival - c->c->read_staleness_s &&
              c->seen_applied >= atomic_load(&c->last_write);
  pthread_mutex_unlock(&c->mu);
  return fresh;
}

double wg_cache_sync(wg_cache_t *c, double since, double deadline) {
  if (!c)
    return -1;
  double got = -1;
  pthread_mutex_lock(&c->mu);
  unsigned failures = c->failures;
  while (!c->stop && !c->reload) {
    if (c->verified >= since && c->seen_applied >= atomic_load(&c->last_write)) {
      got = c->verified;
      break;
    }
    if (c->failures != failures && c->failures - failures >= 2)
      break; /* etcd does not answer: the caller reads etcd (and says so) */
    double now = wg_mono();
    if (now >= deadline)
      break;
    c->want = 1;
    pthread_cond_broadcast(&c->cv);
    timed_wait(c, deadline - now);
  }
  pthread_mutex_unlock(&c->mu);
  return got;
}
