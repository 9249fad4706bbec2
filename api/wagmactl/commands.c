/* commands.c — each wagmactl command as one request and its output.
 *
 * A command builds (method, path, body) from the parsed arguments (ids are validated job
 * names, so they are safe in a path), sends it with the deadline of --timeout (list: as many
 * requests as pages, within one deadline for all) and maps the
 * outcome to an exit code: no answer -> 3, 404 -> 4, other non-2xx -> 1 (the server's error
 * code, message and field on stderr), 2xx -> 0 with the body printed unchanged (--json) or
 * rendered. Single-threaded; no globals. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctl.h"

#define MAX_SPEC_BYTES (16u << 20)

typedef int (*render_fn)(const json_t *root, FILE *out);

/* Reads a whole file ("-" = stdin). Ownership: *data is the caller's (free). */
static int read_spec(const char *path, char **data, size_t *len, FILE *err) {
  FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
  char *buf = NULL;
  size_t used = 0, cap = 0;
  int rc = -1;
  if (!f) {
    fprintf(err, "wagmactl: cannot read %s: %s\n", path, strerror(errno));
    return -1;
  }
  for (;;) {
    if (used + 4096 + 1 > cap) {
      cap = cap ? cap * 2 : 8192;
      char *nb = realloc(buf, cap);
      if (!nb) {
        fprintf(err, "wagmactl: out of memory reading %s\n", path);
        goto out;
      }
      buf = nb;
    }
    size_t n = fread(buf + used, 1, cap - used - 1, f);
    used += n;
    if (used > MAX_SPEC_BYTES) {
      fprintf(err, "wagmactl: %s is larger than %u bytes\n", path, MAX_SPEC_BYTES);
      goto out;
    }
    if (n == 0)
      break;
  }
  if (ferror(f)) {
    fprintf(err, "wagmactl: cannot read %s: %s\n", path, strerror(errno));
    goto out;
  }
  buf[used] = '\0';
  *data = buf;
  *len = used;
  buf = NULL;
  rc = 0;
out:
  free(buf);
  if (f != stdin)
    fclose(f);
  return rc;
}

/* Sends the request and handles everything but a 2xx body. Returns the exit code; on 0 the
 * caller owns *res (wg_ctl_response_free), otherwise it is freed. */
static int exchange(const wg_ctl_args_t *a, const char *method, const char *path, const char *body,
                    size_t body_len, wg_ctl_response_t *res, FILE *err) {
  wg_ctl_conn_t conn = {.server = a->server, .token = a->token, .timeout_s = a->timeout_s};
  if (wg_ctl_http_request(&conn, method, path, body, body_len, res) != 0) {
    fprintf(err, "wagmactl: cannot reach %s%s: %s\n", a->server,
            res->timed_out ? " (timed out)" : "", res->error);
    wg_ctl_response_free(res);
    return WG_CTL_EXIT_UNREACHABLE;
  }
  int code = wg_ctl_exit_for_status(res->status);
  if (code != WG_CTL_EXIT_OK) {
    wg_ctl_print_error(res->status, res->body, res->len, err);
    wg_ctl_response_free(res);
  }
  return code;
}

/* --json: the body unchanged (a newline added when it has none). */
static void print_raw(const wg_ctl_response_t *res, FILE *out) {
  if (res->len == 0)
    return;
  fwrite(res->body, 1, res->len, out);
  if (res->body[res->len - 1] != '\n')
    fputc('\n', out);
}

/* Parses the body. NULL (with a message) when it is not JSON. Caller decrefs. */
static json_t *parse_body(const wg_ctl_response_t *res, FILE *err) {
  json_error_t je;
  json_t *root = json_loadb(res->body, res->len, 0, &je);
  if (!root)
    fprintf(err, "wagmactl: the server's answer is not JSON (%s)\n", je.text);
  return root;
}

/* GET-style commands: request, then --json or render. */
static int show(const wg_ctl_args_t *a, const char *method, const char *path, render_fn render,
                FILE *out, FILE *err) {
  wg_ctl_response_t res;
  int code = exchange(a, method, path, NULL, 0, &res, err);
  if (code != WG_CTL_EXIT_OK)
    return code;
  if (a->json) {
    print_raw(&res, out);
  } else {
    json_t *root = parse_body(&res, err);
    if (!root || render(root, out) != 0) {
      if (root)
        fprintf(err, "wagmactl: the server's answer does not have the expected shape\n");
      code = WG_CTL_EXIT_SERVER;
    }
    json_decref(root);
  }
  wg_ctl_response_free(&res);
  return code;
}

/* For mutations: a one-line confirmation built from the returned job. */
static int confirm(const wg_ctl_args_t *a, wg_ctl_response_t *res, const char *verb, FILE *out,
                   FILE *err) {
  int code = WG_CTL_EXIT_OK;
  if (a->json) {
    print_raw(res, out);
    return code;
  }
  json_t *job = parse_body(res, err);
  if (!job)
    return WG_CTL_EXIT_SERVER;
  const json_t *spec = json_object_get(job, "spec");
  const json_t *status = json_object_get(job, "status");
  char id[128], state[128], w[32], mn[32], mx[32];
  wg_ctl_fmt_str(json_object_get(job, "id"), id, sizeof id);
  wg_ctl_fmt_str(json_object_get(status, "state"), state, sizeof state);
  fprintf(out, "job %s %s: state %s, workers %s (min %s, max %s)\n", id, verb, state,
          wg_ctl_fmt_int(json_object_get(spec, "workers"), w, sizeof w),
          wg_ctl_fmt_int(json_object_get(spec, "min_workers"), mn, sizeof mn),
          wg_ctl_fmt_int(json_object_get(spec, "max_workers"), mx, sizeof mx));
  size_t i;
  json_t *x;
  char w_line[1024];
  json_array_foreach(json_object_get(job, "warnings"), i, x)
      fprintf(err, "wagmactl: warning: %s\n", wg_ctl_fmt_str(x, w_line, sizeof w_line));
  json_decref(job);
  return code;
}

static int cmd_submit(const wg_ctl_args_t *a, FILE *out, FILE *err) {
  char *spec = NULL;
  size_t len = 0;
  if (read_spec(a->file, &spec, &len, err) != 0)
    return WG_CTL_EXIT_USAGE;
  wg_ctl_response_t res;
  int code = exchange(a, "POST", "/v1/jobs", spec, len, &res, err);
  free(spec);
  if (code != WG_CTL_EXIT_OK)
    return code;
  code = confirm(a, &res, "submitted", out, err);
  wg_ctl_response_free(&res);
  return code;
}

static int cmd_scale(const wg_ctl_args_t *a, FILE *out, FILE *err) {
  char path[128], body[64];
  snprintf(path, sizeof path, "/v1/jobs/%s", a->id);
  int n = snprintf(body, sizeof body, "{\"workers\":%d}", a->workers);
  wg_ctl_response_t res;
  int code = exchange(a, "PATCH", path, body, (size_t)n, &res, err);
  if (code != WG_CTL_EXIT_OK)
    return code;
  code = confirm(a, &res, "scaled", out, err);
  wg_ctl_response_free(&res);
  return code;
}

static int cmd_stop(const wg_ctl_args_t *a, FILE *out, FILE *err) {
  char path[160];
  snprintf(path, sizeof path, "/v1/jobs/%s%s", a->id, a->purge ? "?purge=true" : "");
  wg_ctl_response_t res;
  int code = exchange(a, "DELETE", path, NULL, 0, &res, err);
  if (code != WG_CTL_EXIT_OK)
    return code;
  if (res.status == 204 || res.len == 0) {
    if (!a->json)
      fprintf(out, "job %s purged\n", a->id);
  } else {
    code = confirm(a, &res, "stopped", out, err);
  }
  wg_ctl_response_free(&res);
  return code;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* list: GET /v1/jobs page by page (?limit=WG_CTL_LIST_PAGE, then ?continue=<token> until the
 * answer has none), every page's jobs into one array, printed as one answer. --timeout is the
 * deadline of the whole command: each request gets what is left of it. */
static int cmd_list(const wg_ctl_args_t *a, FILE *out, FILE *err) {
  json_t *all = json_array();
  char path[1024], token[512] = "";
  double deadline = now_s() + a->timeout_s;
  int code = WG_CTL_EXIT_OK;
  for (int page = 0; code == WG_CTL_EXIT_OK; page++) {
    wg_ctl_args_t pa = *a;
    pa.timeout_s = deadline - now_s();
    if (pa.timeout_s <= 0) {
      fprintf(err, "wagmactl: cannot reach %s (timed out): %d pages read within --timeout\n",
              a->server, page);
      code = WG_CTL_EXIT_UNREACHABLE;
      break;
    }
    snprintf(path, sizeof path, "/v1/jobs?limit=%d%s%s%s%s", WG_CTL_LIST_PAGE,
             a->state ? "&state=" : "", a->state ? a->state : "", token[0] ? "&continue=" : "",
             token);
    wg_ctl_response_t res;
    if ((code = exchange(&pa, "GET", path, NULL, 0, &res, err)) != WG_CTL_EXIT_OK)
      break;
    json_t *root = parse_body(&res, err);
    json_t *jobs = json_object_get(root, "jobs");
    json_t *next = json_object_get(root, "continue");
    if (!json_is_array(jobs) || (next && !json_is_string(next))) {
      if (root)
        fprintf(err, "wagmactl: the server's answer does not have the expected shape\n");
      code = WG_CTL_EXIT_SERVER;
    } else {
      json_array_extend(all, jobs);
      const char *t = next ? json_string_value(next) : "";
      /* A token that does not fit a path, or the same one again, would never end. */
      if (strlen(t) >= sizeof token ||
          strspn(t, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuv"
                    "wxyz0123456789-_") != strlen(t) ||
          (t[0] && strcmp(t, token) == 0)) {
        fprintf(err, "wagmactl: the server's continue token is not usable\n");
        code = WG_CTL_EXIT_SERVER;
      } else {
        snprintf(token, sizeof token, "%s", t);
      }
    }
    json_decref(root);
    wg_ctl_response_free(&res);
    if (!token[0])
      break;
  }
  if (code == WG_CTL_EXIT_OK) {
    json_t *o = json_pack("{s:O}", "jobs", all);
    if (a->json) {
      char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
      if (text)
        fprintf(out, "%s\n", text);
      free(text);
    } else if (!o || wg_ctl_render_jobs(o, out) != 0) {
      fprintf(err, "wagmactl: the server's answer does not have the expected shape\n");
      code = WG_CTL_EXIT_SERVER;
    }
    json_decref(o);
  }
  json_decref(all);
  return code;
}

int wg_ctl_run(const wg_ctl_args_t *a, FILE *out, FILE *err) {
  char path[192];
  switch (a->cmd) {
  case WG_CTL_CMD_SUBMIT: return cmd_submit(a, out, err);
  case WG_CTL_CMD_SCALE: return cmd_scale(a, out, err);
  case WG_CTL_CMD_STOP: return cmd_stop(a, out, err);
  case WG_CTL_CMD_LIST: return cmd_list(a, out, err);
  case WG_CTL_CMD_GET:
    snprintf(path, sizeof path, "/v1/jobs/%s", a->id);
    return show(a, "GET", path, wg_ctl_render_job, out, err);
  case WG_CTL_CMD_GROUPS:
    if (a->has_iteration)
      snprintf(path, sizeof path, "/v1/jobs/%s/groups?iteration=%" PRIu64, a->id, a->iteration);
    else
      snprintf(path, sizeof path, "/v1/jobs/%s/groups", a->id);
    return show(a, "GET", path, wg_ctl_render_groups, out, err);
  case WG_CTL_CMD_PLAN:
    snprintf(path, sizeof path, "/v1/jobs/%s/plan", a->id);
    return show(a, "GET", path, wg_ctl_render_plan, out, err);
  case WG_CTL_CMD_AGENTS: return show(a, "GET", "/v1/agents", wg_ctl_render_agents, out, err);
  case WG_CTL_CMD_WATCH: return wg_ctl_watch(a, out, err);
  case WG_CTL_CMD_HEALTH:
    return show(a, "GET", a->live ? "/healthz" : "/readyz", wg_ctl_render_health, out, err);
  default: break;
  }
  fprintf(err, "wagmactl: no command (see wagmactl --help)\n");
  return WG_CTL_EXIT_USAGE;
}
