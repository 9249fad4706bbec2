/* main.c — wagmactl's entry point: parse, print help or run the command, exit with the
 * documented code (ctl.h, wagmactl --help). */
#include <stdlib.h>

#include "ctl.h"

int main(int argc, char **argv) {
  wg_ctl_args_t args;
  char err[512];
  if (wg_ctl_args_parse(argc, argv, getenv("WAGMA_SERVER"), getenv("WAGMA_TOKEN"), &args, err,
                        sizeof err) != 0) {
    fprintf(stderr, "wagmactl: %s\n", err);
    return WG_CTL_EXIT_USAGE;
  }
  if (args.cmd == WG_CTL_CMD_HELP) {
    wg_ctl_command_help(args.help_topic, stdout);
    return WG_CTL_EXIT_OK;
  }
  if (args.help) {
    wg_ctl_command_help(args.cmd, stdout); /* NONE: the whole usage */
    return WG_CTL_EXIT_OK;
  }
  if (args.cmd == WG_CTL_CMD_NONE) {
    wg_ctl_usage(stderr);
    return WG_CTL_EXIT_USAGE;
  }
  if (wg_ctl_http_global_init() != 0) {
    fprintf(stderr, "wagmactl: cannot initialise libcurl\n");
    return WG_CTL_EXIT_UNREACHABLE;
  }
  int code = wg_ctl_run(&args, stdout, stderr);
  wg_ctl_http_global_cleanup();
  if (fflush(stdout) != 0 && code == WG_CTL_EXIT_OK)
    code = WG_CTL_EXIT_SERVER;
  return code;
}
