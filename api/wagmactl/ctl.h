/* api/wagmactl/ctl.h — private header of wagmactl, the command-line client of the REST API
 * (api/openapi.yaml). The parts, each testable without a server:
 *
 *   args.c     argv + environment -> wg_ctl_args_t (pure except reading --token-file)
 *   help.c     the usage text and the per-command help
 *   http.c     one HTTP request through libcurl, with a deadline; failures classified
 *   table.c    aligned text tables and cell formatting (numbers, times, null)
 *   render.c   server JSON -> tables (jobs, job, groups, plan, agents, health)
 *   commands.c command -> request -> output and exit code
 *   watch.c    watch: the job's event stream (server-sent events) followed to its end
 *   main.c     wires them together
 *
 * Exit codes (stable; documented in --help and docs/wagmactl.md): */
#ifndef WAGMACTL_CTL_H
#define WAGMACTL_CTL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#define WG_CTL_EXIT_OK 0          /* success */
#define WG_CTL_EXIT_SERVER 1      /* the server answered with an error (or nonsense) */
#define WG_CTL_EXIT_USAGE 2       /* bad command line, unreadable file, invalid id */
#define WG_CTL_EXIT_UNREACHABLE 3 /* cannot connect, timeout, transport failure */
#define WG_CTL_EXIT_NOT_FOUND 4   /* 404: no such job (or no plan yet) */
#define WG_CTL_EXIT_JOB_FAILED 5  /* watch: the job ended failed or stopped */

#define WG_CTL_DEFAULT_SERVER "http://127.0.0.1:8080"
#define WG_CTL_DEFAULT_TIMEOUT_S 10.0
#define WG_CTL_LIST_PAGE 500 /* list asks for pages of this many jobs (the server's maximum) */
#define WG_CTL_SERVER_MAX 512
#define WG_CTL_TOKEN_MAX 4096

/* ---- command line ------------------------------------------------------------------------ */

typedef enum wg_ctl_cmd {
  WG_CTL_CMD_NONE = 0,
  WG_CTL_CMD_HELP,
  WG_CTL_CMD_SUBMIT,
  WG_CTL_CMD_LIST,
  WG_CTL_CMD_GET,
  WG_CTL_CMD_GROUPS,
  WG_CTL_CMD_SCALE,
  WG_CTL_CMD_STOP,
  WG_CTL_CMD_AGENTS,
  WG_CTL_CMD_PLAN,
  WG_CTL_CMD_HEALTH,
  WG_CTL_CMD_WATCH,
  WG_CTL_CMD_COUNT
} wg_ctl_cmd_t;

typedef struct wg_ctl_args {
  /* global options */
  char server[WG_CTL_SERVER_MAX]; /* no trailing '/' */
  char token[WG_CTL_TOKEN_MAX];   /* "" = none */
  int json;                       /* print the server's JSON unchanged */
  double timeout_s;               /* whole-request deadline, > 0 */
  /* the command */
  wg_ctl_cmd_t cmd;
  int help;                /* --help given (for cmd, or global when cmd is NONE) */
  wg_ctl_cmd_t help_topic; /* "help <command>" */
  const char *id;          /* job id (get, groups, scale, stop, plan); points into argv */
  const char *file;        /* submit: path or "-" */
  int has_iteration;       /* groups --iteration */
  uint64_t iteration;
  int workers;       /* scale */
  int purge;         /* stop --purge */
  const char *state; /* list --state */
  int live;          /* health --live: /healthz instead of /readyz */
} wg_ctl_args_t;

/* Parses argv. env_server / env_token: $WAGMA_SERVER / $WAGMA_TOKEN (NULL when unset).
 * Token precedence: --token, then --token-file (first line, trailing whitespace removed),
 * then env_token. Global options may appear before or after the command.
 * Returns 0, or -1 with a one-line message in err (a usage error, exit 2). The string
 * fields of *a point into argv. */
int wg_ctl_args_parse(int argc, char **argv, const char *env_server, const char *env_token,
                      wg_ctl_args_t *a, char *err, size_t errlen);

const char *wg_ctl_cmd_name(wg_ctl_cmd_t cmd);
wg_ctl_cmd_t wg_ctl_cmd_from_name(const char *name);

/* help.c: the whole usage text, or one command's. */
void wg_ctl_usage(FILE *out);
void wg_ctl_command_help(wg_ctl_cmd_t cmd, FILE *out);

/* ---- HTTP -------------------------------------------------------------------------------- */

typedef struct wg_ctl_conn {
  const char *server; /* "http://host:port" without trailing '/' */
  const char *token;  /* NULL or "" = no Authorization header */
  double timeout_s;
} wg_ctl_conn_t;

typedef struct wg_ctl_response {
  long status; /* HTTP status; 0 when the request failed before an answer */
  char *body;  /* NUL-terminated, malloc'd (may be empty), owned here */
  size_t len;
  int timed_out;   /* with status 0: the deadline passed */
  char error[256]; /* with status 0: why (libcurl's words) */
} wg_ctl_response_t;

/* The largest response body kept (larger answers fail as a transport error). */
#define WG_CTL_MAX_RESPONSE (64u << 20)

/* curl_global_init / cleanup; call once from main. */
int wg_ctl_http_global_init(void);
void wg_ctl_http_global_cleanup(void);

/* Sends method path (path starts with '/', may have a query) with an optional JSON body.
 * Returns 0 when the server answered (any status; res->status > 0) and -1 when it did not
 * (res->status == 0, res->error says why). Either way the caller frees with
 * wg_ctl_response_free. */
int wg_ctl_http_request(const wg_ctl_conn_t *conn, const char *method, const char *path,
                        const char *body, size_t body_len, wg_ctl_response_t *res);
void wg_ctl_response_free(wg_ctl_response_t *res);

/* ---- tables ------------------------------------------------------------------------------ */

typedef struct wg_ctl_table wg_ctl_table_t;

/* A table of ncols columns with these headers (copied). NULL on out of memory. */
wg_ctl_table_t *wg_ctl_table_new(int ncols, const char *const *headers);
/* Appends a row of ncols cells (copied; NULL cells print as "-"). 0 or -1. */
int wg_ctl_table_add(wg_ctl_table_t *t, const char *const *cells);
int wg_ctl_table_rows(const wg_ctl_table_t *t);
/* Prints headers and rows, columns separated by two spaces, left-aligned, padded to the
 * widest cell (in characters, UTF-8 aware), no trailing spaces. */
void wg_ctl_table_print(const wg_ctl_table_t *t, FILE *out);
void wg_ctl_table_free(wg_ctl_table_t *t);

/* Cell formatting into buf (always NUL-terminated); "-" when v is absent or null. */
const char *wg_ctl_fmt_int(const json_t *v, char *buf, size_t len);
const char *wg_ctl_fmt_real(const json_t *v, int decimals, char *buf, size_t len);
const char *wg_ctl_fmt_percent(const json_t *v, char *buf, size_t len);  /* 0.5 -> "50.00%" */
const char *wg_ctl_fmt_duration(const json_t *v, char *buf, size_t len); /* s -> "12.3ms" */
const char *wg_ctl_fmt_time(const json_t *v, char *buf, size_t len);     /* unix s -> ISO UTC */
const char *wg_ctl_fmt_bool(const json_t *v, char *buf, size_t len);     /* "yes"/"no" */
/* Strings as they are; numbers and booleans as above; null/absent "-". */
const char *wg_ctl_fmt_str(const json_t *v, char *buf, size_t len);

/* ---- rendering of server answers ----------------------------------------------------------- */

/* Each prints a readable view of one response body (already parsed) to out. Missing fields
 * print as "-". Returns 0, or -1 when the body does not have the documented shape. */
int wg_ctl_render_jobs(const json_t *root, FILE *out);   /* GET /v1/jobs */
int wg_ctl_render_job(const json_t *root, FILE *out);    /* a Job */
int wg_ctl_render_groups(const json_t *root, FILE *out); /* GET .../groups */
int wg_ctl_render_plan(const json_t *root, FILE *out);   /* GET .../plan */
int wg_ctl_render_agents(const json_t *root, FILE *out); /* GET /v1/agents */
int wg_ctl_render_health(const json_t *root, FILE *out); /* /healthz or /readyz */

/* Prints the server's error body as "wagmactl: <status> <code>: <message> (field: <f>)"
 * (or the status and the first line of a non-JSON body) to err. */
void wg_ctl_print_error(long status, const char *body, size_t len, FILE *err);

/* The exit code for an HTTP status (2xx -> 0, 404 -> 4, other -> 1). */
int wg_ctl_exit_for_status(long status);

/* ---- watch (watch.c) ------------------------------------------------------------------------ */

/* An incremental text/event-stream parser: feed it bytes as they come; on_event(user, name,
 * data) is called for each complete event (name "message" when the stream gave none; data
 * lines joined with "\n"); comments and id/retry fields are skipped. Lines longer than
 * WG_CTL_SSE_MAX are an error (-1 from wg_ctl_sse_feed). */
#define WG_CTL_SSE_MAX (64u << 20)
typedef struct wg_ctl_sse {
  char *line; /* the line being read */
  size_t len, cap;
  int cr; /* the last byte was a CR (a following LF ends nothing) */
  char name[64];
  char *data; /* the event's data so far */
  size_t dlen, dcap;
  int has_data;
  void (*on_event)(void *user, const char *name, const char *data);
  void *user;
} wg_ctl_sse_t;
void wg_ctl_sse_init(wg_ctl_sse_t *p, void (*on_event)(void *, const char *, const char *),
                     void *user);
int wg_ctl_sse_feed(wg_ctl_sse_t *p, const char *bytes, size_t n);
void wg_ctl_sse_free(wg_ctl_sse_t *p);

/* watch ID: follows GET /v1/jobs/ID/events as a stream (reconnecting when it breaks, for up to
 * --timeout of failed attempts in a row) until the job is finished: 0 succeeded, 5 failed or
 * stopped, 4 no such job, 3 unreachable, 1 other errors. Output: progress, members and their
 * lag, the groups of the round, epoch changes as they come; --json: one event per line. */
int wg_ctl_watch(const wg_ctl_args_t *a, FILE *out, FILE *err);

/* ---- commands ---------------------------------------------------------------------------- */

/* Runs the parsed command against the server; output to out, diagnostics to err.
 * Returns the exit code. */
int wg_ctl_run(const wg_ctl_args_t *a, FILE *out, FILE *err);

#endif
