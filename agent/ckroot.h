/* agent/ckroot.h — the checkpoint root (ckroot.c): every checkpoint file the agent or its
 * built-in trainer (wagma-train, trainer/) writes or reads lies under it; paths from etcd are
 * relative to it and never leave it. Shared by wagma-agent and wagma-train (wagma_ckroot). */
#ifndef WAGMA_AGENT_CKROOT_H
#define WAGMA_AGENT_CKROOT_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

struct wagma_model;
struct wagma_optim;

typedef struct wg_ckroot {
  int fd;              /* the root directory, held open for the process's life; -1 = none */
  char path[PATH_MAX]; /* its real path (for messages) */
} wg_ckroot_t;

/* Resolves dir ("" = the current directory) with realpath and opens it. 0, or WAGMA_EINVAL with
 * err saying why (missing, not a directory, unreadable). */
int wg_ckroot_open(const char *dir, wg_ckroot_t *root, char *err, size_t err_len);
void wg_ckroot_close(wg_ckroot_t *root);
/* NULL when rel is a path the root takes (relative; no empty, "." or ".." component; no
 * control character; components <= NAME_MAX), else why not. */
const char *wg_ckroot_path_problem(const char *rel);
/* Opens the directory rel below the root ("" or NULL = the root) one component at a time with
 * O_NOFOLLOW, creating missing components (0755) when create. Returns the directory's fd (the
 * caller closes it) or a negative status with err: WAGMA_EPERM for a refused path or a symbolic
 * link on the way, WAGMA_ENOTFOUND for a missing component, WAGMA_EIO otherwise. Thread-safe. */
int wg_ckroot_opendir(const wg_ckroot_t *root, const char *rel, int create, char *err,
                      size_t err_len);
/* A checkpoint saved as <root>/<rel_dir>/<name> (directories created, no link followed) and
 * loaded from <root>/<rel_file>; 0 or a status with err naming the file. A rel_file the root
 * does not take (absolute, "..", ...) or a link on the way is WAGMA_EPERM. */
int wg_ckroot_save(const wg_ckroot_t *root, const char *rel_dir, const char *name,
                   struct wagma_model *m, struct wagma_optim *o, uint64_t iteration, char *err,
                   size_t err_len);
int wg_ckroot_load(const wg_ckroot_t *root, const char *rel_file, struct wagma_model *m,
                   struct wagma_optim *o, uint64_t *iteration, char *err, size_t err_len);

#endif
