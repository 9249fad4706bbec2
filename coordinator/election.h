/* coordinator/election.h — leader election on <prefix>/coordinator/leader, a leased key
 * (election.c: one campaign thread). */
#ifndef WAGMA_COORD_ELECTION_H
#define WAGMA_COORD_ELECTION_H

#include <stdint.h>

#include "wagma/api.h"
#include "wagma/etcd.h"
#include "wagma/status.h"

typedef struct wg_election wg_election_t;
/* Starts the campaign thread. Ownership: *out is the caller's (wg_election_stop). */
int wg_election_start(wagma_etcd_t *etcd, const wagma_keys_t *keys, const char *id,
                      const char *address, int ttl_s, wagma_log_fn log, void *log_user,
                      wg_election_t **out);
/* Resigns (revokes the lease), stops the thread, frees. NULL is a no-op. */
void wg_election_stop(wg_election_t *e);
/* 1 while we lead; *lease (may be NULL) = the lease our leader key is attached to. */
int wg_election_is_leader(wg_election_t *e, int64_t *lease);

#endif
