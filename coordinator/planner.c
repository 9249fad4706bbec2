/* coordinator/planner.c — glue between the scheduler and the plan library: ordered members
 * (names, addresses, joiner flags) + job parameters -> wagma_plan_build -> JSON.
 *
 * The JSON is written here by a direct encoder that produces exactly the bytes of
 * wagma_plan_to_json (same fields, order and compact form; a unit test compares them): the
 * generic jansson path costs ~50-100 ms at P = 10000 (one json_t per rank and group), this
 * one a few ms. wagma_plan_from_json (what agents run) reads it unchanged.
 *
 * Ranks are the members' order (the scheduler keeps survivors in their previous rank order
 * and appends joiners), so a membership change moves as few ranks as possible. Pure apart from
 * the clock; thread-safe. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coord.h"
#include "wagma/collective.h"

typedef struct out {
  char *p;
  size_t len, cap;
  int oom;
} out_t;

static void reserve_bytes(out_t *o, size_t n) {
  if (o->oom || o->len + n + 1 <= o->cap)
    return;
  size_t cap = o->cap ? o->cap : 4096;
  while (cap < o->len + n + 1)
    cap *= 2;
  char *np = realloc(o->p, cap);
  if (!np) {
    o->oom = 1;
    return;
  }
  o->p = np;
  o->cap = cap;
}

static void put_raw(out_t *o, const char *s, size_t n) {
  reserve_bytes(o, n);
  if (o->oom)
    return;
  memcpy(o->p + o->len, s, n);
  o->len += n;
  o->p[o->len] = '\0';
}

static void put_str(out_t *o, const char *s) {
  put_raw(o, s, strlen(s));
}

static void put_u64(out_t *o, uint64_t v) {
  char b[24];
  int n = snprintf(b, sizeof b, "%llu", (unsigned long long)v);
  put_raw(o, b, (size_t)n);
}

/* Small non-negative ints (ranks) without snprintf. */
static void put_int(out_t *o, int v) {
  char b[12];
  int n = 0;
  if (v < 0)
    return put_u64(o, 0);
  do {
    b[sizeof b - 1 - n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v);
  put_raw(o, b + sizeof b - n, (size_t)n);
}

/* A JSON string the way jansson escapes it (" \\ control characters; UTF-8 kept). Returns
 * WAGMA_EINVAL for invalid UTF-8 (jansson refuses those too). */
static int put_json_string(out_t *o, const char *s) {
  put_raw(o, "\"", 1);
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    if (*c == '"' || *c == '\\') {
      char e[2] = {'\\', (char)*c};
      put_raw(o, e, 2);
    } else if (*c < 0x20) {
      char e[8];
      switch (*c) {
      case '\b': put_raw(o, "\\b", 2); break;
      case '\f': put_raw(o, "\\f", 2); break;
      case '\n': put_raw(o, "\\n", 2); break;
      case '\r': put_raw(o, "\\r", 2); break;
      case '\t': put_raw(o, "\\t", 2); break;
      default: snprintf(e, sizeof e, "\\u%04X", *c); put_raw(o, e, 6);
      }
    } else if (*c >= 0x80) {
      return WAGMA_EINVAL; /* addresses and names are ASCII in practice: let jansson decide */
    } else {
      put_raw(o, (const char *)c, 1);
    }
  }
  put_raw(o, "\"", 1);
  return 0;
}

/* Encodes a plan built by wagma_plan_build (valid by construction). Ownership: *json is the
 * caller's. WAGMA_EINVAL when a string is not plain ASCII (the caller falls back). */
static int encode_plan(const wagma_plan_t *plan, char **json) {
  out_t o = {0};
  int e = 0;
  put_str(&o, "{\"epoch\":");
  put_u64(&o, plan->epoch);
  put_str(&o, ",\"start_round\":");
  put_u64(&o, plan->start_round);
  put_str(&o, ",\"group_size\":");
  put_int(&o, plan->group_size);
  put_str(&o, ",\"staleness_bound\":");
  put_int(&o, plan->staleness_bound);
  put_str(&o, plan->global_sync == WAGMA_GLOBAL_WAIT_AVOIDING
                  ? ",\"global_sync\":\"wait-avoiding\",\"members\":["
                  : ",\"global_sync\":\"barrier\",\"members\":[");
  for (int r = 0; r < plan->nranks && !e; r++) {
    put_str(&o, r ? ",{\"rank\":" : "{\"rank\":");
    put_int(&o, r);
    put_str(&o, ",\"name\":");
    e = put_json_string(&o, plan->members[r].name);
    put_str(&o, ",\"address\":");
    if (!e)
      e = put_json_string(&o, plan->members[r].address);
    put_str(&o, plan->members[r].joiner ? ",\"joiner\":true}" : ",\"joiner\":false}");
  }
  put_str(&o, "],\"phases\":[");
  for (int j = 0; j < plan->nphases && !e; j++) {
    const wagma_phase_t *ph = &plan->phases[j];
    put_str(&o, j ? ",[" : "[");
    for (int g = 0; g < ph->ngroups; g++) {
      put_str(&o, g ? ",[" : "[");
      for (int k = ph->offsets[g]; k < ph->offsets[g + 1]; k++) {
        if (k > ph->offsets[g])
          put_raw(&o, ",", 1);
        put_int(&o, ph->ranks[k]);
      }
      put_raw(&o, "]", 1);
    }
    put_raw(&o, "]", 1);
  }
  put_str(&o, "]}");
  if (o.oom)
    e = WAGMA_ENOMEM;
  if (e) {
    free(o.p);
    return e;
  }
  *json = o.p;
  return 0;
}

double wg_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double wg_monotonic(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int wg_planner_build_json(const wg_plan_request_t *req, char **json, double *seconds) {
  wagma_plan_t plan;
  int e;
  double t0 = wg_monotonic();
  memset(&plan, 0, sizeof plan);
  if (req->nmembers < 1 || req->nmembers > WAGMA_API_MAX_WORKERS)
    return WAGMA_EINVAL;
  e = wagma_plan_build(req->nmembers, req->group_size, NULL, &plan);
  if (e)
    goto out;
  plan.epoch = req->epoch;
  plan.start_round = req->start_round;
  plan.staleness_bound = req->staleness_bound;
  plan.global_sync = req->global_sync == WAGMA_SYNC_WAIT_AVOIDING ? WAGMA_GLOBAL_WAIT_AVOIDING
                                                                  : WAGMA_GLOBAL_BARRIER;
  for (int r = 0; r < req->nmembers; r++) {
    const wg_plan_member_t *m = &req->members[r];
    if (strlen(m->name) >= sizeof plan.members[r].name ||
        strlen(m->address) >= sizeof plan.members[r].address) {
      e = WAGMA_EINVAL;
      goto out;
    }
    strcpy(plan.members[r].name, m->name);
    strcpy(plan.members[r].address, m->address);
    plan.members[r].joiner = m->joiner;
  }
  if (plan.epoch > INT64_MAX || plan.start_round > INT64_MAX) {
    e = WAGMA_ERANGE;
    goto out;
  }
  e = encode_plan(&plan, json);
  if (e == WAGMA_EINVAL) /* non-ASCII strings: the library's codec decides */
    e = wagma_plan_to_json(&plan, json);
out:
  wagma_plan_free(&plan);
  if (seconds)
    *seconds = wg_monotonic() - t0;
  return e;
}
