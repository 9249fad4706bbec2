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

#include "router.h"
#include "coord.h"
#include "etcd_fixture.h"
#include "harness.h"
#include "raw_http.h"

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
  assert_int_equal(json_object_size(paths), 10);
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
  check(&c, "GET", "/v1/jobs", "/v1/jobs?limit=1", NULL);    /* a page with "continue" */
  check(&c, "GET", "/v1/jobs", "/v1/jobs?limit=0", NULL);    /* 400 */
  check(&c, "GET", "/v1/jobs", "/v1/jobs?continue=x", NULL); /* 400 */
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
  check(&c, "GET", "/v1/jobs/{id}/events", "/v1/jobs/ct/events", NULL);   /* the timeline */
  check(&c, "GET", "/v1/jobs/{id}/events", "/v1/jobs/none/events", NULL); /* 404 */
  check(&c, "GET", "/v1/events", "/v1/events", NULL); /* 400: a stream only (test_events) */
  check(&c, "GET", "/healthz", "/healthz", NULL);
  check(&c, "GET", "/readyz", "/readyz", NULL);
  check(&c, "GET", "/metrics", "/metrics", NULL);
  check(&c, "DELETE", "/v1/jobs/{id}", "/v1/jobs/pend?purge=true", NULL); /* 409 active */
  check(&c, "DELETE", "/v1/jobs/{id}", "/v1/jobs/pend", NULL);
  check(&c, "DELETE", "/v1/jobs/{id}", "/v1/jobs/pend", NULL); /* 409 finished */
  check(&c, "DELETE", "/v1/jobs/{id}", "/v1/jobs/pend?purge=true", NULL);
  check(&c, "DELETE", "/v1/jobs/{id}", "/v1/jobs/none", NULL); /* 404 */

  /* What the server refuses before routing (HTTP framing, on raw sockets) has the documented
   * error body with a documented code. */
  static const char *const refused[] = {
      "GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n",
      "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: x\r\n\r\n",
      "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
      "GET /healthz HTTP/1.1\r\nBad header\r\n\r\n",
  };
  json_t *error_schema =
      json_object_get(json_object_get(json_object_get(g_api, "components"), "schemas"), "Error");
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    raw_answer_t a;
    assert_int_equal(raw_exchange(NULL, c.port, refused[i], strlen(refused[i]), &a, 1, NULL, 5), 1);
    json_t *v = json_loads(a.body, 0, NULL);
    if (!v)
      fail_msg("refusal %zu: not JSON: %s", i, a.body);
    validate(error_schema, v, "refusal");
    json_decref(v);
  }

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

/* ---- ranges of the job spec ---------------------------------------------------------------- */

/* Extra fields a boundary value of a field needs to be valid otherwise (cross-field rules). */
static const struct {
  const char *field, *extra;
} range_extras[] = {
    {"min_workers", "\"workers\":10000"},
    {"max_workers", "\"workers\":1"},
    {"checkpoint.every", "\"checkpoint\":{\"path\":\"ck\"}"},
    {"program.max_restarts", "\"program\":{\"name\":\"p\"}"}, /* a program needs its name */
};

/* {"workers":1,<extra>,<field>:<value>} with the dotted field nested ("optimizer.lr" ->
 * {"optimizer":{"lr":v}}); an extra naming the same top-level object is merged. */
static json_t *spec_with(const char *field, json_t *value) {
  json_t *spec = json_pack("{s:i}", "workers", 1);
  for (size_t i = 0; i < sizeof range_extras / sizeof range_extras[0]; i++) {
    if (strcmp(range_extras[i].field, field) != 0)
      continue;
    char buf[128];
    snprintf(buf, sizeof buf, "{%s}", range_extras[i].extra);
    json_t *x = json_loads(buf, 0, NULL);
    json_object_update(spec, x);
    json_decref(x);
  }
  const char *dot = strchr(field, '.');
  if (dot) {
    char top[64];
    snprintf(top, sizeof top, "%.*s", (int)(dot - field), field);
    json_t *obj = json_object_get(spec, top);
    if (!obj) {
      obj = json_object();
      json_object_set_new(spec, top, obj);
    }
    json_object_set_new(obj, dot + 1, value);
  } else {
    json_object_set_new(spec, field, value);
  }
  return spec;
}

/* POSTs spec; want_ok: 201, else 422 invalid_spec naming field. */
static void post_range_case(const coord_proc_t *c, const char *field, json_t *spec, int want_ok,
                            int *nposted) {
  char name[64], u[256];
  snprintf(name, sizeof name, "range-%d", (*nposted)++);
  json_object_set_new(spec, "name", json_string(name));
  char *body = json_dumps(spec, JSON_COMPACT);
  snprintf(u, sizeof u, "%s/v1/jobs", c->base);
  http_result_t r;
  harness_http("POST", u, body, strlen(body), "application/json", NULL, &r);
  if (want_ok && r.status != 201)
    fail_msg("%s: %s -> %ld, want 201: %s", field, body, r.status, r.body);
  if (!want_ok) {
    json_t *v = json_loads(r.body, 0, NULL);
    const char *f = json_string_value(json_object_get(json_object_get(v, "error"), "field"));
    if (r.status != 422 || !f || strcmp(f, field) != 0)
      fail_msg("%s: %s -> %ld, want 422 naming %s: %s", field, body, r.status, field, r.body);
    json_decref(v);
  }
  harness_http_free(&r);
  free(body);
  json_decref(spec);
}

/* The boundary values of one numeric schema: min and max accepted (unless exclusive), the
 * next values outside refused. Integers step by 1; numbers by a small relative step. With
 * patch, the JobPatch decoder is asked instead of the server (field rules only). */
static void check_numeric_range(const coord_proc_t *c, const char *field, json_t *schema, int patch,
                                int *nposted) {
  const char *type = json_string_value(json_object_get(schema, "type"));
  json_t *mn = json_object_get(schema, "minimum"), *mx = json_object_get(schema, "maximum");
  if (!mn || !mx)
    fail_msg("%s: a %s without a documented minimum and maximum (every numeric field of the "
             "spec is range-checked)",
             field, type);
  int integer = strcmp(type, "integer") == 0;
  int xmin = json_is_true(json_object_get(schema, "exclusiveMinimum"));
  int xmax = json_is_true(json_object_get(schema, "exclusiveMaximum"));
  struct {
    json_t *v;
    int ok;
  } cases[4];
  int n = 0;
  if (integer) {
    json_int_t lo = json_integer_value(mn), hi = json_integer_value(mx);
    assert_false(xmin || xmax);
    cases[n].v = json_integer(lo), cases[n++].ok = 1;
    cases[n].v = json_integer(hi), cases[n++].ok = 1;
    cases[n].v = json_integer(lo - 1), cases[n++].ok = 0;
    /* Past INT64_MAX a JSON integer does not fit: send a real, refused as not an integer. */
    cases[n].v = hi < INT64_MAX ? json_integer(hi + 1) : json_real(1e19), cases[n++].ok = 0;
  } else {
    double lo = json_number_value(mn), hi = json_number_value(mx);
    double eps = 1e-9;
    cases[n].v = json_real(xmin ? lo : lo - eps), cases[n++].ok = 0;
    cases[n].v = json_real(xmax ? hi : hi + eps), cases[n++].ok = 0;
    cases[n].v = json_real(xmin ? lo + eps : lo), cases[n++].ok = 1;
    cases[n].v = json_real(xmax ? hi - eps : hi), cases[n++].ok = 1;
  }
  for (int i = 0; i < n; i++) {
    if (!patch) {
      post_range_case(c, field, spec_with(field, cases[i].v), cases[i].ok, nposted);
      continue;
    }
    json_t *p = json_object();
    json_object_set_new(p, field, cases[i].v);
    char *body = json_dumps(p, JSON_COMPACT);
    wagma_job_patch_t patch_out;
    wagma_api_error_t err;
    int rc = wagma_job_patch_from_json(body, strlen(body), &patch_out, &err);
    if (cases[i].ok != (rc == 0) || (rc && strcmp(err.field, field) != 0))
      fail_msg("patch %s: %s -> %d (%s: %s)", field, body, rc, err.field, err.message);
    free(body);
    json_decref(p);
  }
}

/* A string with a documented maxLength: that length accepted, one more refused. */
static void check_max_length(const coord_proc_t *c, const char *field, json_t *schema,
                             int *nposted) {
  json_int_t max = json_integer_value(json_object_get(schema, "maxLength"));
  assert_true(max > 0 && max < 4096);
  char buf[4096];
  for (int extra = 0; extra <= 1; extra++) {
    memset(buf, 'a', (size_t)max + (size_t)extra);
    buf[max + extra] = '\0';
    if (strcmp(field, "name") == 0) { /* the case's own name field is overwritten: ask directly */
      json_t *spec = json_pack("{s:i,s:s}", "workers", 1, "name", buf);
      char *body = json_dumps(spec, JSON_COMPACT), u[256];
      snprintf(u, sizeof u, "%s/v1/jobs", c->base);
      http_result_t r;
      harness_http("POST", u, body, strlen(body), "application/json", NULL, &r);
      if (r.status != (extra ? 422 : 201))
        fail_msg("name of %d characters -> %ld: %s", (int)strlen(buf), r.status, r.body);
      harness_http_free(&r);
      free(body);
      json_decref(spec);
      continue;
    }
    post_range_case(c, field, spec_with(field, json_string(buf)), !extra, nposted);
  }
}

/* Walks the properties of a spec schema (recursing into objects) and checks every numeric
 * range and maxLength it documents against the live server. */
static void walk_ranges(const coord_proc_t *c, json_t *schema, const char *prefix, int patch,
                        int *nposted, int *nchecked) {
  json_t *props = json_object_get(resolve(schema), "properties");
  const char *key;
  json_t *ps;
  json_object_foreach(props, key, ps) {
    char field[96];
    snprintf(field, sizeof field, "%s%s%s", prefix, prefix[0] ? "." : "", key);
    json_t *r = resolve(ps);
    const char *type = json_string_value(json_object_get(r, "type"));
    if (!type)
      continue;
    if (strcmp(type, "object") == 0) {
      walk_ranges(c, r, field, patch, nposted, nchecked);
    } else if (strcmp(type, "integer") == 0 || strcmp(type, "number") == 0) {
      check_numeric_range(c, field, r, patch, nposted);
      ++*nchecked;
    } else if (strcmp(type, "string") == 0 && json_object_get(r, "maxLength") && !patch) {
      check_max_length(c, field, r, nposted);
      ++*nchecked;
    }
  }
}

/* Every range the spec validator enforces is in the document (every numeric field has a
 * minimum and a maximum), and the server enforces exactly the documented bounds. */
static void test_spec_ranges(void **state) {
  env_t *e = *state;
  coord_proc_t c;
  int nposted = 0, nchecked = 0;
  harness_coord_start(&c, etcd_fixture_endpoints(e->fx), "ranges", 3, NULL, NULL);
  json_t *schemas = json_object_get(json_object_get(g_api, "components"), "schemas");
  walk_ranges(&c, json_object_get(schemas, "JobSpecInput"), "", 0, &nposted, &nchecked);
  /* workers, min/max_workers, group_size, staleness_bound, batch_size, iterations, epochs,
   * eval_every, seed, optimizer.{lr,momentum,weight_decay,warmup}, checkpoint.every,
   * gradient_delay, ps_shards, dc_lambda, program.max_restarts, name, checkpoint.path and
   * program.name lengths. */
  assert_int_equal(nchecked, 22);
  int npatch = 0;
  walk_ranges(&c, json_object_get(schemas, "JobPatch"), "", 1, &nposted, &npatch);
  assert_int_equal(npatch, 4);
  harness_coord_stop(&c, SIGTERM);
}

int main(void) {
  curl_global_init(CURL_GLOBAL_ALL);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_router_matches_document),
      cmocka_unit_test(test_live_walk),
      cmocka_unit_test(test_spec_ranges),
  };
  int rc = cmocka_run_group_tests(tests, setup, teardown);
  curl_global_cleanup();
  return rc;
}
