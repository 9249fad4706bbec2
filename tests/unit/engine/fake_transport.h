/* fake_transport.h — an in-process transport for the engine's unit tests: P endpoints in one
 * process (threads as ranks) sharing in-memory mailboxes. Implements wg_transport_ops_t with
 * the same contracts as tcp.c; a test can kill a rank (peer_alive -> 0, its frames vanish)
 * or freeze it (its recv delivers nothing until thawed, like SIGSTOP of its threads). */
#ifndef WAGMA_TEST_FAKE_TRANSPORT_H
#define WAGMA_TEST_FAKE_TRANSPORT_H

#include "transport.h"

extern const wg_transport_ops_t fake_transport;

/* Creates the world of nranks endpoints that fake_transport.open attaches to (by rank). */
void fake_world_init(int nranks);
/* Frees what is left (messages never taken). Call after every endpoint closed. */
void fake_world_free(void);
void fake_kill(int rank);
/* Called under the world lock for every frame delivered (header completed), so a test can
 * watch the wire: CONTRIB payloads, EXCLUDED answers. NULL removes the tap. */
typedef void (*fake_tap_fn)(int dst, const wg_frame_header_t *header, const void *payload,
                            size_t length, void *user);
void fake_set_tap(fake_tap_fn fn, void *user);
/* A plan of P ranks, group size S, staleness bound tau and global mode, epoch start_round 0
 * epoch 1, members "r<i>" at "fake:<i>". Returns wagma_plan_build's status. */
int fake_plan(int P, int S, int tau, wagma_global_sync_t mode, wagma_plan_t *plan);
void fake_freeze(int rank, int frozen);

#endif
