/* wagma/collective.h — the only public header of libwagma_collective.
 *
 * Two parts:
 *  1. Plans and groups (pure functions): from P ranks and a group size S, the L phases of
 *     non-overlapping groups that the wait-avoiding group allreduce cycles through, plus the
 *     JSON codec of a plan (the coordinator publishes plans in etcd with it, agents read them).
 *  2. The communicator: built from a plan, my rank and a transport (wagma_transport_kind_t:
 *     TCP, or NCCL for large payloads with the control on TCP, docs/design.md §6.4). It runs the
 *     wait-avoiding group allreduce of docs/design.md §5 on one fused float32 buffer, and plain
 *     blocking collectives (allreduce, broadcast, weighted average) on the same members.
 *
 * Threads: a communicator owns a transport progress thread and a round thread that answers
 * activations while the caller computes (with NCCL also a lane thread, plus one keeper thread
 * per process for page-locked memory). All wagma_comm_* calls that take a buffer must come
 * from one caller thread (the "compute thread"); wagma_comm_counters, wagma_comm_peer_alive
 * and wagma_comm_abort may be called from any.
 *
 * Status: functions return 0 or a negative WAGMA_E* code (wagma/status.h). */
#ifndef WAGMA_COLLECTIVE_H
#define WAGMA_COLLECTIVE_H

#include <stddef.h>
#include <stdint.h>

#include "wagma/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------
 * Plans and groups
 * ---------------------------------------------------------------------------------------- */

#define WAGMA_NAME_MAX 64    /* agent names, including the NUL */
#define WAGMA_ADDRESS_MAX 64 /* "host:port", including the NUL */

/* The size band of the groups wagma_plan_build makes when P >= S (P < S: one group of P). */
#define WAGMA_PLAN_MIN_GROUP(group_size) (group_size)
#define WAGMA_PLAN_MAX_GROUP(group_size) (2 * (group_size)-1)

typedef enum wagma_global_sync {
  WAGMA_GLOBAL_BARRIER = 0,       /* every member arrives; W <- mean (the paper's) */
  WAGMA_GLOBAL_WAIT_AVOIDING = 1, /* activated like a group round; laggards jump (ours) */
} wagma_global_sync_t;

typedef struct wagma_member {
  char name[WAGMA_NAME_MAX];       /* agent name, unique in the plan */
  char address[WAGMA_ADDRESS_MAX]; /* "host:port" its collective listens on */
  int joiner;                      /* 1: new in this epoch, weight 0 in the first global sync */
} wagma_member_t;

/* One phase: a partition of the ranks into non-overlapping groups.
 * The ranks of group g are ranks[offsets[g]] .. ranks[offsets[g + 1] - 1], in increasing
 * order; group_of[r] is the group of rank r. */
typedef struct wagma_phase {
  int ngroups;
  int *offsets;  /* ngroups + 1 entries */
  int *ranks;    /* nranks entries */
  int *group_of; /* nranks entries */
} wagma_phase_t;

typedef struct wagma_plan {
  uint64_t epoch;       /* grows at every membership change */
  uint64_t start_round; /* the round every member begins this epoch at */
  int nranks;           /* P >= 1 */
  int group_size;       /* S >= 2 */
  int staleness_bound;  /* tau >= 1: a global round every tau rounds */
  wagma_global_sync_t global_sync;
  wagma_member_t *members; /* nranks entries, index = rank */
  int nphases;             /* L >= 1 */
  wagma_phase_t *phases;   /* nphases entries; round t uses phase t mod L */
} wagma_plan_t;

/* Fills *plan with the phases for nranks ranks and group size group_size:
 *  - P = S^k: the butterfly, L = k; in phase j the group of rank r is the ranks that agree
 *    with r on every base-S digit except digit j.
 *  - any other P >= 2: the documented rule of plan.c (group sizes within
 *    [WAGMA_PLAN_MIN_GROUP(S), WAGMA_PLAN_MAX_GROUP(S)] = [S, 2*S-1], or P when P < S; the
 *    union of L consecutive phases connects all ranks).
 *  - P = 1: one phase with one group of one.
 * rank_order (may be NULL) is a permutation of 0..P-1: the groups are computed on positions
 * and position i holds rank rank_order[i], so a planner can place ranks (e.g. stragglers
 * together). members is allocated zeroed (the caller fills names and addresses); epoch,
 * start_round, staleness_bound (default 8) and global_sync (default barrier) are the caller's.
 * Ownership: *plan owns its arrays; release with wagma_plan_free. On error *plan is empty. */
int wagma_plan_build(int nranks, int group_size, const int *rank_order, wagma_plan_t *plan);

/* Releases the arrays of *plan and zeroes it. Safe on a zeroed or already freed plan. */
void wagma_plan_free(wagma_plan_t *plan);

/* Deep copy: *dst owns new arrays. */
int wagma_plan_copy(wagma_plan_t *dst, const wagma_plan_t *src);

/* Checks every invariant of a plan (sizes, each rank in exactly one group per phase, groups
 * sorted, member names unique and non-empty). On failure writes a reason naming the field into
 * err (may be NULL) and returns WAGMA_EINVAL. */
int wagma_plan_validate(const wagma_plan_t *plan, char *err, size_t err_len);

/* The phase of round t: plan->phases[t mod nphases]. */
const wagma_phase_t *wagma_plan_phase(const wagma_plan_t *plan, uint64_t round);

/* The group of rank in round t: writes its index to *group (may be NULL), points *ranks at its
 * sorted ranks (inside the plan) and returns their count, or a negative status. */
int wagma_plan_group(const wagma_plan_t *plan, uint64_t round, int rank, int *group,
                     const int **ranks);

/* Rank of the member named name, or WAGMA_ENOTFOUND. */
int wagma_plan_rank_of(const wagma_plan_t *plan, const char *name);

/* JSON codec (jansson). Shape:
 * {"epoch":3,"start_round":120,"group_size":4,"staleness_bound":8,"global_sync":"barrier",
 *  "members":[{"rank":0,"name":"a0","address":"127.0.0.1:7000","joiner":false},...],
 *  "phases":[[[0,1,2,3],[4,5,6,7]],...]}
 * to_json: *json is a NUL-terminated string the caller frees with free().
 * from_json: validates fully (wagma_plan_validate); on error writes a reason that names the
 * field into err and returns WAGMA_EINVAL, leaving *plan empty. */
int wagma_plan_to_json(const wagma_plan_t *plan, char **json);
int wagma_plan_from_json(const char *json, size_t len, wagma_plan_t *plan, char *err,
                         size_t err_len);

/* ------------------------------------------------------------------------------------------
 * Communicator
 * ---------------------------------------------------------------------------------------- */

typedef struct wagma_comm wagma_comm_t;

typedef enum wagma_transport_kind {
  WAGMA_TRANSPORT_TCP = 0,
  WAGMA_TRANSPORT_NCCL = 1, /* control on TCP, large payloads over NCCL (docs/design.md §6.4);
                               WAGMA_ENOSYS in a build without NCCL */
} wagma_transport_kind_t;

enum { WAGMA_ROUNDS_DEFAULT = 0, WAGMA_ROUNDS_STAR = 1, WAGMA_ROUNDS_ALLREDUCE = 2 };

typedef struct wagma_comm_options {
  const wagma_plan_t *plan; /* copied by wagma_comm_create */
  int rank;                 /* my rank in the plan */
  size_t count;             /* floats in the model buffer (the same on every rank) */
  wagma_transport_kind_t transport;
  int device;               /* NCCL: this rank's CUDA device (default 0); one device per rank */
  double connect_timeout_s; /* mesh setup; members not connected by then count as dead.
                               0 = default 10 s */
  double round_deadline_floor_s; /* a round waits at least this long for members; 0 = 1 s */
  double round_deadline_factor;  /* ...or this multiple of the measured round latency,
                                    whichever is larger; 0 = 8 */
  double global_timeout_s;       /* barrier global rounds and blocking collectives give up
                                    after this; 0 = 60 s */
  wagma_log_fn log;              /* may be NULL */
  void *log_user;
  /* The epoch's data-plane secret: bytes only the agents of this epoch can read (never the
   * plan, which is public). Every connection of the mesh proves knowledge of it both ways
   * (HMAC-SHA256 challenge-response, docs/collective.md "Peer authentication"), so only
   * members join the data plane. It authenticates the handshake only: frames are neither
   * encrypted nor MACed unless encrypt is set. secret_len >= WAGMA_SECRET_MIN_LEN (32 random bytes
   * recommended); read only during wagma_comm_create, not kept. secret NULL with secret_len 0 is
   * the unauthenticated mode (tests, benchmarks; logged as a warning): anyone who can reach the
   * port and knows the public plan can join. Any other combination is WAGMA_EINVAL. All
   * members of an epoch must use the same secret, or the same absence of one. */
  const uint8_t *secret;
  size_t secret_len;
  /* 1: encrypt and authenticate every frame after the handshake (AES-256-GCM, a key per
   * direction of each connection derived from the secret and that handshake's nonces;
   * docs/collective.md "Encryption"). Needs a secret and the TCP transport (else
   * WAGMA_EINVAL); every member of an epoch must use the same setting, or the handshake
   * refuses the pair. 0 (default): frames travel in clear after the authenticated handshake. */
  int encrypt;
  /* May be NULL. Polled (at least every 50 ms) while wagma_comm_create sets up the mesh; when
   * it returns non-zero, create gives up at once with WAGMA_ECANCELED (e.g. the agent learned
   * of a newer plan: no point in waiting connect_timeout_s for members of an old epoch).
   * Called on the creating thread only. */
  int (*cancelled)(void *user);
  void *cancel_user;
  /* use_listen_fd 1: listen_fd is a TCP socket already bound to my member's address and
   * listening (e.g. the agent's, inherited by the training program it launched). The
   * communicator accepts on a dup of it and never binds; the caller keeps listen_fd open across
   * epochs, so the port cannot be lost between them. 0 (default): bind the address. */
  int use_listen_fd;
  int listen_fd;
  /* How a wait-avoiding round moves its data (docs/design.md "The engine", "Rounds as an
   * allreduce"): WAGMA_ROUNDS_STAR, every contribution to the round's leader and the mean back;
   * WAGMA_ROUNDS_ALLREDUCE, the leader agrees who contributes and the contributors run one
   * allreduce among themselves, then commit. Every member of an epoch must use the same.
   * 0 (WAGMA_ROUNDS_DEFAULT): $WAGMA_ENGINE_ROUNDS ("star" or "allreduce") if set, else the
   * allreduce over TCP for models of 256 KiB and more, the star otherwise (docs/benchmarks.md). */
  int rounds;
} wagma_comm_options_t;

#define WAGMA_SECRET_MIN_LEN 16 /* bytes; shorter secrets are refused (WAGMA_EINVAL) */

/* Sets every field of *options to its default (transport TCP, zero = default timings). */
void wagma_comm_options_init(wagma_comm_options_t *options);

/* Whether wagma_comm_create could use transport `kind` on CUDA device `device` here: 0, or
 * WAGMA_ENOSYS (NCCL: this build has no NCCL), WAGMA_EUNAVAIL (no usable CUDA device) or
 * WAGMA_EINVAL (unknown kind), with a reason in err (may be NULL). For a daemon's start-up
 * check; wagma_comm_create returns the same codes and logs the reason through options.log. */
int wagma_comm_transport_check(wagma_transport_kind_t kind, int device, char *err, size_t err_len);

/* Binds my member's address, connects the mesh of the plan's members, starts the progress and
 * round threads. Members that do not connect within connect_timeout_s are treated as dead
 * (left out of every round of this epoch); a connection that fails authentication (no or
 * another secret) is refused and does not count as its claimed member. Returns WAGMA_EINVAL
 * for a bad secret/secret_len pair. Ownership: *comm is the caller's; release it with
 * wagma_comm_destroy. */
int wagma_comm_create(const wagma_comm_options_t *options, wagma_comm_t **comm);

/* Aborts rounds in flight (their waiters get WAGMA_ECLOSED), stops the threads, closes every
 * socket and frees everything. Safe while peers are dead or frozen. NULL is a no-op. */
void wagma_comm_destroy(wagma_comm_t *comm);

/* Cancels the communicator from any thread (e.g. a control thread that learned of a new plan
 * while the compute thread is blocked in a round): a wagma_comm_step, _allreduce, _broadcast
 * or _average blocked on it returns WAGMA_ECANCELED at once (within milliseconds), and so does
 * every later one; rounds in flight are abandoned (peers see this member as gone once it is
 * destroyed). Thread-safe and idempotent; NULL is a no-op. It does not free anything: the
 * owner still calls wagma_comm_destroy from the compute thread, and must not let abort run
 * concurrently with or after destroy (e.g. guard the pointer with a mutex). */
void wagma_comm_abort(wagma_comm_t *comm);

typedef enum wagma_round_kind {
  WAGMA_ROUND_GROUP = 0,
  WAGMA_ROUND_GLOBAL = 1,
} wagma_round_kind_t;

#define WAGMA_STATS_MAX_CONTRIBUTORS 64

/* What one wagma_comm_step did. */
typedef struct wagma_round_stats {
  uint64_t round;      /* the round this step ran */
  uint64_t next_round; /* the round the caller runs next: round + 1, more after a jump */
  wagma_round_kind_t kind;
  int group;        /* group index within the phase (0 for a global round) */
  int activator;    /* rank that activated the round, -1 if unknown */
  int members;      /* members of the group (P for a global round) */
  int contributors; /* contributions in the mean */
  int left_out;     /* members left out by the deadline */
  int ncontrib;     /* entries filled below: min(contributors, WAGMA_STATS_MAX_CONTRIBUTORS) */
  int contributor_rank[WAGMA_STATS_MAX_CONTRIBUTORS];
  uint64_t contributor_staleness[WAGMA_STATS_MAX_CONTRIBUTORS]; /* round - snapshot version */
  uint64_t max_staleness;                                       /* over all contributions */
  int corrections_applied; /* pending corrections applied at the start of this step */
  uint64_t rounds_skipped; /* rounds jumped over (wait-avoiding global, catch-up) */
  int caught_up;           /* 1 if this step adopted a global mean from a peer (catch-up) */
  uint64_t global_age;     /* after this step: next_round - 1 - the newest global round whose
                              mean the model contains (the epoch's start counts as one) */
  uint64_t alone_rounds;   /* after this step: next_round - 1 - the newest round whose mean
                              mixed my model with another member's (the epoch's start counts;
                              0 in a plan of one): grows by one a round for a member whose peers
                              are cut off or gone */
  double wait_s;           /* wall time spent inside wagma_comm_step */
  uint64_t bytes_sent;     /* by this rank for this round */
  uint64_t bytes_received;
} wagma_round_stats_t;

/* Cumulative counters since wagma_comm_create; callable from any thread. */
typedef struct wagma_comm_counters {
  uint64_t rounds_completed; /* steps returned */
  uint64_t rounds_activated; /* rounds this rank activated */
  uint64_t rounds_joined;    /* contributions made by the round thread for a peer's activation */
  uint64_t rounds_left_out;  /* rounds this rank was left out of */
  uint64_t corrections_applied;
  uint64_t rounds_skipped;
  uint64_t catchups;
  uint64_t bytes_sent;
  uint64_t bytes_received;
  uint64_t frames_rejected; /* corrupt / wrong-epoch frames dropped */
} wagma_comm_counters_t;

/* One iteration of the wait-avoiding group allreduce (docs/design.md §5.2). The caller has
 * just taken its optimizer step of round r = wagma_comm_round(comm) on model (count floats).
 * The step: adds every correction that arrived to model, publishes it as the snapshot of
 * version r, runs round r (a group round, or the global round when (r+1) mod tau == 0, in the
 * plan's global_sync mode) and, when the round ends within the member timeout, leaves the
 * averaged model in model; a correction that comes later is added at a later step (or by a
 * catch-up's successor), never dropped while its leader lives. stats may be NULL.
 * A barrier global round whose member is known dead (closed, EOF) moves on without it within
 * a fraction of a second; only a frozen member makes it wait for global_timeout_s.
 * Returns 0, WAGMA_ETIMEDOUT (a barrier global round missed its deadline), WAGMA_ECLOSED,
 * WAGMA_ECANCELED (wagma_comm_abort). */
int wagma_comm_step(wagma_comm_t *comm, float *model, wagma_round_stats_t *stats);

/* The round the caller computes next (starts at the plan's start_round). */
uint64_t wagma_comm_round(const wagma_comm_t *comm);

void wagma_comm_counters(const wagma_comm_t *comm, wagma_comm_counters_t *counters);
/* 1 when the member of plan rank `rank` is connected and alive in this communicator (for
 * rank == my own rank: 1), 0 when it is dead, never connected or out of range. Any thread. */
int wagma_comm_peer_alive(const wagma_comm_t *comm, int rank);
/* 1 when the member of plan rank `rank` is dead in this communicator because it could not be
 * reached on the data plane: its connection went silent (its host acknowledged nothing for
 * 3 s with data in flight, or keepalive probes went unanswered, or no route led there), or at
 * setup no dial of mine reached it, as a cut link does; *seconds (may be NULL) is how long ago
 * that was. 0 when it is alive, when it closed its side (its process ended: a death, not a
 * partition), when it is only stopped (its host still acknowledges), for my own rank and out
 * of range. Any thread. */
int wagma_comm_peer_unreachable(const wagma_comm_t *comm, int rank, double *seconds);

typedef enum wagma_reduce_op {
  WAGMA_REDUCE_SUM = 0,
  WAGMA_REDUCE_MEAN = 1,
} wagma_reduce_op_t;

/* Blocking allreduce over all live members (recursive doubling for small buffers, ring
 * reduce-scatter + allgather for large ones). Every member must call it in the same order with
 * the same count; count may exceed options.count (the buffer moves in chunks, all reduced
 * over the same members; it takes a temporary copy of count floats). A member that dies
 * mid-way is left out and the call runs again on the survivors, within a fraction of a second
 * of the death becoming known. Fails with WAGMA_ETIMEDOUT if a member does not take part
 * within global_timeout_s (e.g. frozen), WAGMA_EPEER if no retry can help, WAGMA_ECANCELED
 * after wagma_comm_abort. The blocking collectives below behave the same way. */
int wagma_comm_allreduce(wagma_comm_t *comm, float *buf, size_t count, wagma_reduce_op_t op);

/* Blocking broadcast of buf from root to all members. */
int wagma_comm_broadcast(wagma_comm_t *comm, float *buf, size_t count, int root);

/* Blocking weighted average over all members: buf <- sum(w_i * buf_i) / sum(w_i). A joiner
 * passes weight 0 and receives the others' mean (its own buffer is ignored). Fails with
 * WAGMA_EINVAL if all weights are 0. */
int wagma_comm_average(wagma_comm_t *comm, float *buf, size_t count, float weight);

/* Detail message of the last error on this communicator (never NULL). */
const char *wagma_comm_last_error(const wagma_comm_t *comm);

#ifdef __cplusplus
}
#endif
#endif
