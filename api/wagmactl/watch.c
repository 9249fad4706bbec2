/* watch.c — wagmactl watch ID: the job's event stream (GET /v1/jobs/ID/events with Accept:
 * text/event-stream, docs/api.md "Event streams") followed until the job is finished.
 *
 * The stream is read with libcurl's easy interface (a write callback feeds the incremental
 * parser below); its first event is a snapshot, then come progress, plan, job and timeline
 * events and heartbeats. Every (re)connection starts with a new snapshot, so a stream that
 * breaks (a coordinator failover behind the same address) is simply opened again, with
 * backoff, for as long as the attempts keep failing within --timeout. The plan's phases (for
 * the groups of the current round) come from GET /v1/jobs/ID/plan, asked again at each new
 * epoch. Output for people: a status block at most once a second (progress bar, members and
 * their lag, the groups of the round) and one line per timeline entry; --json: each event as
 * one line {"event":NAME,"data":...}. Single-threaded. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "ctl.h"

/* ---- the event-stream parser ---------------------------------------------------------- */

void wg_ctl_sse_init(wg_ctl_sse_t *p, void (*on_event)(void *, const char *, const char *),
                     void *user) {
  memset(p, 0, sizeof *p);
  p->on_event = on_event;
  p->user = user;
}

void wg_ctl_sse_free(wg_ctl_sse_t *p) {
  free(p->line);
  free(p->data);
  memset(p, 0, sizeof *p);
}

static int grow(char **buf, size_t *cap, size_t need) {
  if (need <= *cap)
    return 0;
  if (need > WG_CTL_SSE_MAX)
    return -1;
  size_t c = *cap ? *cap : 256;
  while (c < need)
    c *= 2;
  char *nb = realloc(*buf, c);
  if (!nb)
    return -1;
  *buf = nb;
  *cap = c;
  return 0;
}

/* One complete line (without its end). */
static int sse_line(wg_ctl_sse_t *p, const char *line, size_t n) {
  if (n == 0) { /* dispatch */
    if (p->has_data && p->on_event) {
      p->data[p->dlen] = '\0';
      p->on_event(p->user, p->name[0] ? p->name : "message", p->data);
    }
    p->name[0] = '\0';
    p->dlen = 0;
    p->has_data = 0;
    return 0;
  }
  if (line[0] == ':')
    return 0; /* comment: a heartbeat */
  const char *colon = memchr(line, ':', n);
  size_t fl = colon ? (size_t)(colon - line) : n;
  const char *v = colon ? colon + 1 : line + n;
  size_t vl = n - (size_t)(v - line);
  if (vl && v[0] == ' ') {
    v++;
    vl--;
  }
  if (fl == 5 && memcmp(line, "event", 5) == 0) {
    size_t k = vl < sizeof p->name - 1 ? vl : sizeof p->name - 1;
    memcpy(p->name, v, k);
    p->name[k] = '\0';
  } else if (fl == 4 && memcmp(line, "data", 4) == 0) {
    if (grow(&p->data, &p->dcap, p->dlen + vl + 2) != 0)
      return -1;
    if (p->has_data)
      p->data[p->dlen++] = '\n';
    memcpy(p->data + p->dlen, v, vl);
    p->dlen += vl;
    p->has_data = 1;
  }
  return 0;
}

int wg_ctl_sse_feed(wg_ctl_sse_t *p, const char *bytes, size_t n) {
  for (size_t i = 0; i < n; i++) {
    char ch = bytes[i];
    if (ch == '\n' && p->cr) { /* the LF of a CRLF */
      p->cr = 0;
      continue;
    }
    p->cr = ch == '\r';
    if (ch == '\r' || ch == '\n') {
      if (sse_line(p, p->line ? p->line : "", p->len) != 0)
        return -1;
      p->len = 0;
      continue;
    }
    if (grow(&p->line, &p->cap, p->len + 2) != 0)
      return -1;
    p->line[p->len++] = ch;
  }
  return 0;
}

/* ---- the watch ------------------------------------------------------------------------------- */

typedef struct watch {
  const wg_ctl_args_t *a;
  FILE *out, *err;
  wg_ctl_sse_t parser;
  json_t *job;      /* the job's view: spec, status, members (from the snapshot) */
  json_t *progress; /* agent -> its last progress */
  json_t *plan;     /* GET .../plan, for the groups */
  long long plan_epoch;
  int done; /* the job is finished: exit code in code */
  int code;
  int got_snapshot;
  double last_print;
  int dirty;
} watch_t;

static double mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void load_plan(watch_t *w) {
  char path[192];
  wg_ctl_conn_t conn = {.server = w->a->server, .token = w->a->token, .timeout_s = w->a->timeout_s};
  wg_ctl_response_t res;
  snprintf(path, sizeof path, "/v1/jobs/%s/plan", w->a->id);
  if (wg_ctl_http_request(&conn, "GET", path, NULL, 0, &res) == 0 && res.status == 200) {
    json_t *p = json_loadb(res.body, res.len, 0, NULL);
    if (p) {
      json_decref(w->plan);
      w->plan = p;
    }
  }
  wg_ctl_response_free(&res);
}

static const char *state_of(const json_t *job) {
  const char *s = json_string_value(json_object_get(json_object_get(job, "status"), "state"));
  return s ? s : "?";
}

static void check_finished(watch_t *w) {
  const char *s = state_of(w->job);
  if (strcmp(s, "succeeded") == 0)
    w->done = 1, w->code = WG_CTL_EXIT_OK;
  else if (strcmp(s, "failed") == 0 || strcmp(s, "stopped") == 0)
    w->done = 1, w->code = WG_CTL_EXIT_JOB_FAILED;
}

static long long job_iteration(const watch_t *w) {
  long long it =
      json_integer_value(json_object_get(json_object_get(w->job, "status"), "iteration"));
  long long epoch = json_integer_value(json_object_get(json_object_get(w->job, "status"), "epoch"));
  const char *k;
  json_t *p;
  json_object_foreach(w->progress, k, p) {
    long long e = json_integer_value(json_object_get(p, "epoch"));
    long long i = json_integer_value(json_object_get(p, "iteration"));
    if (e >= epoch && i > it)
      it = i;
  }
  return it;
}

/* The status block: progress bar, members with their lag, the groups of the round. */
static void print_status(watch_t *w) {
  FILE *o = w->out;
  const json_t *spec = json_object_get(w->job, "spec"), *st = json_object_get(w->job, "status");
  long long total = json_integer_value(json_object_get(spec, "iterations"));
  long long it = job_iteration(w);
  char bar[41];
  int fill = total > 0 ? (int)(40.0 * (double)(it < total ? it : total) / (double)total) : 0;
  for (int i = 0; i < 40; i++)
    bar[i] = i < fill ? '#' : '.';
  bar[40] = '\0';
  fprintf(o, "\njob %s  %s  epoch %lld  iteration %lld", w->a->id, state_of(w->job),
          (long long)json_integer_value(json_object_get(st, "epoch")), it);
  if (total > 0)
    fprintf(o, " of %lld  [%s] %.1f%%", total, bar, 100.0 * (double)it / (double)total);
  fputc('\n', o);
  const json_t *members = json_object_get(w->plan, "members");
  if (!json_is_array(members))
    members = json_object_get(w->job, "members");
  static const char *const head[] = {"RANK", "NAME",     "STATE",     "ITERATION", "LAG",
                                     "LOSS", "ACCURACY", "STEP_TIME", "STALENESS"};
  wg_ctl_table_t *t = wg_ctl_table_new(9, head);
  size_t i;
  json_t *m;
  json_array_foreach(members, i, m) {
    const char *name = json_string_value(json_object_get(m, "name"));
    const json_t *p = name ? json_object_get(w->progress, name) : NULL;
    char c[9][64];
    snprintf(c[0], sizeof c[0], "%zu", i);
    wg_ctl_fmt_str(json_object_get(m, "name"), c[1], sizeof c[1]);
    wg_ctl_fmt_str(json_object_get(p, "state"), c[2], sizeof c[2]);
    wg_ctl_fmt_int(json_object_get(p, "iteration"), c[3], sizeof c[3]);
    if (p)
      snprintf(c[4], sizeof c[4], "%lld", it - json_integer_value(json_object_get(p, "iteration")));
    else
      snprintf(c[4], sizeof c[4], "-");
    wg_ctl_fmt_real(json_object_get(p, "loss"), 4, c[5], sizeof c[5]);
    wg_ctl_fmt_percent(json_object_get(p, "accuracy"), c[6], sizeof c[6]);
    wg_ctl_fmt_duration(json_object_get(p, "step_time"), c[7], sizeof c[7]);
    wg_ctl_fmt_int(json_object_get(p, "staleness"), c[8], sizeof c[8]);
    const char *cells[9] = {c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8]};
    if (t)
      wg_ctl_table_add(t, cells);
  }
  if (t) {
    wg_ctl_table_print(t, o);
    wg_ctl_table_free(t);
  }
  /* The groups of round `it` in the current plan: phase it mod L, or a global round. */
  const json_t *phases = json_object_get(w->plan, "phases");
  long long tau = json_integer_value(json_object_get(w->plan, "staleness_bound"));
  long long start = json_integer_value(json_object_get(w->plan, "start_round"));
  size_t L = json_array_size(phases);
  if (L > 0 && json_is_array(members)) {
    long long r = it < start ? start : it;
    if (tau > 0 && (r + 1) % tau == 0) {
      fprintf(o, "round %lld: global round (all %zu members)\n", r, json_array_size(members));
    } else {
      size_t ph = (size_t)(r % (long long)L);
      fprintf(o, "round %lld, phase %zu of %zu:", r, ph + 1, L);
      size_t g;
      json_t *grp;
      json_array_foreach(json_array_get(phases, ph), g, grp) {
        fputs(" [", o);
        size_t k;
        json_t *rank;
        json_array_foreach(grp, k, rank) {
          const char *n = json_string_value(
              json_object_get(json_array_get(members, (size_t)json_integer_value(rank)), "name"));
          fprintf(o, "%s%s", k ? " " : "", n ? n : "?");
        }
        fputc(']', o);
      }
      fputc('\n', o);
    }
  }
  fflush(o);
}

static void print_timeline(watch_t *w, const json_t *e) {
  time_t t = (time_t)json_number_value(json_object_get(e, "time"));
  char when[32] = "-";
  struct tm tm;
  if (t > 0 && gmtime_r(&t, &tm))
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  const char *msg = json_string_value(json_object_get(e, "message"));
  fprintf(w->out, "%s  %s\n", when, msg ? msg : json_string_value(json_object_get(e, "type")));
  size_t i;
  json_t *x;
  json_array_foreach(json_object_get(e, "left"), i, x)
      fprintf(w->out, "    - %s: %s\n", json_string_value(json_object_get(x, "agent")),
              json_string_value(json_object_get(x, "reason")));
  json_array_foreach(json_object_get(e, "joined"), i, x)
      fprintf(w->out, "    + %s: %s\n", json_string_value(json_object_get(x, "agent")),
              json_string_value(json_object_get(x, "reason")));
  fflush(w->out);
}

static void on_event(void *user, const char *name, const char *data) {
  watch_t *w = user;
  json_t *d = json_loads(data, 0, NULL);
  if (!d)
    return;
  if (w->a->json) {
    json_t *line = json_pack("{s:s,s:O}", "event", name, "data", d);
    char *s = line ? json_dumps(line, JSON_COMPACT) : NULL;
    if (s)
      fprintf(w->out, "%s\n", s);
    fflush(w->out);
    free(s);
    json_decref(line);
  }
  if (strcmp(name, "snapshot") == 0) {
    json_t *job = json_object_get(d, "job");
    if (job) {
      int first = !w->got_snapshot;
      json_decref(w->job);
      w->job = json_incref(job);
      json_object_clear(w->progress);
      size_t i;
      json_t *m;
      json_array_foreach(json_object_get(job, "members"), i, m) {
        const char *n = json_string_value(json_object_get(m, "name"));
        json_t *p = json_object_get(m, "progress");
        if (n && json_is_object(p))
          json_object_set(w->progress, n, p);
      }
      if (first && !w->a->json) {
        json_t *e;
        json_array_foreach(json_object_get(d, "timeline"), i, e) print_timeline(w, e);
      }
      w->got_snapshot = 1;
      w->dirty = 1;
    } else if (json_is_true(json_object_get(d, "deleted"))) {
      w->done = 1;
      w->code = WG_CTL_EXIT_NOT_FOUND;
    }
  } else if (strcmp(name, "job") == 0 && w->job) {
    json_object_set(w->job, "spec", json_object_get(d, "spec"));
    json_object_set(w->job, "status", json_object_get(d, "status"));
    w->dirty = 1;
  } else if (strcmp(name, "progress") == 0) {
    const char *agent = json_string_value(json_object_get(d, "agent"));
    if (agent)
      json_object_set(w->progress, agent, json_object_get(d, "progress"));
    w->dirty = 1;
  } else if (strcmp(name, "timeline") == 0 && !w->a->json) {
    print_timeline(w, d);
  } else if (strcmp(name, "deleted") == 0) {
    w->done = 1;
    w->code = WG_CTL_EXIT_NOT_FOUND;
  }
  json_decref(d);
  if (w->job) {
    long long epoch =
        json_integer_value(json_object_get(json_object_get(w->job, "status"), "epoch"));
    if (epoch != w->plan_epoch && epoch > 0) {
      w->plan_epoch = epoch;
      load_plan(w); /* another handle: the stream's own is inside curl_easy_perform */
      w->dirty = 1;
    }
    check_finished(w);
  }
  if (!w->a->json && w->dirty && (w->done || mono() - w->last_print >= 1.0)) {
    print_status(w);
    w->last_print = mono();
    w->dirty = 0;
  }
}

typedef struct stream_state {
  watch_t *w;
  long status; /* the HTTP status, once the headers are in */
  char errbody[1024];
  size_t errlen;
  int parse_error;
} stream_state_t;

static size_t on_data(char *data, size_t size, size_t nmemb, void *user) {
  stream_state_t *s = user;
  size_t n = size * nmemb;
  if (s->status != 200) { /* an error answer: keep its body for the message */
    size_t k = n < sizeof s->errbody - 1 - s->errlen ? n : sizeof s->errbody - 1 - s->errlen;
    memcpy(s->errbody + s->errlen, data, k);
    s->errlen += k;
    s->errbody[s->errlen] = '\0';
    return n;
  }
  if (wg_ctl_sse_feed(&s->w->parser, data, n) != 0) {
    s->parse_error = 1;
    return 0;
  }
  return s->w->done ? 0 : n; /* 0 ends the transfer: the job is finished */
}

static size_t on_header(char *data, size_t size, size_t nmemb, void *user) {
  stream_state_t *s = user;
  size_t n = size * nmemb;
  if (n > 9 && memcmp(data, "HTTP/", 5) == 0) {
    const char *sp = memchr(data, ' ', n);
    if (sp)
      s->status = strtol(sp + 1, NULL, 10);
  }
  return n;
}

/* One connection: returns 0 when the stream ran (and ended, or the job finished), else the
 * exit code of a definite answer (401, 404, ...) or -1 for a transport failure (*why). */
static int stream_once(watch_t *w, char *why, size_t whylen) {
  char url[1024], auth[WG_CTL_TOKEN_MAX + 32];
  stream_state_t s = {.w = w};
  struct curl_slist *headers = NULL;
  CURL *curl = curl_easy_init();
  if (!curl) {
    snprintf(why, whylen, "cannot initialise libcurl");
    return -1;
  }
  snprintf(url, sizeof url, "%s/v1/jobs/%s/events", w->a->server, w->a->id);
  long connect_ms = (long)(w->a->timeout_s * 1000.0);
  headers = curl_slist_append(headers, "Accept: text/event-stream");
  if (w->a->token[0]) {
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", w->a->token);
    headers = curl_slist_append(headers, auth);
  }
  char errbuf[CURL_ERROR_SIZE] = "";
  curl_easy_setopt(curl, CURLOPT_URL, url);
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, connect_ms > 0 ? connect_ms : 1L);
  /* No overall deadline (a stream lasts as long as the job); a stream that goes quiet for 60 s
   * (heartbeats come every 15 s) is dead: reconnect. */
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, 60L);
  curl_easy_setopt(curl, CURLOPT_USERAGENT, "wagmactl/0.1");
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &s);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &s);
  wg_ctl_sse_free(&w->parser);
  wg_ctl_sse_init(&w->parser, on_event, w);
  CURLcode cc = curl_easy_perform(curl);
  curl_slist_free_all(headers);
  curl_easy_cleanup(curl);
  if (s.status != 0 && s.status != 200) {
    wg_ctl_print_error(s.status, s.errbody, s.errlen, w->err);
    return wg_ctl_exit_for_status(s.status);
  }
  if (w->done)
    return 0;
  if (s.parse_error) {
    snprintf(why, whylen, "the event stream is malformed");
    return -1;
  }
  if (cc != CURLE_OK && s.status != 200) {
    snprintf(why, whylen, "%s", errbuf[0] ? errbuf : curl_easy_strerror(cc));
    return -1;
  }
  snprintf(why, whylen, "the stream ended (%s)",
           cc == CURLE_OK ? "closed by the server"
           : errbuf[0]    ? errbuf
                          : curl_easy_strerror(cc));
  return s.status == 200 ? 0 : -1;
}

int wg_ctl_watch(const wg_ctl_args_t *a, FILE *out, FILE *err) {
  watch_t w = {.a = a, .out = out, .err = err, .progress = json_object(), .plan_epoch = -1};
  double failing_since = 0, delay = 0.25;
  int code = WG_CTL_EXIT_UNREACHABLE;
  char why[512] = "";
  for (;;) {
    int r = stream_once(&w, why, sizeof why);
    if (w.done) {
      code = w.code;
      break;
    }
    if (r > 0) { /* a definite answer: 401, 404, ... */
      code = r;
      break;
    }
    if (r == 0) { /* it ran: start counting failures anew */
      failing_since = 0;
      delay = 0.25;
      if (!a->json)
        fprintf(err, "wagmactl: %s; reconnecting\n", why);
    }
    if (r < 0 && failing_since == 0)
      failing_since = mono();
    if (r < 0 && mono() - failing_since > a->timeout_s) {
      fprintf(err, "wagmactl: cannot reach %s (for %.0f s): %s\n", a->server, a->timeout_s, why);
      code = WG_CTL_EXIT_UNREACHABLE;
      break;
    }
    struct timespec ts = {(time_t)delay, (long)((delay - (double)(time_t)delay) * 1e9)};
    nanosleep(&ts, NULL);
    delay = delay * 2 > 5 ? 5 : delay * 2;
  }
  if (w.done && !a->json)
    fprintf(out, "job %s %s\n", a->id, state_of(w.job));
  wg_ctl_sse_free(&w.parser);
  json_decref(w.job);
  json_decref(w.progress);
  json_decref(w.plan);
  return code;
}
