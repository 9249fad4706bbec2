/* status.c — the one table of status strings and the formatting helpers of
 * wagma/log_internal.h.
 * No state, no threads: safe from any thread. */
#include <stdarg.h>
#include <stdio.h>

#include "wagma/log_internal.h"
#include "wagma/status.h"

static const char *const status_text[] = {
    [0] = "ok",
    [1] = "invalid argument or input",
    [2] = "out of memory",
    [3] = "I/O error",
    [4] = "deadline exceeded",
    [5] = "protocol error (corrupt, short or oversized message)",
    [6] = "wrong epoch",
    [7] = "closed",
    [8] = "peer failed or left",
    [9] = "not found",
    [10] = "already exists",
    [11] = "conflict (compare failed)",
    [12] = "service unavailable",
    [13] = "revision compacted",
    [14] = "permission denied",
    [15] = "out of range",
    [16] = "not supported in this build",
    [17] = "canceled",
    [18] = "busy",
    [19] = "internal error",
};

const char *wagma_strerror(int status) {
  int index = -status;
  if (index < 0 || index >= (int)(sizeof status_text / sizeof status_text[0]) ||
      status_text[index] == NULL)
    return "unknown status";
  return status_text[index];
}

const char *wagma_log_level_name(int level) {
  switch (level) {
  case WAGMA_LOG_DEBUG: return "debug";
  case WAGMA_LOG_INFO: return "info";
  case WAGMA_LOG_WARN: return "warn";
  case WAGMA_LOG_ERROR: return "error";
  default: return "log";
  }
}

void wg_logf(wagma_log_fn fn, void *user, int level, const char *fmt, ...) {
  char message[1024];
  va_list args;
  if (fn == NULL)
    return;
  va_start(args, fmt);
  vsnprintf(message, sizeof message, fmt, args);
  va_end(args);
  fn(user, level, message);
}

void wg_errf(char *err, size_t err_len, const char *fmt, ...) {
  va_list args;
  if (!err || err_len == 0)
    return;
  va_start(args, fmt);
  vsnprintf(err, err_len, fmt, args);
  va_end(args);
}
