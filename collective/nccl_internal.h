/* nccl_internal.h — private to the NCCL transport (nccl.c, nccl_lane.c, nccl_init.c);
 * docs/design.md §6.4 is its design.
 *
 * The transport wraps a TCP transport (the control channel: every header, small payloads)
 * and an NCCL communicator (the lane: large payloads, one transfer at a time, agreed over
 * the control channel before it is posted). Its lane thread is the only reader of the TCP
 * transport: it moves frames into this transport's mailbox, holding a sender's later frames
 * behind its announced transfer so that frames from one peer arrive in order.
 *
 * The same sources build against NCCL and the CUDA runtime (the product) and against
 * tests/fake_nccl (WG_NCCL_FAKE, tests only); WG_NCCL() names the few symbols shared between
 * the files so both builds can be linked into one test. */
#ifndef WAGMA_COLLECTIVE_NCCL_INTERNAL_H
#define WAGMA_COLLECTIVE_NCCL_INTERNAL_H

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <pthread.h>
#include <stdatomic.h>

#include "transport.h"

#ifdef WG_NCCL_FAKE
#define WG_NCCL(name) wg_ncclfake_##name
#else
#define WG_NCCL(name) wg_nccl_##name
#endif

/* Lane control frames: kind COLL with this group (no blocking collective uses it), the
 * operation in seq and the transfer id in aux. */
#define NC_GROUP 0xfffffff0u
enum nc_op {
  NC_ANNOUNCE = 1,    /* payload: the frame's encoded header; its payload follows on the lane */
  NC_CTS = 2,         /* receiver -> sender: I am idle, post transfer aux now */
  NC_GO = 3,          /* sender -> receiver: posted; post your half */
  NC_NACK = 4,        /* sender -> receiver: busy, ask again later */
  NC_PEER_UP = 5,     /* my communicator is ready */
  NC_PEER_DOWN = 6,   /* my communicator is revoked: revoke yours, payloads go on TCP */
  NC_ID = 7,          /* rank 0 -> all: payload = ncclUniqueId, initialise afresh */
  NC_SHRINK = 8,      /* rank 0 -> all: shrink the kept communicator of epoch aux */
  NC_NOLANE = 9,      /* rank 0 -> all: no lane this epoch */
  NC_RESEND = 10,     /* payload: encoded header + payload of transfer aux, on TCP */
  NC_DONE = 11,       /* receiver -> sender: transfer aux delivered; drop your copy */
  NC_GROUPS = 12,     /* aux: the phases whose group communicator I have up (bit p) */
  NC_GROUP_DOWN = 13, /* aux: a phase: I revoked my group's communicator of it */
};

/* Who may post an NCCL operation now (t->turn): one at a time per process. */
enum { NC_TURN_FREE = 0, NC_TURN_LANE = 1, NC_TURN_COLL = 2 };
#define NC_GROUPS_MAX_PHASES                                                                       \
  63 /* a plan with more phases gets no group communicators (the                                   \
        phases and the world's are bits of one NC_GROUPS word) */

/* My group's communicator in one phase of the plan (nccl_groups.c): from ncclCommSplit of the
 * epoch's communicator, colour = the group. comm, n and ranks are set by the lane thread
 * before the lane is up and fixed after; up and down are under t->mu. */
typedef struct nc_group {
  ncclComm_t comm; /* NULL: a group of one, or the split failed */
  int n;
  int *ranks;            /* plan ranks in the communicator's rank order (ascending) */
  int up;                /* initialised */
  int down;              /* revoked after a failure: no collective on it this epoch */
  atomic_int down_asked; /* a member revoked its own: the running collective gives up */
} nc_group_t;

#define NC_LANE_MIN_BYTES 1024 /* smaller payloads travel whole on TCP */

typedef enum nc_lane_state {
  NC_LANE_INIT = 0, /* waiting for rank 0's word, or initialising */
  NC_LANE_UP,
  NC_LANE_DOWN, /* revoked after a failure: payloads on TCP for the rest of the epoch */
  NC_LANE_OFF,  /* never came up this epoch */
} nc_lane_state_t;

/* A frame whose payload goes on the lane, from send() until its receiver said NC_DONE (or it
 * was re-sent on TCP). The host copy stays until then: a send may complete on the sender
 * before the receiver has the data (NCCL's eager sends), so only the receiver can tell. */
typedef struct nc_xfer {
  uint64_t id;
  int dst;
  int sent;                             /* the lane send completed; waiting for NC_DONE */
  int acked;                            /* NC_DONE came while the send was still posted here */
  uint8_t header[WG_FRAME_HEADER_SIZE]; /* encoded, complete */
  uint8_t *host;                        /* page-locked where the cache had one (payload_buffer) */
  int device_reads; /* a copy from host may still be queued on a lane that could not be
                       quiesced: host is leaked, never freed (lane thread, or close after) */
  size_t len;
  struct nc_xfer *next;
} nc_xfer_t;

/* What a sender sent, held at the receiver in its order: a complete message, or an
 * announced transfer whose payload has not come yet. */
typedef struct nc_item {
  wg_message_t *msg; /* complete: deliver when it is at the head */
  uint64_t id;       /* transfer (msg == NULL) */
  wg_frame_header_t header;
  int resend;   /* the lane is not up: wait for NC_RESEND */
  double since; /* when it was held (diagnostics) */
  struct nc_item *next;
} nc_item_t;

typedef struct nc_role {
  int active; /* a transfer posted (or, for reserved, asked for) */
  int peer;
  uint64_t id;
  int send;
  void *dev;
  size_t len;
  double deadline;
  nc_item_t *item;   /* recv: the item it fills */
  wg_message_t *msg; /* recv, posted: the message its payload is copied into */
  int copy_queued;   /* recv: that copy is on the stream (or, pageable, done) */
  nc_xfer_t *xfer;   /* send */
} nc_role_t;

typedef struct wg_transport {
  const wg_transport_ops_t *tcp_ops;
  wg_transport_t *tcp;
  int rank, nranks;
  uint64_t epoch;
  size_t max_payload;
  int device;
  double init_deadline;
  wagma_log_fn log;
  void *log_user;
  char (*names)[WAGMA_NAME_MAX]; /* plan member names, by plan rank */

  /* mailbox: engine threads take, the lane thread puts */
  pthread_mutex_t mu;
  pthread_cond_t cv; /* CLOCK_MONOTONIC */
  wg_message_t *box_head, *box_tail;
  int closed;
  uint8_t *dead_done; /* (mu) per rank: dead, and everything it sent is delivered or dropped */

  /* outbound transfers (mu): appended by send, taken by the lane thread */
  nc_xfer_t *out;
  uint64_t next_id;

  /* lane (lane thread; lane_state and peer_up read by send under mu) */
  _Atomic int lane_state;
  uint8_t *peer_up; /* (mu) LANE_UP received from this rank */
  int *lane_rank;   /* NCCL rank of each plan rank, -1 if none */
  ncclComm_t comm;
  int comm_ready; /* initialised (UP, or DOWN after UP): may be kept for the next epoch */
  cudaStream_t stream;
  nc_item_t **pending; /* per sender, its held frames (lane thread) */
  nc_role_t reserved;  /* CTS sent, waiting for GO / NACK */
  nc_role_t posted;    /* the one posted transfer */
  double backoff_until;
  double next_report; /* diagnostics: when to log transfers held too long */
  unsigned rng;
  void *lane_buf;       /* device buffer of the posted transfer, kept and grown (lane thread) */
  size_t lane_cap;      /* its bytes */
  int lane_buf_ordered; /* lane_buf is from cudaMallocAsync on the lane's stream */
  int no_memory_pools;  /* the device refused cudaMallocAsync: cudaMalloc from then on */
  int lane_size;        /* ranks of the communicator */
  int shrunk;           /* it was shrunk from the previous epoch's */
  int rr;               /* next sender to consider for a CTS */
  int word; /* rank 0's word for this epoch: NC_ID, NC_SHRINK, NC_NOLANE, 0 = none yet */
  uint64_t word_aux;
  ncclUniqueId word_id;
  uint64_t *last_done; /* per sender: highest transfer id delivered (a later RESEND of it is
                          a duplicate) */

  pthread_t lane_thread;
  int lane_started;
  atomic_int stopping;
  atomic_int draining; /* close began: finish what is posted, start nothing new */
  atomic_int busy;     /* the lane thread has a transfer posted or asked for */

  _Atomic uint64_t lane_bytes_sent, lane_bytes_received, lane_transfers;
  _Atomic uint64_t lane_failures;

  /* group communicators and collectives (nccl_groups.c) */
  int nphases;           /* 0: none this epoch */
  int *group_of;         /* (nphases + 1) * nranks: group of plan rank r in phase p (copied at open;
                            the last row: the world's, everyone in group 0) */
  nc_group_t *groups;    /* nphases + 1: per phase, then the world's (everyone) */
  uint64_t *groups_said; /* (mu) per rank: its NC_GROUPS bits */
  uint8_t *groups_heard; /* (mu) per rank: its NC_GROUPS came */
  int turn;              /* (mu) NC_TURN_*: who may post an NCCL operation */
  int coll_want;         /* (mu) a collective waits for the turn: the lane starts nothing new */
  pthread_cond_t turn_cv;
  /* the one caller's (the engine's data thread): its stream and buffers, kept and grown */
  cudaStream_t coll_stream;
  void *coll_dev;
  size_t coll_dev_cap;
  int coll_dev_ordered; /* coll_dev is from cudaMallocAsync on coll_stream */
  float *coll_host;     /* the sum, page-locked where the cache had one */
  size_t coll_host_cap;
  _Atomic uint64_t collectives, collective_failures;
} nc_t;

/* nccl.c: the operations table (wg_nccl_transport; wg_ncclfake_transport in the fake build) */
#ifdef WG_NCCL_FAKE
extern const wg_transport_ops_t wg_ncclfake_transport;
#endif
void WG_NCCL(deliver)(nc_t *t, wg_message_t *m); /* into the mailbox, wakes recv waiters */
void WG_NCCL(mark_dead_done)(nc_t *t, int rank);
/* Sends a lane control frame on TCP. */
int WG_NCCL(control)(nc_t *t, int dst, enum nc_op op, uint64_t id, const void *payload, size_t len);

/* nccl_hostmem.c: page-locked host memory, allocated and freed by one keeper thread per
 * process only (those calls wait for the whole device, the application's compute stream
 * included). */
/* The process's source of page-locked host buffers (cudaHostAlloc, cached by buf_pool.c):
 * the lane's copies to and from the device run from them at DMA speed, asynchronously on
 * the lane's stream. NULL when it cannot be made. Only the keeper allocates from it. */
wg_buf_source_t *WG_NCCL(locked_source)(void);
/* A page-locked buffer of len bytes from the cache, or NULL: then the keeper is asked to put
 * one of that size (on device) in the cache for the next caller. Any thread; no CUDA call.
 * Freed with wg_buf_free. */
void *WG_NCCL(locked_take)(int device, size_t len);
/* A host buffer of len bytes for a payload on the lane: WG_NCCL(locked_take)'s, else
 * pageable (wg_buf_alloc). Any thread; no CUDA call. Freed with wg_buf_free. */
void *WG_NCCL(payload_buffer)(int device, size_t len);
/* 1 when p (from wg_buf_alloc*) is page-locked, from WG_NCCL(locked_source). */
int WG_NCCL(is_locked)(const void *p);

/* nccl_lane.c */
void *WG_NCCL(lane_main)(void *arg);
/* Sleeps us microseconds (the polls of posted operations). */
void WG_NCCL(nap_us)(long us);
/* Waits (at most 1 s) for a revoked communicator to become quiescent and stream idle (a copy
 * queued behind a dropped operation runs then), so the buffers of what was posted can be
 * freed. 1 when they are. The lane thread (its communicator), or a collective's caller. */
int WG_NCCL(quiesce)(ncclComm_t comm, cudaStream_t stream);
/* Reads the control channel for up to wait_s (then whatever else is there, at most 64
 * frames): lane frames are handled, the others delivered or held; dead peers are buried. */
void WG_NCCL(pump)(nc_t *t, double wait_s);
/* Revokes the communicator, tells every peer, re-sends every outbound transfer on TCP and
 * marks every held transfer as waiting for its re-send. Lane thread (or close, after it). */
void WG_NCCL(lane_down)(nc_t *t, const char *why);
/* Sends every outbound transfer (sent on the lane and not acknowledged too) on TCP as
 * NC_RESEND and frees it; a receiver drops one it already has. */
void WG_NCCL(resend_all)(nc_t *t);
/* Frees the lane's device buffer behind what is queued on the lane's stream (nothing may be
 * posted on it): the lane thread, when it grows the buffer; close, after the lane thread
 * ended. */
void WG_NCCL(lane_buffer_free)(nc_t *t);

/* nccl_groups.c */
/* open: copies the plan's groups (nphases 0 when it has more than NC_GROUPS_MAX_PHASES);
 * 0 or WAGMA_ENOMEM. */
int WG_NCCL(groups_new)(nc_t *t, const wagma_plan_t *plan);
/* Lane thread, while initialising (nothing posted on t->comm yet): splits t->comm once per
 * phase, in phase order on every rank, and polls each up to init_deadline. 0, or -1 when a
 * split failed (the epoch's communicator may then be unusable: the caller turns the lane off). */
int WG_NCCL(groups_split)(nc_t *t);
/* Lane thread, once up: tells every peer which group communicators are up here. */
void WG_NCCL(groups_announce)(nc_t *t);
/* Lane thread: NC_GROUPS and NC_GROUP_DOWN from src. */
void WG_NCCL(groups_on_control)(nc_t *t, int src, enum nc_op op, uint64_t aux);
/* The turn for the lane: 1 when it may post (it holds it, or took it), 0 when a collective
 * holds it or waits for it. lane_release gives it back (the lane is idle). Lane thread. */
int WG_NCCL(turn_lane)(nc_t *t);
void WG_NCCL(turn_lane_release)(nc_t *t);
/* close, after every other thread ended: aborts the group communicators, frees the rest. */
void WG_NCCL(groups_free)(nc_t *t);
/* The transport operations (wg_transport_ops_t.group_ready, .group_allreduce). */
int WG_NCCL(group_ready)(wg_transport_t *t, uint64_t round, const int *ranks, int n);
int WG_NCCL(group_allreduce)(wg_transport_t *t, const int *ranks, int n, uint64_t round,
                             const float *src, size_t count, double deadline, const float **sum);

/* nccl_init.c */
/* Checks that a CUDA device is usable: 0, or WAGMA_EUNAVAIL with a message in err. */
int WG_NCCL(device_check)(int device, char *err, size_t err_len);
/* Lane thread, state INIT: runs rank 0's decision, waits for it, creates the communicator and
 * polls it up to init_deadline. Returns with lane_state UP or OFF. */
void WG_NCCL(lane_init)(nc_t *t);
/* close: keeps an initialised communicator for the next epoch (aborting the one kept
 * before), or aborts it. */
void WG_NCCL(keep_or_abort)(nc_t *t);
/* Aborts the kept communicator, if any (tests; a process that leaves the job). */
void WG_NCCL(forget)(void);

#endif
