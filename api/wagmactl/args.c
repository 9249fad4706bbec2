/* args.c — the command line of wagmactl: argv and the environment -> wg_ctl_args_t.
 *
 * One pass over argv. Global options (--server, --token, --token-file, --json, --timeout,
 * --help) may stand anywhere; command options (--iteration, --purge, --state, --live) are
 * checked against the command once it is known. "--opt=value" and "--opt value" both work;
 * "--" ends the options; "-" is a positional (stdin for submit). Every value is validated
 * here so that the commands only build requests: ids are job names (safe in a URL path),
 * numbers are in range, the token has no control characters (it goes into a header).
 * Pure apart from reading --token-file. No globals. */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "wagma/api.h"

#define MAX_POSITIONALS 4

static const char *const cmd_names[WG_CTL_CMD_COUNT] = {
    [WG_CTL_CMD_NONE] = "",       [WG_CTL_CMD_HELP] = "help",     [WG_CTL_CMD_SUBMIT] = "submit",
    [WG_CTL_CMD_LIST] = "list",   [WG_CTL_CMD_GET] = "get",       [WG_CTL_CMD_GROUPS] = "groups",
    [WG_CTL_CMD_SCALE] = "scale", [WG_CTL_CMD_STOP] = "stop",     [WG_CTL_CMD_AGENTS] = "agents",
    [WG_CTL_CMD_PLAN] = "plan",   [WG_CTL_CMD_HEALTH] = "health", [WG_CTL_CMD_WATCH] = "watch",
};

const char *wg_ctl_cmd_name(wg_ctl_cmd_t cmd) {
  return cmd > WG_CTL_CMD_NONE && cmd < WG_CTL_CMD_COUNT ? cmd_names[cmd] : "";
}

wg_ctl_cmd_t wg_ctl_cmd_from_name(const char *name) {
  for (int c = WG_CTL_CMD_NONE + 1; c < WG_CTL_CMD_COUNT; c++)
    if (strcmp(name, cmd_names[c]) == 0)
      return (wg_ctl_cmd_t)c;
  return WG_CTL_CMD_NONE;
}

typedef enum opt_id {
  OPT_SERVER,
  OPT_TOKEN,
  OPT_TOKEN_FILE,
  OPT_JSON,
  OPT_TIMEOUT,
  OPT_HELP,
  OPT_ITERATION,
  OPT_PURGE,
  OPT_STATE,
  OPT_LIVE,
} opt_id_t;

typedef struct opt_def {
  const char *name;
  opt_id_t id;
  int takes_value;
  wg_ctl_cmd_t only; /* NONE = global */
} opt_def_t;

static const opt_def_t opts[] = {
    {"--server", OPT_SERVER, 1, WG_CTL_CMD_NONE},
    {"--token", OPT_TOKEN, 1, WG_CTL_CMD_NONE},
    {"--token-file", OPT_TOKEN_FILE, 1, WG_CTL_CMD_NONE},
    {"--json", OPT_JSON, 0, WG_CTL_CMD_NONE},
    {"--timeout", OPT_TIMEOUT, 1, WG_CTL_CMD_NONE},
    {"--help", OPT_HELP, 0, WG_CTL_CMD_NONE},
    {"-h", OPT_HELP, 0, WG_CTL_CMD_NONE},
    {"--iteration", OPT_ITERATION, 1, WG_CTL_CMD_GROUPS},
    {"--purge", OPT_PURGE, 0, WG_CTL_CMD_STOP},
    {"--state", OPT_STATE, 1, WG_CTL_CMD_LIST},
    {"--live", OPT_LIVE, 0, WG_CTL_CMD_HEALTH},
};

typedef struct parse_state {
  wg_ctl_args_t *a;
  char *err;
  size_t errlen;
  const char *server;
  const char *token;
  const char *token_file;
  const opt_def_t *cmd_opt_seen; /* the last command option seen (checked at the end) */
  const char *positional[MAX_POSITIONALS];
  int npositional;
} parse_state_t;

static int fail(parse_state_t *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(parse_state_t *ps, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ps->err, ps->errlen, fmt, ap);
  va_end(ap);
  return -1;
}

/* Strict unsigned decimal: digits only, no sign, no overflow. */
static int parse_u64(const char *s, uint64_t *out) {
  if (!s || !*s)
    return -1;
  uint64_t v = 0;
  for (const char *p = s; *p; p++) {
    if (!isdigit((unsigned char)*p))
      return -1;
    unsigned d = (unsigned)(*p - '0');
    if (v > (UINT64_MAX - d) / 10)
      return -1;
    v = v * 10 + d;
  }
  *out = v;
  return 0;
}

static int parse_timeout(const char *s, double *out) {
  char *end = NULL;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !(v > 0) || v > 86400)
    return -1;
  *out = v;
  return 0;
}

/* A header-safe token: printable ASCII, no spaces. */
static int token_valid(const char *t) {
  for (const unsigned char *p = (const unsigned char *)t; *p; p++)
    if (*p <= 0x20 || *p >= 0x7f)
      return 0;
  return 1;
}

/* Reads the first line of path into the token, trailing whitespace removed. */
static int read_token_file(parse_state_t *ps, const char *path) {
  FILE *f = fopen(path, "r");
  if (!f)
    return fail(ps, "cannot read --token-file %s: %s", path, strerror(errno));
  char *tok = ps->a->token;
  size_t cap = sizeof ps->a->token;
  int rc = 0;
  if (!fgets(tok, (int)cap, f)) {
    tok[0] = '\0';
  } else if (strlen(tok) == cap - 1 && tok[cap - 2] != '\n') {
    rc = fail(ps, "--token-file %s: token longer than %zu bytes", path, cap - 2);
  }
  fclose(f);
  size_t n = strlen(tok);
  while (n > 0 && isspace((unsigned char)tok[n - 1]))
    tok[--n] = '\0';
  if (rc == 0 && n == 0)
    rc = fail(ps, "--token-file %s is empty", path);
  return rc;
}

static int set_server(parse_state_t *ps, const char *url) {
  if (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0)
    return fail(ps, "server URL must start with http:// or https:// (got '%s')", url);
  size_t n = strlen(url);
  while (n > 0 && url[n - 1] == '/')
    n--;
  if (n >= sizeof ps->a->server)
    return fail(ps, "server URL too long");
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)url[i] <= 0x20 || (unsigned char)url[i] >= 0x7f || url[i] == '?' ||
        url[i] == '#')
      return fail(ps, "server URL '%s' has a character it cannot have", url);
  memcpy(ps->a->server, url, n);
  ps->a->server[n] = '\0';
  return 0;
}

static const opt_def_t *find_opt(const char *name, size_t len) {
  for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
    if (strlen(opts[i].name) == len && strncmp(opts[i].name, name, len) == 0)
      return &opts[i];
  return NULL;
}

static int apply_opt(parse_state_t *ps, const opt_def_t *o, const char *value) {
  wg_ctl_args_t *a = ps->a;
  switch (o->id) {
  case OPT_SERVER: ps->server = value; return 0;
  case OPT_TOKEN: ps->token = value; return 0;
  case OPT_TOKEN_FILE: ps->token_file = value; return 0;
  case OPT_JSON: a->json = 1; return 0;
  case OPT_HELP: a->help = 1; return 0;
  case OPT_TIMEOUT:
    if (parse_timeout(value, &a->timeout_s) != 0)
      return fail(ps, "--timeout wants seconds > 0 (e.g. 2.5), not '%s'", value);
    return 0;
  case OPT_ITERATION:
    if (parse_u64(value, &a->iteration) != 0 || a->iteration > (1ull << 53))
      return fail(ps, "--iteration wants an integer >= 0, not '%s'", value);
    a->has_iteration = 1;
    break;
  case OPT_PURGE: a->purge = 1; break;
  case OPT_STATE:
    if (strcmp(value, "pending") && strcmp(value, "running") && strcmp(value, "succeeded") &&
        strcmp(value, "failed") && strcmp(value, "stopped"))
      return fail(ps, "--state wants pending, running, succeeded, failed or stopped, not '%s'",
                  value);
    a->state = value;
    break;
  case OPT_LIVE: a->live = 1; break;
  }
  ps->cmd_opt_seen = o;
  return 0;
}

/* Handles argv[*i], an option; consumes its value (maybe argv[*i + 1]). */
static int take_option(parse_state_t *ps, int argc, char **argv, int *i) {
  const char *arg = argv[*i];
  const char *eq = strchr(arg, '=');
  size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
  const opt_def_t *o = find_opt(arg, len);
  if (!o)
    return fail(ps, "unknown option '%.*s'", (int)len, arg);
  const char *value = NULL;
  if (o->takes_value) {
    if (eq) {
      value = eq + 1;
    } else if (*i + 1 < argc) {
      value = argv[++*i];
    } else {
      return fail(ps, "option %s needs a value", o->name);
    }
  } else if (eq) {
    return fail(ps, "option %s takes no value", o->name);
  }
  return apply_opt(ps, o, value);
}

static int want_positionals(parse_state_t *ps, int n, const char *what) {
  if (ps->npositional == n)
    return 0;
  return fail(ps, "%s: expected %s%s%s", wg_ctl_cmd_name(ps->a->cmd), what,
              ps->npositional > n ? ", got extra argument " : "",
              ps->npositional > n ? ps->positional[n] : "");
}

static int take_id(parse_state_t *ps, int idx) {
  const char *id = ps->positional[idx];
  if (!wagma_api_name_valid(id))
    return fail(ps,
                "'%s' is not a valid job id (1-63 of [A-Za-z0-9._-], not starting with "
                "'.' or '-')",
                id);
  ps->a->id = id;
  return 0;
}

/* Checks the positionals of the command and stores them. */
static int finish_command(parse_state_t *ps) {
  wg_ctl_args_t *a = ps->a;
  if (ps->cmd_opt_seen && ps->cmd_opt_seen->only != a->cmd)
    return fail(ps, "option %s belongs to '%s'", ps->cmd_opt_seen->name,
                wg_ctl_cmd_name(ps->cmd_opt_seen->only));
  if (a->help)
    return 0; /* "wagmactl scale --help": positionals do not matter */
  switch (a->cmd) {
  case WG_CTL_CMD_NONE: return 0;
  case WG_CTL_CMD_HELP:
    if (ps->npositional > 1)
      return fail(ps, "help: expected at most one command name");
    if (ps->npositional == 1) {
      a->help_topic = wg_ctl_cmd_from_name(ps->positional[0]);
      if (a->help_topic == WG_CTL_CMD_NONE)
        return fail(ps, "help: unknown command '%s'", ps->positional[0]);
    }
    return 0;
  case WG_CTL_CMD_SUBMIT:
    if (want_positionals(ps, 1, "a spec file (FILE.json or - for stdin)") != 0)
      return -1;
    a->file = ps->positional[0];
    return 0;
  case WG_CTL_CMD_LIST:
  case WG_CTL_CMD_AGENTS:
  case WG_CTL_CMD_HEALTH: return want_positionals(ps, 0, "no arguments");
  case WG_CTL_CMD_GET:
  case WG_CTL_CMD_GROUPS:
  case WG_CTL_CMD_STOP:
  case WG_CTL_CMD_PLAN:
  case WG_CTL_CMD_WATCH:
    if (want_positionals(ps, 1, "a job id") != 0)
      return -1;
    return take_id(ps, 0);
  case WG_CTL_CMD_SCALE: {
    if (want_positionals(ps, 2, "a job id and a number of workers") != 0 || take_id(ps, 0) != 0)
      return -1;
    uint64_t n = 0;
    if (parse_u64(ps->positional[1], &n) != 0 || n < 1 || n > WAGMA_API_MAX_WORKERS)
      return fail(ps, "scale: workers must be an integer in 1..%d, not '%s'", WAGMA_API_MAX_WORKERS,
                  ps->positional[1]);
    a->workers = (int)n;
    return 0;
  }
  case WG_CTL_CMD_COUNT: break;
  }
  return fail(ps, "internal: unknown command");
}

static int resolve_connection(parse_state_t *ps, const char *env_server, const char *env_token) {
  const char *server = ps->server                    ? ps->server
                       : (env_server && *env_server) ? env_server
                                                     : WG_CTL_DEFAULT_SERVER;
  if (set_server(ps, server) != 0)
    return -1;
  wg_ctl_args_t *a = ps->a;
  if (ps->token) {
    if (strlen(ps->token) >= sizeof a->token)
      return fail(ps, "--token is too long");
    strcpy(a->token, ps->token);
  } else if (ps->token_file) {
    if (read_token_file(ps, ps->token_file) != 0)
      return -1;
  } else if (env_token && *env_token) {
    if (strlen(env_token) >= sizeof a->token)
      return fail(ps, "$WAGMA_TOKEN is too long");
    strcpy(a->token, env_token);
  }
  if (!token_valid(a->token))
    return fail(ps, "the token has spaces or control characters");
  return 0;
}

int wg_ctl_args_parse(int argc, char **argv, const char *env_server, const char *env_token,
                      wg_ctl_args_t *a, char *err, size_t errlen) {
  memset(a, 0, sizeof *a);
  a->timeout_s = WG_CTL_DEFAULT_TIMEOUT_S;
  parse_state_t ps = {.a = a, .err = err, .errlen = errlen};
  if (errlen > 0)
    err[0] = '\0';
  int options_done = 0;
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (!options_done && strcmp(arg, "--") == 0) {
      options_done = 1;
    } else if (!options_done && arg[0] == '-' && arg[1] != '\0') {
      if (take_option(&ps, argc, argv, &i) != 0)
        return -1;
    } else if (a->cmd == WG_CTL_CMD_NONE) {
      a->cmd = wg_ctl_cmd_from_name(arg);
      if (a->cmd == WG_CTL_CMD_NONE)
        return fail(&ps, "unknown command '%s' (see wagmactl --help)", arg);
    } else if (ps.npositional < MAX_POSITIONALS) {
      ps.positional[ps.npositional++] = arg;
    } else {
      return fail(&ps, "too many arguments");
    }
  }
  if (finish_command(&ps) != 0)
    return -1;
  return resolve_connection(&ps, env_server, env_token);
}
