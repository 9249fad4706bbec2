/* tcp_internal.h — state shared by tcp.c (progress thread, ops) and tcp_mesh.c (connection
 * setup and its authenticated handshake). Private to the TCP transport. */
#ifndef WAGMA_COLLECTIVE_TCP_INTERNAL_H
#define WAGMA_COLLECTIVE_TCP_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <openssl/evp.h>

#include "transport.h"

#define WG_TCP_DEFAULT_MAX_PAYLOAD ((size_t)256 << 20) /* max_payload 0 means this */
#define WG_TCP_DEFAULT_MAX_QUEUED ((size_t)1 << 30)    /* max_queued_bytes 0 means this */
#define WG_TCP_DEFAULT_CONNECT_S 10.0                  /* connect_timeout_s <= 0 means this */
#define WG_TCP_CLOSE_LINGER_S 2.0     /* close flushes queued frames for at most this long */
#define WG_TCP_RCVBUF_BYTES (4 << 20) /* SO_RCVBUF of every data-plane socket (tcp_mesh.c) */
/* A connection whose peer's kernel acknowledges nothing for about this long fails as silent
 * (tcp.c check_silence while data is in flight, keepalive probes every second while it is
 * idle; tcp_mesh.c): a dropped link is seen within seconds, not after minutes of
 * retransmission back-off. A stopped (SIGSTOP) peer's kernel still acknowledges, zero-window
 * probes included, so a frozen member is not taken for a cut one. */
#define WG_TCP_SILENCE_S 3
/* A dialer drops a handshake that takes longer than this; an acceptor allows 1 s more. */
#define WG_TCP_HELLO_TIMEOUT_S 3.0
/* An acceptor drops a connection whose step 1 has not arrived this long after the accept (a
 * dialer sends it as soon as it is connected). */
#define WG_TCP_HELLO_SILENT_S 1.0

/* The HELLO handshake (tcp_mesh.c), three HELLO frames whose seq is the step:
 *   1 dialer -> acceptor: payload nonce_d
 *   2 acceptor -> dialer: payload nonce_a | proof("acceptor")
 *   3 dialer -> acceptor: payload proof("dialer")
 * flags has WG_HELLO_F_AUTH when the sender holds a secret; aux is nranks. */
#define WG_HELLO_NONCE_LEN 32
#define WG_HELLO_PROOF_LEN 32 /* HMAC-SHA256 */
#define WG_HELLO_F_AUTH 1u
#define WG_HELLO_F_SEAL 2u /* the sender seals its frames after the handshake (tcp_seal.c) */
#define WG_HELLO_STEP1_LEN WG_HELLO_NONCE_LEN
#define WG_HELLO_STEP2_LEN (WG_HELLO_NONCE_LEN + WG_HELLO_PROOF_LEN)
#define WG_HELLO_STEP3_LEN WG_HELLO_PROOF_LEN
#define WG_HELLO_MAX_LEN WG_HELLO_STEP2_LEN

typedef enum wg_hello_side { WG_HELLO_DIALER = 'D', WG_HELLO_ACCEPTOR = 'A' } wg_hello_side_t;

/* Sealed frames (tcp_seal.c): AES-256-GCM, a key per direction of a connection. */
#define WG_SEAL_KEY_LEN 32
#define WG_SEAL_TAG_LEN 16
typedef struct wg_seal {
  EVP_CIPHER_CTX *tx, *rx; /* NULL: not sealed */
  uint64_t tx_count;       /* frames sealed: the next one's nonce */
  uint64_t rx_count;       /* frames opened */
} wg_seal_t;

/* Keys both contexts (a previous pair is freed first); counts from 0. 0 or WAGMA_EIO. */
int wg_seal_init(wg_seal_t *seal, const uint8_t tx_key[WG_SEAL_KEY_LEN],
                 const uint8_t rx_key[WG_SEAL_KEY_LEN]);
void wg_seal_free(wg_seal_t *seal);
/* Encrypts length bytes of payload into out (length bytes; may not overlap) under the next
 * nonce, with header (encoded, as sent) authenticated too; the tag into tag. 0 or WAGMA_EIO. */
int wg_seal_frame(wg_seal_t *seal, const uint8_t header[WG_FRAME_HEADER_SIZE],
                  const uint8_t *payload, size_t length, uint8_t *out,
                  uint8_t tag[WG_SEAL_TAG_LEN]);
/* Decrypts payload in place and checks the tag over header and payload under the next
 * nonce: 0, or WAGMA_EPROTO (forged, altered, replayed or reordered: payload wiped), or
 * WAGMA_EIO (libcrypto failed). */
int wg_seal_open_frame(wg_seal_t *seal, const uint8_t header[WG_FRAME_HEADER_SIZE],
                       uint8_t *payload, size_t length, const uint8_t tag[WG_SEAL_TAG_LEN]);

/* One queued outbound frame: the bytes still to write (header and payload, contiguous). */
typedef struct wg_out_frame {
  struct wg_out_frame *next;
  size_t len;
  uint8_t data[];
} wg_out_frame_t;

/* Who reads a peer's socket (wg_tcp_peer_t.reader). LINGER: a reader session ended and
 * left it to the next session for a moment (tcp.c, LINGER_S); nobody reads it, EPOLLIN stays
 * off, and the progress thread takes it back when the moment has passed. */
enum { WG_RD_FREE = 0, WG_RD_PROGRESS = 1, WG_RD_CALLER = 2, WG_RD_LINGER = 3 };

typedef struct wg_tcp_peer {
  int rank;
  int fd;          /* connected socket or -1; closed only by close() */
  atomic_int dead; /* 1: never connected, failed, said BYE or sent a bad frame */
  /* Set with dead, before it: 1 when the peer was never reached or its connection went silent
   * (timed out, no route), 0 when it closed or misbehaved (its process is gone or broken);
   * dead_ns: CLOCK_MONOTONIC ns of the death (tcp_peer_unreachable). */
  atomic_int silent;
  atomic_uint_fast64_t dead_ns;
  int dialed_tcp; /* tcp_mesh.c: a dial of mine to this rank got a TCP connection once */
  /* fd >= 0 only for a connection that completed the handshake as this rank; every frame
   * read from it must carry src == rank (tcp.c), so a BYE or bad frame only ends this rank */

  /* Outbound queue, guarded by out_lock. Whoever writes to the socket holds out_lock: a
   * sender writes directly only when the queue is empty; the progress thread, or a reader
   * session of this peer while it waits, writes the head of a non-empty queue and pops it. So
   * frames leave in the order they were queued. */
  pthread_mutex_t out_lock;
  wg_out_frame_t *out_head, *out_tail;
  size_t out_head_off; /* bytes of out_head already written */
  size_t out_queued;   /* bytes still to write over the whole queue */

  /* Who reads fd: WG_RD_FREE, WG_RD_PROGRESS (the progress thread, for one wake-up) or
   * WG_RD_CALLER (a caller's reader session, tcp.c). Taken by compare-and-swap from FREE; the
   * holder alone reads fd and owns the inbound state machine below. */
  atomic_int reader;
  atomic_int claim_waiting; /* a reader session wants it: wake it when the progress thread
                               gives it back */
  atomic_uint_fast64_t linger_until_ns; /* WG_RD_LINGER ends then (CLOCK_MONOTONIC ns) */

  /* The epoll registration of fd, guarded by ev_lock: EPOLLIN unless a caller reads fd,
   * EPOLLOUT while the progress thread waits to write (ev_out). ev_removed: 1 the fd left
   * the set for good (dead), 2 it left while a caller reads it (an error or hang-up event;
   * added back when the caller lets go). */
  pthread_mutex_t ev_lock;
  uint32_t ev_mask;
  int ev_out;
  int ev_removed;

  /* Inbound state machine, owned by the reader holder. */
  uint8_t in_hdr[WG_FRAME_HEADER_SIZE];
  size_t in_hdr_got;
  wg_message_t *in_msg; /* frame whose payload is being read */
  size_t in_payload_got;
  uint8_t *in_sink; /* non-NULL: in_msg's payload goes here (a caller's recv_into sink), and
                       in_msg->payload is NULL */
  int in_big;       /* the last frame was large: read the next header alone, then its payload
                       in place (tcp.c) */
  int in_tag_phase; /* sealed: in_msg's payload is complete, its tag is being read */
  size_t in_tag_got;
  uint8_t in_tag[WG_SEAL_TAG_LEN];

  /* Sealed transport: this connection's keys (set by tcp_mesh.c with fd; tx under out_lock,
   * rx by the reader holder). */
  wg_seal_t seal;
} wg_tcp_peer_t;

struct wg_transport {
  int rank;
  int nranks;
  uint64_t epoch;
  size_t max_payload;
  size_t max_queued;
  double connect_timeout_s;
  int listen_fd; /* the caller's bound, listening socket (not ours: the mesh dups it), or -1 */
  int sealed;    /* every frame after the handshake is sealed (tcp_seal.c) */
  wagma_log_fn log;
  void *log_user;

  wg_tcp_peer_t *peers; /* nranks entries; peers[rank] is me (fd -1) */
  int epfd;
  int wakefd;  /* eventfd: senders and close wake the progress thread */
  int intrfd;  /* eventfd, written once by interrupt and close: wakes reader sessions' waits */
  int timerfd; /* the progress thread takes lingering sockets back when it fires */
  pthread_mutex_t linger_lock;
  uint64_t timer_armed_ns;    /* guarded by linger_lock: when timerfd fires, 0 = disarmed */
  uint8_t *scratch;           /* the progress thread's read buffer */
  void *_Atomic spare_reader; /* an ended reader session, kept for the next one */
  pthread_t thread;
  int thread_started;
  atomic_int closing;
  atomic_int bye_sent; /* close began: EOFs from peers are expected from now on */

  pthread_mutex_t mbox_lock;
  pthread_cond_t mbox_cond; /* CLOCK_MONOTONIC; broadcast on every arrival and death */
  wg_message_t *mbox_head, *mbox_tail;
  atomic_int interrupted; /* set under mbox_lock (condvar waiters), read anywhere */

  atomic_uint_fast64_t bytes_sent;
  atomic_uint_fast64_t bytes_received;
  atomic_uint_fast64_t frames_rejected;
};

/* Connects the mesh (tcp_mesh.c): binds plan->members[t->rank].address, dials the members
 * of lower rank, accepts the members of higher rank, runs the HELLO handshake with auth's
 * secret on each connection, until all are connected or deadline. Host names are resolved
 * once each, off the calling thread (short-lived resolver threads), and never past deadline.
 * Fills peers[].fd (blocking mode undefined, caller sets it) only with connections that
 * completed the handshake; members left unconnected (their name did not resolve either) keep
 * fd -1. cancelled (may be NULL) is polled at least every 50 ms. Returns 0, WAGMA_EINVAL (a
 * malformed own address, or an own host name that failed to resolve until deadline),
 * WAGMA_ETIMEDOUT (the resolver gave no answer for the own host name by deadline), WAGMA_EIO
 * (cannot bind or listen, or start a resolver thread) or WAGMA_ECANCELED (cancelled returned
 * non-zero). */
int wg_tcp_mesh_connect(struct wg_transport *t, const wagma_plan_t *plan,
                        const wg_transport_auth_t *auth, double deadline, int (*cancelled)(void *),
                        void *cancel_user);

/* The proof one side of a handshake sends (tcp_mesh.c; exported for the tests' raw peers):
 * HMAC-SHA256 keyed with the secret (an empty key when auth has none) over "wagma-hello-v1",
 * the side, epoch, dialer rank, acceptor rank, nranks, nonce_d and nonce_a. The side label
 * keeps one direction's proof from being reflected as the other's. Returns 0, WAGMA_EINVAL
 * (a secret over INT_MAX bytes) or WAGMA_EIO (libcrypto failed). Any thread. */
int wg_tcp_hello_proof(const wg_transport_auth_t *auth, wg_hello_side_t side, uint64_t epoch,
                       int dialer, int acceptor, int nranks,
                       const uint8_t nonce_d[WG_HELLO_NONCE_LEN],
                       const uint8_t nonce_a[WG_HELLO_NONCE_LEN], uint8_t out[WG_HELLO_PROOF_LEN]);
/* The same MAC under another label: the proof is label "wagma-hello-v1"; the key of the
 * frames one side seals is label "wagma-seal-v1" (never sent). */
int wg_tcp_hello_mac(const wg_transport_auth_t *auth, const char *label, wg_hello_side_t side,
                     uint64_t epoch, int dialer, int acceptor, int nranks,
                     const uint8_t nonce_d[WG_HELLO_NONCE_LEN],
                     const uint8_t nonce_a[WG_HELLO_NONCE_LEN], uint8_t out[WG_HELLO_PROOF_LEN]);

/* Parses "host:port" or "[v6]:port" into host (NUL-terminated) and port. */
int wg_tcp_parse_address(const char *address, char *host, size_t host_len, char *port,
                         size_t port_len);

#endif
