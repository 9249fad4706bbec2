/* world.h — test harness: P real processes on 127.0.0.1, one per rank, forked by the test,
 * sharing a random data-plane secret. Results come back through MAP_SHARED memory and exit
 * codes; every child is reaped, and killed (SIGKILL, by pid) when the hard timeout passes.
 * Raw-socket helpers let a test play a member or an impostor by hand. */
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
  uint8_t secret[32]; /* the epoch's data-plane secret, random per world */
  size_t secret_len;  /* 32; set it to 0 for an unauthenticated world */
  int seal;           /* world_open seals frames (data-plane encryption); 0 by default */
} world_t;

/* Picks nranks free loopback ports and a random secret. Returns 0 or -1. */
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

/* Child helpers. world_open opens rank's transport with the world's secret; world_open_as
 * with the plan and secret given (secret NULL/0: unauthenticated), e.g. for an impostor. */
int world_open(world_t *w, int rank, size_t max_payload, double connect_timeout_s,
               wg_transport_t **t);
int world_open_as(const wagma_plan_t *plan, uint64_t epoch, int rank, const uint8_t *secret,
                  size_t secret_len, double connect_timeout_s, wg_transport_t **t);
void world_log(void *user, int level, const char *msg); /* stderr, WARN and up */
int world_count_fds(void);
int world_count_threads(void);

/* Raw peers (a test playing a member or an impostor over a plain blocking socket). */
/* Connects to "host:port", retrying until deadline; 10 s receive timeout. fd or -1. */
int world_raw_connect(const char *address, double deadline);
int world_raw_write(int fd, const void *p, size_t n); /* 0 when all n bytes went out */
/* Waits until the other side closes fd (it dropped us). 0 if it did within 10 s. */
int world_raw_wait_dropped(int fd);
/* Plays the dialer's side of the HELLO handshake (tcp_mesh.c) on fd as rank `as` of w towards
 * rank dst: step 1 (flags WG_HELLO_F_AUTH when claim_auth), reads step 2, sends step 3 with
 * the proof made with secret (NULL/0: the empty key; a wrong secret makes a forged proof).
 * Returns 0 when the acceptor's proof verified under secret and step 3 went out, 1 when step 3
 * went out but the acceptor's proof did not verify, -1 when no step 2 came (refused). */
int world_raw_handshake(const world_t *w, int fd, int as, int dst, const uint8_t *secret,
                        size_t secret_len, int claim_auth);

#endif
