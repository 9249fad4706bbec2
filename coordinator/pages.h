/* coordinator/pages.h — the pages of GET /v1/jobs: ids after a position, the continue token
 * (pages.c, pure). */
#ifndef WAGMA_COORD_PAGES_H
#define WAGMA_COORD_PAGES_H

#include <stddef.h>

#include "wagma/api.h"

#define WG_LIST_LIMIT_DEFAULT 100 /* jobs per page without ?limit */
#define WG_LIST_LIMIT_MAX 500     /* the largest ?limit */
#define WG_LIST_PROBE_KEYS 2048   /* keys per keys-only read of the walk */
#define WG_LIST_ROUND_TRIPS 48    /* etcd round trips of the walk per request */
#define WG_LIST_PROGRESS_MAX 256  /* progress records read per listed job (see docs/api.md) */
#define WG_LIST_TOKEN_MAX 128     /* bytes of a continue token, NUL included */
#define WG_WALK_START (-2)        /* wg_walk_pos_t.level: no position yet */

/* Relative keys (after <prefix>/jobs/), sorted; more = 1 when the read was cut by its limit. */
typedef struct wg_keylist {
  char **keys;
  size_t n;
  int more;
} wg_keylist_t;

typedef struct wg_walk_io {
  /* keys-only read of the first limit keys under <jobs prefix>prefix */
  int (*keys)(void *user, const char *prefix, size_t limit, wg_keylist_t *out);
  /* exists[i] = 1 when some key starts with <jobs prefix>prefixes[i]; one round trip */
  int (*exists)(void *user, const char *const *prefixes, size_t n, int *exists);
  void (*free_keys)(void *user, wg_keylist_t *kl);
  void *user;
} wg_walk_io_t;

/* A position in the job ids: after last, going on at level (WG_WALK_START: before all). */
typedef struct wg_walk_pos {
  char last[WAGMA_API_NAME_MAX];
  int level;
} wg_walk_pos_t;

/* Compares job ids in key order ("a/" against "b/" bytewise). */
int wg_job_key_cmp(const char *a, const char *b);
/* Puts up to want ids after *pos into ids (n of them, in key order) with at most
 * *round_trips etcd calls through io (counted down), and moves *pos past them. *done = 1 when no id
 * is left after *pos. Returns 0 or the first error of io (then *n ids were still found). */
int wg_jobs_walk(const wg_walk_io_t *io, wg_walk_pos_t *pos, size_t want, int *round_trips,
                 size_t probe_keys, char (*ids)[WAGMA_API_NAME_MAX], size_t *n, int *done);
/* The opaque continue token of a position (base64url), and back: -1 when token is not one
 * this server wrote (any other string, a position that cannot be). */
int wg_list_token_encode(const wg_walk_pos_t *pos, char *out, size_t len);
int wg_list_token_decode(const char *token, wg_walk_pos_t *pos);

#endif
