/* transport.h — private contract between the engine (engine.c, coll.c) and the transports:
 * TCP (tcp*.c, wg_tcp_transport) and NCCL (nccl*.c, wg_nccl_transport, in builds with NCCL;
 * docs/design.md §6.4). Not installed; outside collective/ only white-box tests include it.
 *
 * A transport moves framed messages between the members of one epoch. It owns a progress
 * thread that writes queued frames and reads incoming ones into a mailbox; engine threads
 * take messages out of the mailbox by matching (src, kind, round, group, seq) with a deadline.
 * A thread may also read some connections itself for a while (reader_begin: the blocking
 * collectives do, so a hop costs one wake-up instead of two). Every frame header is
 * validated (frame.h) before any payload buffer is allocated or touched.
 *
 * Threads: send, recv, recv_into, peer_alive and interrupt may be called from any thread
 * concurrently; a reader belongs to the thread that began it.
 * close must be called once, from one thread, after no other call is in progress or while
 * calls are blocked in recv (they return WAGMA_ECLOSED). */
#ifndef WAGMA_COLLECTIVE_TRANSPORT_H
#define WAGMA_COLLECTIVE_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "frame.h"
#include "wagma/collective.h"

typedef struct wg_transport wg_transport_t;

/* A source of payload buffers (buf_pool.c; wg_buf_source_new below). */
typedef struct wg_buf_source wg_buf_source_t;

/* A caller's reader session (transport-private; see reader_begin). */
typedef struct wg_reader wg_reader_t;

/* Where recv_into puts the payload of the message it takes: copied to dst, which must hold
 * exactly `length` bytes (a matching message of another length is an error). */
typedef struct wg_sink {
  void *dst;
  size_t length;
} wg_sink_t;

/* A received message. Ownership: the receiver frees it with wg_message_free. */
typedef struct wg_message {
  wg_frame_header_t header;
  uint8_t *payload;        /* header.length bytes, NULL when 0; 64-byte aligned */
  struct wg_message *next; /* mailbox link, transport-private */
} wg_message_t;

/* For transports (transport.c): a message with a copy of *header and an uninitialised
 * payload of payload_len bytes from wg_buf_alloc (NULL when 0), next NULL. Returns NULL when
 * out of memory. Ownership: the caller's, released with wg_message_free. Any thread. */
wg_message_t *wg_message_new(const wg_frame_header_t *header, size_t payload_len);

/* Frees the payload (wg_buf_free) and the message. NULL is a no-op. Any thread. */
void wg_message_free(wg_message_t *message);

/* Buffers for payloads and queued frames (buf_pool.c), for every transport: 64-byte aligned,
 * large ones cached process-wide so a stream of big frames does not fault pages in and out.
 * Any thread. A payload of a wg_message_t must come from wg_buf_alloc or wg_buf_alloc_from. */
void *wg_buf_alloc(size_t size);
void wg_buf_free(void *ptr); /* NULL is a no-op; any source's buffer */

/* A source of buffers of a special kind (e.g. page-locked host memory for a GPU's DMA), with
 * the same caching: alloc returns `bytes` bytes aligned to 64 or better (NULL on failure),
 * release frees what alloc returned. Ownership: the source and what it caches live until the
 * process exits; make one per kind, once. NULL when out of memory. Any thread. */
wg_buf_source_t *wg_buf_source_new(void *(*alloc)(size_t bytes), void (*release)(void *base));
/* Releases src's cached buffers and src itself: for a source whose every buffer came back
 * (tests; the transports keep theirs until the process exits). NULL is a no-op. */
void wg_buf_source_free(wg_buf_source_t *src);
/* A buffer of src (NULL: the default source, as wg_buf_alloc), freed with wg_buf_free. */
void *wg_buf_alloc_from(wg_buf_source_t *src, size_t size);
/* A buffer of src from its cache only (never src's alloc: for threads that must not call it,
 * e.g. page-locked memory, whose allocation waits for the whole GPU, outside the one thread
 * that allocates it); NULL when none is cached. */
void *wg_buf_take_cached(wg_buf_source_t *src, size_t size);
/* Allocates one more buffer of size bytes' class from src into its cache, when the cache
 * has room for it: 1 when it did. For the one thread that may call src's alloc. */
int wg_buf_cache_add(wg_buf_source_t *src, size_t size);
/* 1 when src's cache would keep a freed buffer of size bytes now (else it would release it). */
int wg_buf_cache_room(wg_buf_source_t *src, size_t size);
/* 1 when ptr (from wg_buf_alloc*) came from src (NULL: the default source), else 0. */
int wg_buf_is_from(const void *ptr, const wg_buf_source_t *src);

/* Matching rule for recv: a field equal to WG_ANY matches everything. */
#define WG_ANY UINT64_MAX
typedef struct wg_match {
  uint64_t src;   /* source rank or WG_ANY */
  uint64_t kinds; /* bit mask of (1u << wg_frame_kind); 0 = any kind */
  uint64_t round; /* or WG_ANY */
  uint64_t group; /* or WG_ANY */
  uint64_t seq;   /* or WG_ANY */
} wg_match_t;

/* Fills every field with WG_ANY (kinds with 0). */
void wg_match_any(wg_match_t *match);
/* 1 when header h matches the pattern, else 0 (transport.c; every transport's mailbox). */
int wg_match_frame(const wg_match_t *match, const wg_frame_header_t *h);

/* The data-plane secret of an epoch (wagma_comm_options_t.secret): NULL/0 = unauthenticated,
 * else at least WAGMA_SECRET_MIN_LEN bytes. Only read during open; the transport keeps no
 * copy. */
#define WG_TRANSPORT_HAS_SEAL 1 /* wg_transport_auth_t.seal exists (benchmarks build old trees) */
typedef struct wg_transport_auth {
  const uint8_t *secret;
  size_t secret_len;
  int seal; /* TCP: encrypt and authenticate every frame after the handshake (needs a secret;
               every member the same, or the handshake refuses the pair) */
} wg_transport_auth_t;

typedef struct wg_transport_config {
  const wagma_plan_t *plan; /* addresses of the members; only read during open */
  int rank;
  uint64_t epoch;
  size_t max_payload;           /* frames announcing more are rejected as WAGMA_EPROTO */
  size_t max_queued_bytes;      /* per peer outbound queue; beyond it the peer is declared dead */
  double connect_timeout_s;     /* members not connected by then are marked dead */
  wg_transport_auth_t auth;     /* peers must prove they hold the same secret */
  int device;                   /* NCCL: this rank's CUDA device (others ignore it) */
  int (*cancelled)(void *user); /* NULL, or polled during open: non-zero = give up (ECANCELED) */
  void *cancel_user;
  /* use_listen_fd 1: accept on a dup of listen_fd, a bound, listening socket, not binding */
  int use_listen_fd, listen_fd;
  wagma_log_fn log;
  void *log_user;
} wg_transport_config_t;

typedef struct wg_transport_stats {
  uint64_t bytes_sent;      /* payload + header bytes handed to the kernel */
  uint64_t bytes_received;  /* payload + header bytes of accepted frames */
  uint64_t frames_rejected; /* bad frames, and connections refused in the handshake */
} wg_transport_stats_t;

typedef struct wg_transport_ops {
  const char *name;

  /* Binds the address of cfg->rank, connects to every other member (retrying until the
   * connect deadline), runs the HELLO handshake (epoch, ranks, and a mutual proof of
   * cfg->auth's secret) on each connection and starts the progress thread. A connection that
   * fails the handshake is closed and counted in frames_rejected; it never stands for the
   * member it claimed. Members that did not connect in time are marked dead; that is not an
   * error. Returns WAGMA_EINVAL for a bad auth pair. Ownership: *out is the caller's, released
   * with close. */
  int (*open)(const wg_transport_config_t *cfg, wg_transport_t **out);

  /* Queues one frame for dst and returns without waiting for the wire: the header is
   * completed (magic, version, epoch, src, length) and the payload copied. Thread-safe; frames
   * to one peer leave in the order they were queued. Returns WAGMA_EPEER if dst is dead or
   * its queue overflowed (it is then marked dead), WAGMA_ECLOSED after close began. */
  int (*send)(wg_transport_t *t, int dst, wg_frame_header_t *header, const void *payload,
              size_t length);

  /* Takes the oldest mailbox message that matches, waiting until deadline (absolute
   * CLOCK_MONOTONIC seconds, see wg_now). Returns 0 and *out, WAGMA_ETIMEDOUT,
   * WAGMA_EPEER if match->src is a single rank that is dead and nothing matching is queued,
   * or WAGMA_ECLOSED (close began or interrupt was called). */
  int (*recv)(wg_transport_t *t, const wg_match_t *match, double deadline, wg_message_t **out);

  /* Optional (NULL in a transport without it; callers then use recv). The calling thread
   * becomes the reader of the connections of `ranks` (self, dead ranks and connections
   * another thread reads now are skipped, and taken later if they come free) until
   * reader_end: its recv_into calls with *out's reader read those sockets themselves and wait
   * on them (a wait costs one wake-up, with no hand-off from the progress thread), and it
   * writes the outbound queues of those peers while it waits. Frames it reads that its
   * current call does not want go to the mailbox, where other threads' recv find them as
   * before. While it waits on one of them for longer than a short grace time it reads all of
   * them, so frames for other threads (activations, failure notices) wait at most that long;
   * between its calls they stay in the kernel. Each connection is read by one thread at a
   * time. A reader is used by one thread; reader_end must come before close. Returns 0 or
   * WAGMA_ENOMEM. Ownership: *out is the caller's, released with reader_end. */
  int (*reader_begin)(wg_transport_t *t, const int *ranks, int n, wg_reader_t **out);

  /* Hands the connections back to the progress thread. Complete frames already read are in
   * the mailbox; NULL is a no-op. */
  void (*reader_end)(wg_transport_t *t, wg_reader_t *reader);
  /* Optional (NULL: callers use reader_end). As reader_end, but the connections go back to the
   * progress thread at once instead of lingering for the next session: for a thread whose next
   * operation is far off while other threads expect frames from the same peers. */
  void (*reader_release)(wg_transport_t *t, wg_reader_t *reader);

  /* recv with an optional reader (NULL: as recv) and an optional sink: with a sink, the
   * matching message's payload is copied to sink->dst (read straight from the socket into it
   * when the reader reads that connection), *out is left NULL, and a matching message whose
   * length is not sink->length is taken and dropped with WAGMA_EPROTO. Otherwise as recv.
   * Optional (NULL when reader_begin is NULL). */
  int (*recv_into)(wg_transport_t *t, wg_reader_t *reader, const wg_match_t *match, double deadline,
                   const wg_sink_t *sink, wg_message_t **out);

  /* Optional, with group_allreduce (NULL in a transport without collectives of its own:
   * callers run coll.c's over send and recv). 1 when group_allreduce can run round's
   * allreduce among exactly `ranks` (plan ranks, ascending) here: the communicator of that
   * round's group is up on every one of them (they said so) and none revoked it. What a
   * round's leader asks before it tells the contributors which way to go (all go the same
   * way). Any thread. */
  int (*group_ready)(wg_transport_t *t, uint64_t round, const int *ranks, int n);

  /* The SUM of count floats at src (host memory) over exactly `ranks` as ONE collective of
   * the transport's, for round `round` (its phase names the communicator): 0 and *sum, count
   * floats the transport owns, valid until the next call, the same bits on every rank.
   * WAGMA_EIO when there is no such collective here (group_ready said 0), WAGMA_ETIMEDOUT
   * when it did not complete by deadline, WAGMA_EPEER when a member gave up on it: after a
   * failure that group's collective is retired for the epoch (group_ready says 0, here and,
   * once told, on the other members). One caller at a time. */
  int (*group_allreduce)(wg_transport_t *t, const int *ranks, int n, uint64_t round,
                         const float *src, size_t count, double deadline, const float **sum);

  /* 1 if rank is connected and not declared dead, else 0. */
  int (*peer_alive)(wg_transport_t *t, int rank);

  /* Optional (NULL: never). 1 if rank is dead because it could not be reached: its
   * connection went silent (no acknowledgement for WG_TCP_SILENCE_S, no route), or at setup
   * no dial of mine reached it at the TCP level, with *since (may be NULL) the wg_now() time
   * of that death; 0 if it is alive, closed its side (its process is gone: the lease's
   * business, not the network's) or answered without finishing the handshake. */
  int (*peer_unreachable)(wg_transport_t *t, int rank, double *since);

  /* Wakes every recv waiter with WAGMA_ECLOSED, now and for every later recv. Used by the
   * engine to stop its round thread before close. */
  void (*interrupt)(wg_transport_t *t);

  void (*stats)(wg_transport_t *t, wg_transport_stats_t *out);

  /* Stops the progress thread, closes every socket, frees queued messages and frames. */
  void (*close)(wg_transport_t *t);
} wg_transport_ops_t;

extern const wg_transport_ops_t wg_tcp_transport;

/* The NCCL transport (nccl*.c, docs/design.md §6.4): only in builds with NCCL and the CUDA
 * runtime (WAGMA_HAVE_NCCL). Its open fails with WAGMA_EUNAVAIL without a usable device. */
extern const wg_transport_ops_t wg_nccl_transport;
/* 0 when CUDA device `device` is usable, else WAGMA_EUNAVAIL and a reason in err. */
int wg_nccl_device_check(int device, char *err, size_t err_len);

/* CLOCK_MONOTONIC in seconds (wg_mono of wagma/clock_internal.h); transport.c. */
double wg_now(void);

#endif
