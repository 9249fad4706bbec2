/* etcd_internal.h — private to libwagma_etcd: the handle, the unary-call engine with
 * failover, the stream helper, and kv conversion. Nothing outside etcd/ includes this. */
#ifndef WAGMA_ETCD_INTERNAL_H
#define WAGMA_ETCD_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include <grpc/grpc.h>

#include "etcd_v3.pb-c.h"
#include "wagma/etcd.h"
#include "wagma/log_internal.h"

#define WG_ETCD_ERRMSG_MAX 512

/* Per-thread detail message slot of one handle (linked so close can free them all). */
struct wg_etcd_errslot {
  struct wg_etcd_errslot *next;
  char msg[WG_ETCD_ERRMSG_MAX];
};

/* A channel of one endpoint, shared by the calls created on it. refs (under etcd->lock):
 * one for the handle while it is the endpoint's current channel, one per call or stream
 * created on it; the last release destroys it. TLS rotation replaces the current channel and
 * drops the handle's ref, so calls in flight finish on the channel they started on. */
typedef struct wg_etcd_channel {
  grpc_channel *channel;
  int refs;
} wg_etcd_channel_t;

/* What identifies a TLS file's content without reading it (stat of the file a path names,
 * symbolic links followed: Kubernetes swaps a Secret volume's ..data link). */
typedef struct wg_etcd_file_sig {
  unsigned long long dev, ino, size;
  long long mtime_ns;
  int missing;
} wg_etcd_file_sig_t;

struct wagma_etcd {
  char **endpoints;             /* host:port, n_endpoints of them */
  wg_etcd_channel_t **channels; /* the current channel of each endpoint, under lock */
  size_t n_endpoints;
  int call_timeout_ms;
  wagma_log_fn log_fn;
  void *log_user;
  pthread_mutex_t lock; /* guards preferred, slots, failing, keepalives and channels */
  size_t preferred;     /* index of the endpoint that last worked */
  pthread_key_t errkey;
  struct wg_etcd_errslot *slots;
  int failing; /* a call or stream failed for want of etcd since the last success */
  struct wagma_etcd_keepalive *keepalives; /* running keepalives, woken when etcd is back */
  char *ping_key;                          /* NULL = the library's probe key */
  /* security.c: TLS and etcd authentication */
  int tls;                   /* channels use SSL credentials */
  char *username;            /* NULL = no Authenticate */
  char *password;            /* NULL with password_file */
  char *password_file;       /* re-read at each authentication */
  pthread_mutex_t auth_lock; /* serializes Authenticate; guards token and token_gen */
  char *token;               /* NULL = none yet (or rejected); "" = etcd auth is off */
  uint64_t token_gen;        /* bumped by each authentication */
  /* security.c: the TLS files, re-read when they change (wg_etcd_tls_changed) */
  char *tls_paths[3];             /* CA, client certificate, key; NULL = not given */
  wg_etcd_file_sig_t tls_sigs[3]; /* as of the credentials in use */
  int64_t tls_checked_ms;         /* last look (monotonic ms) */
  int tls_unreadable;             /* the last change did not read: said once */
  pthread_mutex_t tls_lock;       /* guards the three above; never held with lock */
};

/* Lets another thread cancel a call in flight (election campaign, watch stream). */
typedef struct wg_etcd_cancel {
  pthread_mutex_t lock;
  grpc_call *call; /* the call in flight, or NULL */
  int canceled;
} wg_etcd_cancel_t;

void wg_etcd_cancel_init(wg_etcd_cancel_t *cancel);
void wg_etcd_cancel_destroy(wg_etcd_cancel_t *cancel);
/* Marks canceled and cancels the call in flight, if any. Any thread. */
void wg_etcd_cancel_fire(wg_etcd_cancel_t *cancel);

/* Milliseconds on the monotonic clock. */
int64_t wg_etcd_now_ms(void);

/* Records the calling thread's detail message on the handle (printf-style). */
void wg_etcd_set_error(wagma_etcd_t *etcd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Maps a gRPC status (and etcd's detail text) to a WAGMA_E* code. */
int wg_etcd_map_status(grpc_status_code code, const char *details);

/* ---- security.c: TLS credentials and the auth token ---- */

/* Checks the TLS and user options (not the endpoints): 0 or WAGMA_EINVAL with err. *tls =
 * whether any TLS option is set. */
int wg_etcd_security_check(const wagma_etcd_options_t *options, int *tls, char *err,
                           size_t err_len);
/* Channel credentials: SSL (with the CA and the client pair read from the files) when tls,
 * else insecure. Caller releases. NULL on failure (err says why). */
grpc_channel_credentials *wg_etcd_credentials(const wagma_etcd_options_t *options, int tls,
                                              char *err, size_t err_len);
/* Copies the user options into the handle (auth_lock already initialized); 0 or
 * WAGMA_ENOMEM. wg_etcd_auth_destroy frees what it and wg_etcd_tls_init copied (also after a
 * failure) and destroys auth_lock and tls_lock. */
int wg_etcd_auth_init(wagma_etcd_t *etcd, const wagma_etcd_options_t *options);
/* Remembers the TLS files of options and their signatures (tls_lock already initialized);
 * 0 or WAGMA_ENOMEM. Freed by wg_etcd_auth_destroy. */
int wg_etcd_tls_init(wagma_etcd_t *etcd, const wagma_etcd_options_t *options);
/* TLS rotation: at most once a second (WG_ETCD_TLS_CHECK_MS), looks whether a TLS file
 * changed (a renewed certificate, a new CA bundle, a Secret updated in place) and, when one
 * did, reads them all again: new credentials (caller releases), or NULL when nothing changed,
 * another thread is looking, or the files do not read as PEM yet (logged; tried again at the
 * next look, so a file caught half-written is read again once complete). Any thread. */
#define WG_ETCD_TLS_CHECK_MS 1000
grpc_channel_credentials *wg_etcd_tls_changed(wagma_etcd_t *etcd);
void wg_etcd_auth_destroy(wagma_etcd_t *etcd);
/* The token to send on a call: *token NULL when the handle has no user or etcd's auth is
 * off (send none), else a copy (caller frees); *gen its generation. Authenticates first
 * when there is no token (one thread at a time; the others wait and reuse its token),
 * within deadline_ms (absolute, monotonic). Errors: Authenticate's (WAGMA_EPERM for a wrong
 * password), with the thread's detail message set. */
int wg_etcd_token(wagma_etcd_t *etcd, int64_t deadline_ms, char **token, uint64_t *gen);
/* etcd rejected the token of generation gen: the next wg_etcd_token authenticates again. */
void wg_etcd_token_reject(wagma_etcd_t *etcd, uint64_t gen);
/* Nonzero when a call's status says the token was rejected (expired or unknown token, an
 * auth revision that changed, no token where etcd wants one). */
int wg_etcd_token_rejected(grpc_status_code code, const char *details);

/* wg_etcd_unary with the token given (NULL = none) and no re-authentication: security.c
 * runs Authenticate through it. *rejected (may be NULL) is set when etcd rejected the token. */
int wg_etcd_unary_token(wagma_etcd_t *etcd, const char *method, const ProtobufCMessage *request,
                        const ProtobufCMessageDescriptor *response_type,
                        ProtobufCMessage **response, int64_t deadline_ms, wg_etcd_cancel_t *cancel,
                        const char *token, int *rejected);

/* One unary RPC (also used for one request/one answer on a bidi stream such as
 * LeaseKeepAlive) with failover across endpoints until deadline_ms (absolute, monotonic;
 * <= 0 = the handle's call timeout from now). request is packed; on 0, *response is the
 * decoded answer (caller frees with protobuf_c_message_free_unpacked). cancel may be NULL.
 * Errors: mapped status, with the thread's detail message set. */
int wg_etcd_unary(wagma_etcd_t *etcd, const char *method, const ProtobufCMessage *request,
                  const ProtobufCMessageDescriptor *response_type, ProtobufCMessage **response,
                  int64_t deadline_ms, wg_etcd_cancel_t *cancel);

/* A long-lived bidi/server stream on one endpoint, driven by one thread. */
typedef struct wg_etcd_stream {
  wagma_etcd_t *etcd;
  size_t endpoint;
  grpc_completion_queue *cq;
  grpc_call *call;
  grpc_metadata_array initial_md;
  int initial_md_pending;
  uint64_t token_gen;         /* generation of the token the stream was opened with */
  wg_etcd_channel_t *channel; /* held while the stream lives */
} wg_etcd_stream_t;

/* Opens the stream on endpoint index and sends first (initial metadata with the token +
 * message). The call is registered in cancel (which must stay valid until wg_etcd_stream_close). */
int wg_etcd_stream_open(wg_etcd_stream_t *stream, wagma_etcd_t *etcd, size_t endpoint,
                        const char *method, const ProtobufCMessage *first,
                        wg_etcd_cancel_t *cancel);
/* Receives one message. timeout_ms < 0: wait until a message, the end of the stream or a
 * cancel. On a timeout the call is canceled and WAGMA_ETIMEDOUT returned. The end of the
 * stream or a failure returns an error (the status once the stream is closed). */
int wg_etcd_stream_recv(wg_etcd_stream_t *stream, const ProtobufCMessageDescriptor *type,
                        ProtobufCMessage **message, int timeout_ms);
/* Cancels (if still open), collects the status, frees everything, unregisters from cancel.
 * Returns the mapped final status and records the message when it is an error. */
int wg_etcd_stream_close(wg_etcd_stream_t *stream, const char *method, wg_etcd_cancel_t *cancel);

/* Endpoint to start with, and note which one worked / failed. set_preferred is called on
 * every success (a unary answer, a confirmed watch): after a failure it also wakes the
 * handle's keepalives so that they refresh at once (etcd is serving again). */
size_t wg_etcd_preferred(wagma_etcd_t *etcd);
void wg_etcd_set_preferred(wagma_etcd_t *etcd, size_t endpoint);
/* Notes that a call or stream found no etcd to serve it (unavailable or timed out). */
void wg_etcd_note_failure(wagma_etcd_t *etcd);
/* lease.c: wakes every keepalive of the handle for an immediate refresh. Caller holds
 * etcd->lock. */
void wg_etcd_kick_keepalives_locked(wagma_etcd_t *etcd);

/* Copies a protobuf KeyValue into a wagma_etcd_kv_t (fields allocated). */
int wg_etcd_kv_copy(wagma_etcd_kv_t *dst, const Etcdserverpb__KeyValue *src);
/* Frees the fields of a kv filled by wg_etcd_kv_copy (not the struct). */
void wg_etcd_kv_clear(wagma_etcd_kv_t *kv);

/* range_end for a prefix: key with its last byte below 0xff incremented (etcd's rule);
 * "\0" (all keys) when every byte is 0xff. Caller frees *end. */
int wg_etcd_prefix_end(const char *key, uint8_t **end, size_t *end_len);

/* Starts a watch thread (watch.c): a plain watch (fn) or an election observer (leader_fn
 * with election = the election name, key = its prefix). Waits for etcd's confirmation. */
int wg_etcd_watch_begin(wagma_etcd_t *etcd, const char *key, int prefix, int64_t start_rev,
                        int prev_kv, wagma_etcd_watch_fn fn, wagma_etcd_leader_fn leader_fn,
                        const char *election, void *user, wagma_etcd_watch_t **out);

#endif
