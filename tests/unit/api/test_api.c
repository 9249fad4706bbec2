/* Unit tests of wagma_api: job spec codec (defaults, round trip, a table of bad specs each
 * naming its field), PATCH bodies, status / progress / checkpoint / agent / assignment codecs,
 * program jobs (names, arguments kept verbatim, what a program job may not say) and the
 * programs of an agent's registration, the REST error body, and the etcd key layout. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "wagma/api.h"

static int spec_parse(const char *json, wagma_job_spec_t *s, wagma_api_error_t *err) {
  memset(err, 0, sizeof *err);
  return wagma_job_spec_from_json(json, strlen(json), s, err);
}

static void test_spec_defaults(void **state) {
  (void)state;
  wagma_job_spec_t s;
  wagma_api_error_t err;
  assert_int_equal(spec_parse("{\"workers\":8}", &s, &err), 0);
  assert_string_equal(s.name, "");
  assert_int_equal(s.model, WAGMA_MODEL_SOFTMAX);
  assert_int_equal(s.dataset, WAGMA_DATASET_FASHION_MNIST);
  assert_int_equal(s.algorithm, WAGMA_ALGO_WAGMA);
  assert_int_equal(s.workers, 8);
  assert_int_equal(s.min_workers, 8);
  assert_int_equal(s.max_workers, 8);
  assert_int_equal(s.group_size, 4);
  assert_int_equal(s.staleness_bound, 8);
  assert_int_equal(s.global_sync, WAGMA_SYNC_BARRIER);
  assert_int_equal(s.optimizer.type, WAGMA_OPT_SGD);
  assert_true(fabs(s.optimizer.lr - 0.05) < 1e-12);
  assert_true(fabs(s.optimizer.momentum - 0.9) < 1e-12);
  assert_int_equal(s.batch_size, 64);
  assert_int_equal(s.iterations, 1000);
  assert_int_equal(s.epochs, 0);
  assert_int_equal(s.eval_every, 100);
  assert_int_equal(s.seed, 1);
  assert_int_equal(s.device, WAGMA_DEVICE_CPU);
  assert_int_equal(s.checkpoint.every, 0);
  assert_int_equal(s.gradient_delay, 0);
  assert_int_equal(s.ps_shards, 1);
  assert_true(fabs(s.dc_lambda - 0.04) < 1e-12);
  /* the asgd family with its knobs; ps_shards only needs to leave a worker */
  assert_int_equal(
      spec_parse("{\"workers\":4,\"algorithm\":\"dc-asgd\",\"ps_shards\":3,\"dc_lambda\":2}", &s,
                 &err),
      0);
  assert_int_equal(s.algorithm, WAGMA_ALGO_DC_ASGD);
  assert_int_equal(s.ps_shards, 3);
  assert_true(s.dc_lambda == 2);
  assert_int_equal(s.dc_adaptive, 0);
  assert_int_equal(
      spec_parse("{\"workers\":2,\"algorithm\":\"dc-asgd\",\"dc_adaptive\":true}", &s, &err), 0);
  assert_int_equal(s.dc_adaptive, 1);
  assert_int_equal(spec_parse("{\"workers\":1,\"ps_shards\":4}", &s, &err), 0);

  /* adam without momentum gets momentum 0; epochs replaces iterations */
  assert_int_equal(
      spec_parse("{\"workers\":2,\"optimizer\":{\"type\":\"adam\",\"lr\":0.001},\"epochs\":3}", &s,
                 &err),
      0);
  assert_int_equal(s.optimizer.type, WAGMA_OPT_ADAM);
  assert_true(s.optimizer.momentum == 0);
  assert_int_equal(s.iterations, 0);
  assert_int_equal(s.epochs, 3);

  /* max_workers below workers by default is an error, min_workers follows max when smaller */
  assert_int_equal(spec_parse("{\"workers\":4,\"min_workers\":2,\"max_workers\":16}", &s, &err), 0);
  assert_int_equal(s.min_workers, 2);
  assert_int_equal(s.max_workers, 16);
}

static void test_spec_round_trip(void **state) {
  (void)state;
  const char *full =
      "{\"name\":\"fmnist-1\",\"model\":\"lenet5\",\"dataset\":\"synthetic\","
      "\"algorithm\":\"local-sgd\",\"workers\":16,\"min_workers\":4,\"max_workers\":32,"
      "\"group_size\":8,\"staleness_bound\":3,\"global_sync\":\"wait-avoiding\","
      "\"optimizer\":{\"type\":\"sgd\",\"lr\":0.2,\"momentum\":0.5,\"nesterov\":true,"
      "\"weight_decay\":0.0001,\"warmup\":50},\"batch_size\":128,\"iterations\":777,"
      "\"eval_every\":0,\"seed\":42,\"device\":\"cuda\","
      "\"checkpoint\":{\"every\":100,\"path\":\"fmnist/run-1\"},\"gradient_delay\":32}";
  wagma_job_spec_t a, b;
  wagma_api_error_t err;
  char *json = NULL;
  assert_int_equal(spec_parse(full, &a, &err), 0);
  assert_string_equal(a.name, "fmnist-1");
  assert_int_equal(a.model, WAGMA_MODEL_LENET5);
  assert_int_equal(a.dataset, WAGMA_DATASET_SYNTHETIC);
  assert_int_equal(a.algorithm, WAGMA_ALGO_LOCAL_SGD);
  assert_int_equal(a.global_sync, WAGMA_SYNC_WAIT_AVOIDING);
  assert_int_equal(a.optimizer.nesterov, 1);
  assert_int_equal(a.optimizer.warmup, 50);
  assert_int_equal(a.device, WAGMA_DEVICE_CUDA);
  assert_string_equal(a.checkpoint.path, "fmnist/run-1");
  assert_int_equal(a.gradient_delay, 32);
  assert_int_equal(wagma_job_spec_to_json(&a, &json), 0);
  assert_non_null(strstr(json, "\"gradient_delay\":32"));
  assert_int_equal(spec_parse(json, &b, &err), 0);
  char *json2 = NULL;
  assert_int_equal(wagma_job_spec_to_json(&b, &json2), 0);
  assert_string_equal(json, json2);
  assert_int_equal(b.workers, 16);
  assert_int_equal(b.min_workers, 4);
  assert_int_equal(b.max_workers, 32);
  assert_true(b.optimizer.weight_decay == 0.0001);
  free(json);
  free(json2);
}

struct bad_spec {
  const char *json;
  const char *field;
};

static const struct bad_spec bad_specs[] = {
    {"{}", "workers"},
    {"{\"workers\":0}", "workers"},
    {"{\"workers\":10001}", "workers"},
    {"{\"workers\":\"4\"}", "workers"},
    {"{\"workers\":4.5}", "workers"},
    {"{\"workers\":4,\"colour\":\"red\"}", "colour"},
    {"{\"workers\":4,\"name\":\"has space\"}", "name"},
    {"{\"workers\":4,\"name\":\"a/b\"}", "name"},
    {"{\"workers\":4,\"name\":\"\"}", "name"},
    {"{\"workers\":4,\"name\":7}", "name"},
    {"{\"workers\":4,\"model\":\"resnet\"}", "model"},
    {"{\"workers\":4,\"dataset\":\"imagenet\"}", "dataset"},
    {"{\"workers\":4,\"algorithm\":\"downpour\"}", "algorithm"},
    {"{\"workers\":4,\"algorithm\":\"asgd\",\"ps_shards\":4}", "ps_shards"},
    {"{\"workers\":4,\"ps_shards\":0}", "ps_shards"},
    {"{\"workers\":4,\"ps_shards\":65}", "ps_shards"},
    {"{\"workers\":4,\"dc_lambda\":-0.1}", "dc_lambda"},
    {"{\"workers\":4,\"dc_lambda\":1001}", "dc_lambda"},
    {"{\"workers\":4,\"dc_adaptive\":1}", "dc_adaptive"},
    {"{\"workers\":4,\"min_workers\":5}", "min_workers"},
    {"{\"workers\":4,\"min_workers\":0}", "min_workers"},
    {"{\"workers\":4,\"max_workers\":3,\"min_workers\":1}", "max_workers"},
    {"{\"workers\":4,\"group_size\":1}", "group_size"},
    {"{\"workers\":4,\"staleness_bound\":0}", "staleness_bound"},
    {"{\"workers\":4,\"global_sync\":\"never\"}", "global_sync"},
    {"{\"workers\":4,\"optimizer\":[]}", "optimizer"},
    {"{\"workers\":4,\"optimizer\":{\"type\":\"rmsprop\"}}", "optimizer.type"},
    {"{\"workers\":4,\"optimizer\":{\"lr\":0}}", "optimizer.lr"},
    {"{\"workers\":4,\"optimizer\":{\"lr\":-1}}", "optimizer.lr"},
    {"{\"workers\":4,\"optimizer\":{\"momentum\":1.0}}", "optimizer.momentum"},
    {"{\"workers\":4,\"optimizer\":{\"nesterov\":1}}", "optimizer.nesterov"},
    {"{\"workers\":4,\"optimizer\":{\"nesterov\":true,\"momentum\":0}}", "optimizer.nesterov"},
    {"{\"workers\":4,\"optimizer\":{\"weight_decay\":-0.1}}", "optimizer.weight_decay"},
    {"{\"workers\":4,\"optimizer\":{\"warmup\":-1}}", "optimizer.warmup"},
    {"{\"workers\":4,\"optimizer\":{\"beta\":0.9}}", "optimizer.beta"},
    {"{\"workers\":4,\"batch_size\":0}", "batch_size"},
    {"{\"workers\":4,\"gradient_delay\":-1}", "gradient_delay"},
    {"{\"workers\":4,\"gradient_delay\":1025}", "gradient_delay"},
    {"{\"workers\":4,\"gradient_delay\":2.5}", "gradient_delay"},
    {"{\"workers\":4,\"iterations\":0}", "iterations"},
    {"{\"workers\":4,\"iterations\":10,\"epochs\":1}", "epochs"},
    {"{\"workers\":4,\"epochs\":0}", "epochs"},
    {"{\"workers\":4,\"eval_every\":-5}", "eval_every"},
    {"{\"workers\":4,\"seed\":-1}", "seed"},
    {"{\"workers\":4,\"device\":\"tpu\"}", "device"},
    {"{\"workers\":4,\"checkpoint\":{\"every\":10}}", "checkpoint.path"},
    {"{\"workers\":4,\"checkpoint\":{\"path\":3}}", "checkpoint.path"},
    {"{\"workers\":4,\"checkpoint\":{\"dir\":\"/x\"}}", "checkpoint.dir"},
    {"{\"workers\":4,\"checkpoint\":\"yes\"}", "checkpoint"},
    {"[1,2]", ""},
    {"{\"workers\":4", ""},
    {"", ""},
    {"{\"workers\":4,\"workers\":5}", ""},
};

static void test_spec_bad_table(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof bad_specs / sizeof bad_specs[0]; i++) {
    wagma_job_spec_t s;
    wagma_api_error_t err;
    int rc = spec_parse(bad_specs[i].json, &s, &err);
    if (rc != WAGMA_EINVAL || strcmp(err.field, bad_specs[i].field) != 0)
      fail_msg("spec %zu %s: rc %d field '%s' (want '%s'): %s", i, bad_specs[i].json, rc, err.field,
               bad_specs[i].field, err.message);
    assert_true(strlen(err.message) > 0);
  }
}

/* checkpoint.path is relative to the agent's checkpoint root: nothing that could leave it
 * (absolute, "..") or hide in it (control characters, empty or "." components). */
static void test_spec_checkpoint_path(void **state) {
  (void)state;
  static const char *const good[] = {"ck",      "ck/run-1",          "a b/c", "x.ckpt", "..a/b..",
                                     ".hidden", "d\xc3\xa9j\xc3\xa0"};
  static const char *const bad[] = {
      "../../../../etc", "..",  "../x", "a/../b", "a/..",      ".",     "./ck",  "a/./b",    "/etc",
      "/tmp/ck",         "//x", "a//b", "a/",     "a\\u0001b", "a\\nb", "a\\tb", "a\\u007fb"};
  char json[512];
  wagma_job_spec_t s;
  wagma_api_error_t err;
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    snprintf(json, sizeof json, "{\"workers\":1,\"checkpoint\":{\"every\":5,\"path\":\"%s\"}}",
             good[i]);
    if (spec_parse(json, &s, &err) != 0)
      fail_msg("%s refused: %s: %s", good[i], err.field, err.message);
    assert_string_equal(s.checkpoint.path, good[i]);
  }
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    snprintf(json, sizeof json, "{\"workers\":1,\"checkpoint\":{\"every\":5,\"path\":\"%s\"}}",
             bad[i]);
    if (spec_parse(json, &s, &err) != WAGMA_EINVAL)
      fail_msg("%s accepted", bad[i]);
    assert_string_equal(err.field, "checkpoint.path");
    /* The rule holds without checkpoints too: a stored path is never one to escape with. */
    snprintf(json, sizeof json, "{\"workers\":1,\"checkpoint\":{\"path\":\"%s\"}}", bad[i]);
    assert_int_equal(spec_parse(json, &s, &err), WAGMA_EINVAL);
    assert_string_equal(err.field, "checkpoint.path");
  }
  /* wagma_job_spec_validate on its own (a spec built in code) says the same. */
  assert_int_equal(spec_parse("{\"workers\":1}", &s, &err), 0);
  snprintf(s.checkpoint.path, sizeof s.checkpoint.path, "../../../../etc");
  assert_int_equal(wagma_job_spec_validate(&s, &err), WAGMA_EINVAL);
  assert_string_equal(err.field, "checkpoint.path");
}

static void test_patch(void **state) {
  (void)state;
  wagma_job_spec_t s;
  wagma_job_patch_t p;
  wagma_api_error_t err;
  assert_int_equal(spec_parse("{\"workers\":4,\"min_workers\":2,\"max_workers\":8}", &s, &err), 0);
  const char *ok = "{\"workers\":6}";
  assert_int_equal(wagma_job_patch_from_json(ok, strlen(ok), &p, &err), 0);
  assert_int_equal(wagma_job_patch_apply(&p, &s, &err), 0);
  assert_int_equal(s.workers, 6);

  const char *too_many = "{\"workers\":9}";
  assert_int_equal(wagma_job_patch_from_json(too_many, strlen(too_many), &p, &err), 0);
  assert_int_equal(wagma_job_patch_apply(&p, &s, &err), WAGMA_EINVAL);
  assert_string_equal(err.field, "workers");
  assert_int_equal(s.workers, 6); /* unchanged on error */

  const char *both = "{\"workers\":10,\"max_workers\":12}";
  assert_int_equal(wagma_job_patch_from_json(both, strlen(both), &p, &err), 0);
  assert_int_equal(wagma_job_patch_apply(&p, &s, &err), 0);
  assert_int_equal(s.workers, 10);
  assert_int_equal(s.max_workers, 12);

  const char *imm = "{\"model\":\"mlp\"}";
  assert_int_equal(wagma_job_patch_from_json(imm, strlen(imm), &p, &err), WAGMA_EINVAL);
  assert_string_equal(err.field, "model");
  assert_non_null(strstr(err.message, "immutable"));
  const char *unk = "{\"replicas\":3}";
  assert_int_equal(wagma_job_patch_from_json(unk, strlen(unk), &p, &err), WAGMA_EINVAL);
  assert_string_equal(err.field, "replicas");
  const char *empty = "{}";
  assert_int_equal(wagma_job_patch_from_json(empty, strlen(empty), &p, &err), WAGMA_EINVAL);
  const char *badtype = "{\"workers\":true}";
  assert_int_equal(wagma_job_patch_from_json(badtype, strlen(badtype), &p, &err), WAGMA_EINVAL);
  assert_string_equal(err.field, "workers");
}

static void test_status_codec(void **state) {
  (void)state;
  wagma_job_status_t a = {0}, b = {0};
  wagma_api_error_t err;
  const char *names[] = {"agent-0", "agent-1", "agent-2"};
  char *json = NULL;
  a.state = WAGMA_JOB_RUNNING;
  snprintf(a.reason, sizeof a.reason, "3 of 4 workers");
  a.epoch = 7;
  a.iteration = 1234;
  a.start_round = 1200;
  a.regroupings = 6;
  a.created = 1700000000.5;
  a.started = 1700000001.25;
  assert_int_equal(wagma_job_status_set_members(&a, names, 3), 0);
  assert_int_equal(wagma_job_status_to_json(&a, &json), 0);
  assert_int_equal(wagma_job_status_from_json(json, strlen(json), &b, &err), 0);
  assert_int_equal(b.state, WAGMA_JOB_RUNNING);
  assert_string_equal(b.reason, a.reason);
  assert_int_equal(b.epoch, 7);
  assert_int_equal(b.iteration, 1234);
  assert_int_equal(b.start_round, 1200);
  assert_int_equal(b.regroupings, 6);
  assert_true(b.created == a.created && b.started == a.started && b.finished == 0);
  assert_int_equal(b.nmembers, 3);
  assert_string_equal(b.members[2], "agent-2");
  free(json);
  wagma_job_status_free(&a);
  wagma_job_status_free(&b);

  const char *bad = "{\"state\":\"exploded\"}";
  assert_int_equal(wagma_job_status_from_json(bad, strlen(bad), &b, &err), WAGMA_EINVAL);
  assert_string_equal(err.field, "state");
  const char *badm = "{\"state\":\"running\",\"members\":[\"ok\",\"not ok\"]}";
  assert_int_equal(wagma_job_status_from_json(badm, strlen(badm), &b, &err), WAGMA_EINVAL);
  assert_string_equal(err.field, "members[1]");

  for (int s = WAGMA_JOB_PENDING; s <= WAGMA_JOB_STOPPED; s++) {
    wagma_job_state_t back;
    assert_int_equal(wagma_job_state_from_name(wagma_job_state_name(s), &back), 0);
    assert_int_equal(back, s);
    assert_int_equal(wagma_job_state_terminal(s), s >= WAGMA_JOB_SUCCEEDED);
  }
}

/* The summary of final reports: mean, min, max over the reports that have each value; the
 * codec round trip; absent without reports; a summary out of its ranges refused by field. */
static void test_status_summary(void **state) {
  (void)state;
  wagma_progress_t p[4];
  for (int i = 0; i < 4; i++)
    wagma_progress_init(&p[i]);
  p[0].accuracy = 0.80, p[0].loss = 0.5;
  p[1].accuracy = 0.90, p[1].loss = 0.3;
  p[2].loss = 0.4; /* no evaluation (NaN accuracy) */
  const wagma_progress_t *r[] = {&p[0], NULL, &p[1], &p[2]};
  wagma_job_status_t a = {0}, b = {0};
  wagma_api_error_t err;
  char *json = NULL, line[320];
  a.state = WAGMA_JOB_SUCCEEDED;
  wagma_job_summary_of(&a.summary, r, 4, 1000, 12.25);
  assert_int_equal(a.summary.members, 3);
  assert_int_equal(a.summary.evaluated, 2);
  assert_int_equal(a.summary.with_loss, 3);
  assert_true(fabs(a.summary.accuracy_mean - 0.85) < 1e-12);
  assert_true(a.summary.accuracy_min == 0.80 && a.summary.accuracy_max == 0.90);
  assert_true(fabs(a.summary.loss_mean - 0.4) < 1e-12);
  assert_true(a.summary.loss_min == 0.3 && a.summary.loss_max == 0.5);
  wagma_job_summary_format(&a.summary, line, sizeof line);
  assert_string_equal(line, "test accuracy 0.8500 (0.8000-0.9000 over 2 members), loss 0.4, "
                            "1000 iterations in 12.2 s");
  assert_int_equal(wagma_job_status_to_json(&a, &json), 0);
  assert_non_null(strstr(json, "\"summary\""));
  assert_int_equal(wagma_job_status_from_json(json, strlen(json), &b, &err), 0);
  assert_int_equal(b.summary.members, 3);
  assert_int_equal(b.summary.evaluated, 2);
  assert_true(fabs(b.summary.accuracy_mean - a.summary.accuracy_mean) < 1e-12);
  assert_true(b.summary.loss_max == 0.5 && b.summary.iterations == 1000);
  assert_true(b.summary.wall_time == 12.25);
  free(json);
  wagma_job_status_free(&b);

  /* no reports: no summary in JSON */
  wagma_job_summary_of(&a.summary, r, 0, 5, 1);
  assert_int_equal(a.summary.members, 0);
  assert_true(isnan(a.summary.accuracy_mean));
  assert_int_equal(wagma_job_status_to_json(&a, &json), 0);
  assert_null(strstr(json, "summary"));
  free(json);
  /* reports without accuracy or loss: null, and the line says so */
  wagma_progress_init(&p[3]);
  const wagma_progress_t *r1[] = {&p[3]};
  wagma_job_summary_of(&a.summary, r1, 1, 7, 0);
  wagma_job_summary_format(&a.summary, line, sizeof line);
  assert_string_equal(line, "no test accuracy reported, no loss reported, 7 iterations in 0.0 s");
  assert_int_equal(wagma_job_status_to_json(&a, &json), 0);
  assert_non_null(strstr(json, "\"accuracy\":null"));
  assert_int_equal(wagma_job_status_from_json(json, strlen(json), &b, &err), 0);
  assert_int_equal(b.summary.members, 1);
  assert_true(isnan(b.summary.accuracy_mean));
  free(json);

  static const struct {
    const char *json, *field;
  } bad[] = {
      {"{\"state\":\"failed\",\"summary\":3}", "summary"},
      {"{\"state\":\"failed\",\"summary\":{\"members\":-1}}", "summary.members"},
      {"{\"state\":\"failed\",\"summary\":{\"members\":2,\"evaluated\":3,\"with_loss\":0}}",
       "summary.evaluated"},
      {"{\"state\":\"failed\",\"summary\":{\"members\":2,\"evaluated\":1,\"with_loss\":0,"
       "\"accuracy\":{\"mean\":1.5,\"min\":0,\"max\":1},\"loss\":null,\"iterations\":1,"
       "\"wall_time\":1}}",
       "summary.accuracy.mean"},
      {"{\"state\":\"failed\",\"summary\":{\"members\":2,\"evaluated\":0,\"with_loss\":0,"
       "\"accuracy\":{\"mean\":0.5,\"min\":0,\"max\":1},\"loss\":null,\"iterations\":1,"
       "\"wall_time\":1}}",
       "summary.accuracy"},
      {"{\"state\":\"failed\",\"summary\":{\"members\":2,\"evaluated\":0,\"with_loss\":0,"
       "\"accuracy\":null,\"loss\":null,\"iterations\":1,\"wall_time\":-1}}",
       "summary.wall_time"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    memset(&err, 0, sizeof err);
    assert_int_equal(wagma_job_status_from_json(bad[i].json, strlen(bad[i].json), &b, &err),
                     WAGMA_EINVAL);
    if (strcmp(err.field, bad[i].field) != 0)
      fprintf(stderr, "%s: field %s, wanted %s\n", bad[i].json, err.field, bad[i].field);
    assert_string_equal(err.field, bad[i].field);
  }
}

/* Per-algorithm defaults (asgd and dc-asgd: momentum 0) and the warning of a spec known to
 * train badly: asgd / dc-asgd whose workers x lr / (1 - momentum) reaches 0.9. */
static void test_spec_algorithm_defaults_and_warnings(void **state) {
  (void)state;
  wagma_job_spec_t s;
  wagma_api_error_t err;
  char w[WAGMA_API_WARNINGS_MAX][WAGMA_API_WARNING_MAX];
  static const struct {
    const char *algorithm;
    double momentum;
  } defaults[] = {{"wagma", 0.9},  {"allreduce", 0.9}, {"local-sgd", 0.9},
                  {"adpsgd", 0.9}, {"asgd", 0.0},      {"dc-asgd", 0.0}};
  for (size_t i = 0; i < sizeof defaults / sizeof *defaults; i++) {
    char json[160];
    snprintf(json, sizeof json, "{\"workers\":4,\"algorithm\":\"%s\"}", defaults[i].algorithm);
    assert_int_equal(spec_parse(json, &s, &err), 0);
    assert_true(fabs(s.optimizer.momentum - defaults[i].momentum) < 1e-12);
    /* the defaults of every algorithm train: no warning */
    assert_int_equal(wagma_job_spec_warnings(&s, w, WAGMA_API_WARNINGS_MAX), 0);
    json_t *v = wagma_job_spec_warnings_value(&s);
    assert_true(json_is_array(v) && json_array_size(v) == 0);
    json_decref(v);
  }
  /* the measured cases (docs/benchmarks.md): 4 workers, 1 shard = 3 pushing */
  static const struct {
    const char *json;
    int warned;
  } cases[] = {
      {"{\"workers\":4,\"algorithm\":\"asgd\",\"optimizer\":{\"momentum\":0.9}}", 1}, /* 1.50 */
      {"{\"workers\":4,\"algorithm\":\"dc-asgd\",\"optimizer\":{\"momentum\":0.9}}", 1},
      {"{\"workers\":4,\"algorithm\":\"asgd\",\"optimizer\":{\"lr\":0.1,\"momentum\":0.7}}",
       1},                                                                            /* 1.00 */
      {"{\"workers\":4,\"algorithm\":\"asgd\",\"optimizer\":{\"momentum\":0.8}}", 0}, /* 0.75 */
      {"{\"workers\":4,\"algorithm\":\"asgd\",\"optimizer\":{\"momentum\":0.5}}", 0},
      /* scaling up to max_workers counts */
      {"{\"workers\":4,\"max_workers\":40,\"algorithm\":\"asgd\"}", 1},
      /* more shards, fewer workers pushing */
      {"{\"workers\":4,\"ps_shards\":3,\"algorithm\":\"asgd\",\"optimizer\":{\"momentum\":0.9}}",
       0},
      /* adam is not subject to the rule; the synchronous algorithms neither */
      {"{\"workers\":4,\"algorithm\":\"asgd\",\"optimizer\":{\"type\":\"adam\"}}", 0},
      {"{\"workers\":64,\"algorithm\":\"wagma\",\"optimizer\":{\"momentum\":0.99}}", 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    assert_int_equal(spec_parse(cases[i].json, &s, &err), 0);
    int n = wagma_job_spec_warnings(&s, w, WAGMA_API_WARNINGS_MAX);
    if (n != cases[i].warned)
      fprintf(stderr, "%s: %d warnings, wanted %d\n", cases[i].json, n, cases[i].warned);
    assert_int_equal(n, cases[i].warned);
    if (n)
      assert_non_null(strstr(w[0], "known to stall at chance accuracy or diverge"));
  }
  /* max 0: nothing written */
  assert_int_equal(spec_parse(cases[0].json, &s, &err), 0);
  assert_int_equal(wagma_job_spec_warnings(&s, w, 0), 0);
}

/* Progress "unreachable" (issue 27): round trip, the total, and what is refused. */
static void test_progress_unreachable(void **state) {
  (void)state;
  wagma_progress_t a, b;
  wagma_api_error_t err;
  char *json = NULL;
  wagma_progress_init(&a);
  a.iteration = 7;
  a.nunreachable = 2;
  a.unreachable_total = 5;
  a.unreachable[0] = (struct wagma_unreachable){.rank = 3, .seconds = 4.5};
  a.unreachable[1] = (struct wagma_unreachable){.rank = 1, .seconds = 2};
  assert_int_equal(wagma_progress_to_json(&a, &json), 0);
  assert_non_null(strstr(json, "\"unreachable_total\":5"));
  assert_int_equal(wagma_progress_from_json(json, strlen(json), &b, &err), 0);
  free(json);
  assert_int_equal(b.nunreachable, 2);
  assert_int_equal(b.unreachable_total, 5);
  assert_int_equal(b.unreachable[0].rank, 3);
  assert_true(b.unreachable[0].seconds == 4.5);
  assert_int_equal(b.unreachable[1].rank, 1);
  /* none: absent */
  wagma_progress_init(&a);
  assert_int_equal(wagma_progress_to_json(&a, &json), 0);
  assert_null(strstr(json, "unreachable"));
  free(json);
  /* a total below the list is raised to it */
  const char *low = "{\"iteration\":1,\"unreachable\":[{\"rank\":2,\"for\":1}]}";
  assert_int_equal(wagma_progress_from_json(low, strlen(low), &b, &err), 0);
  assert_int_equal(b.unreachable_total, 1);
  static const char *const bad[] = {
      "{\"iteration\":1,\"unreachable\":{}}",
      "{\"iteration\":1,\"unreachable\":[3]}",
      "{\"iteration\":1,\"unreachable\":[{\"rank\":2}]}",
      "{\"iteration\":1,\"unreachable\":[{\"rank\":-1,\"for\":1}]}",
      "{\"iteration\":1,\"unreachable\":[{\"rank\":1,\"for\":-1}]}",
      "{\"iteration\":1,\"unreachable_total\":\"x\"}",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    if (wagma_progress_from_json(bad[i], strlen(bad[i]), &b, &err) == 0)
      fail_msg("accepted %s", bad[i]);
    assert_non_null(strstr(err.field, "unreachable"));
  }
  char many[4096];
  int n = snprintf(many, sizeof many, "{\"iteration\":1,\"unreachable\":[");
  for (int i = 0; i <= WAGMA_API_UNREACHABLE_MAX; i++)
    n += snprintf(many + n, sizeof many - (size_t)n, "%s{\"rank\":%d,\"for\":1}", i ? "," : "", i);
  snprintf(many + n, sizeof many - (size_t)n, "]}");
  assert_int_not_equal(wagma_progress_from_json(many, strlen(many), &b, &err), 0);
}

/* The quarantine of a member cut off ("probe", "reachable") and the agent's "reached". */
static void test_quarantine_probe_codec(void **state) {
  (void)state;
  wagma_quarantine_t q = {.since = 100.5, .until = 400.5, .registration = 9, .nprobe = 2}, r;
  wagma_api_error_t err;
  char *json = NULL;
  snprintf(q.probe[0], sizeof q.probe[0], "10.0.0.1:7000");
  snprintf(q.probe[1], sizeof q.probe[1], "[::1]:7001");
  assert_int_equal(wagma_quarantine_to_json(&q, &json), 0);
  assert_int_equal(wagma_quarantine_from_json(json, strlen(json), &r, &err), 0);
  free(json);
  assert_int_equal(r.nprobe, 2);
  assert_string_equal(r.probe[1], "[::1]:7001");
  assert_true(r.reachable == 0 && r.since == 100.5);
  const char *bad = "{\"registration\":1,\"probe\":[\"nohostport\"]}";
  assert_int_not_equal(wagma_quarantine_from_json(bad, strlen(bad), &r, &err), 0);
  assert_string_equal(err.field, "probe[0]");
  wagma_agent_info_t a, b;
  memset(&a, 0, sizeof a);
  snprintf(a.address, sizeof a.address, "h:1");
  a.capacity = 1;
  a.reached = 100.5;
  assert_int_equal(wagma_agent_info_to_json(&a, &json), 0);
  assert_int_equal(wagma_agent_info_from_json(json, strlen(json), &b, &err), 0);
  free(json);
  assert_true(b.reached == 100.5);
}

static void test_progress_codec(void **state) {
  (void)state;
  wagma_progress_t a, b;
  wagma_api_error_t err;
  char *json = NULL;
  wagma_progress_init(&a);
  a.state = WAGMA_PROGRESS_DONE;
  a.epoch = 3;
  a.iteration = 500;
  a.loss = 0.25;
  a.step_time = 0.01;
  a.staleness = 2;
  a.rounds_activated = 100;
  a.rounds_joined = 300;
  a.time = 1700000000;
  assert_int_equal(wagma_progress_to_json(&a, &json), 0);
  assert_non_null(strstr(json, "\"accuracy\":null"));
  assert_int_equal(wagma_progress_from_json(json, strlen(json), &b, &err), 0);
  assert_int_equal(b.state, WAGMA_PROGRESS_DONE);
  assert_int_equal(b.iteration, 500);
  assert_true(b.loss == 0.25);
  assert_true(isnan(b.accuracy));
  assert_int_equal(b.rounds_joined, 300);
  free(json);

  /* unknown fields are ignored; iteration is required; types are checked */
  const char *fwd = "{\"iteration\":5,\"gpu_util\":0.9,\"state\":\"failed\",\"error\":\"oom\"}";
  assert_int_equal(wagma_progress_from_json(fwd, strlen(fwd), &b, &err), 0);
  assert_int_equal(b.state, WAGMA_PROGRESS_FAILED);
  assert_string_equal(b.error, "oom");
  const char *noit = "{\"loss\":1}";
  assert_int_equal(wagma_progress_from_json(noit, strlen(noit), &b, &err), WAGMA_EINVAL);
  assert_string_equal(err.field, "iteration");
  const char *badloss = "{\"iteration\":1,\"loss\":\"low\"}";
  assert_int_equal(wagma_progress_from_json(badloss, strlen(badloss), &b, &err), WAGMA_EINVAL);
  assert_string_equal(err.field, "loss");
  /* the role: absent when not reported, one of the known names, anything else refused */
  assert_int_equal(wagma_progress_to_json(&a, &json), 0);
  assert_null(strstr(json, "\"role\""));
  free(json);
  snprintf(a.role, sizeof a.role, "passive");
  assert_int_equal(wagma_progress_to_json(&a, &json), 0);
  assert_non_null(strstr(json, "\"role\":\"passive\""));
  assert_int_equal(wagma_progress_from_json(json, strlen(json), &b, &err), 0);
  assert_string_equal(b.role, "passive");
  free(json);
  a.role[0] = '\0';
  const char *badrole = "{\"iteration\":1,\"role\":\"king\"}";
  assert_int_equal(wagma_progress_from_json(badrole, strlen(badrole), &b, &err), WAGMA_EINVAL);
  assert_string_equal(err.field, "role");

  /* no round yet: neither round, round_kind nor group is written */
  assert_int_equal(wagma_progress_to_json(&a, &json), 0);
  assert_null(strstr(json, "\"round\":"));
  assert_null(strstr(json, "\"round_kind\""));
  assert_null(strstr(json, "\"group\""));
  assert_null(strstr(json, "\"fingerprint\""));
  free(json);
  /* the round last averaged in, my group there, the final fingerprint */
  a.has_round = 1;
  a.round = 499;
  a.ngroup = 3;
  a.group[0] = 0, a.group[1] = 2, a.group[2] = 5;
  a.nfingerprint = 5;
  for (int i = 0; i < 5; i++)
    a.fingerprint[i] = -1.5 + i;
  assert_int_equal(wagma_progress_to_json(&a, &json), 0);
  assert_non_null(strstr(json, "\"round\":499,\"round_kind\":\"group\",\"group\":[0,2,5]"));
  assert_int_equal(wagma_progress_from_json(json, strlen(json), &b, &err), 0);
  free(json);
  assert_true(b.has_round);
  assert_int_equal(b.round, 499);
  assert_false(b.round_global);
  assert_int_equal(b.ngroup, 3);
  assert_int_equal(b.group[2], 5);
  assert_int_equal(b.nfingerprint, 5);
  assert_true(b.fingerprint[0] == -1.5 && b.fingerprint[4] == 2.5);
  a.round_global = 1;
  a.ngroup = 0;
  assert_int_equal(wagma_progress_to_json(&a, &json), 0);
  assert_non_null(strstr(json, "\"round_kind\":\"global\""));
  assert_null(strstr(json, "\"group\""));
  assert_int_equal(wagma_progress_from_json(json, strlen(json), &b, &err), 0);
  free(json);
  assert_true(b.has_round && b.round_global && b.ngroup == 0);
  const char *noround = "{\"iteration\":1,\"group\":[0,1]}";
  assert_int_equal(wagma_progress_from_json(noround, strlen(noround), &b, &err), WAGMA_EINVAL);
  assert_string_equal(err.field, "group");
  const char *badkind = "{\"iteration\":1,\"round\":0,\"round_kind\":\"ring\"}";
  assert_int_equal(wagma_progress_from_json(badkind, strlen(badkind), &b, &err), WAGMA_EINVAL);
  assert_string_equal(err.field, "round_kind");
  const char *badrank = "{\"iteration\":1,\"round\":0,\"group\":[0,-1]}";
  assert_int_equal(wagma_progress_from_json(badrank, strlen(badrank), &b, &err), WAGMA_EINVAL);
  assert_string_equal(err.field, "group[1]");
  char big[1024] = "{\"iteration\":1,\"round\":0,\"group\":[0";
  for (int i = 1; i <= WAGMA_API_PROGRESS_GROUP_MAX; i++)
    snprintf(big + strlen(big), sizeof big - strlen(big), ",%d", i);
  strcat(big, "]}");
  assert_int_equal(wagma_progress_from_json(big, strlen(big), &b, &err), WAGMA_EINVAL);
  assert_string_equal(err.field, "group");
  const char *badfp = "{\"iteration\":1,\"fingerprint\":[1,\"x\"]}";
  assert_int_equal(wagma_progress_from_json(badfp, strlen(badfp), &b, &err), WAGMA_EINVAL);
  assert_string_equal(err.field, "fingerprint[1]");
}

static void test_plan_record_codec(void **state) {
  (void)state;
  wagma_plan_record_t a, b;
  wagma_api_error_t err;
  char *json = NULL;
  char names[3][WAGMA_API_NAME_MAX] = {"a0", "a1", "b-2"};
  memset(&a, 0, sizeof a);
  a.epoch = 7;
  a.start_round = 1234;
  a.group_size = 4;
  a.staleness_bound = 8;
  a.global_sync = WAGMA_SYNC_WAIT_AVOIDING;
  a.phases_hash = 0x0123456789abcdefull;
  a.nmembers = 3;
  a.members = names;
  assert_int_equal(wagma_plan_record_to_json(&a, &json), 0);
  assert_string_equal(json,
                      "{\"epoch\":7,\"start_round\":1234,\"group_size\":4,"
                      "\"staleness_bound\":8,\"global_sync\":\"wait-avoiding\","
                      "\"phases_hash\":\"0123456789abcdef\",\"members\":[\"a0\",\"a1\",\"b-2\"]}");
  assert_int_equal(wagma_plan_record_from_json(json, strlen(json), &b, &err), 0);
  free(json);
  assert_int_equal(b.epoch, 7);
  assert_int_equal(b.start_round, 1234);
  assert_int_equal(b.group_size, 4);
  assert_int_equal(b.staleness_bound, 8);
  assert_int_equal(b.global_sync, WAGMA_SYNC_WAIT_AVOIDING);
  assert_true(b.phases_hash == 0x0123456789abcdefull);
  assert_int_equal(b.nmembers, 3);
  assert_string_equal(b.members[2], "b-2");
  wagma_plan_record_free(&b);
  assert_null(b.members);

  struct {
    const char *json, *field;
  } bad[] = {
      {"{\"start_round\":0,\"group_size\":2,\"staleness_bound\":1,\"global_sync\":\"barrier\","
       "\"phases_hash\":\"0000000000000000\",\"members\":[\"a\"]}",
       "epoch"},
      {"{\"epoch\":1,\"start_round\":0,\"group_size\":1,\"staleness_bound\":1,"
       "\"global_sync\":\"barrier\",\"phases_hash\":\"0000000000000000\",\"members\":[\"a\"]}",
       "group_size"},
      {"{\"epoch\":1,\"start_round\":0,\"group_size\":2,\"staleness_bound\":1,"
       "\"global_sync\":\"ring\",\"phases_hash\":\"0000000000000000\",\"members\":[\"a\"]}",
       "global_sync"},
      {"{\"epoch\":1,\"start_round\":0,\"group_size\":2,\"staleness_bound\":1,"
       "\"global_sync\":\"barrier\",\"phases_hash\":\"+123456789abcdef\",\"members\":[\"a\"]}",
       "phases_hash"},
      {"{\"epoch\":1,\"start_round\":0,\"group_size\":2,\"staleness_bound\":1,"
       "\"global_sync\":\"barrier\",\"phases_hash\":\"0000000000000000\",\"members\":[]}",
       "members"},
      {"{\"epoch\":1,\"start_round\":0,\"group_size\":2,\"staleness_bound\":1,"
       "\"global_sync\":\"barrier\",\"phases_hash\":\"0000000000000000\",\"members\":[\"a/b\"]}",
       "members[0]"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    if (wagma_plan_record_from_json(bad[i].json, strlen(bad[i].json), &b, &err) != WAGMA_EINVAL)
      fail_msg("bad record %zu accepted", i);
    assert_string_equal(err.field, bad[i].field);
  }
}

static void test_checkpoint_record_codec(void **state) {
  (void)state;
  wagma_checkpoint_record_t a, b;
  wagma_api_error_t err;
  char *json = NULL;
  memset(&a, 0, sizeof a);
  snprintf(a.path, sizeof a.path, "/tmp/ck/job-1.ckpt");
  a.iteration = 1200;
  a.epoch = 4;
  snprintf(a.agent, sizeof a.agent, "a0");
  a.time = 1700000000.5;
  assert_int_equal(wagma_checkpoint_record_to_json(&a, &json), 0);
  assert_non_null(json);
  /* the field order documented in docs/api.md */
  const char *pi = strstr(json, "\"path\""), *ii = strstr(json, "\"iteration\"");
  const char *ei = strstr(json, "\"epoch\""), *ai = strstr(json, "\"agent\"");
  const char *ti = strstr(json, "\"time\"");
  assert_true(pi && ii && ei && ai && ti && pi < ii && ii < ei && ei < ai && ai < ti);
  memset(&b, 0xab, sizeof b);
  assert_int_equal(wagma_checkpoint_record_from_json(json, strlen(json), &b, &err), 0);
  assert_string_equal(b.path, a.path);
  assert_int_equal(b.iteration, a.iteration);
  assert_int_equal(b.epoch, a.epoch);
  assert_string_equal(b.agent, a.agent);
  assert_true(b.time == a.time);
  free(json);

  /* an empty path is not encoded */
  a.path[0] = '\0';
  json = (char *)"untouched";
  assert_int_equal(wagma_checkpoint_record_to_json(&a, &json), WAGMA_EINVAL);
  assert_null(json);

  /* the older two-field record and unknown fields are accepted; defaults fill the rest */
  const char *old = "{\"path\":\"/d/j.ckpt\",\"iteration\":7,\"sha256\":\"00\"}";
  assert_int_equal(wagma_checkpoint_record_from_json(old, strlen(old), &b, &err), 0);
  assert_string_equal(b.path, "/d/j.ckpt");
  assert_int_equal(b.iteration, 7);
  assert_int_equal(b.epoch, 0);
  assert_string_equal(b.agent, "");
  assert_true(b.time == 0);

  /* required fields, types and ranges name their field; the output is left alone */
  static const struct {
    const char *json, *field;
  } bad[] = {
      {"{\"iteration\":1}", "path"},
      {"{\"path\":\"/x\"}", "iteration"},
      {"{\"path\":\"\",\"iteration\":1}", "path"},
      {"{\"path\":3,\"iteration\":1}", "path"},
      {"{\"path\":\"/x\",\"iteration\":-1}", "iteration"},
      {"{\"path\":\"/x\",\"iteration\":1.5}", "iteration"},
      {"{\"path\":\"/x\",\"iteration\":1,\"epoch\":\"2\"}", "epoch"},
      {"{\"path\":\"/x\",\"iteration\":1,\"agent\":7}", "agent"},
      {"{\"path\":\"/x\",\"iteration\":1,\"time\":-3}", "time"},
      {"[1]", ""},
      {"{\"path\":", ""},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    memset(&err, 0, sizeof err);
    memset(&b, 0, sizeof b);
    assert_int_equal(wagma_checkpoint_record_from_json(bad[i].json, strlen(bad[i].json), &b, &err),
                     WAGMA_EINVAL);
    assert_string_equal(err.field, bad[i].field);
    assert_string_equal(b.path, "");
  }

  /* a path longer than the record holds is rejected, not truncated */
  char longrec[WAGMA_API_CHECKPOINT_PATH_MAX + 64];
  char longpath[WAGMA_API_CHECKPOINT_PATH_MAX + 1];
  memset(longpath, 'p', sizeof longpath - 1);
  longpath[sizeof longpath - 1] = '\0';
  snprintf(longrec, sizeof longrec, "{\"path\":\"%s\",\"iteration\":1}", longpath);
  assert_int_equal(wagma_checkpoint_record_from_json(longrec, strlen(longrec), &b, &err),
                   WAGMA_EINVAL);
  assert_string_equal(err.field, "path");
}

static void test_agent_and_assignment(void **state) {
  (void)state;
  wagma_agent_info_t a = {0}, b;
  wagma_api_error_t err;
  char *json = NULL;
  snprintf(a.address, sizeof a.address, "10.0.0.5:7100");
  a.device = WAGMA_DEVICE_CUDA;
  a.capacity = 2;
  snprintf(a.version, sizeof a.version, "0.1.0");
  a.started = 1700000000;
  assert_int_equal(wagma_agent_info_to_json(&a, &json), 0);
  assert_int_equal(wagma_agent_info_from_json(json, strlen(json), &b, &err), 0);
  assert_memory_equal(&a, &b, sizeof a);
  free(json);
  const char *noaddr = "{\"device\":\"cpu\"}";
  assert_int_equal(wagma_agent_info_from_json(noaddr, strlen(noaddr), &b, &err), WAGMA_EINVAL);
  assert_string_equal(err.field, "address");
  const char *badcap = "{\"address\":\"h:1\",\"capacity\":0}";
  assert_int_equal(wagma_agent_info_from_json(badcap, strlen(badcap), &b, &err), WAGMA_EINVAL);
  assert_string_equal(err.field, "capacity");
  const char *minimal = "{\"address\":\"h:1\",\"extra\":[1]}";
  assert_int_equal(wagma_agent_info_from_json(minimal, strlen(minimal), &b, &err), 0);
  assert_int_equal(b.capacity, 1);
  assert_int_equal(b.device, WAGMA_DEVICE_CPU);

  wagma_assignment_t s = {.epoch = 9}, t;
  snprintf(s.job, sizeof s.job, "job-1");
  assert_int_equal(wagma_assignment_to_json(&s, &json), 0);
  assert_string_equal(json, "{\"job\":\"job-1\",\"epoch\":9}");
  assert_int_equal(wagma_assignment_from_json(json, strlen(json), &t, &err), 0);
  assert_string_equal(t.job, "job-1");
  assert_int_equal(t.epoch, 9);
  free(json);
  const char *badjob = "{\"job\":\"../x\"}";
  assert_int_equal(wagma_assignment_from_json(badjob, strlen(badjob), &t, &err), WAGMA_EINVAL);
  assert_string_equal(err.field, "job");
}

/* ---- programs (issue 25) ------------------------------------------------------------------ */

static const char *const good_program_names[] = {
    "fmnist_cnn", "a",
    "train.py",   "A-1_b.c",
    "x.",         "a..b",
    "run-2",      "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijk" /* 63 */};
/* as JSON string bodies (escapes allowed) */
static const char *const bad_program_names[] = {
    "a/b",
    "..",
    ".",
    ".x",
    "-x",
    "",
    "a b",
    "a;b",
    "$(x)",
    "`id`",
    "a\\nb",
    "/bin/sh",
    "../x",
    "x/..",
    "\\u00e9",
    "sub/../../etc/passwd",
    "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijkl" /* 64 */};

static void test_program_names(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof good_program_names / sizeof *good_program_names; i++)
    if (!wagma_program_name_valid(good_program_names[i]))
      fail_msg("'%s' refused", good_program_names[i]);
  static const char *const bad_raw[] = {"a/b", "..",   ".",       ".x",   "-x",   "",         "a b",
                                        "a;b", "a\nb", "/bin/sh", "../x", "x/..", "\xc3\xa9", NULL};
  for (size_t i = 0; i < sizeof bad_raw / sizeof *bad_raw; i++)
    if (wagma_program_name_valid(bad_raw[i]))
      fail_msg("'%s' accepted", bad_raw[i]);
  char n64[65];
  memset(n64, 'a', 64);
  n64[64] = '\0';
  assert_false(wagma_program_name_valid(n64));
  n64[63] = '\0';
  assert_true(wagma_program_name_valid(n64));

  /* The same rule on "program.name" of a spec: 422 naming the field. */
  char json[512];
  wagma_job_spec_t s;
  wagma_api_error_t err;
  for (size_t i = 0; i < sizeof bad_program_names / sizeof *bad_program_names; i++) {
    snprintf(json, sizeof json, "{\"workers\":1,\"program\":{\"name\":\"%s\"}}",
             bad_program_names[i]);
    if (spec_parse(json, &s, &err) != WAGMA_EINVAL || strcmp(err.field, "program.name") != 0)
      fail_msg("%s: field '%s' (%s)", json, err.field, err.message);
    assert_true(strlen(err.message) > 0);
  }
  for (size_t i = 0; i < sizeof good_program_names / sizeof *good_program_names; i++) {
    snprintf(json, sizeof json, "{\"workers\":1,\"program\":{\"name\":\"%s\"}}",
             good_program_names[i]);
    if (spec_parse(json, &s, &err) != 0)
      fail_msg("%s refused: %s: %s", json, err.field, err.message);
    assert_string_equal(s.program.name, good_program_names[i]);
  }
}

/* Arguments are argv entries, never a shell's text: whatever they hold comes back unchanged. */
static void test_program_spec(void **state) {
  (void)state;
  wagma_job_spec_t a, b;
  wagma_api_error_t err;
  char *json = NULL, *json2 = NULL;
  assert_int_equal(spec_parse("{\"name\":\"p\",\"workers\":2,\"algorithm\":\"allreduce\","
                              "\"program\":{\"name\":\"fmnist_cnn\",\"args\":[\"--lr\",\"0.05\"],"
                              "\"max_restarts\":5}}",
                              &a, &err),
                   0);
  assert_string_equal(a.program.name, "fmnist_cnn");
  assert_int_equal(a.program.nargs, 2);
  assert_string_equal(a.program.args[0], "--lr");
  assert_string_equal(a.program.args[1], "0.05");
  assert_int_equal(a.program.max_restarts, 5);
  assert_int_equal(wagma_job_spec_to_json(&a, &json), 0);
  /* the stored spec: the program where the model was, no model and no dataset */
  assert_non_null(strstr(json, "{\"name\":\"p\",\"program\":{\"name\":\"fmnist_cnn\",\"args\":"
                               "[\"--lr\",\"0.05\"],\"max_restarts\":5},\"algorithm\""));
  assert_null(strstr(json, "\"model\""));
  assert_null(strstr(json, "\"dataset\""));
  assert_int_equal(spec_parse(json, &b, &err), 0);
  assert_memory_equal(&a, &b, sizeof a);
  assert_int_equal(wagma_job_spec_to_json(&b, &json2), 0);
  assert_string_equal(json, json2);
  free(json);
  free(json2);

  /* defaults: no arguments, 3 restarts; a built-in job has no "program" */
  assert_int_equal(spec_parse("{\"workers\":1,\"program\":{\"name\":\"x\"}}", &a, &err), 0);
  assert_int_equal(a.program.nargs, 0);
  assert_int_equal(a.program.max_restarts, 3);
  assert_int_equal(wagma_job_spec_to_json(&a, &json), 0);
  assert_non_null(strstr(json, "\"program\":{\"name\":\"x\",\"args\":[],\"max_restarts\":3}"));
  free(json);
  assert_int_equal(spec_parse("{\"workers\":1}", &a, &err), 0);
  assert_string_equal(a.program.name, "");
  assert_int_equal(wagma_job_spec_to_json(&a, &json), 0);
  assert_null(strstr(json, "\"program\""));
  assert_non_null(strstr(json, "\"model\":\"softmax\",\"dataset\":\"fashion-mnist\""));
  free(json);

  /* shell metacharacters, quotes, spaces, an empty argument, UTF-8: verbatim, both ways */
  static const char *const wild[] = {
      "; rm -rf /",        "$(x)",    "`id`",        "'quoted'", "\"dq\"", "a b", "", "|&><*", "\\",
      "\xc3\xa9t\xc3\xa9", "--x=a b", "line\nbreak", "~/$HOME"};
  int nw = (int)(sizeof wild / sizeof *wild);
  json_t *args = json_array();
  for (int i = 0; i < nw; i++)
    json_array_append_new(args, json_string(wild[i]));
  json_t *body = json_pack("{s:i,s:{s:s,s:o}}", "workers", 1, "program", "name", "p", "args", args);
  char *text = json_dumps(body, 0);
  json_decref(body);
  assert_int_equal(spec_parse(text, &a, &err), 0);
  free(text);
  assert_int_equal(a.program.nargs, nw);
  for (int i = 0; i < nw; i++)
    assert_string_equal(a.program.args[i], wild[i]);
  assert_int_equal(wagma_job_spec_to_json(&a, &json), 0);
  assert_int_equal(spec_parse(json, &b, &err), 0);
  free(json);
  assert_memory_equal(&a, &b, sizeof a);

  /* 32 arguments and 255-byte ones pass; a 33rd or a 256th byte does not */
  char big[WAGMA_API_PROGRAM_ARG_MAX + 1];
  memset(big, 'x', sizeof big);
  for (int n = 32; n <= 33; n++) {
    args = json_array();
    for (int i = 0; i < n; i++)
      json_array_append_new(args, json_string(i == 2 ? "--lr" : "v"));
    body = json_pack("{s:i,s:{s:s,s:o}}", "workers", 1, "program", "name", "p", "args", args);
    text = json_dumps(body, 0);
    json_decref(body);
    int rc = spec_parse(text, &a, &err);
    free(text);
    if (n == 32) {
      assert_int_equal(rc, 0);
      assert_int_equal(a.program.nargs, 32);
    } else {
      assert_int_equal(rc, WAGMA_EINVAL);
      assert_string_equal(err.field, "program.args");
    }
  }
  for (size_t len = 255; len <= 256; len++) {
    body = json_pack("{s:i,s:{s:s,s:[s,s,s#]}}", "workers", 1, "program", "name", "p", "args", "a",
                     "b", big, (int)len);
    text = json_dumps(body, 0);
    json_decref(body);
    int rc = spec_parse(text, &a, &err);
    free(text);
    if (len == 255) {
      assert_int_equal(rc, 0);
      assert_int_equal(strlen(a.program.args[2]), 255);
    } else {
      assert_int_equal(rc, WAGMA_EINVAL);
      assert_string_equal(err.field, "program.args[2]");
    }
  }

  /* what a program job may not say, each naming its field */
  static const struct bad_spec bad[] = {
      {"{\"workers\":1,\"program\":\"fmnist_cnn\"}", "program"},
      {"{\"workers\":1,\"program\":{}}", "program.name"},
      {"{\"workers\":1,\"program\":{\"args\":[\"x\"]}}", "program.name"},
      {"{\"workers\":1,\"program\":{\"name\":7}}", "program.name"},
      {"{\"workers\":1,\"program\":{\"name\":\"p\",\"path\":\"/bin/sh\"}}", "program.path"},
      {"{\"workers\":1,\"program\":{\"name\":\"p\",\"command\":\"sh -c x\"}}", "program.command"},
      {"{\"workers\":1,\"program\":{\"name\":\"p\",\"args\":\"--lr 0.05\"}}", "program.args"},
      {"{\"workers\":1,\"program\":{\"name\":\"p\",\"args\":[\"a\",1]}}", "program.args[1]"},
      {"{\"workers\":1,\"program\":{\"name\":\"p\",\"max_restarts\":101}}", "program.max_restarts"},
      {"{\"workers\":1,\"program\":{\"name\":\"p\",\"max_restarts\":-1}}", "program.max_restarts"},
      {"{\"workers\":1,\"model\":\"mlp\",\"program\":{\"name\":\"p\"}}", "model"},
      {"{\"workers\":1,\"program\":{\"name\":\"p\"},\"model\":\"softmax\"}", "model"},
      {"{\"workers\":1,\"program\":{\"name\":\"p\"},\"dataset\":\"synthetic\"}", "dataset"},
      {"{\"workers\":4,\"algorithm\":\"asgd\",\"program\":{\"name\":\"p\"}}", "algorithm"},
      {"{\"workers\":4,\"algorithm\":\"dc-asgd\",\"program\":{\"name\":\"p\"}}", "algorithm"},
      {"{\"workers\":4,\"algorithm\":\"adpsgd\",\"program\":{\"name\":\"p\"}}", "algorithm"},
      {"{\"workers\":1,\"gradient_delay\":2,\"program\":{\"name\":\"p\"}}", "gradient_delay"},
      {"{\"workers\":1,\"checkpoint\":{\"every\":10,\"path\":\"ck\"},\"program\":{\"name\":\"p\"}}",
       "checkpoint.every"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    int rc = spec_parse(bad[i].json, &a, &err);
    if (rc != WAGMA_EINVAL || strcmp(err.field, bad[i].field) != 0)
      fail_msg("spec %zu %s: rc %d field '%s' (want '%s'): %s", i, bad[i].json, rc, err.field,
               bad[i].field, err.message);
    assert_true(strlen(err.message) > 0);
  }
  /* a NUL cannot reach an argument (nor a name): the JSON parser refuses it */
  assert_int_equal(
      spec_parse("{\"workers\":1,\"program\":{\"name\":\"p\",\"args\":[\"c\\u0000d\"]}}", &a, &err),
      WAGMA_EINVAL);
  assert_int_equal(spec_parse("{\"workers\":1,\"program\":{\"name\":\"a\\u0000b\"}}", &a, &err),
                   WAGMA_EINVAL);
  /* the algorithm's refusal says why and what a program may use */
  assert_int_equal(
      spec_parse("{\"workers\":4,\"algorithm\":\"asgd\",\"program\":{\"name\":\"p\"}}", &a, &err),
      WAGMA_EINVAL);
  assert_non_null(strstr(err.message, "not available for programs"));
  assert_non_null(strstr(err.message, "wagma, allreduce or local-sgd"));
  assert_non_null(strstr(
      (spec_parse("{\"workers\":1,\"model\":\"mlp\",\"program\":{\"name\":\"p\"}}", &a, &err),
       err.message),
      "a program job has no built-in model"));
  /* and the algorithms a program has */
  static const char *const algos[] = {"wagma", "allreduce", "local-sgd"};
  for (size_t i = 0; i < 3; i++) {
    char j[160];
    snprintf(j, sizeof j, "{\"workers\":2,\"algorithm\":\"%s\",\"program\":{\"name\":\"p\"}}",
             algos[i]);
    if (spec_parse(j, &a, &err) != 0)
      fail_msg("%s refused: %s: %s", j, err.field, err.message);
  }
  /* built-in jobs keep what programs may not have */
  assert_int_equal(spec_parse("{\"workers\":4,\"algorithm\":\"asgd\",\"gradient_delay\":2,"
                              "\"checkpoint\":{\"every\":10,\"path\":\"ck\"},\"model\":\"mlp\"}",
                              &a, &err),
                   0);

  /* wagma_job_spec_validate on a spec built in code */
  assert_int_equal(spec_parse("{\"workers\":1,\"program\":{\"name\":\"p\"}}", &a, &err), 0);
  b = a;
  b.program.nargs = 33;
  assert_int_equal(wagma_job_spec_validate(&b, &err), WAGMA_EINVAL);
  assert_string_equal(err.field, "program.args");
  b = a;
  b.program.nargs = 1;
  memset(b.program.args[0], 'x', sizeof b.program.args[0]); /* no NUL */
  assert_int_equal(wagma_job_spec_validate(&b, &err), WAGMA_EINVAL);
  assert_string_equal(err.field, "program.args[0]");
  b = a;
  b.program.nargs = 1;
  snprintf(b.program.args[0], sizeof b.program.args[0], "\xff\xfe");
  assert_int_equal(wagma_job_spec_validate(&b, &err), WAGMA_EINVAL);
  assert_string_equal(err.field, "program.args[0]");
  b = a;
  snprintf(b.program.name, sizeof b.program.name, "../x");
  assert_int_equal(wagma_job_spec_validate(&b, &err), WAGMA_EINVAL);
  assert_string_equal(err.field, "program.name");
  b = a;
  b.program.name[0] = '\0';
  b.program.nargs = 1;
  assert_int_equal(wagma_job_spec_validate(&b, &err), WAGMA_EINVAL);
  assert_string_equal(err.field, "program.name");
  b = a;
  b.algorithm = WAGMA_ALGO_DC_ASGD;
  assert_int_equal(wagma_job_spec_validate(&b, &err), WAGMA_EINVAL);
  assert_string_equal(err.field, "algorithm");

  /* program is immutable */
  wagma_job_patch_t p;
  const char *imm = "{\"program\":{\"name\":\"other\"}}";
  assert_int_equal(wagma_job_patch_from_json(imm, strlen(imm), &p, &err), WAGMA_EINVAL);
  assert_string_equal(err.field, "program");
  assert_non_null(strstr(err.message, "immutable"));
  /* a PATCH keeps the program */
  const char *scale = "{\"workers\":3}";
  assert_int_equal(spec_parse("{\"workers\":2,\"max_workers\":4,\"program\":{\"name\":\"p\","
                              "\"args\":[\"x y\"]}}",
                              &a, &err),
                   0);
  assert_int_equal(wagma_job_patch_from_json(scale, strlen(scale), &p, &err), 0);
  assert_int_equal(wagma_job_patch_apply(&p, &a, &err), 0);
  assert_string_equal(a.program.name, "p");
  assert_string_equal(a.program.args[0], "x y");
}

static void test_agent_programs(void **state) {
  (void)state;
  wagma_agent_info_t a, b;
  wagma_api_error_t err;
  char *json = NULL;
  const char *three = "{\"address\":\"h:1\",\"programs\":[\"train.py\",\"a\",\"fmnist_cnn\"]}";
  assert_int_equal(wagma_agent_info_from_json(three, strlen(three), &a, &err), 0);
  assert_int_equal(a.nprograms, 3);
  assert_string_equal(a.programs[0], "a"); /* sorted */
  assert_string_equal(a.programs[1], "fmnist_cnn");
  assert_string_equal(a.programs[2], "train.py");
  assert_true(wagma_agent_has_program(&a, "fmnist_cnn"));
  assert_true(wagma_agent_has_program(&a, "a"));
  assert_true(wagma_agent_has_program(&a, "train.py"));
  assert_false(wagma_agent_has_program(&a, "fmnist"));
  assert_false(wagma_agent_has_program(&a, "zzz"));
  assert_false(wagma_agent_has_program(&a, ""));
  assert_int_equal(wagma_agent_info_to_json(&a, &json), 0);
  assert_non_null(strstr(json, "\"programs\":[\"a\",\"fmnist_cnn\",\"train.py\"]"));
  assert_int_equal(wagma_agent_info_from_json(json, strlen(json), &b, &err), 0);
  assert_memory_equal(&a, &b, sizeof a);
  free(json);
  /* none: absent or [] ("programs":[] encoded) */
  const char *none = "{\"address\":\"h:1\"}", *empty = "{\"address\":\"h:1\",\"programs\":[]}";
  assert_int_equal(wagma_agent_info_from_json(none, strlen(none), &a, &err), 0);
  assert_int_equal(a.nprograms, 0);
  assert_false(wagma_agent_has_program(&a, "a"));
  assert_int_equal(wagma_agent_info_from_json(empty, strlen(empty), &b, &err), 0);
  assert_memory_equal(&a, &b, sizeof a);
  assert_int_equal(wagma_agent_info_to_json(&a, &json), 0);
  assert_non_null(strstr(json, "\"programs\":[]"));
  free(json);
  /* 64 pass, 65 do not */
  for (int n = 64; n <= 65; n++) {
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) {
      char name[16];
      snprintf(name, sizeof name, "p%02d", n - i);
      json_array_append_new(arr, json_string(name));
    }
    json_t *o = json_pack("{s:s,s:o}", "address", "h:1", "programs", arr);
    char *text = json_dumps(o, 0);
    json_decref(o);
    int rc = wagma_agent_info_from_json(text, strlen(text), &a, &err);
    free(text);
    if (n == 64) {
      assert_int_equal(rc, 0);
      assert_int_equal(a.nprograms, 64);
      assert_string_equal(a.programs[0], "p01");
      assert_true(wagma_agent_has_program(&a, "p64"));
      assert_true(wagma_agent_has_program(&a, "p33"));
    } else {
      assert_int_equal(rc, WAGMA_EINVAL);
      assert_string_equal(err.field, "programs");
    }
  }
  static const struct bad_spec bad[] = {
      {"{\"address\":\"h:1\",\"programs\":\"a\"}", "programs"},
      {"{\"address\":\"h:1\",\"programs\":{\"a\":1}}", "programs"},
      {"{\"address\":\"h:1\",\"programs\":[\"a/b\"]}", "programs[0]"},
      {"{\"address\":\"h:1\",\"programs\":[\"ok\",\"..\"]}", "programs[1]"},
      {"{\"address\":\"h:1\",\"programs\":[\"ok\",\"x\",\"-rf\"]}", "programs[2]"},
      {"{\"address\":\"h:1\",\"programs\":[\"a b\"]}", "programs[0]"},
      {"{\"address\":\"h:1\",\"programs\":[\"\"]}", "programs[0]"},
      {"{\"address\":\"h:1\",\"programs\":[1]}", "programs[0]"},
      {"{\"address\":\"h:1\",\"programs\":[\"a\",\"b\",\"a\"]}", "programs"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    int rc = wagma_agent_info_from_json(bad[i].json, strlen(bad[i].json), &a, &err);
    if (rc != WAGMA_EINVAL || strcmp(err.field, bad[i].field) != 0)
      fail_msg("agent %zu %s: rc %d field '%s' (want '%s'): %s", i, bad[i].json, rc, err.field,
               bad[i].field, err.message);
  }
}

static void test_error_body(void **state) {
  (void)state;
  char *b = wagma_api_error_body("invalid_spec", "must be \"x\"", "optimizer.lr");
  assert_string_equal(
      b, "{\"error\":{\"code\":\"invalid_spec\",\"message\":\"must be \\\"x\\\"\",\"field\":"
         "\"optimizer.lr\"}}");
  free(b);
  b = wagma_api_error_body("not_found", "no such job", NULL);
  assert_string_equal(b, "{\"error\":{\"code\":\"not_found\",\"message\":\"no such job\"}}");
  free(b);
  b = wagma_api_error_body("x", "bad \xff utf8", "");
  assert_non_null(b);
  free(b);
}

static void test_keys(void **state) {
  (void)state;
  wagma_keys_t k;
  char buf[256], job[WAGMA_API_NAME_MAX], agent[WAGMA_API_NAME_MAX];
  assert_int_equal(wagma_keys_init(&k, NULL), 0);
  assert_string_equal(k.prefix, "/wagma");
  assert_int_equal(wagma_keys_init(&k, "/x/y/"), 0);
  assert_string_equal(k.prefix, "/x/y");
  assert_int_equal(wagma_keys_init(&k, "x"), WAGMA_EINVAL);
  assert_int_equal(wagma_keys_init(&k, "/"), WAGMA_EINVAL);
  assert_int_equal(wagma_keys_init(&k, "/a//b"), WAGMA_EINVAL);
  assert_int_equal(wagma_keys_init(&k, "/a b"), WAGMA_EINVAL);
  assert_int_equal(wagma_keys_init(&k, "/wagma"), 0);

  assert_int_equal(wagma_key_agent(&k, "a0", buf, sizeof buf), 0);
  assert_string_equal(buf, "/wagma/agents/a0");
  assert_int_equal(wagma_key_agent(&k, "a/0", buf, sizeof buf), WAGMA_EINVAL);
  assert_int_equal(wagma_key_assignment(&k, "a0", buf, sizeof buf), 0);
  assert_string_equal(buf, "/wagma/assignments/a0");
  assert_int_equal(wagma_key_job_spec(&k, "j", buf, sizeof buf), 0);
  assert_string_equal(buf, "/wagma/jobs/j/spec");
  assert_int_equal(wagma_key_job_status(&k, "j", buf, sizeof buf), 0);
  assert_string_equal(buf, "/wagma/jobs/j/status");
  assert_int_equal(wagma_key_job_plan(&k, "j", buf, sizeof buf), 0);
  assert_string_equal(buf, "/wagma/jobs/j/plan");
  assert_int_equal(wagma_key_job_checkpoint(&k, "j", buf, sizeof buf), 0);
  assert_string_equal(buf, "/wagma/jobs/j/checkpoint");
  assert_int_equal(wagma_key_job_progress(&k, "j", "a0", buf, sizeof buf), 0);
  assert_string_equal(buf, "/wagma/jobs/j/progress/a0");
  assert_int_equal(wagma_key_job_progress_prefix(&k, "j", buf, sizeof buf), 0);
  assert_string_equal(buf, "/wagma/jobs/j/progress/");
  assert_int_equal(wagma_key_job_prefix(&k, "j", buf, sizeof buf), 0);
  assert_string_equal(buf, "/wagma/jobs/j/");
  assert_int_equal(wagma_key_jobs_prefix(&k, buf, sizeof buf), 0);
  assert_string_equal(buf, "/wagma/jobs/");
  assert_int_equal(wagma_key_agents_prefix(&k, buf, sizeof buf), 0);
  assert_string_equal(buf, "/wagma/agents/");
  assert_int_equal(wagma_key_leader(&k, buf, sizeof buf), 0);
  assert_string_equal(buf, "/wagma/coordinator/leader");
  assert_int_equal(wagma_key_root(&k, buf, sizeof buf), 0);
  assert_string_equal(buf, "/wagma/");
  assert_int_equal(wagma_key_job_plans_prefix(&k, "j", buf, sizeof buf), 0);
  assert_string_equal(buf, "/wagma/jobs/j/plans/");
  assert_int_equal(wagma_key_job_plan_record(&k, "j", 42, buf, sizeof buf), 0);
  assert_string_equal(buf, "/wagma/jobs/j/plans/00000000000000000042");
  assert_int_equal(wagma_key_job_plan_record(&k, "j", UINT64_MAX, buf, sizeof buf), 0);
  assert_string_equal(buf, "/wagma/jobs/j/plans/18446744073709551615");
  assert_int_equal(wagma_key_job_plan_record(&k, "a/b", 1, buf, sizeof buf), WAGMA_EINVAL);
  assert_int_equal(wagma_key_job_spec(&k, "j", buf, 10), WAGMA_ERANGE);

  struct {
    const char *key;
    wagma_key_kind_t kind;
    const char *job, *agent;
  } cases[] = {
      {"/wagma/agents/a0", WAGMA_KEY_AGENT, "", "a0"},
      {"/wagma/assignments/a1", WAGMA_KEY_ASSIGNMENT, "", "a1"},
      {"/wagma/jobs/j1/spec", WAGMA_KEY_JOB_SPEC, "j1", ""},
      {"/wagma/jobs/j1/status", WAGMA_KEY_JOB_STATUS, "j1", ""},
      {"/wagma/jobs/j1/plan", WAGMA_KEY_JOB_PLAN, "j1", ""},
      {"/wagma/jobs/j1/checkpoint", WAGMA_KEY_JOB_CHECKPOINT, "j1", ""},
      {"/wagma/jobs/j1/progress/a2", WAGMA_KEY_JOB_PROGRESS, "j1", "a2"},
      {"/wagma/jobs/j1/plans/00000000000000000003", WAGMA_KEY_JOB_PLAN_RECORD, "j1", ""},
      {"/wagma/jobs/j1/plans/3", WAGMA_KEY_UNKNOWN, "", ""},
      {"/wagma/jobs/j1/plans/0000000000000000000x", WAGMA_KEY_UNKNOWN, "", ""},
      {"/wagma/jobs/j1/plans/", WAGMA_KEY_UNKNOWN, "", ""},
      {"/wagma/coordinator/leader", WAGMA_KEY_LEADER, "", ""},
      {"/wagma/secrets/j1/00000000000000000007", WAGMA_KEY_SECRET, "j1", ""},
      {"/wagma/secrets/j1/7", WAGMA_KEY_UNKNOWN, "", ""},
      {"/wagma/secrets/j1", WAGMA_KEY_UNKNOWN, "", ""},
      {"/wagma/secrets/j1/", WAGMA_KEY_UNKNOWN, "", ""},
      {"/wagma/secrets/a/b/00000000000000000007", WAGMA_KEY_UNKNOWN, "", ""},
      {"/wagma/jobs/j1/progress/", WAGMA_KEY_UNKNOWN, "", ""},
      {"/wagma/jobs/j1/progress/a/b", WAGMA_KEY_UNKNOWN, "", ""},
      {"/wagma/jobs/j1/other", WAGMA_KEY_UNKNOWN, "", ""},
      {"/wagma/agents/", WAGMA_KEY_UNKNOWN, "", ""},
      {"/wagma/agents/a/b", WAGMA_KEY_UNKNOWN, "", ""},
      {"/wagmax/agents/a", WAGMA_KEY_UNKNOWN, "", ""},
      {"/other/agents/a", WAGMA_KEY_UNKNOWN, "", ""},
      {"/wagma", WAGMA_KEY_UNKNOWN, "", ""},
      {"", WAGMA_KEY_UNKNOWN, "", ""},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    job[0] = agent[0] = '\0';
    wagma_key_kind_t kind = wagma_key_parse(&k, cases[i].key, strlen(cases[i].key), job, agent);
    if (kind != cases[i].kind)
      fail_msg("key %s: kind %d want %d", cases[i].key, kind, cases[i].kind);
    if (kind != WAGMA_KEY_UNKNOWN) {
      assert_string_equal(job, cases[i].job);
      assert_string_equal(agent, cases[i].agent);
    }
  }
}

/* The data-plane secret keys (outside <prefix>/jobs/) and their hex values. */
static void test_secret_keys(void **state) {
  (void)state;
  wagma_keys_t k;
  char buf[128], hex[65];
  uint8_t secret[32], back[32];
  uint64_t epoch = 0;
  assert_int_equal(wagma_keys_init(&k, "/wagma"), 0);
  assert_int_equal(wagma_key_secrets_prefix(&k, buf, sizeof buf), 0);
  assert_string_equal(buf, "/wagma/secrets/");
  assert_int_equal(wagma_key_job_secrets_prefix(&k, "j", buf, sizeof buf), 0);
  assert_string_equal(buf, "/wagma/secrets/j/");
  assert_int_equal(wagma_key_secret(&k, "j", 42, buf, sizeof buf), 0);
  assert_string_equal(buf, "/wagma/secrets/j/00000000000000000042");
  assert_int_equal(wagma_key_secret_epoch(buf, strlen(buf), &epoch), 0);
  assert_int_equal(epoch, 42);
  assert_int_equal(wagma_key_secret(&k, "j", UINT64_MAX, buf, sizeof buf), 0);
  assert_int_equal(wagma_key_secret_epoch(buf, strlen(buf), &epoch), 0);
  assert_true(epoch == UINT64_MAX);
  assert_int_equal(wagma_key_secret_epoch("/wagma/secrets/j/99999999999999999999", 38, &epoch),
                   WAGMA_EINVAL);
  assert_int_equal(wagma_key_secret(&k, "a/b", 1, buf, sizeof buf), WAGMA_EINVAL);
  assert_int_equal(wagma_key_job_secrets_prefix(&k, "", buf, sizeof buf), WAGMA_EINVAL);
  /* no job key prefix holds it */
  assert_int_equal(wagma_key_jobs_prefix(&k, buf, sizeof buf), 0);
  char skey[128];
  wagma_key_secret(&k, "j", 1, skey, sizeof skey);
  assert_true(strncmp(skey, buf, strlen(buf)) != 0);

  for (size_t i = 0; i < sizeof secret; i++)
    secret[i] = (uint8_t)(i * 37 + 5);
  assert_int_equal(wagma_secret_to_hex(secret, sizeof secret, hex, sizeof hex), 0);
  assert_int_equal(strlen(hex), 64);
  assert_memory_equal(hex, "052a4f74", 8);
  assert_int_equal(wagma_secret_from_hex(hex, 64, back, sizeof back), 0);
  assert_memory_equal(secret, back, sizeof secret);
  hex[0] = 'F'; /* either case */
  assert_int_equal(wagma_secret_from_hex(hex, 64, back, sizeof back), 0);
  assert_int_equal(back[0], 0xf5);
  assert_int_equal(wagma_secret_to_hex(secret, sizeof secret, hex, 64), WAGMA_ERANGE);
  assert_int_equal(wagma_secret_from_hex(hex, 63, back, sizeof back), WAGMA_EINVAL);
  assert_int_equal(wagma_secret_from_hex(hex, 62, back, sizeof back), WAGMA_EINVAL);
  hex[5] = 'g';
  assert_int_equal(wagma_secret_from_hex(hex, 64, back, sizeof back), WAGMA_EINVAL);
}

static void test_names(void **state) {
  (void)state;
  assert_true(wagma_api_name_valid("a"));
  assert_true(wagma_api_name_valid("Job_1.v2-x"));
  assert_false(wagma_api_name_valid(""));
  assert_false(wagma_api_name_valid(".hidden"));
  assert_false(wagma_api_name_valid("-x"));
  assert_false(wagma_api_name_valid("a/b"));
  assert_false(wagma_api_name_valid("a b"));
  char longname[80];
  memset(longname, 'a', sizeof longname);
  longname[63] = '\0';
  assert_true(wagma_api_name_valid(longname));
  longname[63] = 'a';
  longname[64] = '\0';
  assert_false(wagma_api_name_valid(longname));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_spec_defaults),
      cmocka_unit_test(test_spec_round_trip),
      cmocka_unit_test(test_spec_bad_table),
      cmocka_unit_test(test_spec_checkpoint_path),
      cmocka_unit_test(test_patch),
      cmocka_unit_test(test_status_codec),
      cmocka_unit_test(test_status_summary),
      cmocka_unit_test(test_spec_algorithm_defaults_and_warnings),
      cmocka_unit_test(test_progress_codec),
      cmocka_unit_test(test_progress_unreachable),
      cmocka_unit_test(test_quarantine_probe_codec),
      cmocka_unit_test(test_plan_record_codec),
      cmocka_unit_test(test_checkpoint_record_codec),
      cmocka_unit_test(test_agent_and_assignment),
      cmocka_unit_test(test_program_names),
      cmocka_unit_test(test_program_spec),
      cmocka_unit_test(test_agent_programs),
      cmocka_unit_test(test_error_body),
      cmocka_unit_test(test_keys),
      cmocka_unit_test(test_secret_keys),
      cmocka_unit_test(test_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
