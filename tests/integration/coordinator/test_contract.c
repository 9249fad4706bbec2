/* OpenAPI contract test: loads api/openapi.yaml (libyaml -> jansson) and checks that
 *  1. the router and the document agree on every path and method (documented = routed,
 *     other methods = 405);
 *  2. against a live coordinator (real etcd, fake agents, a running job), every documented
 *     operation answers a representative request with a documented status, and the body
 *     validates against the documented schema (type, required, properties,
 *     additionalProperties, items, enum, nullable, allOf, $ref);
 *  3. every documented operation was exercised. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <curl/curl.h>
#include <yaml.h>

#include "coord.h"
#include "etcd_fixture.h"
#include "harness.h"

#ifndef WAGMA_OPENAPI_PATH
#error "WAGMA_OPENAPI_PATH must be defined"
#endif

/* ---- YAML -> JSON ------------------------------------------------------------------------ */

static json_t *scalar_value(const yaml_node_t *n) {
  const char *s = (const char *)n->data.scalar.value;
  if (n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
    return json_string(s);
  if (strcmp(s, "true") == 0)
    return json_true();
  if (strcmp(s, "false") == 0)
    return json_false();
  if (strcmp(s, "null") == 0 || strcmp(s, "~") == 0)
    return json_null();
  char *end;
  long long i = strtoll(s, &end, 10);
  if (*s && !*end)
    return json_integer(i);
  double d = strtod(s, &end);
  if (*s && !*end)
    return json_real(d);
  return json_string(s);
}

static json_t *yaml_to_json(yaml_document_t *doc, yaml_node_t *n) {
  switch (n->type) {
  case YAML_SCALAR_NODE: return scalar_value(n);
  case YAML_SEQUENCE_NODE: {
    json_t *a = json_array();
    for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top; it++)
      json_array_append_new(a, yaml_to_json(doc, yaml_document_get_node(doc, *it)));
    return a;
  }
  case YAML_MAPPING_NODE: {
    json_t *o = json_object();
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
      yaml_node_t *k = yaml_document_get_node(doc, p->key);
      json_object_set_new(o, (const char *)k->data.scalar.value,
                          yaml_to_json(doc, yaml_document_get_node(doc, p->value)));
    }
    return o;
  }
  default: return json_null();
  }
}

static json_t *load_openapi(void) {
  FILE *f = fopen(WAGMA_OPENAPI_PATH, "rb");
  yaml_parser_t parser;
  yaml_document_t doc;
  assert_non_null(f);
  assert_true(yaml_parser_initialize(&parser));
  yaml_parser_set_input_file(&parser, f);
  assert_true(yaml_parser_load(&parser, &doc));
  json_t *root = yaml_to_json(&doc, yaml_document_get_root_node(&doc));
  yaml_document_delete(&doc);
  yaml_parser_delete(&parser);
  fclose(f);
  return root;
}

/* ---- schema validation ------------------------------------------------------------------- */

static json_t *g_api;

static json_t *resolve(json_t *node) {
  const char *ref;
  while (node && (ref = json_string_value(json_object_get(node, "$ref")))) {
    assert_true(strncmp(ref, "#/", 2) == 0);
    char buf[256];
    snprintf(buf, sizeof buf, "%s", ref + 2);
    json_t *cur = g_api;
    for (char *tok = strtok(buf, "/"); tok; tok = strtok(NULL, "/"))
      cur = json_object_get(cur, tok);
    if (!cur)
      fail_msg("unresolved $ref %s", ref);
    node = cur;
  }
  return node;
}

static void validate(json_t *schema, json_t *v, const char *path) {
  char sub[256];
  schema = resolve(schema);
  if (!schema)
    return;
  if (json_is_null(v) && json_is_true(json_object_get(schema, "nullable")))
    return;
  json_t *all = json_object_get(schema, "allOf");
  size_t i;
  json_t *s;
  json_array_foreach(all, i, s) validate(s, v, path);
  const char *type = json_string_value(json_object_get(schema, "type"));
  if (type) {
    int ok = (strcmp(type, "object") == 0 && json_is_object(v)) ||
             (strcmp(type, "array") == 0 && json_is_array(v)) ||
             (strcmp(type, "string") == 0 && json_is_string(v)) ||
             (strcmp(type, "integer") == 0 && json_is_integer(v)) ||
             (strcmp(type, "number") == 0 && json_is_number(v)) ||
             (strcmp(type, "boolean") == 0 && json_is_boolean(v));
    if (!ok)
      fail_msg("%s: expected %s", path, type);
  }
  json_t *en = json_object_get(schema, "enum");
  if (en) {
    int found = 0;
    json_array_foreach(en, i, s) found |= json_equal(s, v);
    if (!found)
      fail_msg("%s: value not in enum", path);
  }
  if (json_is_object(v)) {
    json_t *req = json_object_get(schema, "required");
    json_array_foreach(req, i, s) {
      if (!json_object_get(v, json_string_value(s)))
        fail_msg("%s: missing required %s", path, json_string_value(s));
    }
    json_t *props = json_object_get(schema, "properties");
    const char *key;
    json_t *val;
    json_object_foreach(v, key, val) {
      json_t *ps = json_object_get(props, key);
      snprintf(sub, sizeof sub, "%s.%s", path, key);
      if (ps)
        validate(ps, val, sub);
      else if (json_is_false(json_object_get(schema, "additionalProperties")))
        fail_msg("%s: not documented", sub);
    }
  }
  if (json_is_array(v)) {
    json_t *items = json_object_get(schema, "items");
    json_array_foreach(v, i, s) {
      snprintf(sub, sizeof sub, "%s[%zu]", path, i);
      validate(items, s, sub);
    }
  }
}

/* ---- the walk --------------------------------------------------------------------------- */

typedef harness_env_t env_t;

static int setup(void **state) {
  env_t *e = NULL;
  int rc = harness_env_start(&e);
  *state = e;
  if (rc != 0)
    return -1;
  g_api = load_openapi();
  return 0;
}

static int teardown(void **state) {
  harness_env_stop(*state);
  json_decref(g_api);
  return 0;
}

static const char *const methods[] = {"get", "post", "patch", "delete", "put"};

static void test_router_matches_document(void **state) {
  (void)state;
  json_t *paths = json_object_get(g_api, "paths");
  const char *p;
  json_t *ops;
  assert_int_equal(json_object_size(paths), 8);
  json_object_foreach(paths, p, ops) {
    char concrete[128], upper[8];
    snprintf(concrete, sizeof concrete, "%s", p);
    char *brace = strstr(concrete, "{id}");
    if (brace) {
      memmove(brace + 3, brace + 4, strlen(brace + 4) + 1);
      memcpy(brace, "job", 3);
    }
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
      size_t k;
      for (k = 0; methods[i][k]; k++)
        upper[k] = (char)(methods[i][k] - 32);
      upper[k] = '\0';
      wg_route_t r;
      wg_route(upper, concrete, &r);
      int documented = json_object_get(ops, methods[i]) != NULL;
      if (documented && r.status != 0)
        fail_msg("%s %s is documented but the router says %d", upper, p, r.status);
      if (!documented && r.status != 405)
        fail_msg("%s %s is not documented but the router says %d", upper, p, r.status);
    }
  }
}

typedef struct counter {
  char op[96];
  int n;
} counter_t;
static counter_t g_cov[64];
static int g_ncov;

/* Issues one request and checks it against the document. */
static void check(const coord_proc_t *c, const char *method, const char *doc_path, const char *path,
                  const char *body) {
  char u[256], lower[8];
  size_t k;
  http_result_t r;
  for (k = 0; method[k]; k++)
    lower[k] = (char)(method[k] + 32);
  lower[k] = '\0';
  json_t *op = json_object_get(json_object_get(json_object_get(g_api, "paths"), doc_path), lower);
  if (!op)
    fail_msg("%s %s not documented", method, doc_path);
  snprintf(u, sizeof u, "%s%s", c->base, path);
  harness_http(method, u, body, body ? strlen(body) : 0, body ? "application/json" : NULL, NULL,
               &r);
  char code[8];
  snprintf(code, sizeof code, "%ld", r.status);
  json_t *resp = resolve(json_object_get(json_object_get(op, "responses"), code));
  if (!resp)
    fail_msg("%s %s -> %ld: status not documented (%s)", method, path, r.status, r.body);
  json_t *content = json_object_get(resp, "content");
  if (content && json_object_get(content, "application/json")) {
    json_t *v = json_loads(r.body, 0, NULL);
    if (!v)
      fail_msg("%s %s -> %ld: body is not JSON: %s", method, path, r.status, r.body);
    char where[160];
    snprintf(where, sizeof where, "%s %s (%ld)", method, path, r.status);
    validate(json_object_get(json_object_get(content, "application/json"), "schema"), v, where);
    json_decref(v);
    assert_non_null(strstr(r.content_type, "application/json"));
  } else if (content && json_object_get(content, "text/plain")) {
    assert_non_null(strstr(r.content_type, "text/plain"));
  } else {
    assert_int_equal(r.len, 0);
  }
  harness_http_free(&r);
  char key[96];
  snprintf(key, sizeof key, "%s %s", lower, doc_path);
  int i;
  for (i = 0; i < g_ncov; i++)
    if (strcmp(g_cov[i].op, key) == 0)
      break;
  if (i == g_ncov && g_ncov < 64)
    snprintf(g_cov[g_ncov++].op, sizeof g_cov[0].op, "%s", key);
  g_cov[i].n++;
}

static void test_live_walk(void **state) {
  env_t *e = *state;
  coord_proc_t c;
  fake_agent_t a[2];
  harness_coord_start(&c, etcd_fixture_endpoints(e->fx), "contract", 3, NULL, NULL);
  harness_agent_start(e->etcd, &a[0], "k0", 7400, 10);
  harness_agent_start(e->etcd, &a[1], "k1", 7401, 10);

  check(&c, "POST", "/v1/jobs", "/v1/jobs", "{\"name\":\"ct\",\"workers\":2,\"max_workers\":3}");
  check(&c, "POST", "/v1/jobs", "/v1/jobs", "{\"name\":\"ct\",\"workers\":2}");   /* 409 */
  check(&c, "POST", "/v1/jobs", "/v1/jobs", "{\"workers\":0}");                   /* 422 */
  check(&c, "POST", "/v1/jobs", "/v1/jobs", "{");                                 /* 400 */
  check(&c, "POST", "/v1/jobs", "/v1/jobs", "{\"name\":\"pend\",\"workers\":5}"); /* pending */
  assert_true(harness_wait_epoch(c.base, "ct", 1, 10) >= 0);
  harness_progress(e->etcd, "ct", "k0", 12, "running", 0.7);
  /* A wagma member's report: the round it last averaged in, its group, a fingerprint. */
  const char *k1 = "{\"state\":\"running\",\"epoch\":1,\"iteration\":12,\"loss\":0.5,"
                   "\"accuracy\":0.8,\"step_time\":0.01,\"round\":11,\"round_kind\":\"group\","
                   "\"group\":[0,1],\"fingerprint\":[0.5,-0.25,1,2,3.5]}";
  assert_int_equal(wagma_etcd_put(e->etcd, "/wagma/jobs/ct/progress/k1", k1, strlen(k1), 0, NULL),
                   0);

  check(&c, "GET", "/v1/jobs", "/v1/jobs", NULL);
  check(&c, "GET", "/v1/jobs", "/v1/jobs?state=running", NULL);
  check(&c, "GET", "/v1/jobs", "/v1/jobs?state=nope", NULL); /* 400 */
  check(&c, "GET", "/v1/jobs/{id}", "/v1/jobs/ct", NULL);
  check(&c, "GET", "/v1/jobs/{id}", "/v1/jobs/pend", NULL);
  check(&c, "GET", "/v1/jobs/{id}", "/v1/jobs/none", NULL); /* 404 */
  check(&c, "PATCH", "/v1/jobs/{id}", "/v1/jobs/ct", "{\"eval_every\":5}");
  check(&c, "PATCH", "/v1/jobs/{id}", "/v1/jobs/ct", "{\"workers\":9}");   /* 422 */
  check(&c, "PATCH", "/v1/jobs/{id}", "/v1/jobs/none", "{\"workers\":1}"); /* 404 */
  check(&c, "GET", "/v1/jobs/{id}/groups", "/v1/jobs/ct/groups", NULL);
  check(&c, "GET", "/v1/jobs/{id}/groups", "/v1/jobs/ct/groups?iteration=7", NULL);
  check(&c, "GET", "/v1/jobs/{id}/groups", "/v1/jobs/ct/groups?iteration=11", NULL);
  check(&c, "GET", "/v1/jobs/{id}/groups", "/v1/jobs/ct/groups?iteration=-1", NULL); /* 400 */
  check(&c, "GET", "/v1/jobs/{id}/groups", "/v1/jobs/pend/groups", NULL);            /* 404 */
  check(&c, "GET", "/v1/jobs/{id}/plan", "/v1/jobs/ct/plan", NULL);
  check(&c, "GET", "/v1/jobs/{id}/plan", "/v1/jobs/pend/plan", NULL); /* 404 */
  check(&c, "GET", "/v1/agents", "/v1/agents", NULL);
  check(&c, "GET", "/healthz", "/healthz", NULL);
  check(&c, "GET", "/readyz", "/readyz", NULL);
  check(&c, "GET", "/metrics", "/metrics", NULL);
  check(&c, "DELETE", "/v1/jobs/{id}", "/v1/jobs/pend?purge=true", NULL); /* 409 active */
  check(&c, "DELETE", "/v1/jobs/{id}", "/v1/jobs/pend", NULL);
  check(&c, "DELETE", "/v1/jobs/{id}", "/v1/jobs/pend", NULL); /* 409 finished */
  check(&c, "DELETE", "/v1/jobs/{id}", "/v1/jobs/pend?purge=true", NULL);
  check(&c, "DELETE", "/v1/jobs/{id}", "/v1/jobs/none", NULL); /* 404 */

  /* Every documented operation was exercised. */
  json_t *paths = json_object_get(g_api, "paths");
  const char *p;
  json_t *ops;
  json_object_foreach(paths, p, ops) {
    const char *m;
    json_t *op;
    json_object_foreach(ops, m, op) {
      if (strcmp(m, "parameters") == 0)
        continue;
      char key[96];
      snprintf(key, sizeof key, "%s %s", m, p);
      int seen = 0;
      for (int i = 0; i < g_ncov; i++)
        seen |= strcmp(g_cov[i].op, key) == 0;
      if (!seen)
        fail_msg("documented operation %s was not exercised", key);
    }
  }
  harness_agent_kill(e->etcd, &a[0]);
  harness_agent_kill(e->etcd, &a[1]);
  harness_coord_stop(&c, SIGTERM);
}

int main(void) {
  curl_global_init(CURL_GLOBAL_ALL);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_router_matches_document),
      cmocka_unit_test(test_live_walk),
  };
  int rc = cmocka_run_group_tests(tests, setup, teardown);
  curl_global_cleanup();
  return rc;
}
