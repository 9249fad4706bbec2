/* coordinator/router.c — maps (method, path) onto a route of the REST API (docs/design.md
 * §10) and the web view's files (/, /ui/...), and checks the raw request target before
 * anything is decoded.
 *
 * Pure and allocation-free (fuzzed by tests/fuzz/coordinator). Paths are matched exactly:
 * no trailing slash, no empty, "." or ".." segments. A path that exists with another method
 * gives 405 and the Allow list; anything else 404. Job ids in paths must be valid names (else
 * 404). The target check runs first (400): a decoded path is a C string, so a NUL (raw or
 * %00) would otherwise cut it short and turn "/healthz%00junk" into "/healthz". */
#include <stdint.h>
#include <string.h>

#include "router.h"
#include "ui.h"

static int method_is(const char *m, const char *want) {
  return strcmp(m, want) == 0;
}

/* Resolves one path with its method table. methods[i] pairs with ids[i]. */
static void pick(const char *method, const char *const *methods, const wg_route_id_t *ids, int n,
                 const char *label, wg_route_t *out) {
  const char *m = method_is(method, "HEAD") ? "GET" : method;
  out->label = label;
  for (int i = 0; i < n; i++) {
    if (strcmp(m, methods[i]) == 0) {
      out->id = ids[i];
      out->status = 0;
      out->mutation = !method_is(m, "GET");
      return;
    }
  }
  out->status = 405;
  size_t used = 0;
  out->allow[0] = '\0';
  for (int i = 0; i < n; i++) {
    size_t l = strlen(methods[i]);
    if (used + l + 3 >= sizeof out->allow)
      break;
    if (i) {
      memcpy(out->allow + used, ", ", 2);
      used += 2;
    }
    memcpy(out->allow + used, methods[i], l);
    used += l;
    out->allow[used] = '\0';
  }
  if (method_is(methods[0], "GET") && used + 7 < sizeof out->allow)
    strcat(out->allow, ", HEAD");
}

static int hex_value(uint8_t c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

static int control_byte(uint8_t c) {
  return c < 0x20 || c == 0x7f;
}

int wg_route_target_check(const char *target, size_t len, const char **why) {
  const char *reason = NULL;
  int in_query = 0;
  const uint8_t *t = (const uint8_t *)target;
  if (target == NULL)
    len = 0;
  for (size_t i = 0; i < len && reason == NULL; i++) {
    uint8_t c = t[i];
    if (c == '?') {
      in_query = 1;
    } else if (c == '\0') {
      reason = in_query ? "the query contains a NUL byte" : "the path contains a NUL byte";
    } else if (control_byte(c)) {
      reason = in_query ? "the query contains a control character"
                        : "the path contains a control character";
    } else if (c == '%') {
      int hi = i + 1 < len ? hex_value(t[i + 1]) : -1;
      int lo = i + 2 < len ? hex_value(t[i + 2]) : -1;
      if (hi < 0 || lo < 0) {
        reason = "malformed percent escape (want %HH)";
        break;
      }
      uint8_t d = (uint8_t)(hi << 4 | lo);
      if (d == 0)
        reason = in_query ? "the query decodes to a NUL (%00)" : "the path decodes to a NUL (%00)";
      else if (control_byte(d))
        reason = in_query ? "the query decodes to a control character"
                          : "the path decodes to a control character";
      else if (!in_query && d == '/')
        reason = "the path contains an encoded '/' (%2F)";
      i += 2;
    }
  }
  if (why)
    *why = reason;
  return reason ? 400 : 0;
}

void wg_route(const char *method, const char *path, wg_route_t *out) {
  memset(out, 0, sizeof *out);
  out->status = 404;
  out->label = "other";
  if (!method || !path)
    return;
  static const char *const get_only[] = {"GET"};
  static const char *const jobs_m[] = {"GET", "POST"};
  static const char *const job_m[] = {"GET", "PATCH", "DELETE"};
  if (strcmp(path, "/healthz") == 0) {
    static const wg_route_id_t ids[] = {WG_ROUTE_HEALTHZ};
    pick(method, get_only, ids, 1, "/healthz", out);
    return;
  }
  if (strcmp(path, "/readyz") == 0) {
    static const wg_route_id_t ids[] = {WG_ROUTE_READYZ};
    pick(method, get_only, ids, 1, "/readyz", out);
    return;
  }
  if (strcmp(path, "/metrics") == 0) {
    static const wg_route_id_t ids[] = {WG_ROUTE_METRICS};
    pick(method, get_only, ids, 1, "/metrics", out);
    return;
  }
  if (strcmp(path, "/v1/events") == 0) {
    static const wg_route_id_t ids[] = {WG_ROUTE_EVENTS};
    pick(method, get_only, ids, 1, "/v1/events", out);
    out->events = 1;
    return;
  }
  if (strcmp(path, "/") == 0 || strncmp(path, "/ui/", 4) == 0) {
    int asset = path[1] ? wg_ui_asset(path + 4) : -1;
    if (path[1] && asset < 0)
      return; /* 404 */
    static const wg_route_id_t ids[] = {WG_ROUTE_UI};
    pick(method, get_only, ids, 1, "/ui", out);
    out->asset = asset;
    return;
  }
  if (strcmp(path, "/v1/agents") == 0) {
    static const wg_route_id_t ids[] = {WG_ROUTE_AGENTS};
    pick(method, get_only, ids, 1, "/v1/agents", out);
    return;
  }
  if (strcmp(path, "/v1/jobs") == 0) {
    static const wg_route_id_t ids[] = {WG_ROUTE_JOBS_LIST, WG_ROUTE_JOBS_SUBMIT};
    pick(method, jobs_m, ids, 2, "/v1/jobs", out);
    return;
  }
  static const char jobs_prefix[] = "/v1/jobs/";
  if (strncmp(path, jobs_prefix, sizeof jobs_prefix - 1) != 0)
    return;
  const char *id = path + sizeof jobs_prefix - 1;
  const char *slash = strchr(id, '/');
  size_t idlen = slash ? (size_t)(slash - id) : strlen(id);
  if (idlen == 0 || idlen >= sizeof out->job)
    return;
  memcpy(out->job, id, idlen);
  out->job[idlen] = '\0';
  if (!wagma_api_name_valid(out->job)) {
    out->job[0] = '\0';
    return;
  }
  if (!slash) {
    static const wg_route_id_t ids[] = {WG_ROUTE_JOB_GET, WG_ROUTE_JOB_PATCH, WG_ROUTE_JOB_DELETE};
    pick(method, job_m, ids, 3, "/v1/jobs/{id}", out);
    return;
  }
  if (strcmp(slash, "/groups") == 0) {
    static const wg_route_id_t ids[] = {WG_ROUTE_JOB_GROUPS};
    pick(method, get_only, ids, 1, "/v1/jobs/{id}/groups", out);
    return;
  }
  if (strcmp(slash, "/events") == 0) {
    static const wg_route_id_t ids[] = {WG_ROUTE_JOB_EVENTS};
    pick(method, get_only, ids, 1, "/v1/jobs/{id}/events", out);
    out->events = 1;
    return;
  }
  if (strcmp(slash, "/plan") == 0) {
    static const wg_route_id_t ids[] = {WG_ROUTE_JOB_PLAN};
    pick(method, get_only, ids, 1, "/v1/jobs/{id}/plan", out);
    return;
  }
  out->job[0] = '\0';
}
