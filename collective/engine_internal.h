/* engine_internal.h — state shared by engine.c (communicator, compute-thread side) and
 * engine_round.c (the round thread, group leaders, results). Private to collective/.
 *
 * Locking: one engine mutex `mu` guards everything below marked (mu); the snapshot has its
 * own mutex `snap_mu`. Lock order: mu before snap_mu, never the reverse. */
#ifndef WAGMA_COLLECTIVE_ENGINE_INTERNAL_H
#define WAGMA_COLLECTIVE_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "transport.h"
#include "wagma/collective.h"

/* RESULT frame flags. */
#define WG_RESULT_EXCLUDED 1u /* your contribution came too late: no correction */
#define WG_RESULT_GLOBAL 2u   /* the result of a global round */
/* CONTRIB flags. */
#define WG_CONTRIB_DECLINE 1u /* no snapshot yet (still computing my first round): don't wait */
/* CATCHUP_REP flags. */
#define WG_CATCHUP_NONE 1u /* the peer has no global mean yet */

#define WG_FINISHED_RING 256 /* leader rounds remembered after they finish */

/* A contribution of mine to a round, from the moment it is sent until the compute thread
 * has applied its correction (and passed the round). */
typedef enum wg_entry_state {
  WG_ENTRY_WAITING = 0, /* contributed, result not in yet; delta holds C */
  WG_ENTRY_RESOLVED,    /* delta holds A - C, not applied yet */
  WG_ENTRY_APPLIED,     /* applied; kept as a marker "contributed" while round >= cur */
  WG_ENTRY_DROPPED,     /* left out (excluded or expired): no correction */
} wg_entry_state_t;

typedef struct wg_entry {
  uint64_t round;
  uint32_t group;
  int global;
  wg_entry_state_t state;
  float *delta;      /* count floats: C while waiting, A - C once resolved; NULL after */
  uint64_t version;  /* snapshot version contributed */
  uint64_t snap_seq; /* snapshot sequence contributed (for the snapshot update rule) */
  int leader;
  int by_round_thread; /* 1: answered an activation, 0: the compute thread's own arrival */
  double created;
  /* filled when resolved */
  int activator;
  int members;
  int ncontrib;
  int *ranks;            /* ncontrib */
  uint64_t *versions;    /* ncontrib */
  struct wg_entry *next; /* sorted by round ascending */
} wg_entry_t;

/* A round this rank leads, open until every expected member contributed or its deadline. */
typedef struct wg_lround {
  uint64_t round;
  uint32_t group;
  int global;
  int nmembers;
  const int *members;   /* inside the plan, or comm->all_ranks */
  uint8_t *contributed; /* nmembers */
  uint8_t *expected;    /* nmembers: we wait for these */
  uint64_t *versions;   /* nmembers */
  double *sum;          /* count doubles */
  int ncontrib;
  int activator;
  double created;
  double deadline;
  struct wg_lround *next;
} wg_lround_t;

struct wagma_comm {
  wagma_plan_t plan;
  int rank;
  int nranks;
  size_t count;
  uint64_t epoch;
  uint64_t tau;
  wagma_global_sync_t mode;
  double floor_s, factor, global_timeout_s, connect_timeout_s;
  wagma_log_fn log;
  void *log_user;
  int *all_ranks; /* 0..P-1 */

  const wg_transport_ops_t *ops;
  wg_transport_t *tp;

  pthread_t round_thread;
  int round_thread_started;
  pthread_mutex_t mu;
  pthread_cond_t cv;  /* CLOCK_MONOTONIC; signalled when an entry changes state */
  int stopping;       /* (mu) */
  atomic_int aborted; /* wagma_comm_abort was called: public calls return WAGMA_ECANCELED */

  _Atomic uint64_t cur_round; /* the round the compute thread runs next; written under mu */

  /* snapshot (snap_mu) */
  pthread_mutex_t snap_mu;
  float *snap[2];
  int snap_front;
  int snap_have;
  int snap_publishing;
  uint64_t snap_version;
  uint64_t snap_seq;

  wg_entry_t *entries;                 /* (mu) */
  wg_lround_t *lrounds;                /* (mu) */
  uint64_t finished[WG_FINISHED_RING]; /* (mu) rounds led and finished, +1 (0 = empty) */
  int finished_pos;
  uint8_t *suspect; /* (mu) per rank: missed a deadline, not waited for until heard from */
  double ewma_leader, ewma_member; /* (mu) measured round latency, 0 = none yet */
  uint64_t highest_seen;           /* (mu) highest round in any engine frame from a peer */
  int highest_src;
  float *global_mean; /* (mu) the latest global mean, count floats */
  uint64_t global_round;
  int have_global;
  wagma_comm_counters_t counters; /* (mu) */

  /* (mu) activations of global rounds that came before my first snapshot: answered by the
   * round thread as soon as the compute thread publishes one */
  struct {
    uint64_t round;
    uint32_t group;
    int src;
  } deferred[16];
  int ndeferred;
  uint64_t model_global; /* (mu) newest global round whose mean the model includes, +1 */
  uint64_t coll_calls;   /* compute thread only */
  size_t coll_chunk;     /* floats per chunk of a blocking collective (tests may lower it) */
  uint64_t catchup_seq;
  char err[256]; /* compute thread only */
};

/* wagma_comm_create over a given transport (tests pass an in-process fake). */
int wg_comm_create_with(const wagma_comm_options_t *options, const wg_transport_ops_t *ops,
                        wagma_comm_t **comm);

/* Applies every correction that has arrived to model (as the start of a step does) without
 * running a round; returns how many. For tests and a clean end of training. */
int wg_comm_apply_pending(wagma_comm_t *comm, float *model);

/* Contributions still waiting for a result plus rounds I lead that are still open. */
int wg_comm_busy(wagma_comm_t *comm);

/* Round deadline of a leader round starting now: max(floor, factor * latency). (mu) */
double wg_engine_leader_timeout(const wagma_comm_t *c);
/* How long a member waits for its own round's result. (mu) */
double wg_engine_member_timeout(const wagma_comm_t *c);

/* round - version, 0 when the snapshot is newer than the round. */
static inline uint64_t wg_engine_staleness(uint64_t round, uint64_t version) {
  return round > version ? round - version : 0;
}

/* Round-thread main. */
void *wg_engine_round_main(void *arg);

/* Leader side. (mu held) */
wg_lround_t *wg_engine_lround_find(wagma_comm_t *c, uint64_t round);
int wg_engine_finished(const wagma_comm_t *c, uint64_t round);
/* Creates the leader round (round, group) and activates its members; activator = who
 * started it. NULL on allocation failure. */
wg_lround_t *wg_engine_lround_start(wagma_comm_t *c, uint64_t round, uint32_t group, int global,
                                    int activator);
/* Adds one contribution; finalizes when every expected member contributed. */
void wg_engine_lround_add(wagma_comm_t *c, wg_lround_t *lr, int src, uint64_t version,
                          const float *model);
void wg_engine_lround_finalize(wagma_comm_t *c, wg_lround_t *lr, double now);

/* Entries. (mu held) */
wg_entry_t *wg_engine_entry_find(wagma_comm_t *c, uint64_t round);
/* Creates the entry of round from the current snapshot (C := snapshot). NULL if no snapshot
 * or allocation failed. */
wg_entry_t *wg_engine_entry_from_snapshot(wagma_comm_t *c, uint64_t round, uint32_t group,
                                          int global, int leader);
/* Resolves e with the mean A and the contributor list. */
void wg_engine_entry_resolve(wagma_comm_t *c, wg_entry_t *e, const float *mean, int activator,
                             int members, int ncontrib, const int *ranks, const uint64_t *versions);
void wg_engine_entry_free(wg_entry_t *e);
/* Sends my contribution e (its snapshot version and delta) to round's leader dst, or with e
 * NULL a decline (no snapshot yet: don't wait for me). Returns the transport's send result. */
int wg_engine_send_contrib(wagma_comm_t *c, int dst, uint64_t round, uint32_t group,
                           const wg_entry_t *e);

/* Groups: the sorted ranks of round's group for rank, or all ranks for a global round. */
int wg_engine_is_global(const wagma_comm_t *c, uint64_t round);
int wg_engine_group_of(const wagma_comm_t *c, uint64_t round, int rank, uint32_t *group,
                       const int **ranks);
/* The leader of a group: its lowest rank that is alive and not suspected (me counts as
 * alive), or the lowest rank if every one is suspected. */
int wg_engine_leader_of(wagma_comm_t *c, const int *ranks, int n);

#endif
