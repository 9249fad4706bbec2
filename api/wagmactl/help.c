/* help.c — the usage text of wagmactl and the help of each command. Static text only;
 * docs/wagmactl.md says the same in more words. */
#include "ctl.h"

static const char usage_text[] =
    "usage: wagmactl [GLOBAL OPTIONS] COMMAND [ARGS]\n"
    "\n"
    "The command-line client of the wagma coordinator's REST API.\n"
    "\n"
    "Commands:\n"
    "  submit FILE.json|-        submit a job spec (from a file or stdin)\n"
    "  list [--state S]          list jobs\n"
    "  get ID                    one job: status and per-member progress\n"
    "  groups ID [--iteration T] the averaging groups of a round\n"
    "  scale ID N                set the job's target number of workers\n"
    "  stop ID [--purge]         stop a job (--purge: delete a finished job's records)\n"
    "  agents                    registered agents and their jobs\n"
    "  plan ID                   the job's current averaging plan\n"
    "  health [--live]           is the coordinator ready (etcd answers)? --live: alive?\n"
    "  watch ID                  follow a job live until it ends (--json: its events)\n"
    "  help [COMMAND]            this text, or one command's help (also COMMAND --help)\n"
    "\n"
    "Global options (before or after the command):\n"
    "  --server URL       coordinator URL (env WAGMA_SERVER, default " WG_CTL_DEFAULT_SERVER ")\n"
    "  --token T          bearer token (submit, scale, stop, watch; env WAGMA_TOKEN)\n"
    "  --token-file F     read the token from the first line of F\n"
    "  --json             print the server's JSON answer unchanged (for scripts)\n"
    "  --timeout S        seconds for the whole request, connect included (default 10)\n"
    "  -h, --help         help\n"
    "\n"
    "Exit codes:\n"
    "  0  success\n"
    "  1  the server answered with an error (code, message and field go to stderr)\n"
    "  2  usage error: bad arguments, unreadable spec file, invalid job id\n"
    "  3  cannot reach the server: connection refused, timeout, transport error\n"
    "  4  not found (HTTP 404): no such job, or the job has no plan yet\n"
    "  5  watch: the job ended failed or stopped\n";

void wg_ctl_usage(FILE *out) {
  fputs(usage_text, out);
}

typedef struct cmd_help {
  const char *synopsis;
  const char *text;
} cmd_help_t;

static const cmd_help_t helps[WG_CTL_CMD_COUNT] = {
    [WG_CTL_CMD_HELP] = {"help [COMMAND]", "Prints the usage, or the help of COMMAND.\n"},
    [WG_CTL_CMD_SUBMIT] = {"submit FILE.json|-",
                           "POST /v1/jobs. Sends the job spec in FILE (or stdin for '-') as it\n"
                           "is; the server validates it and names a wrong field. Prints the\n"
                           "created job. Needs the token when the coordinator has one.\n"},
    [WG_CTL_CMD_LIST] = {"list [--state pending|running|succeeded|failed|stopped]",
                         "GET /v1/jobs, page after page (following the server's continue\n"
                         "tokens, within one --timeout). One row per job: ID STATE WORKERS\n"
                         "(members/target) EPOCH ITERATION ALGORITHM MODEL REASON. With\n"
                         "--json: {\"jobs\":[...]} with the jobs of every page.\n"},
    [WG_CTL_CMD_GET] = {"get ID",
                        "GET /v1/jobs/ID. The job's spec and status, then one row per member\n"
                        "of the current plan: RANK NAME ADDRESS [ALIVE] STATE ITERATION LOSS\n"
                        "ACCURACY STEP_TIME STALENESS ROLE (ALIVE when the server reports it).\n"
                        "Exit 4 when there is no such job.\n"},
    [WG_CTL_CMD_GROUPS] = {"groups ID [--iteration T]",
                           "GET /v1/jobs/ID/groups. The groups of round T (default: the\n"
                           "current round), one line per group with its ranks and members.\n"},
    [WG_CTL_CMD_SCALE] = {"scale ID N",
                          "PATCH /v1/jobs/ID {\"workers\": N}. Live scaling within the job's\n"
                          "min_workers..max_workers. Needs the token when one is configured.\n"},
    [WG_CTL_CMD_STOP] = {"stop ID [--purge]",
                         "DELETE /v1/jobs/ID. Stops a pending or running job. With --purge,\n"
                         "removes every record of a finished job instead.\n"},
    [WG_CTL_CMD_AGENTS] = {"agents", "GET /v1/agents. One row per live agent: NAME ADDRESS DEVICE\n"
                                     "CAPACITY VERSION JOB STARTED HEALTHY (yes, or no: and the\n"
                                     "reason of its quarantine).\n"},
    [WG_CTL_CMD_PLAN] = {"plan ID",
                         "GET /v1/jobs/ID/plan. The plan's parameters, its members and each\n"
                         "phase's groups (by rank). Exit 4 when the job has no plan yet.\n"},
    [WG_CTL_CMD_WATCH] = {"watch ID",
                          "GET /v1/jobs/ID/events as a stream (server-sent events). Prints the\n"
                          "job's progress (a bar to its iterations), its members and their lag,\n"
                          "the groups of the current round and each epoch change with who left\n"
                          "or joined and why, as they happen; reconnects when the stream breaks\n"
                          "(a coordinator failover). Ends with the job: exit 0 when it\n"
                          "succeeded, 5 when it failed or was stopped. --json: one line per\n"
                          "event, {\"event\":NAME,\"data\":{...}}. --timeout bounds each\n"
                          "connection attempt and the time spent failing to reconnect. Needs\n"
                          "the token when the coordinator has one.\n"},
    [WG_CTL_CMD_HEALTH] = {"health [--live]",
                           "GET /readyz: exit 0 when the coordinator is ready (etcd answers),\n"
                           "1 when it is not. --live: GET /healthz (the process only).\n"},
};

void wg_ctl_command_help(wg_ctl_cmd_t cmd, FILE *out) {
  if (cmd <= WG_CTL_CMD_NONE || cmd >= WG_CTL_CMD_COUNT || !helps[cmd].synopsis) {
    wg_ctl_usage(out);
    return;
  }
  fprintf(out, "usage: wagmactl [GLOBAL OPTIONS] %s\n\n%s\n", helps[cmd].synopsis, helps[cmd].text);
  fputs("Global options: --server URL, --token T, --token-file F, --json, --timeout S\n"
        "(see wagmactl --help, which also lists the exit codes).\n",
        out);
}
