/* collective/plan_json.c — the JSON codec of a plan, shape in wagma/collective.h:
 * {"epoch":3,"start_round":120,"group_size":4,"staleness_bound":8,"global_sync":"barrier",
 *  "members":[{"rank":0,"name":"a0","address":"127.0.0.1:7000","joiner":false},...],
 *  "phases":[[[0,1,2,3],[4,5,6,7]],...]}
 *
 * Design note. Pure functions, no threads. Encoding validates the plan first, so everything
 * published decodes, then writes the text directly with a growable string (a json_t tree per
 * rank and group cost ~20-100 ms at P = 10000); the bytes are exactly jansson's compact dump
 * of the documented object (the tests compare both).
 *
 * Decoding is strict: every field is required, unknown fields and duplicate keys are rejected,
 * members[i].rank must be i, and every error names its field as a path ("members[2].name",
 * "phases[1][0][3]"). The decoder checks ranges and duplicates itself before it writes into
 * the group table (so nothing overflows), then wagma_plan_validate checks the rest (order,
 * coverage, connectivity). P is the length of "members". */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "wagma/collective.h"
#include "wagma/log_internal.h"

#define PLAN_JSON_MAX_PHASES 1024

static const char *const sync_names[] = {"barrier", "wait-avoiding"};

/* ---------------------------------------------------------------------------------------- */
/* Encoding                                                                                 */

/* A growable string: every append reserves first; after a failed allocation the builder only
 * remembers the failure (oom), so callers check once at the end. buf is NUL-terminated. */
typedef struct strbuf {
  char *buf;
  size_t len, cap;
  int oom;
} strbuf_t;

static int sb_reserve(strbuf_t *sb, size_t n) {
  if (sb->oom)
    return -1;
  if (sb->len + n + 1 <= sb->cap)
    return 0;
  size_t cap = sb->cap ? sb->cap : 4096;
  while (cap < sb->len + n + 1)
    cap *= 2;
  char *grown = realloc(sb->buf, cap);
  if (!grown) {
    sb->oom = 1;
    return -1;
  }
  sb->buf = grown;
  sb->cap = cap;
  return 0;
}

static void sb_put(strbuf_t *sb, const char *s, size_t n) {
  if (sb_reserve(sb, n) != 0)
    return;
  memcpy(sb->buf + sb->len, s, n);
  sb->len += n;
  sb->buf[sb->len] = '\0';
}

static void sb_puts(strbuf_t *sb, const char *s) {
  sb_put(sb, s, strlen(s));
}

/* Decimal, as jansson writes a json_integer ("%lld"). */
static void sb_put_int(strbuf_t *sb, int64_t v) {
  char digits[24];
  size_t n = 0;
  uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
  do {
    digits[sizeof(digits) - 1 - n++] = (char)('0' + u % 10);
    u /= 10;
  } while (u);
  if (v < 0)
    digits[sizeof(digits) - 1 - n++] = '-';
  sb_put(sb, digits + sizeof(digits) - n, n);
}

/* Length of the well-formed UTF-8 sequence at s (1..4), or 0: the rules of jansson's
 * json_string (no overlong forms, no surrogates, nothing above U+10FFFF). */
static size_t utf8_sequence_length(const unsigned char *s) {
  size_t n;
  uint32_t cp;
  if (s[0] < 0x80)
    return 1;
  if (s[0] >= 0xC2 && s[0] <= 0xDF) {
    n = 2;
    cp = s[0] & 0x1F;
  } else if (s[0] >= 0xE0 && s[0] <= 0xEF) {
    n = 3;
    cp = s[0] & 0x0F;
  } else if (s[0] >= 0xF0 && s[0] <= 0xF4) {
    n = 4;
    cp = s[0] & 0x07;
  } else {
    return 0;
  }
  for (size_t i = 1; i < n; i++) {
    if (s[i] < 0x80 || s[i] > 0xBF) /* also stops at the NUL */
      return 0;
    cp = (cp << 6) | (s[i] & 0x3F);
  }
  if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF) || (n == 3 && cp < 0x800) ||
      (n == 4 && cp < 0x10000))
    return 0;
  return n;
}

/* Appends s (NUL-terminated) as a JSON string escaped exactly as jansson's compact dump does:
 * \" \\ \b \f \n \r \t, other control characters as \u00XX, everything else (UTF-8 included)
 * as is. Returns WAGMA_EINVAL when s is not valid UTF-8. */
static int sb_put_json_string(strbuf_t *sb, const char *s) {
  const unsigned char *run = (const unsigned char *)s, *c = run;
  sb_put(sb, "\"", 1);
  while (*c) {
    if (*c >= 0x20 && *c != '"' && *c != '\\' && *c < 0x80) {
      c++;
      continue;
    }
    if (*c >= 0x80) {
      size_t n = utf8_sequence_length(c);
      if (n == 0)
        return WAGMA_EINVAL;
      c += n;
      continue;
    }
    sb_put(sb, (const char *)run, (size_t)(c - run));
    char esc[8];
    switch (*c) {
    case '"': sb_put(sb, "\\\"", 2); break;
    case '\\': sb_put(sb, "\\\\", 2); break;
    case '\b': sb_put(sb, "\\b", 2); break;
    case '\f': sb_put(sb, "\\f", 2); break;
    case '\n': sb_put(sb, "\\n", 2); break;
    case '\r': sb_put(sb, "\\r", 2); break;
    case '\t': sb_put(sb, "\\t", 2); break;
    default: snprintf(esc, sizeof(esc), "\\u%04X", (unsigned)*c); sb_put(sb, esc, 6);
    }
    run = ++c;
  }
  sb_put(sb, (const char *)run, (size_t)(c - run));
  sb_put(sb, "\"", 1);
  return 0;
}

/* Writes the plan directly (no json_t tree): one pass, amortized O(1) appends. The bytes are
 * those of jansson's json_dumps(JSON_COMPACT) on the documented object, fields in order.
 * Ownership: on success *json is a new string the caller frees with free(). */
int wagma_plan_to_json(const wagma_plan_t *plan, char **json) {
  strbuf_t sb = {0};
  int rc = 0;
  if (!json)
    return WAGMA_EINVAL;
  *json = NULL;
  if (wagma_plan_validate(plan, NULL, 0) != 0)
    return WAGMA_EINVAL;
  if (plan->epoch > INT64_MAX || plan->start_round > INT64_MAX)
    return WAGMA_ERANGE;
  /* ~90 bytes per member and ~7 per rank and phase: one allocation in the common case */
  sb_reserve(&sb, 256 + (size_t)plan->nranks * (100 + 8 * (size_t)plan->nphases));
  sb_puts(&sb, "{\"epoch\":");
  sb_put_int(&sb, (int64_t)plan->epoch);
  sb_puts(&sb, ",\"start_round\":");
  sb_put_int(&sb, (int64_t)plan->start_round);
  sb_puts(&sb, ",\"group_size\":");
  sb_put_int(&sb, plan->group_size);
  sb_puts(&sb, ",\"staleness_bound\":");
  sb_put_int(&sb, plan->staleness_bound);
  sb_puts(&sb, ",\"global_sync\":\"");
  sb_puts(&sb, sync_names[plan->global_sync]);
  sb_puts(&sb, "\",\"members\":[");
  for (int i = 0; i < plan->nranks && rc == 0; i++) {
    const wagma_member_t *m = &plan->members[i];
    sb_puts(&sb, i ? ",{\"rank\":" : "{\"rank\":");
    sb_put_int(&sb, i);
    sb_puts(&sb, ",\"name\":");
    rc = sb_put_json_string(&sb, m->name);
    sb_puts(&sb, ",\"address\":");
    if (rc == 0)
      rc = sb_put_json_string(&sb, m->address);
    sb_puts(&sb, m->joiner ? ",\"joiner\":true}" : ",\"joiner\":false}");
  }
  sb_puts(&sb, "],\"phases\":[");
  for (int j = 0; j < plan->nphases && rc == 0; j++) {
    const wagma_phase_t *ph = &plan->phases[j];
    sb_put(&sb, j ? ",[" : "[", j ? 2 : 1);
    for (int g = 0; g < ph->ngroups; g++) {
      sb_put(&sb, g ? ",[" : "[", g ? 2 : 1);
      for (int x = ph->offsets[g]; x < ph->offsets[g + 1]; x++) {
        if (x > ph->offsets[g])
          sb_put(&sb, ",", 1);
        sb_put_int(&sb, ph->ranks[x]);
      }
      sb_put(&sb, "]", 1);
    }
    sb_put(&sb, "]", 1);
  }
  sb_puts(&sb, "]}");
  if (rc == 0 && sb.oom)
    rc = WAGMA_ENOMEM;
  if (rc != 0) {
    free(sb.buf);
    return rc;
  }
  *json = sb.buf;
  return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Decoding                                                                                 */

struct decoder {
  char *err;
  size_t err_len;
};

/* Rejects any key of obj that is not in allowed (NULL-terminated); path prefixes the key. */
static int check_keys(struct decoder *d, json_t *obj, const char *path,
                      const char *const *allowed) {
  const char *key;
  json_t *value;
  json_object_foreach(obj, key, value) {
    int known = 0;
    for (const char *const *a = allowed; *a && !known; a++)
      known = strcmp(*a, key) == 0;
    if (!known) {
      wg_errf(d->err, d->err_len, "%s%s: unknown field", path, key);
      return WAGMA_EINVAL;
    }
  }
  for (const char *const *a = allowed; *a; a++) {
    if (!json_object_get(obj, *a)) {
      wg_errf(d->err, d->err_len, "%s%s: missing", path, *a);
      return WAGMA_EINVAL;
    }
  }
  return 0;
}

static int get_int(struct decoder *d, json_t *obj, const char *path, const char *key, json_int_t lo,
                   json_int_t hi, json_int_t *out) {
  json_t *v = json_object_get(obj, key);
  if (!json_is_integer(v)) {
    wg_errf(d->err, d->err_len, "%s%s: expected an integer", path, key);
    return WAGMA_EINVAL;
  }
  json_int_t x = json_integer_value(v);
  if (x < lo || x > hi) {
    wg_errf(d->err, d->err_len, "%s%s: %lld out of range [%lld, %lld]", path, key, (long long)x,
            (long long)lo, (long long)hi);
    return WAGMA_EINVAL;
  }
  *out = x;
  return 0;
}

/* Copies a JSON string of at most max-1 bytes without NUL into buf[max]. */
static int get_string(struct decoder *d, json_t *obj, const char *path, const char *key, char *buf,
                      size_t max) {
  json_t *v = json_object_get(obj, key);
  if (!json_is_string(v)) {
    wg_errf(d->err, d->err_len, "%s%s: expected a string", path, key);
    return WAGMA_EINVAL;
  }
  size_t len = json_string_length(v);
  const char *s = json_string_value(v);
  if (len >= max) {
    wg_errf(d->err, d->err_len, "%s%s: %zu bytes, at most %zu", path, key, len, max - 1);
    return WAGMA_EINVAL;
  }
  if (memchr(s, '\0', len)) {
    wg_errf(d->err, d->err_len, "%s%s: contains a NUL character", path, key);
    return WAGMA_EINVAL;
  }
  memset(buf, 0, max);
  memcpy(buf, s, len);
  return 0;
}

static int decode_members(struct decoder *d, json_t *arr, wagma_plan_t *plan) {
  static const char *const fields[] = {"rank", "name", "address", "joiner", NULL};
  char path[48];
  if (!json_is_array(arr)) {
    wg_errf(d->err, d->err_len, "members: expected an array");
    return WAGMA_EINVAL;
  }
  size_t n = json_array_size(arr);
  if (n < 1 || n > INT32_MAX / 2) {
    wg_errf(d->err, d->err_len, "members: %zu members, need at least 1", n);
    return WAGMA_EINVAL;
  }
  plan->members = calloc(n, sizeof(*plan->members));
  if (!plan->members) {
    wg_errf(d->err, d->err_len, "out of memory");
    return WAGMA_ENOMEM;
  }
  plan->nranks = (int)n;
  for (size_t i = 0; i < n; i++) {
    json_t *obj = json_array_get(arr, i);
    wagma_member_t *m = &plan->members[i];
    json_int_t rank;
    int rc;
    snprintf(path, sizeof(path), "members[%zu].", i);
    if (!json_is_object(obj)) {
      wg_errf(d->err, d->err_len, "members[%zu]: expected an object", i);
      return WAGMA_EINVAL;
    }
    if ((rc = check_keys(d, obj, path, fields)) != 0 ||
        (rc = get_int(d, obj, path, "rank", 0, (json_int_t)n - 1, &rank)) != 0 ||
        (rc = get_string(d, obj, path, "name", m->name, sizeof(m->name))) != 0 ||
        (rc = get_string(d, obj, path, "address", m->address, sizeof(m->address))) != 0)
      return rc;
    if (rank != (json_int_t)i) {
      wg_errf(d->err, d->err_len, "members[%zu].rank: %lld, must equal its index %zu", i,
              (long long)rank, i);
      return WAGMA_EINVAL;
    }
    json_t *joiner = json_object_get(obj, "joiner");
    if (!json_is_boolean(joiner)) {
      wg_errf(d->err, d->err_len, "members[%zu].joiner: expected true or false", i);
      return WAGMA_EINVAL;
    }
    m->joiner = json_is_true(joiner);
  }
  return 0;
}

/* Fills phase j from its JSON groups; seen[r] == j + 1 marks ranks already placed. */
static int decode_phase(struct decoder *d, json_t *groups, int j, int P, int *seen,
                        wagma_phase_t *ph) {
  if (!json_is_array(groups)) {
    wg_errf(d->err, d->err_len, "phases[%d]: expected an array of groups", j);
    return WAGMA_EINVAL;
  }
  size_t ng = json_array_size(groups);
  if (ng < 1 || ng > (size_t)P) {
    wg_errf(d->err, d->err_len, "phases[%d]: %zu groups, must be in [1, %d]", j, ng, P);
    return WAGMA_EINVAL;
  }
  ph->offsets = malloc((ng + 1) * sizeof(int));
  ph->ranks = malloc((size_t)P * sizeof(int));
  ph->group_of = malloc((size_t)P * sizeof(int));
  if (!ph->offsets || !ph->ranks || !ph->group_of) {
    wg_errf(d->err, d->err_len, "out of memory");
    return WAGMA_ENOMEM;
  }
  ph->ngroups = (int)ng;
  int at = 0;
  for (size_t g = 0; g < ng; g++) {
    json_t *ranks = json_array_get(groups, g);
    if (!json_is_array(ranks) || json_array_size(ranks) == 0) {
      wg_errf(d->err, d->err_len, "phases[%d][%zu]: expected a non-empty array of ranks", j, g);
      return WAGMA_EINVAL;
    }
    ph->offsets[g] = at;
    for (size_t x = 0; x < json_array_size(ranks); x++) {
      json_t *v = json_array_get(ranks, x);
      if (!json_is_integer(v)) {
        wg_errf(d->err, d->err_len, "phases[%d][%zu][%zu]: expected an integer rank", j, g, x);
        return WAGMA_EINVAL;
      }
      json_int_t r = json_integer_value(v);
      if (r < 0 || r >= P) {
        wg_errf(d->err, d->err_len, "phases[%d][%zu][%zu]: rank %lld out of range [0, %d)", j, g, x,
                (long long)r, P);
        return WAGMA_EINVAL;
      }
      if (seen[r] == j + 1) {
        wg_errf(d->err, d->err_len, "phases[%d][%zu]: rank %lld appears twice", j, g, (long long)r);
        return WAGMA_EINVAL;
      }
      seen[r] = j + 1;
      ph->ranks[at++] = (int)r; /* at <= P: every rank at most once */
      ph->group_of[r] = (int)g;
    }
  }
  ph->offsets[ng] = at;
  if (at != P) {
    for (int r = 0; r < P; r++) {
      if (seen[r] != j + 1) {
        wg_errf(d->err, d->err_len, "phases[%d]: rank %d is in no group", j, r);
        return WAGMA_EINVAL;
      }
    }
  }
  return 0;
}

static int decode_phases(struct decoder *d, json_t *arr, wagma_plan_t *plan) {
  int *seen = NULL;
  int rc = 0;
  if (!json_is_array(arr)) {
    wg_errf(d->err, d->err_len, "phases: expected an array of phases");
    return WAGMA_EINVAL;
  }
  size_t n = json_array_size(arr);
  if (n < 1 || n > PLAN_JSON_MAX_PHASES) {
    wg_errf(d->err, d->err_len, "phases: %zu phases, must be in [1, %d]", n, PLAN_JSON_MAX_PHASES);
    return WAGMA_EINVAL;
  }
  plan->phases = calloc(n, sizeof(*plan->phases));
  seen = calloc((size_t)plan->nranks, sizeof(int));
  if (!plan->phases || !seen) {
    wg_errf(d->err, d->err_len, "out of memory");
    rc = WAGMA_ENOMEM;
    goto out;
  }
  for (size_t j = 0; j < n; j++) {
    plan->nphases = (int)j + 1;
    rc = decode_phase(d, json_array_get(arr, j), (int)j, plan->nranks, seen, &plan->phases[j]);
    if (rc != 0)
      goto out;
  }
out:
  free(seen);
  return rc;
}

/* Ownership: *plan is overwritten (not freed); on success it owns new arrays, on error it is
 * zeroed. json is only read (len bytes, need not be NUL-terminated). */
int wagma_plan_from_json(const char *json, size_t len, wagma_plan_t *plan, char *err,
                         size_t err_len) {
  static const char *const fields[] = {"epoch",           "start_round", "group_size",
                                       "staleness_bound", "global_sync", "members",
                                       "phases",          NULL};
  struct decoder d = {err, err_len};
  json_t *root = NULL;
  json_error_t jerr;
  json_int_t v;
  int rc = WAGMA_EINVAL;
  if (!plan) {
    wg_errf(err, err_len, "plan: NULL");
    return WAGMA_EINVAL;
  }
  memset(plan, 0, sizeof(*plan));
  if (!json) {
    wg_errf(err, err_len, "json: NULL");
    goto out;
  }
  root = json_loadb(json, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
  if (!root) {
    wg_errf(err, err_len, "json: %s (line %d, column %d)", jerr.text, jerr.line, jerr.column);
    goto out;
  }
  if (!json_is_object(root)) {
    wg_errf(err, err_len, "plan: expected a JSON object");
    goto out;
  }
  if ((rc = check_keys(&d, root, "", fields)) != 0)
    goto out;
  if ((rc = get_int(&d, root, "", "epoch", 0, INT64_MAX, &v)) != 0)
    goto out;
  plan->epoch = (uint64_t)v;
  if ((rc = get_int(&d, root, "", "start_round", 0, INT64_MAX, &v)) != 0)
    goto out;
  plan->start_round = (uint64_t)v;
  if ((rc = get_int(&d, root, "", "group_size", 2, INT32_MAX / 2, &v)) != 0)
    goto out;
  plan->group_size = (int)v;
  if ((rc = get_int(&d, root, "", "staleness_bound", 1, INT32_MAX, &v)) != 0)
    goto out;
  plan->staleness_bound = (int)v;
  json_t *sync = json_object_get(root, "global_sync");
  const char *sync_name = json_string_value(sync);
  if (sync_name && strcmp(sync_name, sync_names[0]) == 0) {
    plan->global_sync = WAGMA_GLOBAL_BARRIER;
  } else if (sync_name && strcmp(sync_name, sync_names[1]) == 0) {
    plan->global_sync = WAGMA_GLOBAL_WAIT_AVOIDING;
  } else {
    wg_errf(err, err_len, "global_sync: expected \"barrier\" or \"wait-avoiding\"");
    rc = WAGMA_EINVAL;
    goto out;
  }
  if ((rc = decode_members(&d, json_object_get(root, "members"), plan)) != 0)
    goto out;
  if ((rc = decode_phases(&d, json_object_get(root, "phases"), plan)) != 0)
    goto out;
  rc = wagma_plan_validate(plan, err, err_len);
out:
  json_decref(root);
  if (rc != 0)
    wagma_plan_free(plan);
  return rc;
}
