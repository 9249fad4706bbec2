/* api/json_util.c — typed JSON field readers shared by the codecs of wagma_api.
 * Pure functions, no state, thread-safe. Every failure names the field. */
#include "json_util.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int wg_api_fail(wagma_api_error_t *err, const char *field, const char *fmt, ...) {
  if (err) {
    snprintf(err->field, sizeof err->field, "%s", field ? field : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
  }
  return WAGMA_EINVAL;
}

const char *wg_api_path(char *buf, size_t len, const char *parent, const char *child) {
  if (!parent || !*parent)
    snprintf(buf, len, "%s", child);
  else
    snprintf(buf, len, "%s.%s", parent, child);
  return buf;
}

int wg_api_int(const json_t *v, const char *field, int64_t min, int64_t max, int64_t *out,
               wagma_api_error_t *err) {
  if (!json_is_integer(v))
    return wg_api_fail(err, field, "must be an integer");
  json_int_t x = json_integer_value(v);
  if (x < min || x > max)
    return wg_api_fail(err, field, "must be between %lld and %lld", (long long)min, (long long)max);
  *out = x;
  return 0;
}

int wg_api_u64(const json_t *v, const char *field, uint64_t max, uint64_t *out,
               wagma_api_error_t *err) {
  if (!json_is_integer(v))
    return wg_api_fail(err, field, "must be an integer");
  json_int_t x = json_integer_value(v);
  if (x < 0 || (uint64_t)x > max)
    return wg_api_fail(err, field, "must be between 0 and %llu", (unsigned long long)max);
  *out = (uint64_t)x;
  return 0;
}

int wg_api_num(const json_t *v, const char *field, double min, int min_open, double max,
               int max_open, double *out, wagma_api_error_t *err) {
  if (!json_is_number(v))
    return wg_api_fail(err, field, "must be a number");
  double x = json_number_value(v);
  if (!isfinite(x) || (min_open ? x <= min : x < min) || (max_open ? x >= max : x > max))
    return wg_api_fail(err, field, "must be in %s%g, %g%s", min_open ? "(" : "[", min, max,
                       max_open ? ")" : "]");
  *out = x;
  return 0;
}

int wg_api_bool(const json_t *v, const char *field, int *out, wagma_api_error_t *err) {
  if (!json_is_boolean(v))
    return wg_api_fail(err, field, "must be true or false");
  *out = json_is_true(v);
  return 0;
}

int wg_api_str(const json_t *v, const char *field, char *out, size_t cap, wagma_api_error_t *err) {
  if (!json_is_string(v))
    return wg_api_fail(err, field, "must be a string");
  size_t n = json_string_length(v);
  const char *s = json_string_value(v);
  if (n >= cap)
    return wg_api_fail(err, field, "must be at most %zu characters", cap - 1);
  if (memchr(s, '\0', n))
    return wg_api_fail(err, field, "must not contain NUL characters");
  memcpy(out, s, n);
  out[n] = '\0';
  return 0;
}

int wg_api_enum(const json_t *v, const char *field, const char *const *names, int n, int *out,
                wagma_api_error_t *err) {
  char choices[160] = "";
  size_t used = 0;
  for (int i = 0; i < n; i++) {
    int w = snprintf(choices + used, sizeof choices - used, "%s%s", i ? ", " : "", names[i]);
    if (w < 0 || (size_t)w >= sizeof choices - used)
      break;
    used += (size_t)w;
  }
  if (!json_is_string(v))
    return wg_api_fail(err, field, "must be one of: %s", choices);
  const char *s = json_string_value(v);
  for (int i = 0; i < n; i++) {
    if (strcmp(s, names[i]) == 0) {
      *out = i;
      return 0;
    }
  }
  return wg_api_fail(err, field, "must be one of: %s", choices);
}

json_t *wg_api_parse_object(const char *json, size_t len, wagma_api_error_t *err) {
  json_error_t jerr;
  if (!json) {
    wg_api_fail(err, "", "empty body");
    return NULL;
  }
  json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
  if (!root) {
    wg_api_fail(err, "", "invalid JSON at line %d column %d: %s", jerr.line, jerr.column,
                jerr.text);
    return NULL;
  }
  if (!json_is_object(root)) {
    json_decref(root);
    wg_api_fail(err, "", "must be a JSON object");
    return NULL;
  }
  return root;
}

int wg_api_dump(json_t *v, char **json) {
  if (!v)
    return WAGMA_ENOMEM;
  *json = json_dumps(v, WG_JSON_FLAGS);
  return *json ? 0 : WAGMA_ENOMEM;
}
