/* api/records.c — codecs of the records kept in etcd besides the spec: job status
 * (coordinator), progress, checkpoint and agent registration with its programs (agents),
 * assignment, plan history entry and quarantine record (coordinator), and the REST error
 * body. Decoders of agent-written records ignore unknown fields (newer agents may add some);
 * the status decoder is strict about types only. Pure functions, thread-safe. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_util.h"
#include "wagma/api.h"

#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define U64MAX_JSON ((uint64_t)INT64_MAX)

static const char *const state_names[] = {"pending", "running", "succeeded", "failed", "stopped"};
static const char *const progress_state_names[] = {"running", "done", "failed", "unavailable"};
static const char *const device_names[] = {"cpu", "cuda"};

const char *wagma_job_state_name(wagma_job_state_t s) {
  return (int)s >= 0 && (int)s < NELEM(state_names) ? state_names[s] : "?";
}

int wagma_job_state_from_name(const char *name, wagma_job_state_t *s) {
  for (int i = 0; i < NELEM(state_names); i++) {
    if (name && strcmp(name, state_names[i]) == 0) {
      *s = (wagma_job_state_t)i;
      return 0;
    }
  }
  return WAGMA_EINVAL;
}

int wagma_job_state_terminal(wagma_job_state_t s) {
  return s == WAGMA_JOB_SUCCEEDED || s == WAGMA_JOB_FAILED || s == WAGMA_JOB_STOPPED;
}

const char *wagma_progress_state_name(wagma_progress_state_t s) {
  return (int)s >= 0 && (int)s < NELEM(progress_state_names) ? progress_state_names[s] : "?";
}

/* ---- job status ------------------------------------------------------------------------ */

void wagma_job_status_free(wagma_job_status_t *st) {
  free(st->members);
  memset(st, 0, sizeof *st);
}

int wagma_job_status_set_members(wagma_job_status_t *st, const char *const *names, int n) {
  char(*m)[WAGMA_API_NAME_MAX] = NULL;
  if (n < 0)
    return WAGMA_EINVAL;
  if (n > 0) {
    m = calloc((size_t)n, sizeof *m);
    if (!m)
      return WAGMA_ENOMEM;
    for (int i = 0; i < n; i++) {
      if (!wagma_api_name_valid(names[i])) {
        free(m);
        return WAGMA_EINVAL;
      }
      strcpy(m[i], names[i]);
    }
  }
  free(st->members);
  st->members = m;
  st->nmembers = n;
  return 0;
}

/* ---- job summary ---------------------------------------------------------------------- */

void wagma_job_summary_of(wagma_job_summary_t *s, const wagma_progress_t *const *reports, int n,
                          uint64_t iterations, double wall_time) {
  double acc = 0, loss = 0;
  memset(s, 0, sizeof *s);
  s->accuracy_mean = s->accuracy_min = s->accuracy_max = NAN;
  s->loss_mean = s->loss_min = s->loss_max = NAN;
  s->iterations = iterations;
  s->wall_time = wall_time > 0 ? wall_time : 0;
  for (int i = 0; i < n; i++) {
    const wagma_progress_t *p = reports[i];
    if (!p)
      continue;
    s->members++;
    if (isfinite(p->accuracy)) {
      acc += p->accuracy;
      s->accuracy_min = s->evaluated ? fmin(s->accuracy_min, p->accuracy) : p->accuracy;
      s->accuracy_max = s->evaluated ? fmax(s->accuracy_max, p->accuracy) : p->accuracy;
      s->evaluated++;
    }
    if (isfinite(p->loss)) {
      loss += p->loss;
      s->loss_min = s->with_loss ? fmin(s->loss_min, p->loss) : p->loss;
      s->loss_max = s->with_loss ? fmax(s->loss_max, p->loss) : p->loss;
      s->with_loss++;
    }
  }
  if (s->evaluated)
    s->accuracy_mean = acc / s->evaluated;
  if (s->with_loss)
    s->loss_mean = loss / s->with_loss;
}

int wagma_job_summary_format(const wagma_job_summary_t *s, char *buf, size_t len) {
  char acc[96], loss[96];
  if (s->evaluated == 1)
    snprintf(acc, sizeof acc, "test accuracy %.4f (1 member)", s->accuracy_mean);
  else if (s->evaluated)
    snprintf(acc, sizeof acc, "test accuracy %.4f (%.4f-%.4f over %d members)", s->accuracy_mean,
             s->accuracy_min, s->accuracy_max, s->evaluated);
  else
    snprintf(acc, sizeof acc, "no test accuracy reported");
  if (s->with_loss)
    snprintf(loss, sizeof loss, "loss %.4g", s->loss_mean);
  else
    snprintf(loss, sizeof loss, "no loss reported");
  return snprintf(buf, len, "%s, %s, %llu iterations in %.1f s", acc, loss,
                  (unsigned long long)s->iterations, s->wall_time);
}

/* {"mean","min","max"} or null */
static json_t *stats_value(int n, double mean, double min, double max) {
  return n ? json_pack("{s:f,s:f,s:f}", "mean", mean, "min", min, "max", max) : json_null();
}

static json_t *summary_value(const wagma_job_summary_t *s) {
  return json_pack(
      "{s:i,s:i,s:o,s:i,s:o,s:I,s:f}", "members", s->members, "evaluated", s->evaluated, "accuracy",
      stats_value(s->evaluated, s->accuracy_mean, s->accuracy_min, s->accuracy_max), "with_loss",
      s->with_loss, "loss", stats_value(s->with_loss, s->loss_mean, s->loss_min, s->loss_max),
      "iterations", (json_int_t)s->iterations, "wall_time", s->wall_time);
}

/* {"mean","min","max"} (all numbers, min <= mean <= max, within [lo, hi]) or null when n is 0. */
static int stats_from(const json_t *v, const char *field, int n, double lo, double hi, double *mean,
                      double *min, double *max, wagma_api_error_t *err) {
  char f[48];
  int e;
  if (!n) {
    if (!json_is_null(v) && v)
      return wg_api_fail(err, field, "must be null when no report has it");
    *mean = *min = *max = NAN;
    return 0;
  }
  if (!json_is_object(v))
    return wg_api_fail(err, field, "must be an object {mean, min, max}");
  snprintf(f, sizeof f, "%s.mean", field);
  if ((e = wg_api_num(json_object_get(v, "mean"), f, lo, 0, hi, 0, mean, err)))
    return e;
  snprintf(f, sizeof f, "%s.min", field);
  if ((e = wg_api_num(json_object_get(v, "min"), f, lo, 0, hi, 0, min, err)))
    return e;
  snprintf(f, sizeof f, "%s.max", field);
  if ((e = wg_api_num(json_object_get(v, "max"), f, lo, 0, hi, 0, max, err)))
    return e;
  return 0;
}

static int summary_from(const json_t *v, wagma_job_summary_t *s, wagma_api_error_t *err) {
  int64_t i64;
  int e;
  if (!json_is_object(v))
    return wg_api_fail(err, "summary", "must be an object");
  memset(s, 0, sizeof *s);
  if ((e = wg_api_int(json_object_get(v, "members"), "summary.members", 0, WAGMA_API_MAX_WORKERS,
                      &i64, err)))
    return e;
  s->members = (int)i64;
  if ((e = wg_api_int(json_object_get(v, "evaluated"), "summary.evaluated", 0, s->members, &i64,
                      err)))
    return e;
  s->evaluated = (int)i64;
  if ((e = wg_api_int(json_object_get(v, "with_loss"), "summary.with_loss", 0, s->members, &i64,
                      err)))
    return e;
  s->with_loss = (int)i64;
  if ((e = stats_from(json_object_get(v, "accuracy"), "summary.accuracy", s->evaluated, 0, 1,
                      &s->accuracy_mean, &s->accuracy_min, &s->accuracy_max, err)) ||
      (e = stats_from(json_object_get(v, "loss"), "summary.loss", s->with_loss, -1e300, 1e300,
                      &s->loss_mean, &s->loss_min, &s->loss_max, err)) ||
      (e = wg_api_u64(json_object_get(v, "iterations"), "summary.iterations", U64MAX_JSON,
                      &s->iterations, err)) ||
      (e = wg_api_num(json_object_get(v, "wall_time"), "summary.wall_time", 0, 0, 1e12, 0,
                      &s->wall_time, err)))
    return e;
  return 0;
}

json_t *wagma_job_status_to_value(const wagma_job_status_t *st) {
  json_t *o = json_object();
  json_t *m = json_array();
  if (!o || !m) {
    json_decref(o);
    json_decref(m);
    return NULL;
  }
  json_object_set_new(o, "state", json_string(wagma_job_state_name(st->state)));
  json_object_set_new(o, "reason", json_string(st->reason));
  json_object_set_new(o, "epoch", json_integer((json_int_t)st->epoch));
  json_object_set_new(o, "iteration", json_integer((json_int_t)st->iteration));
  json_object_set_new(o, "start_round", json_integer((json_int_t)st->start_round));
  json_object_set_new(o, "regroupings", json_integer((json_int_t)st->regroupings));
  json_object_set_new(o, "created", json_real(st->created));
  json_object_set_new(o, "started", json_real(st->started));
  json_object_set_new(o, "finished", json_real(st->finished));
  for (int i = 0; i < st->nmembers; i++)
    json_array_append_new(m, json_string(st->members[i]));
  json_object_set_new(o, "members", m);
  if (st->summary.members > 0)
    json_object_set_new(o, "summary", summary_value(&st->summary));
  return o;
}

int wagma_job_status_to_json(const wagma_job_status_t *st, char **json) {
  json_t *v = wagma_job_status_to_value(st);
  int e = wg_api_dump(v, json);
  json_decref(v);
  return e;
}

int wagma_job_status_from_json(const char *json, size_t len, wagma_job_status_t *st,
                               wagma_api_error_t *err) {
  wagma_job_status_t s;
  const char *key;
  json_t *v;
  int e = 0;
  memset(&s, 0, sizeof s);
  json_t *root = wg_api_parse_object(json, len, err);
  if (!root)
    return WAGMA_EINVAL;
  json_t *state = json_object_get(root, "state");
  if (!state) {
    e = wg_api_fail(err, "state", "is required");
    goto out;
  }
  json_object_foreach(root, key, v) {
    if (strcmp(key, "state") == 0) {
      int x;
      if ((e = wg_api_enum(v, key, state_names, NELEM(state_names), &x, err)))
        goto out;
      s.state = (wagma_job_state_t)x;
    } else if (strcmp(key, "reason") == 0) {
      if ((e = wg_api_str(v, key, s.reason, sizeof s.reason, err)))
        goto out;
    } else if (strcmp(key, "epoch") == 0) {
      if ((e = wg_api_u64(v, key, U64MAX_JSON, &s.epoch, err)))
        goto out;
    } else if (strcmp(key, "iteration") == 0) {
      if ((e = wg_api_u64(v, key, U64MAX_JSON, &s.iteration, err)))
        goto out;
    } else if (strcmp(key, "start_round") == 0) {
      if ((e = wg_api_u64(v, key, U64MAX_JSON, &s.start_round, err)))
        goto out;
    } else if (strcmp(key, "regroupings") == 0) {
      if ((e = wg_api_u64(v, key, U64MAX_JSON, &s.regroupings, err)))
        goto out;
    } else if (strcmp(key, "created") == 0) {
      if ((e = wg_api_num(v, key, 0, 0, 1e12, 0, &s.created, err)))
        goto out;
    } else if (strcmp(key, "started") == 0) {
      if ((e = wg_api_num(v, key, 0, 0, 1e12, 0, &s.started, err)))
        goto out;
    } else if (strcmp(key, "finished") == 0) {
      if ((e = wg_api_num(v, key, 0, 0, 1e12, 0, &s.finished, err)))
        goto out;
    } else if (strcmp(key, "members") == 0) {
      if (!json_is_array(v) || json_array_size(v) > WAGMA_API_MAX_WORKERS) {
        e = wg_api_fail(err, key, "must be an array of at most %d names", WAGMA_API_MAX_WORKERS);
        goto out;
      }
      size_t n = json_array_size(v);
      if (n) {
        s.members = calloc(n, sizeof *s.members);
        if (!s.members) {
          e = WAGMA_ENOMEM;
          goto out;
        }
      }
      for (size_t i = 0; i < n; i++) {
        char f[32];
        snprintf(f, sizeof f, "members[%zu]", i);
        if ((e = wg_api_str(json_array_get(v, i), f, s.members[i], WAGMA_API_NAME_MAX, err)))
          goto out;
        if (!wagma_api_name_valid(s.members[i])) {
          e = wg_api_fail(err, f, "invalid agent name");
          goto out;
        }
      }
      s.nmembers = (int)n;
    } else if (strcmp(key, "summary") == 0) {
      if ((e = summary_from(v, &s.summary, err)))
        goto out;
    }
  }
  *st = s;
  s.members = NULL;
out:
  free(s.members);
  json_decref(root);
  return e;
}

/* ---- progress ------------------------------------------------------------------------- */

void wagma_progress_init(wagma_progress_t *p) {
  memset(p, 0, sizeof *p);
  p->loss = NAN;
  p->accuracy = NAN;
}

static void set_num_or_null(json_t *o, const char *key, double x) {
  json_object_set_new(o, key, isfinite(x) ? json_real(x) : json_null());
}

json_t *wagma_progress_to_value(const wagma_progress_t *p) {
  json_t *o = json_object();
  if (!o)
    return NULL;
  json_object_set_new(o, "state", json_string(wagma_progress_state_name(p->state)));
  json_object_set_new(o, "epoch", json_integer((json_int_t)p->epoch));
  json_object_set_new(o, "iteration", json_integer((json_int_t)p->iteration));
  set_num_or_null(o, "loss", p->loss);
  set_num_or_null(o, "accuracy", p->accuracy);
  json_object_set_new(o, "step_time", json_real(p->step_time));
  json_object_set_new(o, "staleness", json_integer((json_int_t)p->staleness));
  json_object_set_new(o, "rounds_activated", json_integer((json_int_t)p->rounds_activated));
  json_object_set_new(o, "rounds_joined", json_integer((json_int_t)p->rounds_joined));
  json_object_set_new(o, "rounds_left_out", json_integer((json_int_t)p->rounds_left_out));
  json_object_set_new(o, "rounds_skipped", json_integer((json_int_t)p->rounds_skipped));
  json_object_set_new(o, "time", json_real(p->time));
  if (p->has_round) {
    json_object_set_new(o, "round", json_integer((json_int_t)p->round));
    json_object_set_new(o, "round_kind", json_string(p->round_global ? "global" : "group"));
    if (p->ngroup > 0) {
      json_t *g = json_array();
      for (int i = 0; i < p->ngroup && i < WAGMA_API_PROGRESS_GROUP_MAX; i++)
        json_array_append_new(g, json_integer(p->group[i]));
      json_object_set_new(o, "group", g);
    }
  }
  if (p->nfingerprint > 0) {
    json_t *f = json_array();
    for (int i = 0; i < p->nfingerprint && i < WAGMA_API_FINGERPRINT_MAX; i++)
      json_array_append_new(f, json_real(p->fingerprint[i]));
    json_object_set_new(o, "fingerprint", f);
  }
  if (p->error[0])
    json_object_set_new(o, "error", json_string(p->error));
  if (p->role[0])
    json_object_set_new(o, "role", json_string(p->role));
  if (p->rejoin)
    json_object_set_new(o, "rejoin", json_integer((json_int_t)p->rejoin));
  if (p->nunreachable > 0) {
    json_t *u = json_array();
    for (int i = 0; i < p->nunreachable && i < WAGMA_API_UNREACHABLE_MAX; i++)
      json_array_append_new(u, json_pack("{s:i,s:f}", "rank", p->unreachable[i].rank, "for",
                                         p->unreachable[i].seconds));
    json_object_set_new(o, "unreachable", u);
    if (p->unreachable_total > p->nunreachable)
      json_object_set_new(o, "unreachable_total", json_integer(p->unreachable_total));
  }
  return o;
}

int wagma_progress_to_json(const wagma_progress_t *p, char **json) {
  json_t *v = wagma_progress_to_value(p);
  int e = wg_api_dump(v, json);
  json_decref(v);
  return e;
}

/* A number field that may be null (NaN). */
static int num_or_null(const json_t *v, const char *f, double *out, wagma_api_error_t *err) {
  if (json_is_null(v)) {
    *out = NAN;
    return 0;
  }
  if (!json_is_number(v))
    return wg_api_fail(err, f, "must be a number or null");
  *out = json_number_value(v);
  return 0;
}

/* An array of at most cap integers in [0, max] into out[0..*n-1]. */
static int int_list(const json_t *v, const char *f, int64_t max, int *out, int cap, int *n,
                    wagma_api_error_t *err) {
  if (!json_is_array(v) || json_array_size(v) > (size_t)cap)
    return wg_api_fail(err, f, "must be an array of at most %d integers", cap);
  for (size_t i = 0; i < json_array_size(v); i++) {
    char sub[48];
    int64_t x;
    snprintf(sub, sizeof sub, "%s[%zu]", f, i);
    int e = wg_api_int(json_array_get(v, i), sub, 0, max, &x, err);
    if (e)
      return e;
    out[i] = (int)x;
  }
  *n = (int)json_array_size(v);
  return 0;
}

/* "unreachable": an array of at most WAGMA_API_UNREACHABLE_MAX {"rank","for"} objects. */
static int unreachable_list(const json_t *v, wagma_progress_t *p, wagma_api_error_t *err) {
  if (!json_is_array(v) || json_array_size(v) > WAGMA_API_UNREACHABLE_MAX)
    return wg_api_fail(err, "unreachable", "must be an array of at most %d objects",
                       WAGMA_API_UNREACHABLE_MAX);
  for (size_t i = 0; i < json_array_size(v); i++) {
    const json_t *x = json_array_get(v, i);
    char f[48];
    int64_t rank;
    snprintf(f, sizeof f, "unreachable[%zu]", i);
    if (!json_is_object(x) || !json_object_get(x, "rank") || !json_object_get(x, "for"))
      return wg_api_fail(err, f, "must be an object {\"rank\",\"for\"}");
    snprintf(f, sizeof f, "unreachable[%zu].rank", i);
    int e = wg_api_int(json_object_get(x, "rank"), f, 0, WAGMA_API_MAX_WORKERS - 1, &rank, err);
    if (e)
      return e;
    snprintf(f, sizeof f, "unreachable[%zu].for", i);
    if ((e = wg_api_num(json_object_get(x, "for"), f, 0, 0, 1e9, 0, &p->unreachable[i].seconds,
                        err)))
      return e;
    p->unreachable[i].rank = (int)rank;
  }
  p->nunreachable = (int)json_array_size(v);
  return 0;
}

int wagma_progress_from_json(const char *json, size_t len, wagma_progress_t *out,
                             wagma_api_error_t *err) {
  wagma_progress_t p;
  const char *key;
  json_t *v;
  int e = 0;
  wagma_progress_init(&p);
  json_t *root = wg_api_parse_object(json, len, err);
  if (!root)
    return WAGMA_EINVAL;
  if (!json_object_get(root, "iteration")) {
    e = wg_api_fail(err, "iteration", "is required");
    goto out;
  }
  json_object_foreach(root, key, v) {
    uint64_t *u = NULL;
    if (strcmp(key, "state") == 0) {
      int x;
      if ((e = wg_api_enum(v, key, progress_state_names, NELEM(progress_state_names), &x, err)))
        goto out;
      p.state = (wagma_progress_state_t)x;
    } else if (strcmp(key, "epoch") == 0) {
      u = &p.epoch;
    } else if (strcmp(key, "iteration") == 0) {
      u = &p.iteration;
    } else if (strcmp(key, "staleness") == 0) {
      u = &p.staleness;
    } else if (strcmp(key, "rounds_activated") == 0) {
      u = &p.rounds_activated;
    } else if (strcmp(key, "rounds_joined") == 0) {
      u = &p.rounds_joined;
    } else if (strcmp(key, "rounds_left_out") == 0) {
      u = &p.rounds_left_out;
    } else if (strcmp(key, "rounds_skipped") == 0) {
      u = &p.rounds_skipped;
    } else if (strcmp(key, "rejoin") == 0) {
      u = &p.rejoin;
    } else if (strcmp(key, "loss") == 0) {
      if ((e = num_or_null(v, key, &p.loss, err)))
        goto out;
    } else if (strcmp(key, "accuracy") == 0) {
      if ((e = num_or_null(v, key, &p.accuracy, err)))
        goto out;
    } else if (strcmp(key, "step_time") == 0) {
      if ((e = wg_api_num(v, key, 0, 0, 1e9, 0, &p.step_time, err)))
        goto out;
    } else if (strcmp(key, "time") == 0) {
      if ((e = wg_api_num(v, key, 0, 0, 1e12, 0, &p.time, err)))
        goto out;
    } else if (strcmp(key, "error") == 0) {
      if (!json_is_string(v)) {
        e = wg_api_fail(err, key, "must be a string");
        goto out;
      }
      snprintf(p.error, sizeof p.error, "%s", json_string_value(v)); /* truncates */
    } else if (strcmp(key, "role") == 0) {
      static const char *const roles[] = {WAGMA_API_ROLES};
      int x;
      if ((e = wg_api_enum(v, key, roles, NELEM(roles), &x, err)))
        goto out;
      snprintf(p.role, sizeof p.role, "%s", roles[x]);
    } else if (strcmp(key, "round") == 0) {
      u = &p.round;
      p.has_round = 1;
    } else if (strcmp(key, "round_kind") == 0) {
      static const char *const kinds[] = {"group", "global"};
      if ((e = wg_api_enum(v, key, kinds, NELEM(kinds), &p.round_global, err)))
        goto out;
    } else if (strcmp(key, "group") == 0) {
      if ((e = int_list(v, key, WAGMA_API_MAX_WORKERS - 1, p.group, WAGMA_API_PROGRESS_GROUP_MAX,
                        &p.ngroup, err)))
        goto out;
    } else if (strcmp(key, "unreachable") == 0) {
      if ((e = unreachable_list(v, &p, err)))
        goto out;
    } else if (strcmp(key, "unreachable_total") == 0) {
      int64_t x;
      if ((e = wg_api_int(v, key, 0, WAGMA_API_MAX_WORKERS, &x, err)))
        goto out;
      p.unreachable_total = (int)x;
    } else if (strcmp(key, "fingerprint") == 0) {
      if (!json_is_array(v) || json_array_size(v) > WAGMA_API_FINGERPRINT_MAX) {
        e = wg_api_fail(err, key, "must be an array of at most %d numbers",
                        WAGMA_API_FINGERPRINT_MAX);
        goto out;
      }
      for (size_t i = 0; i < json_array_size(v); i++) {
        char f[40];
        snprintf(f, sizeof f, "fingerprint[%zu]", i);
        if ((e = wg_api_num(json_array_get(v, i), f, -1e300, 0, 1e300, 0, &p.fingerprint[i], err)))
          goto out;
      }
      p.nfingerprint = (int)json_array_size(v);
    }
    if (u && (e = wg_api_u64(v, key, U64MAX_JSON, u, err)))
      goto out;
  }
  if (p.unreachable_total < p.nunreachable)
    p.unreachable_total = p.nunreachable;
  if (p.ngroup > 0 && !p.has_round) {
    e = wg_api_fail(err, "group", "needs round");
    goto out;
  }
  *out = p;
out:
  json_decref(root);
  return e;
}

/* ---- checkpoint record ------------------------------------------------------------------ */

int wagma_checkpoint_record_to_json(const wagma_checkpoint_record_t *r, char **json) {
  *json = NULL;
  if (!r->path[0])
    return WAGMA_EINVAL;
  json_t *o = json_object();
  if (!o)
    return WAGMA_ENOMEM;
  json_object_set_new(o, "path", json_string(r->path));
  json_object_set_new(o, "iteration", json_integer((json_int_t)r->iteration));
  json_object_set_new(o, "epoch", json_integer((json_int_t)r->epoch));
  json_object_set_new(o, "agent", json_string(r->agent));
  json_object_set_new(o, "time", json_real(r->time));
  int e = wg_api_dump(o, json);
  json_decref(o);
  return e;
}

int wagma_checkpoint_record_from_json(const char *json, size_t len, wagma_checkpoint_record_t *out,
                                      wagma_api_error_t *err) {
  wagma_checkpoint_record_t r;
  json_t *v;
  int e = 0;
  memset(&r, 0, sizeof r);
  json_t *root = wg_api_parse_object(json, len, err);
  if (!root)
    return WAGMA_EINVAL;
  if (!(v = json_object_get(root, "path"))) {
    e = wg_api_fail(err, "path", "is required");
    goto out;
  }
  if ((e = wg_api_str(v, "path", r.path, sizeof r.path, err)))
    goto out;
  if (!r.path[0]) {
    e = wg_api_fail(err, "path", "must not be empty");
    goto out;
  }
  if (!(v = json_object_get(root, "iteration"))) {
    e = wg_api_fail(err, "iteration", "is required");
    goto out;
  }
  if ((e = wg_api_u64(v, "iteration", U64MAX_JSON, &r.iteration, err)))
    goto out;
  if ((v = json_object_get(root, "epoch")) &&
      (e = wg_api_u64(v, "epoch", U64MAX_JSON, &r.epoch, err)))
    goto out;
  if ((v = json_object_get(root, "agent")) &&
      (e = wg_api_str(v, "agent", r.agent, sizeof r.agent, err)))
    goto out;
  if ((v = json_object_get(root, "time")) &&
      (e = wg_api_num(v, "time", 0, 0, 1e12, 0, &r.time, err)))
    goto out;
  *out = r;
out:
  json_decref(root);
  return e;
}

/* ---- plan history entry ---------------------------------------------------------------- */

static const char *const sync_names[] = {"barrier", "wait-avoiding"};

void wagma_plan_record_free(wagma_plan_record_t *r) {
  free(r->members);
  memset(r, 0, sizeof *r);
}

int wagma_plan_record_to_json(const wagma_plan_record_t *r, char **json) {
  char hash[24];
  *json = NULL;
  json_t *o = json_object(), *m = json_array();
  if (!o || !m) {
    json_decref(o);
    json_decref(m);
    return WAGMA_ENOMEM;
  }
  snprintf(hash, sizeof hash, "%016llx", (unsigned long long)r->phases_hash);
  json_object_set_new(o, "epoch", json_integer((json_int_t)r->epoch));
  json_object_set_new(o, "start_round", json_integer((json_int_t)r->start_round));
  json_object_set_new(o, "group_size", json_integer(r->group_size));
  json_object_set_new(o, "staleness_bound", json_integer(r->staleness_bound));
  json_object_set_new(o, "global_sync",
                      json_string(sync_names[r->global_sync == WAGMA_SYNC_WAIT_AVOIDING]));
  json_object_set_new(o, "phases_hash", json_string(hash));
  for (int i = 0; i < r->nmembers; i++)
    json_array_append_new(m, json_string(r->members[i]));
  json_object_set_new(o, "members", m);
  int e = wg_api_dump(o, json);
  json_decref(o);
  return e;
}

int wagma_plan_record_from_json(const char *json, size_t len, wagma_plan_record_t *out,
                                wagma_api_error_t *err) {
  wagma_plan_record_t r;
  json_t *v;
  int64_t i64;
  int e = 0, x;
  memset(&r, 0, sizeof r);
  json_t *root = wg_api_parse_object(json, len, err);
  if (!root)
    return WAGMA_EINVAL;
  static const char *const required[] = {"epoch",           "start_round", "group_size",
                                         "staleness_bound", "global_sync", "phases_hash",
                                         "members"};
  for (int i = 0; i < NELEM(required); i++)
    if (!json_object_get(root, required[i])) {
      e = wg_api_fail(err, required[i], "is required");
      goto out;
    }
  if ((e = wg_api_u64(json_object_get(root, "epoch"), "epoch", U64MAX_JSON, &r.epoch, err)) ||
      (e = wg_api_u64(json_object_get(root, "start_round"), "start_round", U64MAX_JSON,
                      &r.start_round, err)))
    goto out;
  if ((e = wg_api_int(json_object_get(root, "group_size"), "group_size", 2, 1024, &i64, err)))
    goto out;
  r.group_size = (int)i64;
  if ((e = wg_api_int(json_object_get(root, "staleness_bound"), "staleness_bound", 1, 1000000, &i64,
                      err)))
    goto out;
  r.staleness_bound = (int)i64;
  if ((e = wg_api_enum(json_object_get(root, "global_sync"), "global_sync", sync_names,
                       NELEM(sync_names), &x, err)))
    goto out;
  r.global_sync = x ? WAGMA_SYNC_WAIT_AVOIDING : WAGMA_SYNC_BARRIER;
  v = json_object_get(root, "phases_hash");
  const char *h = json_string_value(v);
  int hex = h && strlen(h) == 16;
  for (int i = 0; hex && i < 16; i++)
    hex = (h[i] >= '0' && h[i] <= '9') || (h[i] >= 'a' && h[i] <= 'f');
  if (!hex) {
    e = wg_api_fail(err, "phases_hash", "must be 16 lowercase hex digits");
    goto out;
  }
  r.phases_hash = strtoull(h, NULL, 16);
  v = json_object_get(root, "members");
  size_t n = json_array_size(v);
  if (!json_is_array(v) || n < 1 || n > WAGMA_API_MAX_WORKERS) {
    e = wg_api_fail(err, "members", "must be an array of 1 to %d names", WAGMA_API_MAX_WORKERS);
    goto out;
  }
  if (!(r.members = calloc(n, sizeof *r.members))) {
    e = WAGMA_ENOMEM;
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    char f[32];
    snprintf(f, sizeof f, "members[%zu]", i);
    if ((e = wg_api_str(json_array_get(v, i), f, r.members[i], WAGMA_API_NAME_MAX, err)))
      goto out;
    if (!wagma_api_name_valid(r.members[i])) {
      e = wg_api_fail(err, f, "invalid agent name");
      goto out;
    }
  }
  r.nmembers = (int)n;
  *out = r;
  r.members = NULL;
out:
  free(r.members);
  json_decref(root);
  return e;
}

/* ---- agent registration and assignment -------------------------------------------------- */

int wagma_agent_has_program(const wagma_agent_info_t *a, const char *name) {
  int lo = 0, hi = a->nprograms;
  while (name && name[0] && lo < hi) {
    int mid = lo + (hi - lo) / 2, d = strcmp(a->programs[mid], name);
    if (d == 0)
      return 1;
    if (d < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return 0;
}

static int cmp_program(const void *x, const void *y) {
  return strcmp(x, y);
}

/* "programs": [names] into a (nprograms, programs sorted); absent = none. */
static int decode_programs(const json_t *v, wagma_agent_info_t *a, wagma_api_error_t *err) {
  char f[32];
  size_t i;
  json_t *item;
  if (!json_is_array(v))
    return wg_api_fail(err, "programs", "must be an array of program names");
  if (json_array_size(v) > WAGMA_API_AGENT_PROGRAMS_MAX)
    return wg_api_fail(err, "programs", "at most %d programs", WAGMA_API_AGENT_PROGRAMS_MAX);
  json_array_foreach(v, i, item) {
    int e;
    snprintf(f, sizeof f, "programs[%zu]", i);
    if ((e = wg_api_str(item, f, a->programs[i], sizeof a->programs[i], err)))
      return e;
    if (!wagma_program_name_valid(a->programs[i]))
      return wg_api_fail(err, f,
                         "must be a program name: 1-63 characters of [A-Za-z0-9._-], not "
                         "starting with '.' or '-'");
  }
  a->nprograms = (int)json_array_size(v);
  qsort(a->programs, (size_t)a->nprograms, sizeof a->programs[0], cmp_program);
  for (int k = 1; k < a->nprograms; k++)
    if (strcmp(a->programs[k - 1], a->programs[k]) == 0)
      return wg_api_fail(err, "programs", "lists %s twice", a->programs[k]);
  return 0;
}

json_t *wagma_agent_info_to_value(const wagma_agent_info_t *a) {
  json_t *o = json_object(), *progs = json_array();
  if (!o || !progs) {
    json_decref(o);
    json_decref(progs);
    return NULL;
  }
  for (int i = 0; i < a->nprograms && i < WAGMA_API_AGENT_PROGRAMS_MAX; i++)
    json_array_append_new(
        progs, json_stringn(a->programs[i], strnlen(a->programs[i], sizeof a->programs[i])));
  json_object_set_new(o, "address", json_string(a->address));
  json_object_set_new(o, "device", json_string(wagma_device_name(a->device)));
  json_object_set_new(o, "capacity", json_integer(a->capacity));
  json_object_set_new(o, "version", json_string(a->version));
  json_object_set_new(o, "started", json_real(a->started));
  json_object_set_new(o, "programs", progs);
  if (a->reached > 0)
    json_object_set_new(o, "reached", json_real(a->reached));
  return o;
}

int wagma_agent_info_to_json(const wagma_agent_info_t *a, char **json) {
  json_t *v = wagma_agent_info_to_value(a);
  int e = wg_api_dump(v, json);
  json_decref(v);
  return e;
}

int wagma_agent_info_from_json(const char *json, size_t len, wagma_agent_info_t *out,
                               wagma_api_error_t *err) {
  wagma_agent_info_t a;
  json_t *v;
  int e = 0;
  int64_t i64;
  memset(&a, 0, sizeof a);
  a.capacity = 1;
  json_t *root = wg_api_parse_object(json, len, err);
  if (!root)
    return WAGMA_EINVAL;
  if (!(v = json_object_get(root, "address"))) {
    e = wg_api_fail(err, "address", "is required");
    goto out;
  }
  if ((e = wg_api_str(v, "address", a.address, sizeof a.address, err)))
    goto out;
  if (!a.address[0] || !strchr(a.address, ':')) {
    e = wg_api_fail(err, "address", "must be host:port");
    goto out;
  }
  if ((v = json_object_get(root, "device"))) {
    int d;
    if ((e = wg_api_enum(v, "device", device_names, NELEM(device_names), &d, err)))
      goto out;
    a.device = (wagma_device_t)d;
  }
  if ((v = json_object_get(root, "capacity"))) {
    if ((e = wg_api_int(v, "capacity", 1, 1024, &i64, err)))
      goto out;
    a.capacity = (int)i64;
  }
  if ((v = json_object_get(root, "version")) &&
      (e = wg_api_str(v, "version", a.version, sizeof a.version, err)))
    goto out;
  if ((v = json_object_get(root, "started")) &&
      (e = wg_api_num(v, "started", 0, 0, 1e12, 0, &a.started, err)))
    goto out;
  if ((v = json_object_get(root, "programs")) && (e = decode_programs(v, &a, err)))
    goto out;
  if ((v = json_object_get(root, "reached")) &&
      (e = wg_api_num(v, "reached", 0, 0, 1e12, 0, &a.reached, err)))
    goto out;
  *out = a;
out:
  json_decref(root);
  return e;
}

int wagma_assignment_to_json(const wagma_assignment_t *a, char **json) {
  json_t *o = json_object();
  if (!o)
    return WAGMA_ENOMEM;
  json_object_set_new(o, "job", json_string(a->job));
  json_object_set_new(o, "epoch", json_integer((json_int_t)a->epoch));
  int e = wg_api_dump(o, json);
  json_decref(o);
  return e;
}

int wagma_assignment_from_json(const char *json, size_t len, wagma_assignment_t *out,
                               wagma_api_error_t *err) {
  wagma_assignment_t a;
  json_t *v;
  int e = 0;
  memset(&a, 0, sizeof a);
  json_t *root = wg_api_parse_object(json, len, err);
  if (!root)
    return WAGMA_EINVAL;
  if (!(v = json_object_get(root, "job"))) {
    e = wg_api_fail(err, "job", "is required");
    goto out;
  }
  if ((e = wg_api_str(v, "job", a.job, sizeof a.job, err)))
    goto out;
  if (!wagma_api_name_valid(a.job)) {
    e = wg_api_fail(err, "job", "invalid job name");
    goto out;
  }
  if ((v = json_object_get(root, "epoch")) &&
      (e = wg_api_u64(v, "epoch", U64MAX_JSON, &a.epoch, err)))
    goto out;
  *out = a;
out:
  json_decref(root);
  return e;
}

/* ---- quarantine record ---------------------------------------------------------------- */

json_t *wagma_quarantine_to_value(const wagma_quarantine_t *q) {
  json_t *o = json_object();
  if (!o)
    return NULL;
  json_object_set_new(o, "reason", json_string(q->reason));
  json_object_set_new(o, "job", json_string(q->job));
  json_object_set_new(o, "since", json_real(q->since));
  json_object_set_new(o, "until", json_real(q->until));
  json_object_set_new(o, "registration", json_integer((json_int_t)q->registration));
  json_object_set_new(o, "refusal", json_integer((json_int_t)q->refusal));
  if (q->nprobe > 0) {
    json_t *pr = json_array();
    for (int i = 0; i < q->nprobe && i < WAGMA_API_UNREACHABLE_MAX; i++)
      json_array_append_new(pr, json_string(q->probe[i]));
    json_object_set_new(o, "probe", pr);
    json_object_set_new(o, "reachable", json_real(q->reachable));
  }
  return o;
}

int wagma_quarantine_to_json(const wagma_quarantine_t *q, char **json) {
  json_t *v = wagma_quarantine_to_value(q);
  int e = wg_api_dump(v, json);
  json_decref(v);
  return e;
}

int wagma_quarantine_from_json(const char *json, size_t len, wagma_quarantine_t *out,
                               wagma_api_error_t *err) {
  wagma_quarantine_t q;
  json_t *v;
  int e = 0;
  int64_t i64;
  memset(&q, 0, sizeof q);
  json_t *root = wg_api_parse_object(json, len, err);
  if (!root)
    return WAGMA_EINVAL;
  if (!(v = json_object_get(root, "registration"))) {
    e = wg_api_fail(err, "registration", "is required");
    goto out;
  }
  if ((e = wg_api_int(v, "registration", 1, INT64_MAX, &i64, err)))
    goto out;
  q.registration = i64;
  if ((v = json_object_get(root, "reason"))) {
    if (!json_is_string(v)) {
      e = wg_api_fail(err, "reason", "must be a string");
      goto out;
    }
    snprintf(q.reason, sizeof q.reason, "%s", json_string_value(v)); /* truncates */
  }
  if ((v = json_object_get(root, "job")) && (e = wg_api_str(v, "job", q.job, sizeof q.job, err)))
    goto out;
  if ((v = json_object_get(root, "since")) &&
      (e = wg_api_num(v, "since", 0, 0, 1e12, 0, &q.since, err)))
    goto out;
  if ((v = json_object_get(root, "until")) &&
      (e = wg_api_num(v, "until", 0, 0, 1e12, 0, &q.until, err)))
    goto out;
  if ((v = json_object_get(root, "refusal"))) {
    if ((e = wg_api_int(v, "refusal", 0, INT64_MAX, &i64, err)))
      goto out;
    q.refusal = i64;
  }
  if ((v = json_object_get(root, "probe"))) {
    size_t i;
    json_t *x;
    if (!json_is_array(v) || json_array_size(v) > WAGMA_API_UNREACHABLE_MAX) {
      e = wg_api_fail(err, "probe", "must be an array of at most %d addresses",
                      WAGMA_API_UNREACHABLE_MAX);
      goto out;
    }
    json_array_foreach(v, i, x) {
      char f[32];
      snprintf(f, sizeof f, "probe[%zu]", i);
      if ((e = wg_api_str(x, f, q.probe[i], sizeof q.probe[i], err)))
        goto out;
      if (!strchr(q.probe[i], ':')) {
        e = wg_api_fail(err, f, "must be host:port");
        goto out;
      }
    }
    q.nprobe = (int)json_array_size(v);
  }
  if ((v = json_object_get(root, "reachable")) &&
      (e = wg_api_num(v, "reachable", 0, 0, 1e12, 0, &q.reachable, err)))
    goto out;
  *out = q;
out:
  json_decref(root);
  return e;
}

/* ---- REST error body ------------------------------------------------------------------ */

char *wagma_api_error_body(const char *code, const char *message, const char *field) {
  json_t *o = json_object(), *inner = json_object();
  char *s = NULL;
  if (!o || !inner) {
    json_decref(o);
    json_decref(inner);
    return NULL;
  }
  json_object_set_new(inner, "code", json_string(code ? code : "error"));
  /* json_string rejects invalid UTF-8: fall back to a fixed message. */
  json_t *msg = json_string(message ? message : "");
  json_object_set_new(inner, "message", msg ? msg : json_string("(message not UTF-8)"));
  if (field && *field) {
    json_t *f = json_string(field);
    if (f)
      json_object_set_new(inner, "field", f);
  }
  json_object_set_new(o, "error", inner);
  s = json_dumps(o, WG_JSON_FLAGS);
  json_decref(o);
  return s;
}
