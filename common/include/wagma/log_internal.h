/* wagma/log_internal.h — formatting helper for libraries that hold a wagma_log_fn.
 * Internal to wagma's libraries (wg_ prefix); not part of any public API. */
#ifndef WAGMA_LOG_INTERNAL_H
#define WAGMA_LOG_INTERNAL_H

#include "wagma/status.h"

/* Formats and forwards to fn; does nothing when fn is NULL. Thread-safe. */
void wg_logf(wagma_log_fn fn, void *user, int level, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
