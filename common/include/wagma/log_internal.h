/* wagma/log_internal.h — formatting helpers: log lines for libraries that hold a wagma_log_fn,
 * and detail messages into a caller's error buffer.
 * Internal to wagma's libraries (wg_ prefix); not part of any public API. */
#ifndef WAGMA_LOG_INTERNAL_H
#define WAGMA_LOG_INTERNAL_H

#include <stddef.h>

#include "wagma/status.h"

/* Formats and forwards to fn; does nothing when fn is NULL. Thread-safe. */
void wg_logf(wagma_log_fn fn, void *user, int level, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Formats into err (err_len bytes, truncated); does nothing when err is NULL or err_len 0. */
void wg_errf(char *err, size_t err_len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
