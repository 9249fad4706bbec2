/* world.h — test harness: P real processes on 127.0.0.1, one per rank, forked by the test.
 * Results come back through MAP_SHARED memory and exit codes; every child is reaped, and
 * killed (SIGKILL, by pid) when the hard timeout passes. */
#ifndef WAGMA_TEST_WORLD_H
#define WAGMA_TEST_WORLD_H

#include <stddef.h>
#include <stdint.h>

#include "transport.h"

typedef struct world {
  int nranks;
  uint64_t epoch;
  wagma_plan_t plan; /* nranks and members[].address filled by hand */
  void *shared;      /* MAP_SHARED, zeroed, shared_len bytes */
  size_t shared_len;
} world_t;

/* Picks nranks free loopback ports. Returns 0 or -1. */
int world_init(world_t *w, int nranks, size_t shared_len);
void world_free(world_t *w);

/* A child's body: returns its exit code (0 = success). Runs in the forked child only. */
typedef int (*world_fn)(world_t *w, int rank, void *arg);

#define WORLD_SPAWN 1     /* fork this rank */
#define WORLD_KILL_LAST 2 /* SIGKILL it once every other child has exited (e.g. frozen) */

/* Forks the ranks whose mode (NULL = all WORLD_SPAWN) has WORLD_SPAWN, waits for them all
 * until timeout_s. codes[r] = exit code, or -signal, or -1000 if never spawned. Returns 0, or
 * -1 if the timeout passed (everything is killed and reaped then). If parent_fn is not NULL
 * it runs in the parent right after the fork (e.g. to play a fake rank) and its return value
 * is stored in *parent_rc. */
int world_run(world_t *w, world_fn fn, void *arg, double timeout_s, const int *mode, int *codes,
              int (*parent_fn)(world_t *w, void *arg), int *parent_rc);

/* Child helpers. */
int world_open(world_t *w, int rank, size_t max_payload, double connect_timeout_s,
               wg_transport_t **t);
void world_log(void *user, int level, const char *msg); /* stderr, WARN and up */
int world_count_fds(void);
int world_count_threads(void);

#endif
