/* test_wagmactl_unit.c — wagmactl without a coordinator: argument parsing (options anywhere,
 * env defaults, token precedence, every usage error), cell formatting, aligned tables, the
 * renderers on documented response shapes, error printing, the exit-code mapping, and the
 * HTTP client's deadline against a socket that never answers and a port nobody listens on. */
#define _GNU_SOURCE /* asprintf, open_memstream */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cmocka.h>

#include "ctl.h"

/* ---- helpers ----------------------------------------------------------------------------- */

static int parse(wg_ctl_args_t *a, char *err, const char *env_server, const char *env_token, ...) {
  char *argv[32] = {"wagmactl"};
  int argc = 1;
  va_list ap;
  va_start(ap, env_token);
  for (const char *s; (s = va_arg(ap, const char *)) != NULL && argc < 31;)
    argv[argc++] = (char *)s;
  va_end(ap);
  return wg_ctl_args_parse(argc, argv, env_server, env_token, a, err, 256);
}

#define PARSE(a, err, ...) parse(a, err, NULL, NULL, __VA_ARGS__, (const char *)NULL)

typedef struct capture {
  char *buf;
  size_t len;
  FILE *f;
} capture_t;

static void cap_open(capture_t *c) {
  memset(c, 0, sizeof *c);
  c->f = open_memstream(&c->buf, &c->len);
  assert_non_null(c->f);
}

static const char *cap_text(capture_t *c) {
  fflush(c->f);
  return c->buf;
}

static void cap_close(capture_t *c) {
  fclose(c->f);
  free(c->buf);
}

static json_t *load(const char *text) {
  json_error_t je;
  json_t *v = json_loads(text, 0, &je);
  if (!v)
    fail_msg("bad test JSON: %s", je.text);
  return v;
}

/* The line of text (0-based) copied into buf; "" when there are fewer lines. */
static const char *line_of(const char *text, int n, char *buf, size_t len) {
  const char *p = text;
  for (int i = 0; i < n && p; i++) {
    p = strchr(p, '\n');
    if (p)
      p++;
  }
  buf[0] = '\0';
  if (!p)
    return buf;
  size_t l = strcspn(p, "\n");
  if (l >= len)
    l = len - 1;
  memcpy(buf, p, l);
  buf[l] = '\0';
  return buf;
}

/* Column where word starts in line, or -1. */
static int column_of(const char *line, const char *word) {
  const char *p = strstr(line, word);
  return p ? (int)(p - line) : -1;
}

/* ---- argument parsing -------------------------------------------------------------------- */

static void test_parse_defaults(void **state) {
  (void)state;
  wg_ctl_args_t a;
  char err[256];
  assert_int_equal(PARSE(&a, err, "list"), 0);
  assert_int_equal(a.cmd, WG_CTL_CMD_LIST);
  assert_string_equal(a.server, WG_CTL_DEFAULT_SERVER);
  assert_string_equal(a.token, "");
  assert_int_equal(a.json, 0);
  assert_true(a.timeout_s == WG_CTL_DEFAULT_TIMEOUT_S);
}

static void test_parse_globals_anywhere(void **state) {
  (void)state;
  wg_ctl_args_t a;
  char err[256];
  assert_int_equal(PARSE(&a, err, "--json", "get", "job-1", "--server=http://h:9/", "--timeout",
                         "2.5", "--token", "abc"),
                   0);
  assert_int_equal(a.cmd, WG_CTL_CMD_GET);
  assert_string_equal(a.id, "job-1");
  assert_string_equal(a.server, "http://h:9"); /* trailing '/' dropped */
  assert_true(a.timeout_s == 2.5);
  assert_string_equal(a.token, "abc");
  assert_int_equal(a.json, 1);
}

static void test_parse_commands(void **state) {
  (void)state;
  wg_ctl_args_t a;
  char err[256];
  assert_int_equal(PARSE(&a, err, "submit", "-"), 0);
  assert_int_equal(a.cmd, WG_CTL_CMD_SUBMIT);
  assert_string_equal(a.file, "-");
  assert_int_equal(PARSE(&a, err, "groups", "j", "--iteration", "17"), 0);
  assert_int_equal(a.cmd, WG_CTL_CMD_GROUPS);
  assert_int_equal(a.has_iteration, 1);
  assert_int_equal(a.iteration, 17);
  assert_int_equal(PARSE(&a, err, "groups", "j"), 0);
  assert_int_equal(a.has_iteration, 0);
  assert_int_equal(PARSE(&a, err, "scale", "j", "12"), 0);
  assert_int_equal(a.cmd, WG_CTL_CMD_SCALE);
  assert_int_equal(a.workers, 12);
  assert_int_equal(PARSE(&a, err, "stop", "--purge", "j"), 0);
  assert_int_equal(a.cmd, WG_CTL_CMD_STOP);
  assert_int_equal(a.purge, 1);
  assert_int_equal(PARSE(&a, err, "list", "--state", "running"), 0);
  assert_string_equal(a.state, "running");
  assert_int_equal(PARSE(&a, err, "health", "--live"), 0);
  assert_int_equal(a.live, 1);
  assert_int_equal(PARSE(&a, err, "agents"), 0);
  assert_int_equal(a.cmd, WG_CTL_CMD_AGENTS);
  assert_int_equal(PARSE(&a, err, "plan", "j.2_x"), 0);
  assert_int_equal(a.cmd, WG_CTL_CMD_PLAN);
  /* "--" ends options: an id may then look like an option... but ids cannot start with '-' */
  assert_int_equal(PARSE(&a, err, "get", "--", "-x"), -1);
  assert_int_equal(PARSE(&a, err, "--", "get", "j"), 0);
}

static void test_parse_help(void **state) {
  (void)state;
  wg_ctl_args_t a;
  char err[256];
  assert_int_equal(PARSE(&a, err, "--help"), 0);
  assert_int_equal(a.help, 1);
  assert_int_equal(a.cmd, WG_CTL_CMD_NONE);
  assert_int_equal(PARSE(&a, err, "scale", "-h"), 0); /* positionals do not matter */
  assert_int_equal(a.help, 1);
  assert_int_equal(a.cmd, WG_CTL_CMD_SCALE);
  assert_int_equal(PARSE(&a, err, "help", "groups"), 0);
  assert_int_equal(a.cmd, WG_CTL_CMD_HELP);
  assert_int_equal(a.help_topic, WG_CTL_CMD_GROUPS);
  assert_int_equal(PARSE(&a, err, "help", "nonsense"), -1);
  assert_non_null(strstr(err, "nonsense"));

  capture_t c;
  cap_open(&c);
  wg_ctl_usage(c.f);
  const char *text = cap_text(&c);
  for (int cmd = WG_CTL_CMD_NONE + 1; cmd < WG_CTL_CMD_COUNT; cmd++)
    assert_non_null(strstr(text, wg_ctl_cmd_name((wg_ctl_cmd_t)cmd)));
  assert_non_null(strstr(text, "Exit codes"));
  assert_non_null(strstr(text, "4  not found"));
  cap_close(&c);
  cap_open(&c);
  wg_ctl_command_help(WG_CTL_CMD_GROUPS, c.f);
  assert_non_null(strstr(cap_text(&c), "groups ID [--iteration T]"));
  cap_close(&c);
}

static void test_parse_usage_errors(void **state) {
  (void)state;
  wg_ctl_args_t a;
  char err[256];
  struct {
    const char *args[5];
    const char *says;
  } cases[] = {
      {{"frobnicate"}, "unknown command"},
      {{"list", "--bogus"}, "unknown option"},
      {{"get"}, "expected a job id"},
      {{"get", "a", "b"}, "extra argument b"},
      {{"get", "bad/id"}, "not a valid job id"},
      {{"get", ".hidden"}, "not a valid job id"},
      {{"scale", "j", "0"}, "1..10000"},
      {{"scale", "j", "10001"}, "1..10000"},
      {{"scale", "j", "-3"}, "unknown option"},
      {{"scale", "j", "4x"}, "1..10000"},
      {{"scale", "j"}, "expected a job id and a number"},
      {{"groups", "j", "--iteration", "-1"}, "--iteration wants"},
      {{"groups", "j", "--iteration", "x"}, "--iteration"},
      {{"groups", "j", "--iteration"}, "needs a value"},
      {{"list", "--iteration", "3"}, "belongs to 'groups'"},
      {{"list", "--state", "weird"}, "--state"},
      {{"list", "--json=1"}, "takes no value"},
      {{"list", "--timeout", "0"}, "--timeout"},
      {{"list", "--timeout", "abc"}, "--timeout"},
      {{"list", "--server", "ftp://x"}, "http://"},
      {{"list", "--server", "http://a b"}, "character"},
      {{"list", "--token", "two words"}, "spaces or control"},
      {{"list", "--token-file", "/nonexistent/token"}, "cannot read"},
      {{"submit"}, "spec file"},
      {{"agents", "extra"}, "extra argument"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *argv[8] = {"wagmactl"};
    int argc = 1;
    for (int k = 0; k < 5 && cases[i].args[k]; k++)
      argv[argc++] = (char *)cases[i].args[k];
    int rc = wg_ctl_args_parse(argc, argv, NULL, NULL, &a, err, sizeof err);
    if (rc != -1 || !strstr(err, cases[i].says))
      fail_msg("case %zu (%s ...): rc %d, err '%s', wanted '%s'", i, cases[i].args[0], rc, err,
               cases[i].says);
  }
}

static void test_parse_env_and_token_file(void **state) {
  (void)state;
  wg_ctl_args_t a;
  char err[256];
  assert_int_equal(parse(&a, err, "https://env:1", "envtok", "list", (const char *)NULL), 0);
  assert_string_equal(a.server, "https://env:1");
  assert_string_equal(a.token, "envtok");
  /* --server and --token beat the environment */
  assert_int_equal(parse(&a, err, "https://env:1", "envtok", "list", "--server", "http://flag:2",
                         "--token", "flagtok", (const char *)NULL),
                   0);
  assert_string_equal(a.server, "http://flag:2");
  assert_string_equal(a.token, "flagtok");
  /* --token-file beats the environment, first line, whitespace trimmed */
  char path[] = "/tmp/wagmactl-token-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  const char content[] = "s3cret-token  \nsecond line\n";
  assert_int_equal(write(fd, content, sizeof content - 1), (ssize_t)(sizeof content - 1));
  close(fd);
  assert_int_equal(parse(&a, err, NULL, "envtok", "list", "--token-file", path, (const char *)NULL),
                   0);
  assert_string_equal(a.token, "s3cret-token");
  /* an empty token file is an error, not "no token" */
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fclose(f);
  assert_int_equal(parse(&a, err, NULL, NULL, "list", "--token-file", path, (const char *)NULL),
                   -1);
  assert_non_null(strstr(err, "empty"));
  unlink(path);
  /* an empty env var means unset */
  assert_int_equal(parse(&a, err, "", "", "list", (const char *)NULL), 0);
  assert_string_equal(a.server, WG_CTL_DEFAULT_SERVER);
  assert_string_equal(a.token, "");
}

/* ---- cells and tables -------------------------------------------------------------------- */

static void test_format_cells(void **state) {
  (void)state;
  char buf[64];
  json_t *v = load("{\"i\":42,\"r\":0.123456,\"acc\":0.8125,\"n\":null,\"t\":0.0123,"
                   "\"slow\":2.5,\"fast\":0.0000042,\"ts\":86400,\"b\":true,\"s\":\"a\\u001bb\","
                   "\"e\":\"\"}");
  assert_string_equal(wg_ctl_fmt_int(json_object_get(v, "i"), buf, sizeof buf), "42");
  assert_string_equal(wg_ctl_fmt_int(json_object_get(v, "n"), buf, sizeof buf), "-");
  assert_string_equal(wg_ctl_fmt_int(json_object_get(v, "missing"), buf, sizeof buf), "-");
  assert_string_equal(wg_ctl_fmt_real(json_object_get(v, "r"), 4, buf, sizeof buf), "0.1235");
  assert_string_equal(wg_ctl_fmt_real(json_object_get(v, "n"), 4, buf, sizeof buf), "-");
  assert_string_equal(wg_ctl_fmt_percent(json_object_get(v, "acc"), buf, sizeof buf), "81.25%");
  assert_string_equal(wg_ctl_fmt_duration(json_object_get(v, "t"), buf, sizeof buf), "12.3ms");
  assert_string_equal(wg_ctl_fmt_duration(json_object_get(v, "slow"), buf, sizeof buf), "2.50s");
  assert_string_equal(wg_ctl_fmt_duration(json_object_get(v, "fast"), buf, sizeof buf), "4.2us");
  assert_string_equal(wg_ctl_fmt_time(json_object_get(v, "ts"), buf, sizeof buf),
                      "1970-01-02T00:00:00Z");
  assert_string_equal(wg_ctl_fmt_time(json_object_get(v, "n"), buf, sizeof buf), "-");
  assert_string_equal(wg_ctl_fmt_bool(json_object_get(v, "b"), buf, sizeof buf), "yes");
  assert_string_equal(wg_ctl_fmt_str(json_object_get(v, "s"), buf, sizeof buf), "a?b");
  assert_string_equal(wg_ctl_fmt_str(json_object_get(v, "e"), buf, sizeof buf), "-");
  assert_string_equal(wg_ctl_fmt_str(json_object_get(v, "i"), buf, sizeof buf), "42");
  json_decref(v);
}

static void test_table_alignment(void **state) {
  (void)state;
  static const char *const h[] = {"ID", "STATE", "N"};
  wg_ctl_table_t *t = wg_ctl_table_new(3, h);
  assert_non_null(t);
  const char *r1[] = {"a-very-long-job-name", "running", "1"};
  const char *r2[] = {"x", NULL, "12345"};
  const char *r3[] = {"\xc3\xa9t\xc3\xa9", "ok", "7"}; /* "été": 3 characters, 5 bytes */
  assert_int_equal(wg_ctl_table_add(t, r1), 0);
  assert_int_equal(wg_ctl_table_add(t, r2), 0);
  assert_int_equal(wg_ctl_table_add(t, r3), 0);
  assert_int_equal(wg_ctl_table_rows(t), 3);
  capture_t c;
  cap_open(&c);
  wg_ctl_table_print(t, c.f);
  const char *text = cap_text(&c);
  char l0[128], l1[128], l2[128], l3[128];
  line_of(text, 0, l0, sizeof l0);
  line_of(text, 1, l1, sizeof l1);
  line_of(text, 2, l2, sizeof l2);
  line_of(text, 3, l3, sizeof l3);
  /* every column starts where its header starts: widest cell + 2 */
  int state_col = (int)strlen("a-very-long-job-name") + 2;
  assert_int_equal(column_of(l0, "STATE"), state_col);
  assert_int_equal(column_of(l1, "running"), state_col);
  assert_int_equal(column_of(l2, "-"), state_col); /* NULL cell */
  assert_int_equal(column_of(l0, "N"), state_col + (int)strlen("running") + 2);
  assert_int_equal(column_of(l2, "12345"), column_of(l0, "N"));
  /* UTF-8: "été" is 5 bytes but pads as 3 characters, so "ok" is 2 bytes further right */
  assert_int_equal(column_of(l3, "ok"), state_col + 2);
  /* no trailing blanks */
  for (const char *p = text; (p = strchr(p, '\n')) != NULL; p++)
    assert_true(p == text || p[-1] != ' ');
  cap_close(&c);
  wg_ctl_table_free(t);
}

/* ---- renderers --------------------------------------------------------------------------- */

static const char job_json[] =
    "{\"id\":\"mnist-1\",\"spec\":{\"name\":\"mnist-1\",\"model\":\"mlp\",\"dataset\":"
    "\"fashion-mnist\",\"algorithm\":\"wagma\",\"workers\":4,\"min_workers\":2,\"max_workers\":8,"
    "\"group_size\":2,\"staleness_bound\":8,\"global_sync\":\"barrier\",\"optimizer\":{\"type\":"
    "\"sgd\",\"lr\":0.05,\"momentum\":0.9},\"batch_size\":64,\"iterations\":1000,"
    "\"eval_every\":100,\"seed\":1,\"device\":\"cpu\",\"checkpoint\":{\"every\":0,\"path\":\"\"}},"
    "\"status\":{\"state\":\"running\",\"reason\":\"\",\"epoch\":3,\"iteration\":250,"
    "\"start_round\":200,\"regroupings\":2,\"created\":1700000000.5,\"started\":1700000001,"
    "\"finished\":0,\"members\":[\"agent-a\",\"agent-b\"]},"
    "\"members\":[{\"rank\":0,\"name\":\"agent-a\",\"address\":\"127.0.0.1:7001\",\"joiner\":false,"
    "\"alive\":true,\"progress\":{\"state\":\"running\",\"iteration\":250,\"loss\":0.51234,"
    "\"accuracy\":0.8,\"step_time\":0.02,\"staleness\":1,\"role\":\"active\"}},"
    "{\"rank\":1,\"name\":\"agent-b\",\"address\":\"127.0.0.1:7002\",\"joiner\":true,"
    "\"alive\":false,\"progress\":null}]}";

static void test_render_jobs(void **state) {
  (void)state;
  char *list = NULL;
  assert_true(asprintf(&list, "{\"jobs\":[%s]}", job_json) > 0);
  json_t *root = load(list);
  capture_t c;
  cap_open(&c);
  assert_int_equal(wg_ctl_render_jobs(root, c.f), 0);
  const char *text = cap_text(&c);
  char l0[256], l1[256];
  line_of(text, 0, l0, sizeof l0);
  line_of(text, 1, l1, sizeof l1);
  assert_int_equal(column_of(l0, "ID"), 0);
  assert_int_equal(column_of(l1, "mnist-1"), 0);
  assert_int_equal(column_of(l1, "running"), column_of(l0, "STATE"));
  assert_int_equal(column_of(l1, "2/4"), column_of(l0, "WORKERS"));
  assert_int_equal(column_of(l1, "250"), column_of(l0, "ITERATION"));
  assert_int_equal(column_of(l1, "wagma"), column_of(l0, "ALGORITHM"));
  assert_int_equal(column_of(l1, "mlp"), column_of(l0, "MODEL"));
  cap_close(&c);
  json_decref(root);
  free(list);
  /* wrong shape */
  root = load("{\"items\":[]}");
  cap_open(&c);
  assert_int_equal(wg_ctl_render_jobs(root, c.f), -1);
  cap_close(&c);
  json_decref(root);
}

static void test_render_job(void **state) {
  (void)state;
  json_t *root = load(job_json);
  capture_t c;
  cap_open(&c);
  assert_int_equal(wg_ctl_render_job(root, c.f), 0);
  const char *text = cap_text(&c);
  assert_non_null(strstr(text, "mnist-1"));
  assert_non_null(strstr(text, "2 of 4 (min 2, max 8)"));
  assert_non_null(strstr(text, "250 of 1000"));
  assert_non_null(strstr(text, "2023-11-14T22:13:20Z")); /* created */
  /* the member table: header, then one row per member aligned under it */
  const char *hdr = strstr(text, "RANK");
  assert_non_null(hdr);
  char h[256], r0[256], r1[256];
  line_of(hdr, 0, h, sizeof h);
  line_of(hdr, 1, r0, sizeof r0);
  line_of(hdr, 2, r1, sizeof r1);
  assert_int_equal(column_of(r0, "agent-a"), column_of(h, "NAME"));
  assert_int_equal(column_of(r0, "0.5123"), column_of(h, "LOSS"));
  assert_int_equal(column_of(r0, "80.00%"), column_of(h, "ACCURACY"));
  assert_int_equal(column_of(r0, "20.0ms"), column_of(h, "STEP_TIME"));
  assert_int_equal(column_of(r1, "agent-b"), column_of(h, "NAME"));
  assert_int_equal(column_of(r1, "no"), column_of(h, "ALIVE"));
  assert_int_equal(column_of(r0, "active"), column_of(h, "ROLE"));
  assert_int_equal(column_of(r1 + column_of(h, "LOSS"), "-"), 0); /* no progress yet */
  cap_close(&c);
  json_decref(root);
}

/* A member that cannot reach peers on the data plane gets a line naming them (issue 27). */
static void test_render_job_unreachable(void **state) {
  (void)state;
  json_t *root = load(job_json);
  json_t *m0 = json_array_get(json_object_get(root, "members"), 0);
  json_object_set_new(json_object_get(m0, "progress"), "unreachable",
                      json_pack("[{s:i,s:f}]", "rank", 1, "for", 4.25));
  json_object_set_new(json_object_get(m0, "progress"), "epoch", json_integer(3));
  capture_t c;
  cap_open(&c);
  assert_int_equal(wg_ctl_render_job(root, c.f), 0);
  const char *text = cap_text(&c);
  assert_non_null(strstr(text, "agent-a cannot reach 1 peer on the data plane: agent-b (4.2 s)"));
  cap_close(&c);
  json_object_set_new(json_object_get(m0, "progress"), "unreachable_total", json_integer(7));
  cap_open(&c);
  assert_int_equal(wg_ctl_render_job(root, c.f), 0);
  assert_non_null(strstr(cap_text(&c), "agent-a cannot reach 7 peers on the data plane:"));
  cap_close(&c);
  /* a report of an older epoch: its ranks name another plan's members, no line */
  json_object_set_new(json_object_get(m0, "progress"), "epoch", json_integer(2));
  cap_open(&c);
  assert_int_equal(wg_ctl_render_job(root, c.f), 0);
  assert_null(strstr(cap_text(&c), "cannot reach"));
  cap_close(&c);
  json_decref(root);
}

/* A server that does not report "alive" gets no ALIVE column (and the rest stays aligned). */
static void test_render_job_without_alive(void **state) {
  (void)state;
  json_t *root = load(job_json);
  size_t i;
  json_t *m;
  json_array_foreach(json_object_get(root, "members"), i, m) json_object_del(m, "alive");
  capture_t c;
  cap_open(&c);
  assert_int_equal(wg_ctl_render_job(root, c.f), 0);
  const char *hdr = strstr(cap_text(&c), "RANK");
  assert_non_null(hdr);
  char h[256], r0[256];
  line_of(hdr, 0, h, sizeof h);
  line_of(hdr, 1, r0, sizeof r0);
  assert_null(strstr(h, "ALIVE"));
  assert_int_equal(column_of(r0, "running"), column_of(h, "STATE"));
  assert_int_equal(column_of(r0, "0.5123"), column_of(h, "LOSS"));
  cap_close(&c);
  json_decref(root);
}

static void test_render_groups_plan_agents_health(void **state) {
  (void)state;
  capture_t c;
  json_t *g = load("{\"job\":\"j\",\"epoch\":2,\"iteration\":9,\"phase\":1,\"kind\":\"group\","
                   "\"groups\":[{\"group\":0,\"ranks\":[0,2],\"members\":[\"a\",\"c\"]},"
                   "{\"group\":1,\"ranks\":[1,3],\"members\":[\"b\",\"d\"]}]}");
  cap_open(&c);
  assert_int_equal(wg_ctl_render_groups(g, c.f), 0);
  const char *text = cap_text(&c);
  assert_non_null(strstr(text, "job j  epoch 2  iteration 9  phase 1  kind group"));
  char h[128], r[128];
  line_of(text, 1, h, sizeof h);
  line_of(text, 3, r, sizeof r);
  assert_int_equal(column_of(r, "1,3"), column_of(h, "RANKS"));
  assert_int_equal(column_of(r, "b,d"), column_of(h, "MEMBERS"));
  cap_close(&c);
  json_decref(g);

  json_t *p = load("{\"epoch\":2,\"start_round\":100,\"group_size\":2,\"staleness_bound\":8,"
                   "\"global_sync\":\"barrier\",\"members\":[{\"rank\":0,\"name\":\"a\","
                   "\"address\":\"h:1\",\"joiner\":false},{\"rank\":1,\"name\":\"b\","
                   "\"address\":\"h:2\",\"joiner\":true}],\"phases\":[[[0,1]],[[0],[1]]]}");
  cap_open(&c);
  assert_int_equal(wg_ctl_render_plan(p, c.f), 0);
  text = cap_text(&c);
  assert_non_null(strstr(text, "phases (2):\n  0: [0 1]\n  1: [0] [1]\n"));
  assert_non_null(strstr(text, "start round:  100"));
  cap_close(&c);
  json_decref(p);

  json_t *ag = load("{\"agents\":[{\"name\":\"a1\",\"address\":\"127.0.0.1:9\",\"device\":"
                    "\"cpu\",\"capacity\":1,\"version\":\"0.1.0\",\"started\":0,\"job\":null},"
                    "{\"name\":\"a2\",\"address\":\"127.0.0.1:10\",\"device\":\"cuda\","
                    "\"capacity\":2,\"version\":\"0.1.0\",\"started\":0,\"job\":\"j\","
                    "\"healthy\":false,\"quarantine\":{\"reason\":\"bad data\",\"job\":\"j\"}},"
                    "{\"name\":\"a3\",\"address\":\"127.0.0.1:11\",\"device\":\"cpu\","
                    "\"capacity\":1,\"version\":\"0.1.0\",\"started\":0,\"job\":null,"
                    "\"healthy\":true}]}");
  cap_open(&c);
  assert_int_equal(wg_ctl_render_agents(ag, c.f), 0);
  text = cap_text(&c);
  line_of(text, 0, h, sizeof h);
  line_of(text, 2, r, sizeof r);
  assert_int_equal(column_of(r, "cuda"), column_of(h, "DEVICE"));
  assert_int_equal(column_of(r, "j "), column_of(h, "JOB"));
  /* HEALTHY (the last column): the quarantine's reason, "yes", or "-" when the coordinator
   * does not say */
  int healthy = column_of(h, "HEALTHY");
  assert_true(healthy > 0);
  assert_string_equal(r + healthy, "no: bad data");
  line_of(text, 3, r, sizeof r);
  assert_string_equal(r + healthy, "yes");
  line_of(text, 1, r, sizeof r);
  assert_string_equal(r + healthy, "-");
  cap_close(&c);
  json_decref(ag);

  json_t *hz = load("{\"ready\":true,\"id\":\"c1\",\"leader\":false,\"revision\":7}");
  cap_open(&c);
  assert_int_equal(wg_ctl_render_health(hz, c.f), 0);
  text = cap_text(&c);
  assert_non_null(strstr(text, "ready:        yes\n"));
  assert_non_null(strstr(text, "leader:       no\n"));
  assert_non_null(strstr(text, "revision:     7\n"));
  cap_close(&c);
  json_decref(hz);
}

static void test_errors_and_exit_codes(void **state) {
  (void)state;
  assert_int_equal(wg_ctl_exit_for_status(200), WG_CTL_EXIT_OK);
  assert_int_equal(wg_ctl_exit_for_status(201), WG_CTL_EXIT_OK);
  assert_int_equal(wg_ctl_exit_for_status(204), WG_CTL_EXIT_OK);
  assert_int_equal(wg_ctl_exit_for_status(404), WG_CTL_EXIT_NOT_FOUND);
  assert_int_equal(wg_ctl_exit_for_status(401), WG_CTL_EXIT_SERVER);
  assert_int_equal(wg_ctl_exit_for_status(422), WG_CTL_EXIT_SERVER);
  assert_int_equal(wg_ctl_exit_for_status(503), WG_CTL_EXIT_SERVER);
  capture_t c;
  const char body[] = "{\"error\":{\"code\":\"invalid_spec\",\"message\":\"must be > 0\","
                      "\"field\":\"optimizer.lr\"}}";
  cap_open(&c);
  wg_ctl_print_error(422, body, sizeof body - 1, c.f);
  assert_string_equal(cap_text(&c),
                      "wagmactl: HTTP 422 invalid_spec: must be > 0 (field: optimizer.lr)\n");
  cap_close(&c);
  const char html[] = "<html>\x1b[31mBad gateway\nmore</html>";
  cap_open(&c);
  wg_ctl_print_error(502, html, sizeof html - 1, c.f);
  assert_string_equal(cap_text(&c), "wagmactl: HTTP 502: <html>?[31mBad gateway\n");
  cap_close(&c);
  cap_open(&c);
  wg_ctl_print_error(500, "", 0, c.f);
  assert_string_equal(cap_text(&c), "wagmactl: HTTP 500\n");
  cap_close(&c);
}

/* ---- HTTP client deadlines ----------------------------------------------------------------- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* A listening socket on a free 127.0.0.1 port that never accepts: connects succeed (the
 * kernel completes the handshake), answers never come. */
static int silent_listener(int *port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  assert_int_equal(listen(fd, 16), 0);
  socklen_t sl = sizeof sa;
  assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
  *port = ntohs(sa.sin_port);
  return fd;
}

static void test_http_deadline(void **state) {
  (void)state;
  int port = 0;
  int fd = silent_listener(&port);
  char server[64];
  snprintf(server, sizeof server, "http://127.0.0.1:%d", port);
  wg_ctl_conn_t conn = {.server = server, .token = "t", .timeout_s = 0.5};
  wg_ctl_response_t res;
  double t0 = now_s();
  assert_int_equal(wg_ctl_http_request(&conn, "GET", "/v1/jobs", NULL, 0, &res), -1);
  double took = now_s() - t0;
  assert_int_equal(res.status, 0);
  assert_int_equal(res.timed_out, 1);
  assert_true(res.error[0] != '\0');
  assert_true(took >= 0.4 && took < 10.0); /* the deadline, not forever */
  wg_ctl_response_free(&res);
  close(fd); /* now nobody listens on that port: refused at once */
  t0 = now_s();
  conn.timeout_s = 5;
  assert_int_equal(wg_ctl_http_request(&conn, "GET", "/healthz", NULL, 0, &res), -1);
  assert_int_equal(res.status, 0);
  assert_int_equal(res.timed_out, 0);
  assert_true(now_s() - t0 < 4.0);
  wg_ctl_response_free(&res);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse_defaults),
      cmocka_unit_test(test_parse_globals_anywhere),
      cmocka_unit_test(test_parse_commands),
      cmocka_unit_test(test_parse_help),
      cmocka_unit_test(test_parse_usage_errors),
      cmocka_unit_test(test_parse_env_and_token_file),
      cmocka_unit_test(test_format_cells),
      cmocka_unit_test(test_table_alignment),
      cmocka_unit_test(test_render_jobs),
      cmocka_unit_test(test_render_job),
      cmocka_unit_test(test_render_job_without_alive),
      cmocka_unit_test(test_render_job_unreachable),
      cmocka_unit_test(test_render_groups_plan_agents_health),
      cmocka_unit_test(test_errors_and_exit_codes),
      cmocka_unit_test(test_http_deadline),
  };
  if (wg_ctl_http_global_init() != 0)
    return 1;
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  wg_ctl_http_global_cleanup();
  return rc;
}
