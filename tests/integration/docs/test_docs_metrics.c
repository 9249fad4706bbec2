/* test_docs_metrics — every metric a live wagma-coordinator exports is documented, and every
 * documented metric is exported: docs/api.md "## Metrics" (its table: the metric with its labels
 * in braces, its type) and api/openapi.yaml (the description of GET /metrics: each
 * `wagma_...{labels} (type)`), both ways.
 *
 * The truth is a real coordinator (tests/support etcd fixture and the coordinator harness, on
 * 127.0.0.1, stopped by PID) with a job running on a fake agent that reported progress, so that
 * the per-job series exist too: its /metrics' `# TYPE name type` lines name every metric (the
 * coordinator writes HELP and TYPE even for a metric without samples), and the samples give the
 * label names (histograms' `le` aside). Checked for each metric: named in both documents, the
 * same type, and, when the scrape has samples of it, the same label names; and no document names
 * a metric the coordinator does not export. */
#include <regex.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "etcd_fixture.h"
#include "harness.h"

#ifndef WAGMA_API_MD
#error "WAGMA_API_MD must be defined"
#endif
#ifndef WAGMA_OPENAPI_PATH
#error "WAGMA_OPENAPI_PATH must be defined"
#endif

#define MAX_METRICS 128

typedef struct metric {
  char name[96];
  char type[16];    /* "" = not said */
  char labels[128]; /* sorted, comma separated; "" = none */
  int has_labels;   /* labels known: samples seen (scrape), braces or not (documents) */
  int line;         /* where a document names it (0 = unknown) */
} metric_t;

typedef struct metric_set {
  const char *what; /* "the coordinator", "docs/api.md", ... */
  metric_t m[MAX_METRICS];
  int n;
} metric_set_t;

static metric_t *find(metric_set_t *s, const char *name) {
  for (int i = 0; i < s->n; i++)
    if (strcmp(s->m[i].name, name) == 0)
      return &s->m[i];
  return NULL;
}

static metric_t *add(metric_set_t *s, const char *name) {
  metric_t *m = find(s, name);
  if (m)
    return m;
  assert_true(s->n < MAX_METRICS);
  m = &s->m[s->n++];
  memset(m, 0, sizeof *m);
  snprintf(m->name, sizeof m->name, "%s", name);
  return m;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* "b, a,le" -> "a,b": sorted, blanks, values (`a="x"`) and `le` dropped. */
static void normalize_labels(const char *in, char *out, size_t len) {
  char buf[512], *names[16];
  int n = 0;
  snprintf(buf, sizeof buf, "%s", in);
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t && n < 16;
       t = strtok_r(NULL, ",", &save)) {
    while (*t == ' ')
      t++;
    t[strcspn(t, "= ")] = '\0';
    if (*t && strcmp(t, "le") != 0)
      names[n++] = t;
  }
  qsort(names, (size_t)n, sizeof names[0], cmp_str);
  out[0] = '\0';
  for (int i = 0; i < n; i++) {
    size_t l = strlen(out);
    snprintf(out + l, len - l, "%s%s", i ? "," : "", names[i]);
  }
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f)
    fail_msg("cannot read %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  assert_non_null(s);
  assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
  s[n] = '\0';
  fclose(f);
  return s;
}

/* ---- the scrape --------------------------------------------------------------------------- */

/* The metrics of `# TYPE` lines, with the label names of their samples. */
static void parse_scrape(const char *text, metric_set_t *out) {
  char *copy = strdup(text);
  assert_non_null(copy);
  for (char *save = NULL, *line = strtok_r(copy, "\n", &save); line;
       line = strtok_r(NULL, "\n", &save)) {
    char name[96], type[16];
    if (sscanf(line, "# TYPE %95s %15s", name, type) == 2) {
      snprintf(add(out, name)->type, sizeof out->m[0].type, "%s", type);
      continue;
    }
    if (line[0] == '#' || !line[0])
      continue;
    size_t k = strcspn(line, "{ ");
    snprintf(name, sizeof name, "%.*s", (int)k, line);
    metric_t *m = find(out, name);
    if (!m) { /* a histogram's samples are <name>_bucket, <name>_sum and <name>_count */
      static const char *const suffixes[] = {"_bucket", "_sum", "_count"};
      for (size_t s = 0; s < 3 && !m; s++) {
        size_t nl = strlen(name), sl = strlen(suffixes[s]);
        if (nl > sl && strcmp(name + nl - sl, suffixes[s]) == 0) {
          char base[96];
          snprintf(base, sizeof base, "%.*s", (int)(nl - sl), name);
          m = find(out, base);
        }
      }
    }
    if (!m)
      fail_msg("/metrics: sample %s of no `# TYPE`d metric", line);
    char labels[128] = "";
    if (line[k] == '{') { /* name="value",... with escapes in the values; the names only */
      char raw[512] = "";
      const char *p = line + k + 1;
      while (*p && *p != '}') {
        size_t nl = strcspn(p, "=");
        size_t l = strlen(raw);
        snprintf(raw + l, sizeof raw - l, "%s%.*s", l ? "," : "", (int)nl, p);
        p += nl;
        if (p[0] != '=' || p[1] != '"')
          fail_msg("/metrics: malformed labels in %s", line);
        for (p += 2; *p && *p != '"'; p++)
          if (*p == '\\' && p[1])
            p++;
        if (*p == '"')
          p++;
        if (*p == ',')
          p++;
      }
      normalize_labels(raw, labels, sizeof labels);
    }
    if (m->has_labels && strcmp(m->labels, labels) != 0)
      fail_msg("/metrics: %s has samples with labels {%s} and {%s}", m->name, m->labels, labels);
    snprintf(m->labels, sizeof m->labels, "%s", labels);
    m->has_labels = 1;
  }
  free(copy);
}

/* ---- the documents ------------------------------------------------------------------------ */

/* Every `wagma_<name>[{labels}]` in text[from, to), with a type when "(gauge)", "(counter)" or
 * "(histogram)" (openapi) or a table cell `| gauge |` (api.md) follows it on its line. */
static void parse_doc(const char *text, size_t from, size_t to, metric_set_t *out) {
  regex_t re;
  assert_int_equal(regcomp(&re, "wagma_[a-z0-9_]+(\\{[a-z_, ]*\\})?", REG_EXTENDED), 0);
  size_t at = from;
  regmatch_t mt[2];
  while (at < to && regexec(&re, text + at, 2, mt, 0) == 0 && at + (size_t)mt[0].rm_eo <= to) {
    const char *s = text + at + mt[0].rm_so;
    size_t len = (size_t)(mt[0].rm_eo - mt[0].rm_so);
    size_t base = mt[1].rm_so >= 0 ? (size_t)(mt[1].rm_so - mt[0].rm_so) : len;
    char name[96];
    snprintf(name, sizeof name, "%.*s", (int)base, s);
    int line = 1;
    for (const char *p = text; p < s; p++)
      line += *p == '\n';
    metric_t *m = add(out, name);
    if (!m->line)
      m->line = line;
    char labels[128] = "";
    if (mt[1].rm_so >= 0) {
      char raw[128];
      snprintf(raw, sizeof raw, "%.*s", (int)(len - base - 2), s + base + 1);
      normalize_labels(raw, labels, sizeof labels);
    }
    /* a later mention without braces (prose) does not undo the labels of the first */
    if (!m->has_labels || labels[0]) {
      if (m->has_labels && m->labels[0] && strcmp(m->labels, labels) != 0)
        fail_msg("%s:%d: %s named with labels {%s} and {%s}", out->what, line, name, m->labels,
                 labels);
      snprintf(m->labels, sizeof m->labels, "%s", labels);
      m->has_labels = 1;
    }
    /* the type: the rest of the line, up to the next metric named on it */
    const char *eol = strchr(s + len, '\n');
    size_t rest = eol ? (size_t)(eol - (s + len)) : strlen(s + len);
    const char *next = strstr(s + len, "wagma_");
    if (next && (size_t)(next - (s + len)) < rest)
      rest = (size_t)(next - (s + len));
    static const char *const types[] = {"gauge", "counter", "histogram", "summary"};
    for (size_t t = 0; t < 4 && !m->type[0]; t++) {
      char paren[24], cell[24];
      snprintf(paren, sizeof paren, "(%s)", types[t]);
      snprintf(cell, sizeof cell, "| %s |", types[t]);
      const char *p = strstr(s + len, paren), *c = strstr(s + len, cell);
      if ((p && (size_t)(p - (s + len)) < rest) || (c && (size_t)(c - (s + len)) < rest))
        snprintf(m->type, sizeof m->type, "%s", types[t]);
    }
    at += (size_t)mt[0].rm_eo;
  }
  regfree(&re);
}

/* docs/api.md: the "## Metrics" section, up to the next "## ". */
static void parse_api_md(metric_set_t *out) {
  char *md = slurp(WAGMA_API_MD);
  const char *sec = strstr(md, "\n## Metrics\n");
  if (!sec)
    fail_msg("%s has no \"## Metrics\" section", WAGMA_API_MD);
  const char *end = strstr(sec + 1, "\n## ");
  out->what = "docs/api.md";
  parse_doc(md, (size_t)(sec - md), end ? (size_t)(end - md) : strlen(md), out);
  free(md);
}

/* api/openapi.yaml: the text of the /metrics path item, up to the next line indented two
 * spaces or less. */
static void parse_openapi(metric_set_t *out) {
  char *y = slurp(WAGMA_OPENAPI_PATH);
  const char *item = strstr(y, "\n  /metrics:\n");
  if (!item)
    fail_msg("%s has no /metrics path", WAGMA_OPENAPI_PATH);
  const char *p = item + 1;
  const char *end = NULL;
  for (const char *l = strchr(p, '\n') + 1; l && *l;
       l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
    size_t ind = strspn(l, " ");
    if (l[ind] != '\n' && ind <= 2) {
      end = l;
      break;
    }
  }
  out->what = "api/openapi.yaml";
  parse_doc(y, (size_t)(p - y), end ? (size_t)(end - y) : strlen(y), out);
  free(y);
}

/* ---- the comparison ----------------------------------------------------------------------- */

static int compare(metric_set_t *live, metric_set_t *doc) {
  int bad = 0;
  for (int i = 0; i < live->n; i++) {
    metric_t *l = &live->m[i], *d = find(doc, l->name);
    if (!d) {
      fprintf(stderr, "FAIL %s does not document %s (%s%s%s%s)\n", doc->what, l->name, l->type,
              l->has_labels ? ", labels {" : "", l->has_labels ? l->labels : "",
              l->has_labels ? "}" : "");
      bad++;
      continue;
    }
    if (!d->type[0] || strcmp(d->type, l->type) != 0) {
      fprintf(stderr, "FAIL %s:%d: %s is a %s, the document says %s\n", doc->what, d->line, l->name,
              l->type, d->type[0] ? d->type : "no type");
      bad++;
    }
    if (l->has_labels && strcmp(d->labels, l->labels) != 0) {
      fprintf(stderr, "FAIL %s:%d: %s has labels {%s}, the document says {%s}\n", doc->what,
              d->line, l->name, l->labels, d->labels);
      bad++;
    }
  }
  for (int i = 0; i < doc->n; i++)
    if (!find(live, doc->m[i].name)) {
      fprintf(stderr, "FAIL %s:%d: %s is documented, the coordinator exports no such metric\n",
              doc->what, doc->m[i].line, doc->m[i].name);
      bad++;
    }
  printf("%s names %d metrics; the coordinator exports %d: %d failure(s)\n", doc->what, doc->n,
         live->n, bad);
  return bad;
}

/* ---- the test ----------------------------------------------------------------------------- */

static char *scrape(const coord_proc_t *c) {
  char u[128];
  http_result_t r;
  snprintf(u, sizeof u, "%s/metrics", c->base);
  harness_http("GET", u, NULL, 0, NULL, NULL, &r);
  assert_int_equal(r.status, 200);
  char *text = strdup(r.body);
  harness_http_free(&r);
  assert_non_null(text);
  return text;
}

static void test_metrics_documented(void **state) {
  harness_env_t *e = *state;
  coord_proc_t c;
  fake_agent_t a;
  http_result_t r;
  char u[128];
  harness_coord_start(&c, etcd_fixture_endpoints(e->fx), "docs-metrics", 3, NULL, NULL);
  harness_agent_start(e->etcd, &a, "dm0", harness_free_port(), 10);
  snprintf(u, sizeof u, "%s/v1/jobs", c.base);
  const char *spec = "{\"name\":\"dm\",\"workers\":1}";
  harness_http("POST", u, spec, strlen(spec), "application/json", NULL, &r);
  assert_int_equal(r.status, 201);
  harness_http_free(&r);
  assert_true(harness_wait_epoch(c.base, "dm", 1, 20) >= 0);
  harness_progress(e->etcd, "dm", "dm0", 7, "running", 0.5);
  /* until the scheduler's snapshot has the job's progress (every series is then there) */
  char *text = NULL;
  double deadline = harness_now() + 20;
  for (;;) {
    text = scrape(&c);
    if (strstr(text, "wagma_job_loss{job=\"dm\"}") &&
        strstr(text, "wagma_job_staleness{job=\"dm\"}"))
      break;
    if (harness_now() > deadline)
      fail_msg("/metrics never showed the job's loss and staleness:\n%s", text);
    free(text);
    harness_sleep(0.2);
  }

  static metric_set_t live, api_md, openapi;
  live.what = "the coordinator";
  parse_scrape(text, &live);
  free(text);
  assert_true(live.n >= 10);
  parse_api_md(&api_md);
  parse_openapi(&openapi);
  int bad = compare(&live, &api_md) + compare(&live, &openapi);

  harness_agent_kill(e->etcd, &a);
  harness_coord_stop(&c, SIGTERM);
  assert_int_equal(bad, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_metrics_documented, harness_group_setup,
                                      harness_group_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
