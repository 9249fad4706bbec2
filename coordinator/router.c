/* coordinator/router.c — maps (method, path) onto a route of the REST API (§8).
 *
 * Pure and allocation-free (fuzzed by tests/fuzz/coordinator). Paths are matched exactly:
 * no trailing slash, no empty segments. A path that exists with another method gives 405 and
 * the Allow list; anything else 404. Job ids in paths must be valid names (else 404). */
#include <string.h>

#include "coord.h"

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
  if (strcmp(slash, "/plan") == 0) {
    static const wg_route_id_t ids[] = {WG_ROUTE_JOB_PLAN};
    pick(method, get_only, ids, 1, "/v1/jobs/{id}/plan", out);
    return;
  }
  out->job[0] = '\0';
}
