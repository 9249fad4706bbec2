/* engine_internal.h — the state of a communicator and the contracts between the engine's
 * files. Private to collective/. docs/design.md ("The engine") describes the algorithm; this
 * header says who owns what:
 *
 *   engine.c           the communicator: create, destroy, abort, counters, wagma_comm_step
 *   engine_snapshot.c  the snapshot buffers and the correction accumulator
 *   engine_member.c    my contributions: at most one outstanding, deferred activations,
 *                      the compute thread's group round
 *   engine_leader.c    the rounds this rank leads: open, add, finalize
 *   engine_thread.c    the round thread: frame dispatch and ticks
 *   engine_global.c    barrier global rounds, catch-up, blocking collectives on live ranks
 *   engine_outbox.c    frames queued under mu and sent after it is released
 *   engine_codec.c     the RESULT payload, little-endian like the frame header
 *   memops.c           the model-sized arithmetic (copy, add, correction), a table (memops.h)
 *
 * Locking: one mutex `mu` guards every field marked (mu). Frames are never sent under mu:
 * code holding mu posts them to the outbox and whoever released mu flushes it. The only
 * copy of the model made outside mu is publish's write into a snapshot buffer nobody reads. */
#ifndef WAGMA_COLLECTIVE_ENGINE_INTERNAL_H
#define WAGMA_COLLECTIVE_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "memops.h"
#include "transport.h"
#include "wagma/collective.h"

/* RESULT frame flags. */
#define WG_RESULT_EXCLUDED                                                                         \
  1u                        /* your contribution did not make it into the mean: void (an           \
                               allreduce round: ABORT, the round is void for everyone) */
#define WG_RESULT_GLOBAL 2u /* the result of a global round */
#define WG_RESULT_GO                                                                               \
  4u /* allreduce rounds: the contributors are decided (payload: the                               \
        list, wg_codec_list_*); run the allreduce among them */
#define WG_RESULT_COMMIT                                                                           \
  8u /* allreduce rounds: every contributor's allreduce succeeded:                                 \
        apply its mean (payload: the list when no GO preceded) */
#define WG_RESULT_COLL                                                                             \
  16u /* with GO: run it as the transport's own collective (group_allreduce), not coll.c's */
/* CONTRIB flags. An allreduce round's CONTRIB carries no payload (a JOIN). */
#define WG_CONTRIB_DECLINE 1u /* I will not contribute to this round: don't wait for me */
#define WG_CONTRIB_DONE 2u    /* allreduce rounds: my allreduce of the round ended... */
#define WG_CONTRIB_FAILED 4u  /* ...without a result (with DONE) */
/* CATCHUP_REP flags. */
#define WG_CATCHUP_NONE 1u /* the peer has no global mean yet */

/* The default way rounds move data (wagma_comm_options_t.rounds): over TCP, an allreduce among
 * the contributors from this model size on, the star below it (where the allreduce's extra
 * hops cost more than the leader's data path saves; docs/benchmarks.md). */
#define WG_ROUNDS_ALLREDUCE_MIN_BYTES ((size_t)256 << 10)
#define WG_FINISHED_RING 256 /* leader rounds remembered after they finish */
#define WG_DEFERRED_MAX 32   /* activations waiting for my outstanding contribution */

/* ---------------------------------------------------------------- snapshot (engine_snapshot.c)
 * Three buffers of count floats: `front` is the published snapshot (what the round thread
 * contributes), `pinned` is the snapshot my outstanding contribution carried (kept until its
 * round ends, because the correction is mean - pinned), and publish writes the third.
 * Invariant: front == the compute thread's model + acc, i.e. the model as it will be once
 * every correction already known is applied. So every contribution contains the corrections
 * of all my earlier rounds, and no snapshot is contributed to two rounds (pinned is spent). */
typedef struct wg_snapshot {
  size_t count;
  float *buf[3];
  int front;   /* published buffer, -1 before the first publish */
  int pinned;  /* buffer of the outstanding contribution, -1 if none */
  int writing; /* buffer publish is filling outside mu, -1 if none */
  int reading; /* buffer the data thread's allreduce reads outside mu (the contribution it
                  took), -1 if none: kept from reuse even when its round is voided meanwhile */
  uint64_t version;
  float *acc;          /* sum of corrections resolved and not yet added to the model */
  float *spare;        /* a zeroed accumulator: acc's replacement when the compute thread
                          takes acc (wg_snapshot_take); NULL while taken (compute thread's) */
  int acc_n;           /* corrections in acc */
  uint64_t acc_global; /* newest global round among them, +1 (0 = none) */
} wg_snapshot_t;

/* ---------------------------------------------------------------- my contributions */
typedef enum wg_entry_state {
  WG_ENTRY_WAITING = 0, /* sent (or added to my own round), its round's end not known yet */
  WG_ENTRY_RESOLVED,    /* the correction is in the accumulator */
  WG_ENTRY_APPLIED,     /* the accumulator went into the model */
  WG_ENTRY_VOID,        /* the round ended without my contribution: no correction */
} wg_entry_state_t;

/* One contribution of mine, from the moment it is made until the compute thread has passed
 * its round: it marks "contributed to this round" so a rank contributes to a round at most
 * once. At most one entry is WAITING at any time (comm->outstanding). */
typedef struct wg_entry {
  uint64_t round;
  uint32_t group;
  int global;
  wg_entry_state_t state;
  uint64_t version; /* snapshot version contributed */
  int leader;
  int sending; /* a CONTRIB of it is in an outbox flush: its pinned buffer is being read */
  /* allreduce rounds (engine_data.c): GO came (ranks/versions/ncontrib hold the list), the
   * data thread took it, its allreduce ended (data_rc) and c->work holds the mean */
  int go, claimed, data_done, data_rc;
  int coll; /* GO said: the transport's own collective (WG_RESULT_COLL) */
  /* filled when resolved */
  int activator;
  int members;
  int ncontrib;
  int *ranks;
  uint64_t *versions;
  struct wg_entry *next; /* sorted by round ascending */
} wg_entry_t;

/* An activation I could not answer yet (a contribution of mine is outstanding, or I have no
 * snapshot yet): answered when I can, dropped at its expiry or once I passed the round. */
typedef struct wg_deferred {
  uint64_t round;
  uint32_t group;
  int leader;
  double expires;
} wg_deferred_t;

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
  double *sum;          /* count doubles (star rounds) */
  int ncontrib;
  /* allreduce rounds: after GO, the round waits for every contributor's DONE (data phase) */
  int data;          /* in the data phase (in c->drounds, its round marked finished) */
  uint8_t *done;     /* nmembers: DONE came (or my own allreduce ended) */
  int ndone, failed; /* DONEs so far; one of them (or a death, the deadline) failed */
  double go_at;
  int activator;
  double created;
  double deadline;
  struct wg_lround *next;
} wg_lround_t;

/* A frame waiting in the outbox: its payload is a shared blob (RESULT, CATCHUP_REP) or the
 * pinned snapshot of `entry` (CONTRIB), or nothing. */
typedef struct wg_blob {
  int refs;
  size_t len;
  uint8_t data[];
} wg_blob_t;

typedef struct wg_out {
  int dst;
  wg_frame_header_t header;
  wg_blob_t *blob;
  wg_entry_t *entry; /* CONTRIB from the pinned snapshot: entry->sending is set */
  int failed;        /* the send failed (set by the flush) */
  struct wg_out *next;
} wg_out_t;

struct wagma_comm {
  wagma_plan_t plan;
  int rank;
  int nranks;
  size_t count;
  uint64_t epoch;
  uint64_t tau;
  wagma_global_sync_t mode;
  double floor_s, factor, global_timeout_s, connect_timeout_s;
  int stale_view_notices; /* compute thread: global collectives that told ranks with a stale
                             view of the dead to give up (wg_global_coll_live), at most 4 */
  wagma_log_fn log;
  void *log_user;
  int *all_ranks; /* 0..P-1 */

  const wg_transport_ops_t *ops;
  wg_transport_t *tp;
  /* the arithmetic on the model-sized buffers (memops.h): the host's today, the buffers being
   * host memory */
  const wg_memops_t *mem;

  pthread_t round_thread;
  int round_thread_started;
  pthread_mutex_t mu;
  pthread_cond_t cv;  /* CLOCK_MONOTONIC; broadcast when an entry or the snapshot changes */
  int stopping;       /* (mu) */
  atomic_int aborted; /* wagma_comm_abort was called: public calls return WAGMA_ECANCELED */

  _Atomic uint64_t cur_round; /* the round the compute thread runs next; written under mu */

  wg_snapshot_t snap;                      /* (mu) */
  wg_entry_t *entries;                     /* (mu) */
  wg_entry_t *outstanding;                 /* (mu) my WAITING entry, or NULL */
  wg_deferred_t deferred[WG_DEFERRED_MAX]; /* (mu) */
  int ndeferred;
  wg_lround_t *lrounds; /* (mu) */
  wg_lround_t *drounds; /* (mu) allreduce rounds I lead in their data phase */
  int rounds_allreduce; /* WAGMA_ROUNDS_ALLREDUCE: rounds move data by an allreduce */
  float *work;          /* allreduce rounds: the data thread's buffer (count floats) */
  float *delta;         /* allreduce rounds: the mean minus the contribution, written by the
                           allreduce (wg_coll_allreduce_delta): the correction, ready */
  pthread_t data_thread;
  int data_thread_started;
  double ewma_data; /* (mu) measured GO -> decision latency of rounds I led, 0 = none */
  uint64_t finished[WG_FINISHED_RING]; /* (mu) rounds led and finished, +1 (0 = empty) */
  int finished_pos;
  uint8_t *suspect; /* (mu) per rank: missed a deadline, not waited for until heard from */
  double ewma_leader, ewma_member; /* (mu) measured round latency, 0 = none yet */
  uint64_t highest_seen;           /* (mu) highest round in any engine frame from a peer */
  int highest_src;
  float *global_mean; /* (mu) the latest global mean, count floats */
  uint64_t global_round;
  int have_global;
  uint64_t model_global; /* (mu) newest global round whose mean the model includes, +1 */
  /* (mu) newest round whose average mixed my model with another member's, +1 (the epoch's
   * start counts): wagma_round_stats_t.alone_rounds */
  uint64_t mixed_round;
  /* (mu) A wait-avoiding step that jumped over global round G raised model_global to G + 1
   * before G's correction came: jump_global = G + 1 and model_global_before_jump what it was
   * (0: no such jump pending). If G becomes void for me, model_global goes back, so that the
   * next step sees the global round I missed and catches up. */
  uint64_t jump_global, model_global_before_jump;
  wagma_comm_counters_t counters; /* (mu) */
  wg_out_t *outbox, *outbox_tail; /* (mu) */

  uint64_t coll_calls; /* compute thread only */
  size_t coll_chunk;   /* floats per chunk of a blocking collective (tests may lower it) */
  uint64_t catchup_seq;
  char err[256]; /* compute thread only */
};

/* wagma_comm_create over a given transport (tests pass an in-process fake). */
int wg_comm_create_with(const wagma_comm_options_t *options, const wg_transport_ops_t *ops,
                        wagma_comm_t **comm);

/* Adds every correction that has arrived to model (as the start of a step does) without
 * running a round; returns how many. For tests and a clean end of training. */
int wg_comm_apply_pending(wagma_comm_t *comm, float *model);

/* My outstanding contribution (0 or 1) plus rounds I lead that are still open. */
int wg_comm_busy(wagma_comm_t *comm);

/* ---------------------------------------------------------------- timing and groups (mu) */
double wg_engine_leader_timeout(const wagma_comm_t *c);
double wg_engine_member_timeout(const wagma_comm_t *c);
void wg_engine_ewma(double *avg, double sample);
static inline uint64_t wg_engine_staleness(uint64_t round, uint64_t version) {
  return round > version ? round - version : 0;
}
int wg_engine_is_global(const wagma_comm_t *c, uint64_t round);
/* The sorted ranks of round's group for rank (all ranks for a global round). */
int wg_engine_group_of(const wagma_comm_t *c, uint64_t round, int rank, uint32_t *group,
                       const int **ranks);
/* 1 if src is in my group g of round. */
int wg_engine_same_group(const wagma_comm_t *c, uint64_t round, uint32_t group, int src);
/* The lowest rank of the group that is me or alive and not suspected (else the lowest). */
int wg_engine_leader_of(wagma_comm_t *c, const int *ranks, int n);

/* ---------------------------------------------------------------- snapshot (mu) */
int wg_snapshot_init(wg_snapshot_t *s, size_t count);
void wg_snapshot_free(wg_snapshot_t *s);
/* Compute thread. Publishes model as the snapshot of version: with apply, first adds the
 * accumulator to model (marks RESOLVED entries APPLIED) and returns how many corrections
 * that was; the addition and the copy run outside mu, in one pass, and corrections resolved
 * meanwhile go into the new snapshot too. Takes and releases mu. */
int wg_snapshot_publish(wagma_comm_t *c, float *model, uint64_t version, int apply);
/* The corrections for the model (mu): every RESOLVED entry becomes APPLIED and the accumulator
 * is exchanged with the zeroed spare; the buffer returned holds them (NULL when there are none),
 * *n their number. The compute thread adds it to its model outside mu, wg_snapshot_add_taken
 * (so no model-sized work is done under mu); until then front holds them and model does not. */
float *wg_snapshot_take(wagma_comm_t *c, int *n);
/* model += taken; taken = 0, and it is the spare again. Compute thread, outside mu. NULL: no-op. */
void wg_snapshot_add_taken(wagma_comm_t *c, float *model, float *taken);
/* 1 if I can contribute now: a snapshot exists and no contribution is outstanding. */
int wg_snapshot_available(const wagma_comm_t *c);
/* The outstanding contribution's round ended with mean: acc += mean - pinned; the snapshot
 * takes the correction too (becomes mean exactly while it is still the pinned one, version
 * round); unpins. */
void wg_snapshot_resolve(wagma_comm_t *c, const float *mean, uint64_t round, int global);
/* The outstanding contribution's round ended without it: unpins, nothing else. */
void wg_snapshot_unpin(wagma_comm_t *c);

/* ---------------------------------------------------------------- my contributions (mu) */
wg_entry_t *wg_member_entry(wagma_comm_t *c, uint64_t round);
void wg_member_entry_free(wg_entry_t *e);
/* Contributes the front snapshot to (round, group) led by leader: pins it, creates the
 * WAITING entry and sends CONTRIB (posted) or, when leader is me, adds it to my open round
 * (which may finalize at once). Precondition: wg_snapshot_available. Returns the entry, or
 * NULL on allocation failure. */
wg_entry_t *wg_member_contribute(wagma_comm_t *c, uint64_t round, uint32_t group, int leader,
                                 int by_round_thread);
/* Round ended for my contribution e: applied (mean, contributors) or void. */
void wg_member_resolve(wagma_comm_t *c, wg_entry_t *e, const float *mean, int activator,
                       int members, int ncontrib, const int *ranks, const uint64_t *versions);
void wg_member_void(wagma_comm_t *c, wg_entry_t *e, const char *why);
/* Allreduce rounds: GO for my contribution e: the contributor list (copied into e) and the
 * data thread may take it, as the transport's own collective when coll is 1. 0 or
 * WAGMA_ENOMEM. */
int wg_member_go(wagma_comm_t *c, wg_entry_t *e, int activator, int members, int n,
                 const int *ranks, const uint64_t *versions, int coll);
/* An activation of (round, group) by leader (me, for a round I lead): answers it now if I
 * can, defers it if my contribution is outstanding or I have no snapshot yet, declines it
 * if my snapshot is too stale. */
void wg_member_activated(wagma_comm_t *c, uint64_t round, uint32_t group, int leader);
/* Answers deferred activations that can be answered now, drops expired ones. */
void wg_member_answer_deferred(wagma_comm_t *c);
/* Posts a DECLINE of (round, group) to leader, or stops my open round waiting for me. */
void wg_member_decline(wagma_comm_t *c, uint64_t round, uint32_t group, int leader);
/* Frees entries that are done with and behind cur. */
void wg_member_prune(wagma_comm_t *c, uint64_t cur);
/* Compute thread: group round r (or wait-avoiding global round) on model, which it leaves
 * with every correction known by then applied. Takes and releases mu. */
int wg_member_group_round(wagma_comm_t *c, float *model, uint64_t r, int global,
                          wagma_round_stats_t *st);
void wg_member_stats(const wagma_comm_t *c, const wg_entry_t *e, wagma_round_stats_t *st);

/* ---------------------------------------------------------------- rounds I lead (mu) */
wg_lround_t *wg_leader_find(wagma_comm_t *c, uint64_t round);
int wg_leader_finished(const wagma_comm_t *c, uint64_t round);
/* Opens (round, group), posting ACTIVATE to the other live members. NULL if my group of that
 * round is not `group` or on allocation failure. */
wg_lround_t *wg_leader_open(wagma_comm_t *c, uint64_t round, uint32_t group, int activator);
/* Adds src's contribution (count host floats); finalizes when nobody else is expected. */
void wg_leader_add(wagma_comm_t *c, wg_lround_t *lr, int src, uint64_t version, const float *model);
/* Marks src as not expected (declined, dead); finalizes when nobody else is expected. */
void wg_leader_release(wagma_comm_t *c, wg_lround_t *lr, int src);
/* Posts the mean to every contributor, resolves my own contribution, frees lr. */
void wg_leader_finalize(wagma_comm_t *c, wg_lround_t *lr, double now);
/* Finalizes rounds whose deadline passed or whose missing members died; ends allreduce
 * rounds in their data phase whose deadline passed or a contributor of which died (abort). */
void wg_leader_tick(wagma_comm_t *c, double now);
/* Allreduce rounds: src's allreduce of round ended (ok or not); commits the round once every
 * contributor's did, aborts it at the first failure. */
void wg_leader_done(wagma_comm_t *c, uint64_t round, int src, int ok);
wg_lround_t *wg_leader_data_find(wagma_comm_t *c, uint64_t round);
void wg_leader_free_all(wagma_comm_t *c);
/* Records the mean of global round round as the latest global mean. */
void wg_engine_store_global(wagma_comm_t *c, uint64_t round, const float *mean);

/* ---------------------------------------------------------------- outbox */
/* Queues a frame (mu). blob may be NULL; its reference is taken (refs incremented). */
void wg_outbox_post(wagma_comm_t *c, int dst, const wg_frame_header_t *h, wg_blob_t *blob);
/* Queues CONTRIB of e's pinned snapshot and sets e->sending (mu). */
void wg_outbox_post_contrib(wagma_comm_t *c, wg_entry_t *e);
/* Sends everything queued. Call without mu; takes it briefly. */
void wg_outbox_flush(wagma_comm_t *c);
void wg_outbox_discard(wagma_comm_t *c);
wg_blob_t *wg_blob_new(size_t len);
void wg_blob_unref(wg_blob_t *b);

/* ---------------------------------------------------------------- codec (engine_codec.c)
 * RESULT payload: the mean (count float32) followed by n (int32 rank) and n (uint64
 * version), all little-endian. CONTRIB and CATCHUP_REP payloads: count float32 LE. */
size_t wg_codec_result_size(size_t count, int n);
void wg_codec_result_encode(uint8_t *out, const float *mean, size_t count, int n, const int *ranks,
                            const uint64_t *versions);
/* Returns 0, or WAGMA_EPROTO if a rank is outside [0, nranks). mean gets count floats. */
int wg_codec_result_decode(const uint8_t *in, size_t count, int n, int nranks, float *mean,
                           int *ranks, uint64_t *versions);
void wg_codec_put_floats(uint8_t *out, const float *in, size_t n);
void wg_codec_get_floats(float *out, const uint8_t *in, size_t n);
/* in as floats without a copy when the host is little-endian and in is aligned, else NULL. */
const float *wg_codec_floats_view(const uint8_t *in);

/* The list of an allreduce round's contributors (GO, a COMMIT without GO): n int32 ranks then
 * n uint64 versions, little-endian. */
size_t wg_codec_list_size(int n);
void wg_codec_list_encode(uint8_t *out, int n, const int *ranks, const uint64_t *versions);
int wg_codec_list_decode(const uint8_t *in, int n, int nranks, int *ranks, uint64_t *versions);

/* ---------------------------------------------------------------- round thread, globals */
void *wg_engine_round_main(void *arg);
/* engine_data.c: the data thread of allreduce rounds (docs/design.md "Rounds as an
 * allreduce"), and the time an allreduce of the model is given. */
void *wg_engine_data_main(void *arg);
double wg_engine_data_timeout(const wagma_comm_t *c);
/* The seq base of a round's allreduce among ranks (n sorted contributors): 40 bits of a hash of
 * the list, shifted as barrier rounds' (engine_global.c); its failure notice is it | the
 * notice bit (coll.h). */
uint64_t wg_engine_list_seq(const int *ranks, int n);
/* Tests only (NULL otherwise): called by the data thread (under mu) with the snapshot a member
 * (not the round's leader) puts into an allreduce round's allreduce, once the leader's GO
 * accepted it: what the star path sends in its CONTRIB, for test_engine_property's "no
 * snapshot in two rounds" check (a contribution voided before GO, e.g. its JOIN never
 * reached the leader, went into no round). Set it before any communicator exists. */
typedef void (*wg_engine_staged_hook_t)(int rank, int leader, uint64_t round, const float *snap,
                                        size_t count);
extern wg_engine_staged_hook_t wg_engine_staged_hook;
/* Tests only (NULL otherwise): the data thread reports the status this returns for its
 * allreduce of round (rc: what the allreduce returned), to inject a partial success. */
typedef int (*wg_engine_data_fault_t)(int rank, uint64_t round, int rc);
extern wg_engine_data_fault_t wg_engine_data_fault;
int wg_global_barrier(wagma_comm_t *c, float *model, uint64_t g, wagma_round_stats_t *st);
int wg_global_catch_up(wagma_comm_t *c, float *model, uint64_t r, uint64_t *next);
enum wg_coll_op { WG_COLL_ALLREDUCE, WG_COLL_BROADCAST, WG_COLL_AVERAGE };
int wg_global_coll_live(wagma_comm_t *c, enum wg_coll_op op, uint64_t round, uint32_t group,
                        float *buf, size_t count, size_t chunk, wagma_reduce_op_t rop, int root,
                        float weight, int *live_out, int *nlive_out);
/* Waits on cv (mu held) until pred-independent wake, deadline or stop. 0 or WAGMA_ECLOSED. */
int wg_engine_wait(wagma_comm_t *c, double deadline);

#endif
