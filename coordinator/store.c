/* coordinator/store.c — reading jobs from etcd and shaping them for REST.
 *
 * A job is every key under <prefix>/jobs/<id>/ (spec, status, plan, progress/<agent>,
 * checkpoint; the plan history plans/<epoch> is read only by the groups endpoint and skipped
 * here), read with one Range so the view is consistent at one revision. Records that do
 * not decode are skipped with a warning (an agent's bad progress must not hide the job).
 * No state; thread-safe. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord.h"
#include "store.h"
#include "wagma/log_internal.h"

void wg_job_record_free(wg_job_record_t *rec) {
  wagma_job_status_free(&rec->status);
  free(rec->plan_json);
  free(rec->progress);
  memset(rec, 0, sizeof *rec);
}

int wg_job_record_from_kvs(wg_coord_t *c, const char *id, const wagma_etcd_kv_t *kvs, size_t n,
                           wg_job_record_t *rec) {
  char job[WAGMA_API_NAME_MAX], agent[WAGMA_API_NAME_MAX];
  wagma_api_error_t err;
  int e = 0;
  memset(rec, 0, sizeof *rec);
  snprintf(rec->id, sizeof rec->id, "%s", id);
  size_t nprog = 0;
  for (size_t i = 0; i < n; i++)
    nprog +=
        wagma_key_parse(&c->keys, kvs[i].key, kvs[i].key_len, NULL, NULL) == WAGMA_KEY_JOB_PROGRESS;
  if (nprog) {
    rec->progress = calloc(nprog, sizeof *rec->progress);
    if (!rec->progress)
      return WAGMA_ENOMEM;
  }
  for (size_t i = 0; i < n; i++) {
    const wagma_etcd_kv_t *kv = &kvs[i];
    job[0] = agent[0] = '\0';
    wagma_key_kind_t kind = wagma_key_parse(&c->keys, kv->key, kv->key_len, job, agent);
    if (strcmp(job, id) != 0)
      continue;
    switch (kind) {
    case WAGMA_KEY_JOB_SPEC:
      if (wagma_job_spec_from_json(kv->value, kv->value_len, &rec->spec, &err) == 0) {
        rec->has_spec = 1;
        rec->spec_mod = kv->mod_revision;
      } else {
        wg_logf(c->log, c->log_user, WAGMA_LOG_WARN, "%s: bad spec (%s: %s)", kv->key, err.field,
                err.message);
      }
      break;
    case WAGMA_KEY_JOB_STATUS:
      if (wagma_job_status_from_json(kv->value, kv->value_len, &rec->status, &err) == 0) {
        rec->has_status = 1;
        rec->status_mod = kv->mod_revision;
      } else {
        wg_logf(c->log, c->log_user, WAGMA_LOG_WARN, "%s: bad status (%s: %s)", kv->key, err.field,
                err.message);
      }
      break;
    case WAGMA_KEY_JOB_PLAN:
      rec->plan_json = malloc(kv->value_len + 1);
      if (!rec->plan_json) {
        e = WAGMA_ENOMEM;
        goto out;
      }
      memcpy(rec->plan_json, kv->value, kv->value_len);
      rec->plan_json[kv->value_len] = '\0';
      rec->plan_len = kv->value_len;
      rec->plan_mod = kv->mod_revision;
      break;
    case WAGMA_KEY_JOB_CHECKPOINT:
      if (wagma_checkpoint_record_from_json(kv->value, kv->value_len, &rec->checkpoint, &err) == 0)
        rec->has_checkpoint = 1;
      else
        wg_logf(c->log, c->log_user, WAGMA_LOG_WARN, "%s: bad checkpoint record (%s: %s)", kv->key,
                err.field, err.message);
      break;
    case WAGMA_KEY_JOB_PROGRESS: {
      wg_progress_entry_t *pe = &rec->progress[rec->nprogress];
      if (wagma_progress_from_json(kv->value, kv->value_len, &pe->progress, &err) == 0) {
        snprintf(pe->agent, sizeof pe->agent, "%s", agent);
        pe->mod = kv->mod_revision;
        rec->nprogress++;
      } else {
        wg_logf(c->log, c->log_user, WAGMA_LOG_DEBUG, "%s: bad progress (%s: %s)", kv->key,
                err.field, err.message);
      }
      break;
    }
    default: break;
    }
  }
out:
  if (e)
    wg_job_record_free(rec);
  return e;
}

int wg_store_load_job(wg_coord_t *c, const char *id, wg_job_record_t *rec) {
  char key[256];
  wagma_etcd_range_t range = {0};
  wagma_etcd_range_options_t opt = {.prefix = 1};
  int e = wagma_key_job_prefix(&c->keys, id, key, sizeof key);
  if (e)
    return WAGMA_ENOTFOUND;
  if ((e = wagma_etcd_range(c->etcd, key, &opt, &range)))
    return e;
  e = wg_job_record_from_kvs(c, id, range.kvs, range.n, rec);
  if (e == 0 && !rec->has_spec) {
    wg_job_record_free(rec);
    e = WAGMA_ENOTFOUND;
  }
  wagma_etcd_range_free(&range);
  return e;
}

uint64_t wg_job_record_iteration(const wg_job_record_t *rec) {
  uint64_t it = rec->status.iteration;
  for (int i = 0; i < rec->nprogress; i++) {
    const wagma_progress_t *p = &rec->progress[i].progress;
    if (p->epoch >= rec->status.epoch && p->iteration > it)
      it = p->iteration;
  }
  return it;
}

void wg_job_record_summary(const wg_job_record_t *rec, double finished, wagma_job_summary_t *out) {
  const wagma_progress_t **take =
      calloc((size_t)(rec->nprogress ? rec->nprogress : 1), sizeof *take);
  int n = 0, any_done = 0;
  for (int i = 0; i < rec->nprogress; i++) {
    const wagma_progress_t *p = &rec->progress[i].progress;
    any_done |= p->epoch >= rec->status.epoch && p->state == WAGMA_PROGRESS_DONE;
  }
  for (int i = 0; take && i < rec->nprogress; i++) {
    const wagma_progress_t *p = &rec->progress[i].progress;
    if (p->epoch >= rec->status.epoch &&
        (any_done ? p->state == WAGMA_PROGRESS_DONE : p->state != WAGMA_PROGRESS_UNAVAILABLE))
      take[n++] = p;
  }
  double started = rec->status.started;
  wagma_job_summary_of(out, take, n, wg_job_record_iteration(rec),
                       started > 0 && finished > started ? finished - started : 0);
  free(take);
}

static const wagma_progress_t *find_progress(const wg_job_record_t *rec, const char *agent) {
  /* etcd returns keys sorted, so progress entries are sorted by agent name. */
  int lo = 0, hi = rec->nprogress - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    int d = strcmp(rec->progress[mid].agent, agent);
    if (d == 0)
      return &rec->progress[mid].progress;
    if (d < 0)
      lo = mid + 1;
    else
      hi = mid - 1;
  }
  return NULL;
}

json_t *wg_job_record_to_value(const wg_job_record_t *rec, int with_members) {
  json_t *o = json_object();
  if (!o)
    return NULL;
  wagma_job_status_t st = rec->status; /* shallow: members shared, not freed here */
  st.iteration = wg_job_record_iteration(rec);
  json_object_set_new(o, "id", json_string(rec->id));
  json_object_set_new(o, "spec", wagma_job_spec_to_value(&rec->spec));
  json_object_set_new(o, "status", wagma_job_status_to_value(&st));
  json_object_set_new(o, "warnings", wagma_job_spec_warnings_value(&rec->spec));
  if (!with_members)
    return o;
  json_t *members = json_array();
  json_t *plan = rec->plan_json ? json_loadb(rec->plan_json, rec->plan_len, 0, NULL) : NULL;
  json_t *pm = plan ? json_object_get(plan, "members") : NULL;
  size_t i;
  json_t *m;
  json_array_foreach(pm, i, m) {
    json_t *name = json_object_get(m, "name");
    const char *nm = json_string_value(name);
    json_t *out = json_object();
    json_object_set(out, "rank", json_object_get(m, "rank"));
    json_object_set(out, "name", name);
    json_object_set(out, "address", json_object_get(m, "address"));
    json_object_set(out, "joiner", json_object_get(m, "joiner"));
    const wagma_progress_t *p = nm ? find_progress(rec, nm) : NULL;
    json_object_set_new(out, "progress", p ? wagma_progress_to_value(p) : json_null());
    json_array_append_new(members, out);
  }
  json_decref(plan);
  json_object_set_new(o, "members", members);
  return o;
}
