/* Unit tests of how wagmactl shows a program job and an agent's programs (api/wagmactl/
 * render.c), from specs and registrations as the API encodes them: `get`'s "model:" line
 * (program and its arguments, shell-quoted for display only), `list`'s MODEL column, and
 * `agents`' PROGRAMS column. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ctl.h"
#include "wagma/api.h"

/* A job as GET /v1/jobs/{id} shows it, with the spec of json (decoded and encoded by the API,
 * as the coordinator stores it). Ownership: the caller decrefs. */
static json_t *job_of(const char *spec_json) {
  wagma_job_spec_t s;
  wagma_api_error_t err;
  if (wagma_job_spec_from_json(spec_json, strlen(spec_json), &s, &err) != 0)
    fail_msg("%s: %s: %s", spec_json, err.field, err.message);
  json_t *job =
      json_pack("{s:s,s:o,s:{s:s,s:s,s:i,s:i}}", "id", "j", "spec", wagma_job_spec_to_value(&s),
                "status", "state", "pending", "reason", "", "epoch", 0, "iteration", 0);
  assert_non_null(job);
  return job;
}

/* What render wrote, NUL-terminated. Ownership: the caller frees. */
static char *rendered(int (*render)(const json_t *, FILE *), const json_t *v) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  assert_non_null(f);
  assert_int_equal(render(v, f), 0);
  fclose(f);
  return text;
}

/* The value of the "key:" line of a `get` view (after the aligned spaces), into buf. */
static const char *line_value(const char *text, const char *key, char *buf, size_t len) {
  const char *p = strstr(text, key);
  if (!p)
    fail_msg("no '%s' line in:\n%s", key, text);
  p += strlen(key);
  while (*p == ' ')
    p++;
  size_t n = strcspn(p, "\n");
  snprintf(buf, len, "%.*s", (int)(n < len ? n : len - 1), p);
  return buf;
}

static void test_get_model_line(void **state) {
  (void)state;
  char line[4096];
  json_t *job = job_of("{\"workers\":2,\"program\":{\"name\":\"fmnist_cnn\",\"args\":[\"--lr\","
                       "\"0.05\"]}}");
  char *text = rendered(wg_ctl_render_job, job);
  assert_string_equal(line_value(text, "\nmodel:", line, sizeof line),
                      "program fmnist_cnn --lr 0.05 (cpu), batch 64");
  free(text);
  json_decref(job);

  /* arguments a shell would split or expand are quoted for display; control characters '?' */
  job = job_of("{\"workers\":1,\"device\":\"cuda\",\"batch_size\":32,\"program\":{\"name\":\"p\","
               "\"args\":[\"; rm -rf /\",\"it's\",\"\",\"$(x)\",\"a\\nb\",\"--k=v\",\"x y\"]}}");
  text = rendered(wg_ctl_render_job, job);
  assert_string_equal(line_value(text, "\nmodel:", line, sizeof line),
                      "program p '; rm -rf /' 'it'\\''s' '' '$(x)' 'a?b' --k=v 'x y' (cuda), "
                      "batch 32");
  free(text);
  json_decref(job);

  /* a built-in job as before */
  job = job_of("{\"workers\":1,\"model\":\"mlp\",\"dataset\":\"synthetic\"}");
  text = rendered(wg_ctl_render_job, job);
  assert_string_equal(line_value(text, "\nmodel:", line, sizeof line),
                      "mlp on synthetic (cpu), batch 64");
  free(text);
  json_decref(job);

  /* the longest command line there is: cut with "..." */
  char spec[16384];
  int n = snprintf(spec, sizeof spec, "{\"workers\":1,\"program\":{\"name\":\"p\",\"args\":[");
  for (int i = 0; i < WAGMA_API_PROGRAM_ARGS_MAX; i++) {
    n += snprintf(spec + n, sizeof spec - (size_t)n, "%s\"", i ? "," : "");
    for (int k = 0; k < WAGMA_API_PROGRAM_ARG_MAX - 1; k++)
      spec[n++] = '\'';
    n += snprintf(spec + n, sizeof spec - (size_t)n, "\"");
  }
  snprintf(spec + n, sizeof spec - (size_t)n, "]}}");
  job = job_of(spec);
  text = rendered(wg_ctl_render_job, job);
  line_value(text, "\nmodel:", line, sizeof line);
  assert_non_null(strstr(line, "program p '"));
  assert_non_null(strstr(line, "...")); /* cut */
  free(text);
  json_decref(job);
}

static void test_list_model_column(void **state) {
  (void)state;
  json_t *jobs = json_pack("{s:[o,o]}", "jobs",
                           job_of("{\"workers\":1,\"program\":{\"name\":\"fmnist_cnn\",\"args\":["
                                  "\"--lr\",\"0.05\"]}}"),
                           job_of("{\"workers\":1,\"model\":\"lenet5\"}"));
  char *text = rendered(wg_ctl_render_jobs, jobs);
  char *row1 = strchr(text, '\n') + 1, *row2 = strchr(row1, '\n') + 1;
  size_t col = (size_t)(strstr(text, "MODEL") - text);
  assert_int_equal(strncmp(row1 + col, "fmnist_cnn ", 11), 0);
  assert_int_equal(strncmp(row2 + col, "lenet5 ", 7), 0);
  free(text);
  json_decref(jobs);
}

static void test_agents_programs_column(void **state) {
  (void)state;
  const char *regs[] = {"{\"address\":\"h:1\",\"programs\":[\"train.py\",\"fmnist_cnn\"]}",
                        "{\"address\":\"h:2\"}"};
  json_t *agents = json_array();
  for (int i = 0; i < 2; i++) {
    wagma_agent_info_t a;
    wagma_api_error_t err;
    assert_int_equal(wagma_agent_info_from_json(regs[i], strlen(regs[i]), &a, &err), 0);
    json_t *o = wagma_agent_info_to_value(&a);
    json_object_set_new(o, "name", json_string(i ? "a1" : "a0"));
    json_object_set_new(o, "job", json_null());
    json_object_set_new(o, "healthy", json_true());
    json_array_append_new(agents, o);
  }
  json_t *root = json_pack("{s:o}", "agents", agents);
  char *text = rendered(wg_ctl_render_agents, root);
  char *row1 = strchr(text, '\n') + 1, *row2 = strchr(row1, '\n') + 1;
  size_t col = (size_t)(strstr(text, "PROGRAMS") - text);
  assert_int_equal(strncmp(row1 + col, "fmnist_cnn,train.py ", 20), 0);
  assert_int_equal(strncmp(row2 + col, "- ", 2), 0);
  /* HEALTHY stays the last column */
  assert_non_null(strstr(text, "HEALTHY\n"));
  free(text);
  json_decref(root);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_get_model_line),
      cmocka_unit_test(test_list_model_column),
      cmocka_unit_test(test_agents_programs_column),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
