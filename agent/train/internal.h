/* agent/train/internal.h — helpers shared by the wagma_train sources (not for the agent). */
#ifndef WAGMA_AGENT_TRAIN_INTERNAL_H
#define WAGMA_AGENT_TRAIN_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

/* Writes a formatted detail message into err[0..err_len) when err is not NULL. */
void wg_train_errf(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* FNV-1a 64 over len bytes, continuing from h (start with WG_FNV_OFFSET). */
#define WG_FNV_OFFSET 0xcbf29ce484222325ull
uint64_t wg_fnv1a(uint64_t h, const void *data, size_t len);

#endif
