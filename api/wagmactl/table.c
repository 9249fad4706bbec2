/* table.c — aligned text tables and the formatting of single cells for wagmactl.
 *
 * A table owns copies of its headers and cells. Widths count characters, not bytes (UTF-8
 * continuation bytes do not count), so names with non-ASCII letters stay aligned. Columns
 * are separated by two spaces and the last column is not padded (no trailing blanks).
 * Single-threaded; no globals. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctl.h"

struct wg_ctl_table {
  int ncols;
  int nrows, cap;
  char **cells; /* (nrows + 1) * ncols, row 0 = headers */
};

static void free_cells(char **cells, int n) {
  for (int i = 0; i < n; i++)
    free(cells[i]);
}

static int add_row(wg_ctl_table_t *t, const char *const *cells) {
  if (t->nrows + 1 >= t->cap) {
    int cap = t->cap ? t->cap * 2 : 8;
    char **nc = realloc(t->cells, (size_t)cap * (size_t)t->ncols * sizeof *nc);
    if (!nc)
      return -1;
    t->cells = nc;
    t->cap = cap;
  }
  char **row = t->cells + (size_t)t->nrows * (size_t)t->ncols;
  for (int c = 0; c < t->ncols; c++) {
    row[c] = strdup(cells[c] ? cells[c] : "-");
    if (!row[c]) {
      free_cells(row, c);
      return -1;
    }
  }
  t->nrows++;
  return 0;
}

/* Ownership: the caller frees the table with wg_ctl_table_free. */
wg_ctl_table_t *wg_ctl_table_new(int ncols, const char *const *headers) {
  if (ncols <= 0)
    return NULL;
  wg_ctl_table_t *t = calloc(1, sizeof *t);
  if (!t)
    return NULL;
  t->ncols = ncols;
  if (add_row(t, headers) != 0) {
    free(t);
    return NULL;
  }
  return t;
}

int wg_ctl_table_add(wg_ctl_table_t *t, const char *const *cells) {
  return add_row(t, cells);
}

int wg_ctl_table_rows(const wg_ctl_table_t *t) {
  return t->nrows - 1;
}

static size_t display_width(const char *s) {
  size_t w = 0;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++)
    if ((*p & 0xc0) != 0x80)
      w++;
  return w;
}

void wg_ctl_table_print(const wg_ctl_table_t *t, FILE *out) {
  size_t *width = calloc((size_t)t->ncols, sizeof *width);
  if (!width)
    return;
  for (int r = 0; r < t->nrows; r++)
    for (int c = 0; c < t->ncols; c++) {
      size_t w = display_width(t->cells[(size_t)r * (size_t)t->ncols + (size_t)c]);
      if (w > width[c])
        width[c] = w;
    }
  for (int r = 0; r < t->nrows; r++) {
    for (int c = 0; c < t->ncols; c++) {
      const char *cell = t->cells[(size_t)r * (size_t)t->ncols + (size_t)c];
      fputs(cell, out);
      if (c + 1 < t->ncols)
        fprintf(out, "%*s", (int)(width[c] - display_width(cell) + 2), "");
    }
    fputc('\n', out);
  }
  free(width);
}

void wg_ctl_table_free(wg_ctl_table_t *t) {
  if (!t)
    return;
  free_cells(t->cells, t->nrows * t->ncols);
  free(t->cells);
  free(t);
}

/* ---- cells ------------------------------------------------------------------------------- */

static const char *dash(char *buf, size_t len) {
  snprintf(buf, len, "-");
  return buf;
}

const char *wg_ctl_fmt_int(const json_t *v, char *buf, size_t len) {
  if (json_is_integer(v))
    snprintf(buf, len, "%lld", (long long)json_integer_value(v));
  else if (json_is_real(v) && isfinite(json_real_value(v)))
    snprintf(buf, len, "%.0f", json_real_value(v));
  else
    return dash(buf, len);
  return buf;
}

const char *wg_ctl_fmt_real(const json_t *v, int decimals, char *buf, size_t len) {
  if (!json_is_number(v) || !isfinite(json_number_value(v)))
    return dash(buf, len);
  snprintf(buf, len, "%.*f", decimals, json_number_value(v));
  return buf;
}

const char *wg_ctl_fmt_percent(const json_t *v, char *buf, size_t len) {
  if (!json_is_number(v) || !isfinite(json_number_value(v)))
    return dash(buf, len);
  snprintf(buf, len, "%.2f%%", 100.0 * json_number_value(v));
  return buf;
}

const char *wg_ctl_fmt_duration(const json_t *v, char *buf, size_t len) {
  if (!json_is_number(v) || !isfinite(json_number_value(v)) || json_number_value(v) < 0)
    return dash(buf, len);
  double s = json_number_value(v);
  if (s < 1e-3)
    snprintf(buf, len, "%.1fus", s * 1e6);
  else if (s < 1.0)
    snprintf(buf, len, "%.1fms", s * 1e3);
  else
    snprintf(buf, len, "%.2fs", s);
  return buf;
}

const char *wg_ctl_fmt_time(const json_t *v, char *buf, size_t len) {
  if (!json_is_number(v) || !isfinite(json_number_value(v)) || json_number_value(v) <= 0 ||
      json_number_value(v) > 1e12)
    return dash(buf, len);
  time_t t = (time_t)json_number_value(v);
  struct tm tm;
  if (!gmtime_r(&t, &tm) || strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
    return dash(buf, len);
  return buf;
}

const char *wg_ctl_fmt_bool(const json_t *v, char *buf, size_t len) {
  if (!json_is_boolean(v))
    return dash(buf, len);
  snprintf(buf, len, "%s", json_is_true(v) ? "yes" : "no");
  return buf;
}

/* Server strings are shown as they are except control characters (a terminal escape in a
 * job's reason must not reach the terminal), which become '?'. "" prints as "-". */
const char *wg_ctl_fmt_str(const json_t *v, char *buf, size_t len) {
  if (json_is_string(v)) {
    if (json_string_length(v) == 0)
      return dash(buf, len);
    snprintf(buf, len, "%s", json_string_value(v));
    for (char *p = buf; *p; p++)
      if ((unsigned char)*p < 0x20 || *p == 0x7f)
        *p = '?';
    return buf;
  }
  if (json_is_integer(v))
    return wg_ctl_fmt_int(v, buf, len);
  if (json_is_real(v))
    return wg_ctl_fmt_real(v, 6, buf, len);
  if (json_is_boolean(v))
    return wg_ctl_fmt_bool(v, buf, len);
  return dash(buf, len);
}
