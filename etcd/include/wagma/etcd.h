/* wagma/etcd.h — a small C client of etcd's v3 gRPC API (KV, Txn, Lease, Watch, Election).
 *
 * The only public header of libwagma_etcd. Everything here is thread-safe: one handle
 * (wagma_etcd_t) may be shared by any number of threads.
 *
 * Conventions
 * - Functions that can fail return 0 or a negative WAGMA_E* code (wagma/status.h):
 *     WAGMA_EUNAVAIL    no endpoint answered (all down, refused, no leader) before the deadline
 *     WAGMA_ETIMEDOUT   the call's deadline passed while an endpoint was working on it
 *     WAGMA_ENOTFOUND   key or lease does not exist
 *     WAGMA_ECONFLICT   a Txn's compares did not hold (the else branch ran)
 *     WAGMA_ECOMPACTED  the requested revision was compacted
 *     WAGMA_EINVAL      bad argument, or etcd rejected the request (INVALID_ARGUMENT)
 *     WAGMA_EPERM       authentication / permission denied: a wrong password, a user
 *                       without permission, etcd auth on and no user given, or a TLS
 *                       handshake that failed (wrong CA, missing or refused client cert)
 *     WAGMA_ECANCELED   canceled by the caller (election campaign)
 *     WAGMA_EPROTO      an answer that could not be decoded
 *   wagma_etcd_errmsg() gives the detail of the calling thread's last failure on a handle,
 *   naming the endpoint, the RPC and the gRPC status.
 * - Every call has a deadline: the handle's call_timeout_ms. Within it a call that meets an
 *   unreachable endpoint fails over to the next one (endpoints are tried round-robin,
 *   starting with the last one that worked).
 * - Keys are NUL-terminated strings. Values are bytes (pointer + length); values returned
 *   by the library are additionally NUL-terminated for convenience.
 * - Results that the library allocates are freed by the matching *_free function.
 * - Callbacks (watch events, lease loss, leader changes) run on a thread of the library,
 *   one thread per watch / keepalive; a callback must not stop its own watch or keepalive.
 */
#ifndef WAGMA_ETCD_H
#define WAGMA_ETCD_H

#include <stddef.h>
#include <stdint.h>

#include "wagma/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct wagma_etcd wagma_etcd_t;

/* ---- handle ------------------------------------------------------------------------- */

typedef struct wagma_etcd_options {
  const char *endpoints; /* "127.0.0.1:2379,127.0.0.1:22379" (an optional "http://" or
                            "https://" prefix on each; https:// turns TLS on); required */
  int call_timeout_ms;   /* deadline of every call, including failover; 0 = 5000 */
  wagma_log_fn log_fn;   /* may be NULL: the library never prints */
  void *log_user;
  /* TLS (any of these set, or an https:// endpoint, turns it on for every endpoint; a
   * plain "http://" endpoint is then refused). Files are PEM, read once by open. */
  const char *ca_file;   /* CAs that sign etcd's server certificates; NULL = gRPC's
                            default roots ($GRPC_DEFAULT_SSL_ROOTS_FILE_PATH or bundled) */
  const char *cert_file; /* client certificate (etcd --client-cert-auth); with key_file */
  const char *key_file;  /* its private key */
  /* etcd authentication (etcd's users): with a username the handle calls
   * Auth.Authenticate, sends the token as the "token" metadata of every call and stream,
   * and authenticates again (once per call) when etcd rejects the token (expired, an
   * etcd restart, a changed auth revision). NULL = no user (none needed, or etcd takes
   * the client certificate's CN as the user). */
  const char *username;
  const char *password;      /* its password; or NULL and password_file */
  const char *password_file; /* read at each authentication (a rotated secret is picked
                                up); trailing newlines are dropped */
  const char *ping_key;      /* key wagma_etcd_ping reads (count only); NULL = a key no
                                one uses. With etcd users, one the user may read. */
} wagma_etcd_options_t;

/* Creates a handle. Does not contact etcd (channels connect lazily; the first call
 * authenticates); use wagma_etcd_ping() to check reachability. WAGMA_EINVAL when the
 * options do not pass wagma_etcd_options_check. Caller owns *out; free with
 * wagma_etcd_close(). */
int wagma_etcd_open(const wagma_etcd_options_t *options, wagma_etcd_t **out);

/* Checks an endpoint list without opening anything: comma separated HOST:PORT entries (an
 * optional "http://" or "https://" and a trailing '/' are ignored, blank entries skipped, at
 * least one needed, http and https not mixed), HOST a name or IPv4 address of
 * [A-Za-z0-9._-] or a bracketed IPv6 address, PORT decimal in 1..65535; other schemes are
 * refused. Returns 0, or WAGMA_EINVAL with the entry and the reason in err (err_len bytes,
 * may be 0). Pure; thread-safe. */
int wagma_etcd_endpoints_check(const char *endpoints, char *err, size_t err_len);

/* Checks options as wagma_etcd_open does, without opening anything: the endpoints, the TLS
 * files (readable, PEM, cert_file and key_file together, no http:// endpoint with TLS),
 * the user (a password or a readable, non-empty password_file). 0, or WAGMA_EINVAL with
 * the reason in err. Thread-safe. */
int wagma_etcd_options_check(const wagma_etcd_options_t *options, char *err, size_t err_len);

/* Frees the handle. Every watch, keepalive and election of the handle must have been
 * stopped / closed first. NULL is a no-op. */
void wagma_etcd_close(wagma_etcd_t *etcd);

/* The detail of the calling thread's last failed call on this handle ("" if none). Valid
 * until this thread's next call on the handle. Never NULL. */
const char *wagma_etcd_errmsg(wagma_etcd_t *etcd);

/* A cheap read (Range on a key nobody uses) to check that some endpoint serves requests.
 * On success *revision (may be NULL) is the cluster's current revision. */
int wagma_etcd_ping(wagma_etcd_t *etcd, int64_t *revision);

/* ---- the daemons' etcd options and their start-up wait ------------------------------ */

/* The etcd options wagma-coordinator and wagma-agent share, parsed once here. Each program
 * lists them in its own getopt_long table with these values (its docs test reads the table
 * there), passes every option to wagma_etcd_cli_option, calls wagma_etcd_cli_finish after
 * the loop, wagma_etcd_cli_options to fill the handle's options, and wagma_etcd_wait_ready
 * once the handle is open:
 *   {"etcd", required_argument, 0, WAGMA_ETCD_CLI_ENDPOINTS},
 *   {"etcd-timeout-ms", required_argument, 0, WAGMA_ETCD_CLI_TIMEOUT_MS}, ... */
enum {
  WAGMA_ETCD_CLI_ENDPOINTS = 0x4500, /* --etcd ENDPOINTS */
  WAGMA_ETCD_CLI_TIMEOUT_MS,         /* --etcd-timeout-ms MS */
  WAGMA_ETCD_CLI_STARTUP_TIMEOUT,    /* --etcd-startup-timeout S */
  WAGMA_ETCD_CLI_CACERT,             /* --etcd-cacert FILE */
  WAGMA_ETCD_CLI_CERT,               /* --etcd-cert FILE */
  WAGMA_ETCD_CLI_KEY,                /* --etcd-key FILE */
  WAGMA_ETCD_CLI_USER,               /* --etcd-user NAME */
  WAGMA_ETCD_CLI_PASSWORD_FILE,      /* --etcd-password-file FILE */
};

/* The exit status of a daemon whose etcd did not answer within --etcd-startup-timeout, or
 * refused it (TLS, user or password). */
#define WAGMA_ETCD_EXIT_STARTUP 4

/* The parsed options. Strings point into argv or the environment: not owned, not copied. */
typedef struct wagma_etcd_cli {
  const char *endpoints;     /* --etcd (checked as wagma_etcd_endpoints_check); NULL = none */
  int call_timeout_ms;       /* --etcd-timeout-ms, 100..600000 (default 3000) */
  double startup_timeout_s;  /* --etcd-startup-timeout, 0..86400 (default 30; 0 = for ever) */
  const char *ca_file;       /* --etcd-cacert */
  const char *cert_file;     /* --etcd-cert */
  const char *key_file;      /* --etcd-key */
  const char *username;      /* --etcd-user */
  const char *password_file; /* --etcd-password-file */
  const char *password;      /* set by wagma_etcd_cli_finish: $WAGMA_ETCD_PASSWORD when a
                                user is given without a password file; else NULL */
} wagma_etcd_cli_t;

/* Sets the defaults: no endpoints, 3000 ms per call, 30 s at start-up, no TLS, no user. */
void wagma_etcd_cli_init(wagma_etcd_cli_t *cli);

/* Applies one getopt_long result: opt one of WAGMA_ETCD_CLI_*, arg its argument (kept by
 * pointer). Returns 1 when applied, 0 when opt is not one of them (nothing changed), or
 * WAGMA_EINVAL with the message for the user in err (without the program's name), e.g.
 * "--etcd-timeout-ms must be 100..600000". Numbers are read as strtod reads them (a
 * fraction or an exponent is taken; --etcd-timeout-ms drops the fraction), as wagma-agent
 * always did. */
int wagma_etcd_cli_option(wagma_etcd_cli_t *cli, int opt, const char *arg, char *err,
                          size_t err_len);

/* After the options: takes the password from $WAGMA_ETCD_PASSWORD when a user is given
 * without --etcd-password-file, then checks everything as wagma_etcd_open would
 * (wagma_etcd_options_check). 0, or WAGMA_EINVAL with "bad etcd options: <why>" in err.
 * Whether --etcd was given is the caller's check (each program words it its own way). */
int wagma_etcd_cli_finish(wagma_etcd_cli_t *cli, char *err, size_t err_len);

/* Fills endpoints, call_timeout_ms, the TLS files and the user of *out from cli; the other
 * fields (log_fn, log_user, ping_key) are left as they are. The strings stay cli's. */
void wagma_etcd_cli_options(const wagma_etcd_cli_t *cli, wagma_etcd_options_t *out);

/* Whether the handle will use TLS, as the daemons log it: a CA, a client certificate or an
 * https:// endpoint. */
int wagma_etcd_cli_tls(const wagma_etcd_cli_t *cli);

/* The usage lines of --etcd-timeout-ms ... --etcd-password-file, each description starting
 * at column (0-based; a longer flag gets two spaces), into out (len bytes, truncated).
 * Returns the length of the whole text, as snprintf does. */
int wagma_etcd_cli_usage(int column, char *out, size_t len);

/* Asked between two tries of wagma_etcd_wait_ready: nonzero = stop waiting. */
typedef int (*wagma_etcd_stop_fn)(void *user);

/* The start-up wait: pings etcd (wagma_etcd_ping) until it answers, at most limit_s
 * seconds (0 = for ever; each try may take one call_timeout_ms more), a try every 0.5 s,
 * with a warning through the handle's log_fn every 5 s ("waiting for etcd ENDPOINTS (N s so
 * far): ..."). endpoints is only named in the messages. stop (may be NULL) is asked after
 * each failed try. Returns 0 when etcd answered; WAGMA_EUNAVAIL when limit_s passed ("etcd
 * ENDPOINTS did not answer within N s (--etcd-startup-timeout): ...; giving up" in err);
 * the ping's error when etcd refused us, i.e. any error but WAGMA_EUNAVAIL and
 * WAGMA_ETIMEDOUT, e.g. WAGMA_EPERM for TLS or a user ("etcd ENDPOINTS refused us: ...");
 * WAGMA_ECANCELED when stop said so ("stopped while waiting for etcd"). Runs on the
 * calling thread. */
int wagma_etcd_wait_ready(wagma_etcd_t *etcd, const char *endpoints, double limit_s,
                          wagma_etcd_stop_fn stop, void *stop_user, char *err, size_t err_len);

/* ---- KV ----------------------------------------------------------------------------- */

typedef struct wagma_etcd_kv {
  char *key; /* NUL-terminated */
  size_t key_len;
  char *value; /* NUL-terminated; "" (value_len 0) in a keys_only range */
  size_t value_len;
  int64_t create_revision;
  int64_t mod_revision;
  int64_t version; /* 1 after create, +1 per put; 0 in a delete event */
  int64_t lease;   /* 0 = no lease */
} wagma_etcd_kv_t;

/* Frees one kv returned by wagma_etcd_get() / wagma_etcd_put_prev() etc. NULL is a no-op. */
void wagma_etcd_kv_free(wagma_etcd_kv_t *kv);

/* Puts key = value, attached to lease (0 = none). *revision (may be NULL) = the revision
 * of the put. */
int wagma_etcd_put(wagma_etcd_t *etcd, const char *key, const void *value, size_t value_len,
                   int64_t lease, int64_t *revision);

/* As wagma_etcd_put(), and returns the previous kv in *prev (caller frees with
 * wagma_etcd_kv_free; NULL when the key did not exist). */
int wagma_etcd_put_prev(wagma_etcd_t *etcd, const char *key, const void *value, size_t value_len,
                        int64_t lease, wagma_etcd_kv_t **prev, int64_t *revision);

/* Reads one key. WAGMA_ENOTFOUND when absent. Caller frees *kv with wagma_etcd_kv_free.
 * *revision (may be NULL) = the store's revision at the read. */
int wagma_etcd_get(wagma_etcd_t *etcd, const char *key, wagma_etcd_kv_t **kv, int64_t *revision);

typedef struct wagma_etcd_range_options {
  int prefix;       /* nonzero: every key that starts with key */
  int64_t limit;    /* max kvs returned; 0 = no limit */
  int64_t revision; /* read at this revision; 0 = latest */
  int keys_only;    /* values left out ("") */
  int count_only;   /* only count is filled in */
  /* > 0: only keys whose mod_revision >= min_mod_revision are returned (count still counts
   * every key of the range; limit then cuts the filtered answer, and more says so) */
  int64_t min_mod_revision;
} wagma_etcd_range_options_t;

typedef struct wagma_etcd_range {
  wagma_etcd_kv_t *kvs; /* n kvs sorted by key */
  size_t n;
  int64_t count;    /* number of keys in the range (may exceed n with a limit) */
  int more;         /* nonzero when the limit cut the answer short */
  int64_t revision; /* the store's revision at the read: watch from revision + 1 */
} wagma_etcd_range_t;

/* Frees the contents of a range result (not the struct itself); leaves it zeroed. */
void wagma_etcd_range_free(wagma_etcd_range_t *range);

/* Reads key (or the prefix key, see options; options may be NULL = exact key, latest).
 * An empty range is not an error (n = 0). WAGMA_ECOMPACTED when options->revision was
 * compacted. *out is filled in; caller frees with wagma_etcd_range_free. */
int wagma_etcd_range(wagma_etcd_t *etcd, const char *key, const wagma_etcd_range_options_t *options,
                     wagma_etcd_range_t *out);

/* Deletes key, or every key under prefix key when prefix != 0. *deleted (may be NULL) =
 * number of keys deleted (0 is not an error); *revision (may be NULL) = revision after. */
int wagma_etcd_delete(wagma_etcd_t *etcd, const char *key, int prefix, int64_t *deleted,
                      int64_t *revision);

/* ---- Txn ---------------------------------------------------------------------------- */

typedef enum wagma_etcd_cmp_target {
  WAGMA_ETCD_CMP_VERSION = 0, /* number: the key's version (0 = key absent) */
  WAGMA_ETCD_CMP_CREATE = 1,  /* number: create_revision (0 = key absent) */
  WAGMA_ETCD_CMP_MOD = 2,     /* number: mod_revision */
  WAGMA_ETCD_CMP_VALUE = 3,   /* value / value_len */
  WAGMA_ETCD_CMP_LEASE = 4,   /* number: the key's lease */
} wagma_etcd_cmp_target_t;

typedef enum wagma_etcd_cmp_result {
  WAGMA_ETCD_EQUAL = 0,
  WAGMA_ETCD_GREATER = 1,
  WAGMA_ETCD_LESS = 2,
  WAGMA_ETCD_NOT_EQUAL = 3,
} wagma_etcd_cmp_result_t;

/* "target(key) result operand", e.g. {key, CMP_MOD, EQUAL, 42} is mod_revision(key) == 42. */
typedef struct wagma_etcd_cmp {
  const char *key;
  wagma_etcd_cmp_target_t target;
  wagma_etcd_cmp_result_t result;
  int64_t number;    /* for VERSION, CREATE, MOD, LEASE */
  const void *value; /* for VALUE */
  size_t value_len;
} wagma_etcd_cmp_t;

typedef enum wagma_etcd_op_type {
  WAGMA_ETCD_OP_PUT = 0,
  WAGMA_ETCD_OP_DELETE = 1,
  WAGMA_ETCD_OP_RANGE = 2,
} wagma_etcd_op_type_t;

typedef struct wagma_etcd_op {
  wagma_etcd_op_type_t type;
  const char *key;
  const void *value; /* PUT */
  size_t value_len;  /* PUT */
  int64_t lease;     /* PUT; 0 = none */
  int prefix;        /* DELETE, RANGE: the whole prefix */
  int64_t limit;     /* RANGE; 0 = no limit */
} wagma_etcd_op_t;

typedef struct wagma_etcd_op_result {
  wagma_etcd_op_type_t type;
  wagma_etcd_range_t range; /* RANGE: the kvs (freed by wagma_etcd_txn_result_free) */
  int64_t deleted;          /* DELETE: keys deleted */
} wagma_etcd_op_result_t;

typedef struct wagma_etcd_txn_result {
  int succeeded;                   /* compares held: then ran; else: else ran */
  int64_t revision;                /* revision after the txn */
  wagma_etcd_op_result_t *results; /* one per op of the branch that ran */
  size_t n;
} wagma_etcd_txn_result_t;

/* Frees the contents of a txn result (not the struct itself); leaves it zeroed. */
void wagma_etcd_txn_result_free(wagma_etcd_txn_result_t *result);

/* Atomically: if every cmp holds, run then_ops, else run else_ops. Returns 0 when the
 * compares held, WAGMA_ECONFLICT when they did not (else_ops ran; not a failure of the
 * call), or an error. result (may be NULL) is filled in on 0 and on WAGMA_ECONFLICT;
 * caller frees it with wagma_etcd_txn_result_free. */
int wagma_etcd_txn(wagma_etcd_t *etcd, const wagma_etcd_cmp_t *cmps, size_t n_cmps,
                   const wagma_etcd_op_t *then_ops, size_t n_then, const wagma_etcd_op_t *else_ops,
                   size_t n_else, wagma_etcd_txn_result_t *result);

/* ---- Leases ------------------------------------------------------------------------- */

/* Grants a lease of ttl_s seconds (etcd may raise it to its minimum). *lease = its id. */
int wagma_etcd_lease_grant(wagma_etcd_t *etcd, int64_t ttl_s, int64_t *lease);

/* Revokes the lease: every key attached to it is deleted. WAGMA_ENOTFOUND if unknown. */
int wagma_etcd_lease_revoke(wagma_etcd_t *etcd, int64_t lease);

/* Remaining and granted TTL in seconds (either may be NULL). WAGMA_ENOTFOUND when the
 * lease expired or never existed. */
int wagma_etcd_lease_ttl(wagma_etcd_t *etcd, int64_t lease, int64_t *remaining_s,
                         int64_t *granted_s);

/* Refreshes the lease once. *ttl_s (may be NULL) = TTL after the refresh. WAGMA_ENOTFOUND
 * when the lease is gone. */
int wagma_etcd_lease_keepalive_once(wagma_etcd_t *etcd, int64_t lease, int64_t *ttl_s);

typedef struct wagma_etcd_keepalive wagma_etcd_keepalive_t;

/* Called once, on the keepalive's thread, when the lease is lost: status WAGMA_ENOTFOUND
 * (etcd says it expired or was revoked) or WAGMA_ETIMEDOUT (no refresh succeeded within
 * the lease's TTL, so etcd must be assumed to have expired it). The keepalive then stops
 * refreshing; the caller still calls wagma_etcd_keepalive_stop() (from another thread). */
typedef void (*wagma_etcd_lease_lost_fn)(void *user, int64_t lease, int status);

/* Starts a thread that refreshes lease every third of its TTL, across endpoint failures,
 * until stopped: after a failed refresh it retries every 500 ms, and at once when another
 * call or watch of the handle finds etcd serving again. lost (may be NULL) is called as
 * above. Caller owns *out. */
int wagma_etcd_keepalive_start(wagma_etcd_t *etcd, int64_t lease, wagma_etcd_lease_lost_fn lost,
                               void *user, wagma_etcd_keepalive_t **out);

/* Stops and joins the keepalive thread and frees it; does not revoke the lease. Must not
 * be called from the lost callback. NULL is a no-op. */
void wagma_etcd_keepalive_stop(wagma_etcd_keepalive_t *keepalive);

/* ---- Watch -------------------------------------------------------------------------- */

typedef enum wagma_etcd_event_type {
  WAGMA_ETCD_EVENT_PUT = 0,
  WAGMA_ETCD_EVENT_DELETE = 1,
} wagma_etcd_event_type_t;

typedef struct wagma_etcd_event {
  wagma_etcd_event_type_t type;
  wagma_etcd_kv_t kv;       /* DELETE: key and mod_revision (= the delete's revision) */
  wagma_etcd_kv_t *prev_kv; /* only with prev_kv requested and known; else NULL */
} wagma_etcd_event_t;

/* Watch callback, on the watch's thread, strictly in revision order, never twice:
 * - status 0: n events (n >= 1); revision = the revision of the last event.
 * - status WAGMA_ECOMPACTED: the watch's next revision was compacted; revision = etcd's
 *   compact revision; n = 0. The watch is over (no further callbacks): the caller reads
 *   the state again (wagma_etcd_range) and starts a new watch from range.revision + 1.
 * events and everything in them are valid only during the call. */
typedef void (*wagma_etcd_watch_fn)(void *user, int status, const wagma_etcd_event_t *events,
                                    size_t n, int64_t revision);

typedef struct wagma_etcd_watch_options {
  int prefix;             /* watch every key under key */
  int64_t start_revision; /* first revision to deliver; 0 = changes after the watch starts */
  int prev_kv;            /* deliver the previous kv with each event */
} wagma_etcd_watch_options_t;

typedef struct wagma_etcd_watch wagma_etcd_watch_t;

/* Starts a watch on key (options may be NULL: exact key, from now). Returns once etcd has
 * confirmed the watch (or the handle's deadline passed: WAGMA_EUNAVAIL/ETIMEDOUT), so a
 * change made after the return is always delivered. When the connection breaks or etcd
 * restarts, the watch reconnects (any endpoint, with backoff) and resumes from the last
 * delivered revision + 1. Caller owns *out. */
int wagma_etcd_watch_start(wagma_etcd_t *etcd, const char *key,
                           const wagma_etcd_watch_options_t *options, wagma_etcd_watch_fn fn,
                           void *user, wagma_etcd_watch_t **out);

/* Cancels the watch, joins its thread and frees it. After return no callback runs. Must
 * not be called from the watch's own callback. NULL is a no-op. */
void wagma_etcd_watch_stop(wagma_etcd_watch_t *watch);

/* ---- Election (etcd's v3electionpb.Election service) -------------------------------- */

typedef struct wagma_etcd_election wagma_etcd_election_t;

/* An election named name (a key prefix, e.g. "/wagma/coordinator/election"). Candidates
 * hold keys "<name>/<lease id in hex>" attached to their lease; the oldest is the leader.
 * Caller owns *out; free with wagma_etcd_election_close. */
int wagma_etcd_election_open(wagma_etcd_t *etcd, const char *name, wagma_etcd_election_t **out);

/* Frees the election (does not resign: the lease's expiry or revoke ends the candidacy).
 * NULL is a no-op. */
void wagma_etcd_election_close(wagma_etcd_election_t *election);

/* Becomes a candidate under lease with value (e.g. our id and address) and blocks until
 * we are the leader (0), timeout_ms passes (WAGMA_ETIMEDOUT; timeout_ms <= 0 = wait
 * forever), wagma_etcd_election_cancel() is called (WAGMA_ECANCELED), or an error. On
 * timeout or cancel we are no longer a candidate. The lease must be kept alive by the
 * caller (wagma_etcd_keepalive_start) for as long as we want to lead. */
int wagma_etcd_election_campaign(wagma_etcd_election_t *election, int64_t lease, const void *value,
                                 size_t value_len, int timeout_ms);

/* Makes a blocked wagma_etcd_election_campaign() return WAGMA_ECANCELED. Any thread. */
void wagma_etcd_election_cancel(wagma_etcd_election_t *election);

/* Updates the value the leader shows (we must be the leader: else WAGMA_EPERM). */
int wagma_etcd_election_proclaim(wagma_etcd_election_t *election, const void *value,
                                 size_t value_len);

/* Gives up leadership (deletes our key, the next candidate becomes leader). A no-op
 * returning 0 when we are not leading. */
int wagma_etcd_election_resign(wagma_etcd_election_t *election);

/* Nonzero while this election object believes it leads (after a successful campaign and
 * before resign / close). Leadership is really lost when the lease is lost. */
int wagma_etcd_election_is_leader(wagma_etcd_election_t *election);

/* The current leader of the election name: its kv (key, value = the leader's proclaimed
 * value, lease). WAGMA_ENOTFOUND when there is no leader. Caller frees *leader with
 * wagma_etcd_kv_free. */
int wagma_etcd_election_leader(wagma_etcd_t *etcd, const char *name, wagma_etcd_kv_t **leader);

/* Leader-change callback: leader is the new leader's kv, or NULL when there is none.
 * Valid only during the call. */
typedef void (*wagma_etcd_leader_fn)(void *user, const wagma_etcd_kv_t *leader);

/* Observes the election name: calls fn once with the current leader (or NULL) and then
 * each time the leader or its value changes, on the watch's thread. Stop with
 * wagma_etcd_watch_stop(*out). */
int wagma_etcd_election_observe(wagma_etcd_t *etcd, const char *name, wagma_etcd_leader_fn fn,
                                void *user, wagma_etcd_watch_t **out);

#ifdef __cplusplus
}
#endif
#endif
