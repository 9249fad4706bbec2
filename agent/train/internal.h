/* agent/train/internal.h — helpers shared by the wagma_train sources (not for the agent). */
#ifndef WAGMA_AGENT_TRAIN_INTERNAL_H
#define WAGMA_AGENT_TRAIN_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "wagma/log_internal.h" /* wg_errf: detail messages into the caller's err buffer */

/* FNV-1a 64 over len bytes, continuing from h (start with WG_FNV_OFFSET). */
#define WG_FNV_OFFSET 0xcbf29ce484222325ull
uint64_t wg_fnv1a(uint64_t h, const void *data, size_t len);

#endif
