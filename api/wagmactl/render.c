/* render.c — the readable views of the server's answers (api/openapi.yaml schemas).
 *
 * Each renderer checks only the outer shape it needs (an object, an array where the schema
 * has one) and prints "-" for any field that is missing or null, so an older or newer
 * server still gets a useful table. Every string from the server goes through
 * wg_ctl_fmt_str (control characters replaced). Pure: JSON in, text out. */
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "wagma/api.h"

#define CELL 256

/* "key:   value" lines with the values aligned at one column. */
static void kv(FILE *out, const char *key, const char *value) {
  fprintf(out, "%-13s %s\n", key, value);
}

static const char *str_at(const json_t *obj, const char *key, char *buf) {
  return wg_ctl_fmt_str(json_object_get(obj, key), buf, CELL);
}

static const char *int_at(const json_t *obj, const char *key, char *buf) {
  return wg_ctl_fmt_int(json_object_get(obj, key), buf, CELL);
}

/* Joins the items of an array (ints or strings) with sep into buf. */
static const char *join(const json_t *arr, const char *sep, char *buf, size_t len) {
  size_t used = 0;
  buf[0] = '\0';
  size_t i;
  json_t *item;
  json_array_foreach(arr, i, item) {
    char cell[CELL];
    wg_ctl_fmt_str(item, cell, sizeof cell);
    int n = snprintf(buf + used, len - used, "%s%s", i ? sep : "", cell);
    if (n < 0 || (size_t)n >= len - used) {
      if (len > 4)
        strcpy(buf + len - 4, "...");
      break;
    }
    used += (size_t)n;
  }
  if (!buf[0])
    snprintf(buf, len, "-");
  return buf;
}

/* What a job trains, for the MODEL column: the spec's model, or its program's name. */
static const char *model_at(const json_t *spec, char *buf) {
  const json_t *prog = json_object_get(spec, "program");
  if (json_is_object(prog))
    return str_at(prog, "name", buf);
  return str_at(spec, "model", buf);
}

/* Appends arg to buf (at used, len bytes in all) as a shell would need it typed, for display
 * only (the agent passes arguments as argv, never through a shell): as is when it is made of
 * [A-Za-z0-9@%+=:,./_-] and not empty, else in single quotes (a ' as '\''); control
 * characters show as '?'. Returns the new length, or len when it did not fit. */
static size_t shell_quoted(char *buf, size_t used, size_t len, const char *arg) {
  int plain = arg[0] != '\0';
  for (const char *p = arg; *p && plain; p++)
    plain = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
            strchr("@%+=:,./_-", *p) != NULL;
  size_t n = used;
#define PUT(ch)                                                                                    \
  do {                                                                                             \
    if (n + 1 >= len)                                                                              \
      return len;                                                                                  \
    buf[n++] = (ch);                                                                               \
  } while (0)
  if (!plain)
    PUT('\'');
  for (const unsigned char *p = (const unsigned char *)arg; *p; p++) {
    if (*p == '\'' && !plain) {
      PUT('\'');
      PUT('\\');
      PUT('\'');
      PUT('\'');
    } else {
      PUT(*p < 0x20 || *p == 0x7f ? '?' : (char)*p);
    }
  }
  if (!plain)
    PUT('\'');
#undef PUT
  buf[n] = '\0';
  return n;
}

/* "program NAME ARG..." (arguments shell-quoted for display) into buf; "..." at the end
 * when it does not fit. */
static const char *program_line(const json_t *prog, char *buf, size_t len) {
  char name[CELL];
  int w = snprintf(buf, len, "program %s", str_at(prog, "name", name));
  size_t used = w > 0 && (size_t)w < len ? (size_t)w : len;
  size_t i;
  json_t *arg;
  json_array_foreach(json_object_get(prog, "args"), i, arg) {
    if (used + 1 >= len) { /* no room for the space and a NUL */
      used = len;
      break;
    }
    buf[used++] = ' ';
    used = shell_quoted(buf, used, len, json_is_string(arg) ? json_string_value(arg) : "?");
  }
  if (used >= len && len > 4)
    strcpy(buf + len - 4, "...");
  return buf;
}

/* Prints t unless adding a row failed (rc != 0); frees t either way. Returns 0 or -1. */
static int finish_table(wg_ctl_table_t *t, int rc, FILE *out) {
  if (rc == 0)
    wg_ctl_table_print(t, out);
  wg_ctl_table_free(t);
  return rc ? -1 : 0;
}

int wg_ctl_render_jobs(const json_t *root, FILE *out) {
  const json_t *jobs = json_object_get(root, "jobs");
  if (!json_is_array(jobs))
    return -1;
  static const char *const headers[] = {"ID",        "STATE",     "WORKERS", "EPOCH",
                                        "ITERATION", "ALGORITHM", "MODEL",   "REASON"};
  wg_ctl_table_t *t = wg_ctl_table_new(8, headers);
  if (!t)
    return -1;
  int rc = 0;
  size_t i;
  json_t *job;
  json_array_foreach(jobs, i, job) {
    const json_t *spec = json_object_get(job, "spec");
    const json_t *status = json_object_get(job, "status");
    char id[CELL], state[CELL], target[CELL], workers[2 * CELL], epoch[CELL], iter[CELL],
        algo[CELL], model[CELL], reason[CELL];
    const json_t *members = json_object_get(status, "members");
    int_at(spec, "workers", target);
    if (json_is_array(members))
      snprintf(workers, sizeof workers, "%zu/%s", json_array_size(members), target);
    else
      snprintf(workers, sizeof workers, "-/%s", target);
    const char *row[] = {str_at(job, "id", id),
                         str_at(status, "state", state),
                         workers,
                         int_at(status, "epoch", epoch),
                         int_at(status, "iteration", iter),
                         str_at(spec, "algorithm", algo),
                         model_at(spec, model),
                         str_at(status, "reason", reason)};
    if ((rc = wg_ctl_table_add(t, row)) != 0)
      break;
  }
  return finish_table(t, rc, out);
}

/* "result:" — the status' summary of a finished job, when it has one. */
static void job_result(const json_t *status, FILE *out) {
  const json_t *sum = json_object_get(status, "summary");
  if (!json_is_object(sum))
    return;
  wagma_job_status_t st;
  char line[4 * CELL];
  /* the summary as the API decodes it (ranges checked), the other fields of a minimal status */
  json_t *v = json_pack("{s:s,s:O}", "state", "succeeded", "summary", sum);
  char *text = v ? json_dumps(v, JSON_COMPACT) : NULL;
  json_decref(v);
  if (text && wagma_job_status_from_json(text, strlen(text), &st, NULL) == 0) {
    wagma_job_summary_format(&st.summary, line, sizeof line);
    wagma_job_status_free(&st);
  } else {
    snprintf(line, sizeof line, "- (a summary this wagmactl cannot read)");
  }
  free(text);
  kv(out, "result:", line);
}

/* "warning:" lines — what the server says of a spec known to train badly. */
static void job_warnings(const json_t *job, FILE *out) {
  const json_t *w = json_object_get(job, "warnings");
  char line[4 * CELL];
  size_t i;
  json_t *x;
  json_array_foreach(w, i, x) kv(out, "warning:", wg_ctl_fmt_str(x, line, sizeof line));
}

static void job_summary(const json_t *job, FILE *out) {
  const json_t *spec = json_object_get(job, "spec");
  const json_t *status = json_object_get(job, "status");
  const json_t *opt = json_object_get(spec, "optimizer");
  char a[CELL], b[CELL], c[CELL], d[CELL], e[CELL], line[6 * CELL];

  kv(out, "job:", str_at(job, "id", a));
  const json_t *reason = json_object_get(status, "reason");
  if (json_is_string(reason) && json_string_length(reason) > 0)
    snprintf(line, sizeof line, "%s (%s)", str_at(status, "state", a), str_at(status, "reason", b));
  else
    snprintf(line, sizeof line, "%s", str_at(status, "state", a));
  kv(out, "state:", line);
  const json_t *members = json_object_get(status, "members");
  snprintf(
      line, sizeof line, "%s of %s (min %s, max %s)",
      json_is_array(members) ? (snprintf(e, sizeof e, "%zu", json_array_size(members)), e) : "-",
      int_at(spec, "workers", a), int_at(spec, "min_workers", b), int_at(spec, "max_workers", c));
  kv(out, "workers:", line);
  snprintf(line, sizeof line, "%s, group size %s, staleness bound %s, global sync %s",
           str_at(spec, "algorithm", a), int_at(spec, "group_size", b),
           int_at(spec, "staleness_bound", c), str_at(spec, "global_sync", d));
  const char *algo = json_string_value(json_object_get(spec, "algorithm"));
  if (algo && (!strcmp(algo, "asgd") || !strcmp(algo, "dc-asgd"))) {
    size_t used = strlen(line);
    snprintf(line + used, sizeof line - used, ", %s parameter-server shards",
             int_at(spec, "ps_shards", e));
    if (!strcmp(algo, "dc-asgd")) {
      used = strlen(line);
      snprintf(line + used, sizeof line - used, ", lambda %s%s",
               wg_ctl_fmt_real(json_object_get(spec, "dc_lambda"), 3, e, sizeof e),
               json_is_true(json_object_get(spec, "dc_adaptive")) ? " (adaptive)" : "");
    }
  }
  const json_t *delay = json_object_get(spec, "gradient_delay");
  if (json_is_integer(delay) && json_integer_value(delay) > 0) {
    size_t used = strlen(line);
    snprintf(line + used, sizeof line - used, ", gradient delay %s",
             int_at(spec, "gradient_delay", e));
  }
  kv(out, "algorithm:", line);
  const json_t *prog = json_object_get(spec, "program");
  if (json_is_object(prog)) { /* "program fmnist_cnn --lr 0.05 (cpu), batch 64" */
    char cmd[4 * CELL];
    snprintf(line, sizeof line, "%s (%s), batch %s", program_line(prog, cmd, sizeof cmd),
             str_at(spec, "device", c), int_at(spec, "batch_size", d));
  } else {
    snprintf(line, sizeof line, "%s on %s (%s), batch %s", str_at(spec, "model", a),
             str_at(spec, "dataset", b), str_at(spec, "device", c), int_at(spec, "batch_size", d));
  }
  kv(out, "model:", line);
  snprintf(line, sizeof line, "%s, lr %s, momentum %s", str_at(opt, "type", a),
           wg_ctl_fmt_real(json_object_get(opt, "lr"), 4, b, sizeof b),
           wg_ctl_fmt_real(json_object_get(opt, "momentum"), 2, c, sizeof c));
  kv(out, "optimizer:", line);
  const json_t *epochs = json_object_get(spec, "epochs");
  if (json_is_integer(epochs) && json_integer_value(epochs) > 0)
    snprintf(line, sizeof line, "%s (goal: %s epochs)", int_at(status, "iteration", a),
             int_at(spec, "epochs", b));
  else
    snprintf(line, sizeof line, "%s of %s", int_at(status, "iteration", a),
             int_at(spec, "iterations", b));
  kv(out, "iteration:", line);
  snprintf(line, sizeof line, "%s (start round %s, %s regroupings)", int_at(status, "epoch", a),
           int_at(status, "start_round", b), int_at(status, "regroupings", c));
  kv(out, "plan epoch:", line);
  kv(out, "created:", wg_ctl_fmt_time(json_object_get(status, "created"), a, sizeof a));
  kv(out, "started:", wg_ctl_fmt_time(json_object_get(status, "started"), a, sizeof a));
  kv(out, "finished:", wg_ctl_fmt_time(json_object_get(status, "finished"), a, sizeof a));
  job_result(status, out);
  job_warnings(job, out);
}

/* One row per member. ALIVE (optional in the schema) is shown only when some member has it.
 * ROLE: the member's role in its algorithm (progress "role"; "-" before its first report). */
static int member_table(const json_t *members, FILE *out) {
  static const char *const headers[] = {"RANK",      "NAME",      "ADDRESS", "ALIVE",
                                        "STATE",     "ITERATION", "LOSS",    "ACCURACY",
                                        "STEP_TIME", "STALENESS", "ROLE"};
  int has_alive = 0;
  size_t i;
  json_t *m;
  json_array_foreach(members, i, m) has_alive |= json_object_get(m, "alive") != NULL;
  const char *const *hdr = headers;
  const char *no_alive[10];
  if (!has_alive) {
    memcpy(no_alive, headers, 3 * sizeof *no_alive);
    memcpy(no_alive + 3, headers + 4, 7 * sizeof *no_alive);
    hdr = no_alive;
  }
  wg_ctl_table_t *t = wg_ctl_table_new(has_alive ? 11 : 10, hdr);
  if (!t)
    return -1;
  int rc = 0;
  json_array_foreach(members, i, m) {
    const json_t *p = json_object_get(m, "progress");
    char rank[CELL], name[CELL], addr[CELL], alive[CELL], state[CELL], iter[CELL], loss[CELL],
        acc[CELL], step[CELL], stale[CELL], role[CELL];
    const char *row[] = {int_at(m, "rank", rank),
                         str_at(m, "name", name),
                         str_at(m, "address", addr),
                         wg_ctl_fmt_bool(json_object_get(m, "alive"), alive, sizeof alive),
                         str_at(p, "state", state),
                         int_at(p, "iteration", iter),
                         wg_ctl_fmt_real(json_object_get(p, "loss"), 4, loss, sizeof loss),
                         wg_ctl_fmt_percent(json_object_get(p, "accuracy"), acc, sizeof acc),
                         wg_ctl_fmt_duration(json_object_get(p, "step_time"), step, sizeof step),
                         int_at(p, "staleness", stale),
                         str_at(p, "role", role)};
    if (!has_alive)
      memmove(row + 3, row + 4, 7 * sizeof *row);
    if ((rc = wg_ctl_table_add(t, row)) != 0)
      break;
  }
  return finish_table(t, rc, out);
}

/* After the member table: one line per member whose progress lists peers it cannot reach on
 * the data plane ("agent-3 cannot reach 3 peers on the data plane: agent-0 (4.1 s), ..."),
 * peers named by their rank in the members. */
static void unreachable_lines(const json_t *members, json_int_t epoch, FILE *out) {
  size_t i, k;
  const json_t *m, *u;
  json_array_foreach(members, i, m) {
    const json_t *p = json_object_get(m, "progress");
    const json_t *list = json_object_get(p, "unreachable");
    if (!json_is_array(list) || json_array_size(list) == 0 ||
        json_integer_value(json_object_get(p, "epoch")) != epoch)
      continue; /* (ranks of another epoch's plan name other members) */
    const json_t *total = json_object_get(p, "unreachable_total");
    char name[CELL];
    fprintf(out, "%s cannot reach %lld peer%s on the data plane:", str_at(m, "name", name),
            json_is_integer(total) ? (long long)json_integer_value(total)
                                   : (long long)json_array_size(list),
            json_array_size(list) == 1 && !json_is_integer(total) ? "" : "s");
    json_array_foreach(list, k, u) {
      json_int_t rank = json_integer_value(json_object_get(u, "rank"));
      const json_t *peer = NULL, *x;
      size_t j;
      json_array_foreach(members, j, x) if (json_integer_value(json_object_get(x, "rank")) == rank)
          peer = x;
      char pn[CELL];
      fprintf(out, "%s %s (%.1f s)", k ? "," : "", peer ? str_at(peer, "name", pn) : "?",
              json_number_value(json_object_get(u, "for")));
    }
    fputc('\n', out);
  }
}

int wg_ctl_render_job(const json_t *root, FILE *out) {
  if (!json_is_object(root) || !json_is_object(json_object_get(root, "status")))
    return -1;
  job_summary(root, out);
  const json_t *members = json_object_get(root, "members");
  fputc('\n', out);
  if (!json_is_array(members) || json_array_size(members) == 0) {
    fputs("no members (no plan yet)\n", out);
    return 0;
  }
  int rc = member_table(members, out);
  if (rc == 0)
    unreachable_lines(members,
                      json_integer_value(json_object_get(json_object_get(root, "status"), "epoch")),
                      out);
  return rc;
}

int wg_ctl_render_groups(const json_t *root, FILE *out) {
  const json_t *groups = json_object_get(root, "groups");
  if (!json_is_array(groups))
    return -1;
  char a[CELL], b[CELL], c[CELL], d[CELL], e[CELL];
  fprintf(out, "job %s  epoch %s  iteration %s  phase %s  kind %s\n", str_at(root, "job", a),
          int_at(root, "epoch", b), int_at(root, "iteration", c), int_at(root, "phase", d),
          str_at(root, "kind", e));
  static const char *const headers[] = {"GROUP", "RANKS", "MEMBERS"};
  wg_ctl_table_t *t = wg_ctl_table_new(3, headers);
  if (!t)
    return -1;
  int rc = 0;
  size_t i;
  json_t *g;
  json_array_foreach(groups, i, g) {
    char group[CELL], ranks[4096], members[16384];
    const char *row[] = {int_at(g, "group", group),
                         join(json_object_get(g, "ranks"), ",", ranks, sizeof ranks),
                         join(json_object_get(g, "members"), ",", members, sizeof members)};
    if ((rc = wg_ctl_table_add(t, row)) != 0)
      break;
  }
  return finish_table(t, rc, out);
}

int wg_ctl_render_plan(const json_t *root, FILE *out) {
  const json_t *members = json_object_get(root, "members");
  const json_t *phases = json_object_get(root, "phases");
  if (!json_is_array(members) || !json_is_array(phases))
    return -1;
  char a[CELL];
  kv(out, "epoch:", int_at(root, "epoch", a));
  kv(out, "start round:", int_at(root, "start_round", a));
  kv(out, "group size:", int_at(root, "group_size", a));
  kv(out, "staleness:", int_at(root, "staleness_bound", a));
  kv(out, "global sync:", str_at(root, "global_sync", a));
  fputc('\n', out);
  static const char *const headers[] = {"RANK", "NAME", "ADDRESS", "JOINER"};
  wg_ctl_table_t *t = wg_ctl_table_new(4, headers);
  if (!t)
    return -1;
  int rc = 0;
  size_t i;
  json_t *m;
  json_array_foreach(members, i, m) {
    char rank[CELL], name[CELL], addr[CELL], joiner[CELL];
    const char *row[] = {int_at(m, "rank", rank), str_at(m, "name", name),
                         str_at(m, "address", addr),
                         wg_ctl_fmt_bool(json_object_get(m, "joiner"), joiner, sizeof joiner)};
    if ((rc = wg_ctl_table_add(t, row)) != 0)
      break;
  }
  if (finish_table(t, rc, out) != 0)
    return -1;
  fprintf(out, "\nphases (%zu):\n", json_array_size(phases));
  json_t *phase;
  json_array_foreach(phases, i, phase) {
    fprintf(out, "  %zu:", i);
    size_t j;
    json_t *group;
    json_array_foreach(phase, j, group) {
      char ranks[4096];
      fprintf(out, " [%s]", join(group, " ", ranks, sizeof ranks));
    }
    fputc('\n', out);
  }
  return 0;
}

/* "yes", "no: <the quarantine's reason>" (the scheduler skips it), or "-" from a coordinator
 * that does not say. */
static const char *health_at(const json_t *agent, char *buf) {
  const json_t *healthy = json_object_get(agent, "healthy");
  if (!json_is_boolean(healthy))
    return "-";
  if (json_is_true(healthy))
    return "yes";
  const char *reason =
      json_string_value(json_object_get(json_object_get(agent, "quarantine"), "reason"));
  snprintf(buf, CELL, "no: %s", reason ? reason : "quarantined");
  return buf;
}

int wg_ctl_render_agents(const json_t *root, FILE *out) {
  const json_t *agents = json_object_get(root, "agents");
  if (!json_is_array(agents))
    return -1;
  static const char *const headers[] = {"NAME", "ADDRESS", "DEVICE",   "CAPACITY", "VERSION",
                                        "JOB",  "STARTED", "PROGRAMS", "HEALTHY"};
  wg_ctl_table_t *t = wg_ctl_table_new(9, headers);
  if (!t)
    return -1;
  int rc = 0;
  size_t i;
  json_t *ag;
  json_array_foreach(agents, i, ag) {
    char name[CELL], addr[CELL], dev[CELL], cap[CELL], ver[CELL], job[CELL], started[CELL],
        progs[CELL], health[CELL];
    const char *row[] = {str_at(ag, "name", name),
                         str_at(ag, "address", addr),
                         str_at(ag, "device", dev),
                         int_at(ag, "capacity", cap),
                         str_at(ag, "version", ver),
                         str_at(ag, "job", job),
                         wg_ctl_fmt_time(json_object_get(ag, "started"), started, CELL),
                         join(json_object_get(ag, "programs"), ",", progs, sizeof progs),
                         health_at(ag, health)};
    if ((rc = wg_ctl_table_add(t, row)) != 0)
      break;
  }
  return finish_table(t, rc, out);
}

int wg_ctl_render_health(const json_t *root, FILE *out) {
  if (!json_is_object(root))
    return -1;
  static const char *const keys[] = {"status", "ready", "id", "leader", "revision"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    const json_t *v = json_object_get(root, keys[i]);
    if (!v)
      continue;
    char key[32], val[CELL];
    snprintf(key, sizeof key, "%s:", keys[i]);
    kv(out, key, wg_ctl_fmt_str(v, val, sizeof val));
  }
  return 0;
}

/* ---- errors ------------------------------------------------------------------------------ */

int wg_ctl_exit_for_status(long status) {
  if (status >= 200 && status < 300)
    return WG_CTL_EXIT_OK;
  if (status == 404)
    return WG_CTL_EXIT_NOT_FOUND;
  return WG_CTL_EXIT_SERVER;
}

void wg_ctl_print_error(long status, const char *body, size_t len, FILE *err) {
  json_t *root = body ? json_loadb(body, len, 0, NULL) : NULL;
  const json_t *e = json_object_get(root, "error");
  char code[CELL], msg[1024], field[CELL];
  if (json_is_object(e)) {
    fprintf(err, "wagmactl: HTTP %ld %s: %s", status, str_at(e, "code", code),
            wg_ctl_fmt_str(json_object_get(e, "message"), msg, sizeof msg));
    const json_t *f = json_object_get(e, "field");
    if (json_is_string(f) && json_string_length(f) > 0)
      fprintf(err, " (field: %s)", wg_ctl_fmt_str(f, field, sizeof field));
    fputc('\n', err);
  } else {
    /* Not our error body (a proxy, another server): its first line, cleaned. */
    size_t n = 0;
    while (body && n < len && n < 200 && body[n] != '\n' && body[n] != '\r')
      n++;
    char line[201];
    for (size_t i = 0; i < n; i++)
      line[i] = ((unsigned char)body[i] < 0x20 || body[i] == 0x7f) ? '?' : body[i];
    line[n] = '\0';
    fprintf(err, "wagmactl: HTTP %ld%s%s\n", status, n ? ": " : "", line);
  }
  json_decref(root);
}
