/* client.c — the etcd handle: endpoints and their gRPC channels, the unary-call engine
 * with deadline and failover, the stream helper used by watch, status mapping and the
 * per-thread detail messages.
 *
 * Owns: the current grpc_channel of each endpoint (thread-safe in gRPC; refcounted here, see
 * wg_etcd_channel_t: a call holds the channel it was created on), the errslot list; holds
 * the list of running keepalives (owned by lease.c) under `lock`.
 * Threads: none of its own; any number of caller threads run calls concurrently. Each call
 * uses its own pluck completion queue, drained with grpc_completion_queue_pluck before it is
 * destroyed, with exactly one batch in flight.
 * Invariants: `preferred` is always a valid endpoint index; every call carries a deadline;
 * UNAVAILABLE moves to the next endpoint, with a short backoff after each full round.
 *
 * Reconnect policy (gRPC 1.51 subchannels, one channel per endpoint). When a connection
 * breaks, gRPC retries it with its own backoff: 100 ms, x1.6 with jitter, capped at 1 s
 * (GRPC_ARG_INITIAL/MAX_RECONNECT_BACKOFF_MS). GRPC_ARG_MIN_RECONNECT_BACKOFF_MS is, in
 * gRPC core, the minimum *connect timeout*, not a backoff: 5 s, so an attempt that reached
 * an etcd still starting (port bound, no HTTP/2 SETTINGS yet) is not abandoned too early;
 * it is independent of our call deadlines, which may be shorter. While an endpoint is in
 * backoff, calls to it fail at once with UNAVAILABLE and the call moves on; after the
 * backoff the subchannel goes IDLE and the next call (or watch stream) starts a new attempt.
 * gRPC's epoll poller makes connection progress only while some thread polls, so the
 * failover backoff polls (poll_sleep_ms) instead of sleeping. Net effect: a restarted
 * etcd is used again by the first call after it serves, whatever call_timeout_ms is
 * (tests/integration/etcd/test_etcd_failover.c, recovers_*). An endpoint that accepts
 * TCP but never answers costs a call its whole deadline (WAGMA_ETIMEDOUT, no failover)
 * until gRPC's connect timeout marks it unreachable; after that calls fail over.
 *
 * Recovery signal: a call that finds no etcd (UNAVAILABLE attempt, timeout, broken watch)
 * sets `failing`; the next success of any call or watch (wg_etcd_set_preferred) clears it
 * and kicks the handle's keepalives (lease.c) into an immediate refresh, so a lease is
 * refreshed as soon as etcd serves anyone again, not at the keepalive's next retry.
 *
 * Security (security.c): channels use SSL credentials when TLS is configured; every call and
 * stream sends the handle's token, and wg_etcd_unary authenticates again once when etcd
 * rejects it. A round in which every endpoint failed its TLS handshake ends the call at once
 * with WAGMA_EPERM: a wrong CA is a misconfiguration, not an outage. When the TLS files
 * change (looked at, at most once a second, by calls and stream opens), every endpoint gets
 * a new channel on the new credentials (rotate_tls); calls and streams in flight keep theirs
 * until they end, so an established watch is not cut by a rotation. */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "etcd_internal.h"

#define DEFAULT_CALL_TIMEOUT_MS 5000
#define FAILOVER_BACKOFF_MIN_MS 50
#define FAILOVER_BACKOFF_MAX_MS 500

int64_t wg_etcd_now_ms(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;
}

static gpr_timespec deadline_from_ms(int64_t deadline_ms) {
  int64_t left = deadline_ms - wg_etcd_now_ms();
  if (left < 0)
    left = 0;
  return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(left, GPR_TIMESPAN));
}

/* Waits ms while driving gRPC's I/O: with gRPC's epoll poller, connections only make
 * progress (connect, HTTP/2 handshake) while some thread polls, so a plain sleep between
 * failover rounds would stall a reconnection to an etcd that came back. */
static void poll_sleep_ms(int64_t ms) {
  grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
  grpc_completion_queue_pluck(cq, (void *)1, deadline_from_ms(wg_etcd_now_ms() + ms), NULL);
  grpc_completion_queue_shutdown(cq);
  while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
         GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(cq);
}

/* ---- detail messages ---------------------------------------------------------------- */

static struct wg_etcd_errslot *errslot(wagma_etcd_t *etcd) {
  struct wg_etcd_errslot *slot = pthread_getspecific(etcd->errkey);
  if (slot != NULL)
    return slot;
  slot = calloc(1, sizeof *slot);
  if (slot == NULL)
    return NULL;
  pthread_mutex_lock(&etcd->lock);
  slot->next = etcd->slots;
  etcd->slots = slot;
  pthread_mutex_unlock(&etcd->lock);
  pthread_setspecific(etcd->errkey, slot);
  return slot;
}

void wg_etcd_set_error(wagma_etcd_t *etcd, const char *fmt, ...) {
  struct wg_etcd_errslot *slot = errslot(etcd);
  va_list args;
  if (slot == NULL)
    return;
  va_start(args, fmt);
  vsnprintf(slot->msg, sizeof slot->msg, fmt, args);
  va_end(args);
}

const char *wagma_etcd_errmsg(wagma_etcd_t *etcd) {
  struct wg_etcd_errslot *slot;
  if (etcd == NULL)
    return "no handle";
  slot = errslot(etcd);
  return slot == NULL ? "out of memory" : slot->msg;
}

static void clear_error(wagma_etcd_t *etcd) {
  struct wg_etcd_errslot *slot = pthread_getspecific(etcd->errkey);
  if (slot != NULL)
    slot->msg[0] = '\0';
}

/* ---- status mapping ----------------------------------------------------------------- */

static const char *status_name(grpc_status_code code) {
  static const char *const names[] = {"OK",
                                      "CANCELLED",
                                      "UNKNOWN",
                                      "INVALID_ARGUMENT",
                                      "DEADLINE_EXCEEDED",
                                      "NOT_FOUND",
                                      "ALREADY_EXISTS",
                                      "PERMISSION_DENIED",
                                      "RESOURCE_EXHAUSTED",
                                      "FAILED_PRECONDITION",
                                      "ABORTED",
                                      "OUT_OF_RANGE",
                                      "UNIMPLEMENTED",
                                      "INTERNAL",
                                      "UNAVAILABLE",
                                      "DATA_LOSS",
                                      "UNAUTHENTICATED"};
  if ((int)code < 0 || (size_t)code >= sizeof names / sizeof names[0])
    return "?";
  return names[code];
}

int wg_etcd_map_status(grpc_status_code code, const char *details) {
  if (details != NULL) {
    if (strstr(details, "compacted") != NULL)
      return WAGMA_ECOMPACTED;
    if (strstr(details, "lease not found") != NULL ||
        strstr(details, "election: no leader") != NULL)
      return WAGMA_ENOTFOUND;
    if (strstr(details, "election: not leader") != NULL ||
        strstr(details, "authentication failed") != NULL ||
        strstr(details, "user name is empty") != NULL ||
        strstr(details, "revision of auth store is old") != NULL)
      return WAGMA_EPERM;
    /* etcd's election service returns the server context's error as it is, which gRPC-Go
     * sends as UNKNOWN with Go's text: the call's deadline passed there first (seen under
     * ASan, a Campaign with a 700 ms deadline). */
    if (code == GRPC_STATUS_UNKNOWN && strstr(details, "context deadline exceeded") != NULL)
      return WAGMA_ETIMEDOUT;
  }
  switch (code) {
  case GRPC_STATUS_OK: return WAGMA_OK;
  case GRPC_STATUS_CANCELLED: return WAGMA_ECANCELED;
  case GRPC_STATUS_INVALID_ARGUMENT: return WAGMA_EINVAL;
  case GRPC_STATUS_DEADLINE_EXCEEDED: return WAGMA_ETIMEDOUT;
  case GRPC_STATUS_NOT_FOUND: return WAGMA_ENOTFOUND;
  case GRPC_STATUS_ALREADY_EXISTS: return WAGMA_EEXIST;
  case GRPC_STATUS_PERMISSION_DENIED:
  case GRPC_STATUS_UNAUTHENTICATED: return WAGMA_EPERM;
  case GRPC_STATUS_RESOURCE_EXHAUSTED: return WAGMA_EBUSY;
  case GRPC_STATUS_FAILED_PRECONDITION:
  case GRPC_STATUS_ABORTED: return WAGMA_ECONFLICT;
  case GRPC_STATUS_OUT_OF_RANGE: return WAGMA_ERANGE;
  case GRPC_STATUS_UNIMPLEMENTED: return WAGMA_ENOSYS;
  case GRPC_STATUS_UNAVAILABLE: return WAGMA_EUNAVAIL;
  default: return WAGMA_EIO;
  }
}

/* ---- handle ------------------------------------------------------------------------- */

size_t wg_etcd_preferred(wagma_etcd_t *etcd) {
  size_t index;
  pthread_mutex_lock(&etcd->lock);
  index = etcd->preferred;
  pthread_mutex_unlock(&etcd->lock);
  return index;
}

void wg_etcd_set_preferred(wagma_etcd_t *etcd, size_t endpoint) {
  pthread_mutex_lock(&etcd->lock);
  if (endpoint < etcd->n_endpoints)
    etcd->preferred = endpoint;
  if (etcd->failing) {
    etcd->failing = 0;
    wg_etcd_kick_keepalives_locked(etcd);
  }
  pthread_mutex_unlock(&etcd->lock);
}

void wg_etcd_note_failure(wagma_etcd_t *etcd) {
  pthread_mutex_lock(&etcd->lock);
  etcd->failing = 1;
  pthread_mutex_unlock(&etcd->lock);
}

/* ---- endpoints ---------------------------------------------------------------------- */

/* Checks one endpoint, [p, p + len) with blanks, a trailing '/' and "http://" already cut:
 * HOST:PORT with HOST a name or IPv4 address ([A-Za-z0-9._-]) or a bracketed IPv6 address,
 * PORT 1..65535 in decimal. 0 or WAGMA_EINVAL with why in err. */
static int check_endpoint(const char *p, size_t len, char *err, size_t err_len) {
  const char *colon = NULL;
  size_t hlen;
  for (size_t i = 0; i + 3 <= len; i++)
    if (memcmp(p + i, "://", 3) == 0) {
      snprintf(err, err_len, "only http:// and https:// endpoints are supported");
      return WAGMA_EINVAL;
    }
  for (size_t i = len; i-- > 0;)
    if (p[i] == ':') {
      colon = p + i;
      break;
    }
  if (colon == NULL) {
    snprintf(err, err_len, "must be HOST:PORT");
    return WAGMA_EINVAL;
  }
  hlen = (size_t)(colon - p);
  if (hlen == 0) {
    snprintf(err, err_len, "empty host");
    return WAGMA_EINVAL;
  }
  if (p[0] == '[') {
    if (hlen < 3 || p[hlen - 1] != ']') {
      snprintf(err, err_len, "bad IPv6 host (want [ADDRESS]:PORT)");
      return WAGMA_EINVAL;
    }
    for (size_t i = 1; i + 1 < hlen; i++)
      if (!isxdigit((unsigned char)p[i]) && p[i] != ':' && p[i] != '.') {
        snprintf(err, err_len, "bad IPv6 host");
        return WAGMA_EINVAL;
      }
  } else {
    for (size_t i = 0; i < hlen; i++)
      if (!isalnum((unsigned char)p[i]) && p[i] != '.' && p[i] != '-' && p[i] != '_') {
        snprintf(err, err_len, "bad character in host (a name or an IPv4 address; IPv6 in [])");
        return WAGMA_EINVAL;
      }
  }
  const char *port = colon + 1;
  size_t plen = len - hlen - 1;
  long value = 0;
  if (plen == 0 || plen > 5) {
    snprintf(err, err_len, plen ? "port must be 1..65535" : "empty port");
    return WAGMA_EINVAL;
  }
  for (size_t i = 0; i < plen; i++) {
    if (!isdigit((unsigned char)port[i])) {
      snprintf(err, err_len, "port must be a number in 1..65535");
      return WAGMA_EINVAL;
    }
    value = value * 10 + (port[i] - '0');
  }
  if (value < 1 || value > 65535) {
    snprintf(err, err_len, "port must be 1..65535");
    return WAGMA_EINVAL;
  }
  return 0;
}

/* Walks "a,b,c": each entry trimmed of blanks and a trailing '/', "http://" or "https://"
 * dropped (*schemes, may be NULL: 1 if an http:// was seen, 2 if an https://; mixing them is
 * refused), empty entries skipped, every other one checked. With etcd non-NULL the entries
 * are copied into etcd->endpoints. 0, WAGMA_EINVAL (err says which entry and why) or
 * WAGMA_ENOMEM. */
static int walk_endpoints(wagma_etcd_t *etcd, const char *list, int *schemes, char *err,
                          size_t err_len) {
  const char *p = list;
  size_t capacity = 0, count = 0;
  int seen = 0; /* 1: an http:// entry, 2: an https:// entry */
  char why[128];
  if (list == NULL) {
    snprintf(err, err_len, "no endpoints");
    return WAGMA_EINVAL;
  }
  while (*p != '\0') {
    const char *end = strchr(p, ',');
    size_t len = end == NULL ? strlen(p) : (size_t)(end - p);
    while (len > 0 && (*p == ' ' || *p == '\t'))
      p++, len--;
    while (len > 0 && (p[len - 1] == ' ' || p[len - 1] == '\t' || p[len - 1] == '/'))
      len--;
    if (len > 7 && strncmp(p, "http://", 7) == 0)
      p += 7, len -= 7, seen |= 1;
    else if (len > 8 && strncmp(p, "https://", 8) == 0)
      p += 8, len -= 8, seen |= 2;
    if (seen == 3) {
      snprintf(err, err_len, "http:// and https:// endpoints mixed");
      return WAGMA_EINVAL;
    }
    if (len > 0 && check_endpoint(p, len, why, sizeof why) != 0) {
      snprintf(err, err_len, "endpoint '%.*s': %s", (int)(len > 96 ? 96 : len), p, why);
      return WAGMA_EINVAL;
    }
    count += len > 0;
    if (len > 0 && etcd != NULL) {
      if (etcd->n_endpoints == capacity) {
        size_t grow = capacity == 0 ? 4 : capacity * 2;
        char **bigger = realloc(etcd->endpoints, grow * sizeof *bigger);
        if (bigger == NULL)
          return WAGMA_ENOMEM;
        etcd->endpoints = bigger;
        capacity = grow;
      }
      etcd->endpoints[etcd->n_endpoints] = strndup(p, len);
      if (etcd->endpoints[etcd->n_endpoints] == NULL)
        return WAGMA_ENOMEM;
      etcd->n_endpoints++;
    }
    if (end == NULL)
      break;
    p = end + 1;
  }
  if (count == 0) {
    snprintf(err, err_len, "no endpoints");
    return WAGMA_EINVAL;
  }
  if (schemes != NULL)
    *schemes = seen;
  return 0;
}

int wagma_etcd_endpoints_check(const char *endpoints, char *err, size_t err_len) {
  char scratch[1];
  if (err == NULL || err_len == 0) {
    err = scratch;
    err_len = sizeof scratch;
  }
  err[0] = '\0';
  return walk_endpoints(NULL, endpoints, NULL, err, err_len);
}

/* The whole check of wagma_etcd_options_check; *tls = whether the channels use TLS. */
static int check_options(const wagma_etcd_options_t *o, int *tls, char *err, size_t err_len) {
  int schemes = 0, rc;
  if (o == NULL || o->endpoints == NULL) {
    snprintf(err, err_len, "no endpoints");
    return WAGMA_EINVAL;
  }
  if ((rc = walk_endpoints(NULL, o->endpoints, &schemes, err, err_len)) != 0)
    return rc;
  if ((rc = wg_etcd_security_check(o, tls, err, err_len)) != 0)
    return rc;
  if (*tls && schemes == 1) {
    snprintf(err, err_len, "http:// endpoints with TLS options (use https:// or HOST:PORT)");
    return WAGMA_EINVAL;
  }
  *tls |= schemes == 2;
  return 0;
}

int wagma_etcd_options_check(const wagma_etcd_options_t *options, char *err, size_t err_len) {
  char scratch[1];
  int tls;
  if (err == NULL || err_len == 0) {
    err = scratch;
    err_len = sizeof scratch;
  }
  err[0] = '\0';
  return check_options(options, &tls, err, err_len);
}

/* ---- channels ------------------------------------------------------------------------ */

/* The channel arguments of every channel (6 entries in args). */
static void channel_args_fill(grpc_arg args[6], grpc_channel_args *channel_args) {
  /* Reconnect quickly after an etcd restart; fail calls fast while it is down (see the
   * reconnect policy above). */
  args[0] = (grpc_arg){GRPC_ARG_INTEGER, GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, {.integer = 100}};
  /* Despite its name, gRPC core uses this only as the minimum connect timeout (an attempt
   * gets max(its backoff, this) to finish TCP + HTTP/2 SETTINGS): keep it generous. */
  args[1] = (grpc_arg){GRPC_ARG_INTEGER, GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, {.integer = 5000}};
  args[2] = (grpc_arg){GRPC_ARG_INTEGER, GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, {.integer = 1000}};
  args[3] = (grpc_arg){GRPC_ARG_INTEGER, GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, {.integer = -1}};
  args[4] = (grpc_arg){GRPC_ARG_INTEGER, GRPC_ARG_KEEPALIVE_TIME_MS, {.integer = 30000}};
  args[5] = (grpc_arg){GRPC_ARG_INTEGER, GRPC_ARG_ENABLE_RETRIES, {.integer = 0}};
  *channel_args = (grpc_channel_args){.num_args = 6, .args = args};
}

/* A channel to endpoint on creds, with the handle's ref only; NULL when gRPC refuses. */
static wg_etcd_channel_t *channel_new(wagma_etcd_t *etcd, size_t endpoint,
                                      grpc_channel_credentials *creds) {
  grpc_arg args[6];
  grpc_channel_args channel_args;
  wg_etcd_channel_t *ch = calloc(1, sizeof *ch);
  if (ch == NULL)
    return NULL;
  channel_args_fill(args, &channel_args);
  ch->channel = grpc_channel_create(etcd->endpoints[endpoint], creds, &channel_args);
  if (ch->channel == NULL) {
    free(ch);
    return NULL;
  }
  ch->refs = 1;
  return ch;
}

/* The current channel of endpoint, held for one call or stream (channel_release). */
static wg_etcd_channel_t *channel_hold(wagma_etcd_t *etcd, size_t endpoint) {
  pthread_mutex_lock(&etcd->lock);
  wg_etcd_channel_t *ch = etcd->channels[endpoint];
  ch->refs++;
  pthread_mutex_unlock(&etcd->lock);
  return ch;
}

/* Drops one ref; the last one destroys the channel. NULL is a no-op. */
static void channel_release(wagma_etcd_t *etcd, wg_etcd_channel_t *ch) {
  if (ch == NULL)
    return;
  pthread_mutex_lock(&etcd->lock);
  int last = --ch->refs == 0;
  pthread_mutex_unlock(&etcd->lock);
  if (last) {
    grpc_channel_destroy(ch->channel);
    free(ch);
  }
}

/* When the TLS files changed: a new channel for every endpoint on the new credentials. The
 * old ones stay with the calls and streams that hold them. */
static void rotate_tls(wagma_etcd_t *etcd) {
  grpc_channel_credentials *creds = wg_etcd_tls_changed(etcd);
  if (creds == NULL)
    return;
  wg_etcd_channel_t **fresh = calloc(etcd->n_endpoints, sizeof *fresh);
  size_t made = 0;
  while (fresh != NULL && made < etcd->n_endpoints &&
         (fresh[made] = channel_new(etcd, made, creds)) != NULL)
    made++;
  grpc_channel_credentials_release(creds);
  if (made < etcd->n_endpoints) {
    wg_logf(etcd->log_fn, etcd->log_user, WAGMA_LOG_WARN,
            "etcd: the TLS files changed but new channels could not be made: keeping the old");
    for (size_t i = 0; fresh != NULL && i < made; i++)
      channel_release(etcd, fresh[i]);
    free(fresh);
    return;
  }
  pthread_mutex_lock(&etcd->lock);
  for (size_t i = 0; i < etcd->n_endpoints; i++) {
    wg_etcd_channel_t *old = etcd->channels[i];
    etcd->channels[i] = fresh[i];
    fresh[i] = old;
  }
  pthread_mutex_unlock(&etcd->lock);
  for (size_t i = 0; i < etcd->n_endpoints; i++)
    channel_release(etcd, fresh[i]);
  free(fresh);
  wg_logf(etcd->log_fn, etcd->log_user, WAGMA_LOG_INFO,
          "etcd: the TLS files changed: new connections use the new certificates (calls and "
          "watches already open keep theirs)");
}

int wagma_etcd_open(const wagma_etcd_options_t *options, wagma_etcd_t **out) {
  wagma_etcd_t *etcd = NULL;
  grpc_channel_credentials *creds = NULL;
  int rc = 0, key_made = 0, lock_made = 0, grpc_started = 0, auth_made = 0, tls = 0;
  char why[256];

  if (out == NULL || options == NULL || options->endpoints == NULL)
    return WAGMA_EINVAL;
  *out = NULL;
  if (check_options(options, &tls, why, sizeof why) != 0) {
    wg_logf(options->log_fn, options->log_user, WAGMA_LOG_ERROR, "etcd: %s", why);
    return WAGMA_EINVAL;
  }
  etcd = calloc(1, sizeof *etcd);
  if (etcd == NULL)
    return WAGMA_ENOMEM;
  etcd->call_timeout_ms =
      options->call_timeout_ms > 0 ? options->call_timeout_ms : DEFAULT_CALL_TIMEOUT_MS;
  etcd->log_fn = options->log_fn;
  etcd->log_user = options->log_user;
  if (pthread_mutex_init(&etcd->lock, NULL) != 0) {
    rc = WAGMA_ENOMEM;
    goto out;
  }
  lock_made = 1;
  if (pthread_key_create(&etcd->errkey, NULL) != 0) {
    rc = WAGMA_ENOMEM;
    goto out;
  }
  key_made = 1;
  if (pthread_mutex_init(&etcd->auth_lock, NULL) != 0) {
    rc = WAGMA_ENOMEM;
    goto out;
  }
  if (pthread_mutex_init(&etcd->tls_lock, NULL) != 0) {
    pthread_mutex_destroy(&etcd->auth_lock);
    rc = WAGMA_ENOMEM;
    goto out;
  }
  auth_made = 1;
  if ((rc = wg_etcd_auth_init(etcd, options)) != 0 || (rc = wg_etcd_tls_init(etcd, options)) != 0)
    goto out;
  etcd->tls = tls;
  if (options->ping_key != NULL && (etcd->ping_key = strdup(options->ping_key)) == NULL) {
    rc = WAGMA_ENOMEM;
    goto out;
  }
  rc = walk_endpoints(etcd, options->endpoints, NULL, why, sizeof why);
  if (rc != 0)
    goto out;
  etcd->channels = calloc(etcd->n_endpoints, sizeof *etcd->channels);
  if (etcd->channels == NULL) {
    rc = WAGMA_ENOMEM;
    goto out;
  }

  grpc_init();
  grpc_started = 1;
  creds = wg_etcd_credentials(options, tls, why, sizeof why);
  if (creds == NULL) {
    wg_logf(options->log_fn, options->log_user, WAGMA_LOG_ERROR, "etcd: %s", why);
    rc = WAGMA_EINVAL;
    goto out;
  }
  for (size_t i = 0; i < etcd->n_endpoints; i++) {
    etcd->channels[i] = channel_new(etcd, i, creds);
    if (etcd->channels[i] == NULL) {
      rc = WAGMA_EINVAL;
      goto out;
    }
  }
  *out = etcd;
  etcd = NULL;
out:
  if (creds != NULL)
    grpc_channel_credentials_release(creds);
  if (etcd != NULL) {
    for (size_t i = 0; etcd->channels != NULL && i < etcd->n_endpoints; i++)
      channel_release(etcd, etcd->channels[i]);
    for (size_t i = 0; i < etcd->n_endpoints; i++)
      free(etcd->endpoints[i]);
    free(etcd->endpoints);
    free(etcd->channels);
    if (key_made)
      pthread_key_delete(etcd->errkey);
    if (auth_made)
      wg_etcd_auth_destroy(etcd);
    free(etcd->ping_key);
    if (lock_made)
      pthread_mutex_destroy(&etcd->lock);
    if (grpc_started)
      grpc_shutdown();
    free(etcd);
  }
  return rc;
}

void wagma_etcd_close(wagma_etcd_t *etcd) {
  if (etcd == NULL)
    return;
  for (size_t i = 0; i < etcd->n_endpoints; i++) {
    channel_release(etcd, etcd->channels[i]); /* every call has ended: the last ref */
    free(etcd->endpoints[i]);
  }
  free(etcd->channels);
  free(etcd->endpoints);
  while (etcd->slots != NULL) {
    struct wg_etcd_errslot *next = etcd->slots->next;
    free(etcd->slots);
    etcd->slots = next;
  }
  pthread_key_delete(etcd->errkey);
  pthread_mutex_destroy(&etcd->lock);
  wg_etcd_auth_destroy(etcd);
  free(etcd->ping_key);
  free(etcd);
  grpc_shutdown();
}

/* ---- cancel ------------------------------------------------------------------------- */

void wg_etcd_cancel_init(wg_etcd_cancel_t *cancel) {
  pthread_mutex_init(&cancel->lock, NULL);
  cancel->call = NULL;
  cancel->canceled = 0;
}

void wg_etcd_cancel_destroy(wg_etcd_cancel_t *cancel) {
  pthread_mutex_destroy(&cancel->lock);
}

void wg_etcd_cancel_fire(wg_etcd_cancel_t *cancel) {
  pthread_mutex_lock(&cancel->lock);
  cancel->canceled = 1;
  if (cancel->call != NULL)
    grpc_call_cancel(cancel->call, NULL);
  pthread_mutex_unlock(&cancel->lock);
}

/* Registers call; returns nonzero (and registers nothing) when already canceled. */
static int cancel_register(wg_etcd_cancel_t *cancel, grpc_call *call) {
  int canceled;
  if (cancel == NULL)
    return 0;
  pthread_mutex_lock(&cancel->lock);
  canceled = cancel->canceled;
  if (!canceled)
    cancel->call = call;
  pthread_mutex_unlock(&cancel->lock);
  return canceled;
}

static void cancel_unregister(wg_etcd_cancel_t *cancel) {
  if (cancel == NULL)
    return;
  pthread_mutex_lock(&cancel->lock);
  cancel->call = NULL;
  pthread_mutex_unlock(&cancel->lock);
}

static int cancel_fired(wg_etcd_cancel_t *cancel) {
  int canceled;
  if (cancel == NULL)
    return 0;
  pthread_mutex_lock(&cancel->lock);
  canceled = cancel->canceled;
  pthread_mutex_unlock(&cancel->lock);
  return canceled;
}

/* ---- messages <-> byte buffers ------------------------------------------------------ */

/* Packs message into a new byte buffer (caller destroys), NULL on allocation failure. */
static grpc_byte_buffer *pack(const ProtobufCMessage *message) {
  size_t size = protobuf_c_message_get_packed_size(message);
  grpc_slice slice = grpc_slice_malloc(size);
  grpc_byte_buffer *buffer;
  protobuf_c_message_pack(message, GRPC_SLICE_START_PTR(slice));
  buffer = grpc_raw_byte_buffer_create(&slice, 1);
  grpc_slice_unref(slice);
  return buffer;
}

/* Decodes buffer (not consumed) as type; NULL when it does not parse. */
static ProtobufCMessage *unpack(grpc_byte_buffer *buffer, const ProtobufCMessageDescriptor *type) {
  grpc_byte_buffer_reader reader;
  grpc_slice slice;
  ProtobufCMessage *message;
  if (!grpc_byte_buffer_reader_init(&reader, buffer))
    return NULL;
  slice = grpc_byte_buffer_reader_readall(&reader);
  grpc_byte_buffer_reader_destroy(&reader);
  message =
      protobuf_c_message_unpack(type, NULL, GRPC_SLICE_LENGTH(slice), GRPC_SLICE_START_PTR(slice));
  grpc_slice_unref(slice);
  return message;
}

static void destroy_cq(grpc_completion_queue *cq) {
  grpc_completion_queue_shutdown(cq);
  while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
         GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(cq);
}

/* ---- unary -------------------------------------------------------------------------- */

/* Nonzero when an UNAVAILABLE's details say the TLS handshake failed (a wrong CA, a client
 * certificate missing or refused, a server name the certificate does not carry). */
static int tls_failure(const char *details) {
  static const char *const hints[] = {"andshake",    "SSL", "ssl", "certificate",
                                      "CERTIFICATE", "tls", "TLS"};
  for (size_t i = 0; details != NULL && i < sizeof hints / sizeof hints[0]; i++)
    if (strstr(details, hints[i]) != NULL)
      return 1;
  return 0;
}

/* What one attempt learned beyond its status. */
typedef struct attempt_note {
  int rejected; /* etcd rejected the token */
  int tls;      /* UNAVAILABLE because the TLS handshake failed */
} attempt_note_t;

/* The "token" metadata entry for token (NULL = none): fills md, returns the count (0 or 1).
 * The caller unrefs md->value once the batch completed. */
static size_t token_metadata(grpc_metadata *md, const char *token) {
  memset(md, 0, sizeof *md);
  if (token == NULL)
    return 0;
  md->key = grpc_slice_from_static_string("token");
  md->value = grpc_slice_from_copied_string(token);
  return 1;
}

/* One attempt on one endpoint. Returns the mapped status; *response set on 0. */
static int unary_attempt(wagma_etcd_t *etcd, size_t endpoint, const char *method,
                         grpc_byte_buffer *request, const ProtobufCMessageDescriptor *type,
                         ProtobufCMessage **response, int64_t deadline_ms, wg_etcd_cancel_t *cancel,
                         const char *token, attempt_note_t *note) {
  grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
  grpc_call *call;
  grpc_metadata_array initial_md, trailing_md;
  grpc_byte_buffer *answer = NULL;
  grpc_status_code status = GRPC_STATUS_UNKNOWN;
  grpc_slice details = grpc_empty_slice();
  grpc_op ops[6];
  grpc_event event;
  grpc_metadata token_md;
  size_t n_md = token_metadata(&token_md, token);
  char *details_text = NULL;
  int rc = 0;

  wg_etcd_channel_t *channel = channel_hold(etcd, endpoint);
  grpc_metadata_array_init(&initial_md);
  grpc_metadata_array_init(&trailing_md);
  call = grpc_channel_create_call(channel->channel, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
                                  grpc_slice_from_static_string(method), NULL,
                                  deadline_from_ms(deadline_ms), NULL);
  if (call == NULL) {
    wg_etcd_set_error(etcd, "etcd %s %s: cannot create call", etcd->endpoints[endpoint], method);
    rc = WAGMA_EINTERNAL;
    goto out;
  }
  if (cancel_register(cancel, call)) {
    wg_etcd_set_error(etcd, "etcd %s %s: canceled", etcd->endpoints[endpoint], method);
    rc = WAGMA_ECANCELED;
    goto out;
  }
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[0].data.send_initial_metadata.count = n_md;
  ops[0].data.send_initial_metadata.metadata = n_md ? &token_md : NULL;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = request;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &initial_md;
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = &answer;
  ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[5].data.recv_status_on_client.trailing_metadata = &trailing_md;
  ops[5].data.recv_status_on_client.status = &status;
  ops[5].data.recv_status_on_client.status_details = &details;
  if (grpc_call_start_batch(call, ops, 6, (void *)1, NULL) != GRPC_CALL_OK) {
    cancel_unregister(cancel);
    wg_etcd_set_error(etcd, "etcd %s %s: cannot start call", etcd->endpoints[endpoint], method);
    rc = WAGMA_EINTERNAL;
    goto out;
  }
  /* The call's deadline guarantees completion. */
  event = grpc_completion_queue_pluck(cq, (void *)1, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  cancel_unregister(cancel);
  (void)event;
  if (status != GRPC_STATUS_OK) {
    details_text = grpc_slice_to_c_string(details);
    rc = wg_etcd_map_status(status, details_text);
    if (status == GRPC_STATUS_CANCELLED && cancel_fired(cancel))
      rc = WAGMA_ECANCELED;
    note->rejected = wg_etcd_token_rejected(status, details_text);
    note->tls = etcd->tls && status == GRPC_STATUS_UNAVAILABLE && tls_failure(details_text);
    if (etcd->username == NULL && details_text != NULL &&
        strstr(details_text, "user name is empty") != NULL)
      wg_etcd_set_error(etcd,
                        "etcd %s %s: %s (%d): %s (etcd has authentication on: give a user, or "
                        "a client certificate whose CN is one)",
                        etcd->endpoints[endpoint], method, status_name(status), (int)status,
                        details_text);
    else
      wg_etcd_set_error(etcd, "etcd %s %s: %s (%d): %s", etcd->endpoints[endpoint], method,
                        status_name(status), (int)status, details_text);
    goto out;
  }
  if (answer == NULL || (*response = unpack(answer, type)) == NULL) {
    wg_etcd_set_error(etcd, "etcd %s %s: undecodable answer", etcd->endpoints[endpoint], method);
    rc = WAGMA_EPROTO;
    goto out;
  }
out:
  gpr_free(details_text);
  grpc_slice_unref(details);
  if (answer != NULL)
    grpc_byte_buffer_destroy(answer);
  grpc_metadata_array_destroy(&initial_md);
  grpc_metadata_array_destroy(&trailing_md);
  if (call != NULL)
    grpc_call_unref(call);
  channel_release(etcd, channel);
  destroy_cq(cq);
  if (n_md)
    grpc_slice_unref(token_md.value);
  return rc;
}

int wg_etcd_unary_token(wagma_etcd_t *etcd, const char *method, const ProtobufCMessage *request,
                        const ProtobufCMessageDescriptor *response_type,
                        ProtobufCMessage **response, int64_t deadline_ms, wg_etcd_cancel_t *cancel,
                        const char *token, int *rejected) {
  attempt_note_t note = {0, 0};
  size_t tls_failures_this_round = 0;
  size_t endpoint = wg_etcd_preferred(etcd);
  size_t tried_this_round = 0;
  int64_t backoff = FAILOVER_BACKOFF_MIN_MS;
  int attempts = 0;
  int rc;

  *response = NULL;
  if (deadline_ms <= 0)
    deadline_ms = wg_etcd_now_ms() + etcd->call_timeout_ms;
  clear_error(etcd);
  rotate_tls(etcd);
  for (;;) {
    /* gRPC consumes a sent byte buffer even when the attempt fails (and a copy shares its
     * slices): pack a fresh one for each attempt. */
    grpc_byte_buffer *buffer = pack(request);
    if (buffer == NULL) {
      rc = WAGMA_ENOMEM;
      break;
    }
    attempts++;
    note = (attempt_note_t){0, 0};
    rc = unary_attempt(etcd, endpoint, method, buffer, response_type, response, deadline_ms, cancel,
                       token, &note);
    grpc_byte_buffer_destroy(buffer);
    if (rc == 0) {
      wg_etcd_set_preferred(etcd, endpoint);
      break;
    }
    if (rc != WAGMA_EUNAVAIL)
      break;
    wg_etcd_note_failure(etcd);
    wg_logf(etcd->log_fn, etcd->log_user, WAGMA_LOG_DEBUG, "%s", wagma_etcd_errmsg(etcd));
    endpoint = (endpoint + 1) % etcd->n_endpoints;
    tls_failures_this_round += note.tls;
    if (++tried_this_round >= etcd->n_endpoints && tls_failures_this_round == tried_this_round)
      break; /* every endpoint refused the handshake: retrying will not change that */
    if (tried_this_round >= etcd->n_endpoints) {
      tls_failures_this_round = 0;
      /* Every endpoint refused: wait a little before the next round, within the deadline. */
      int64_t left = deadline_ms - wg_etcd_now_ms();
      tried_this_round = 0;
      if (left <= backoff)
        break;
      poll_sleep_ms(backoff);
      backoff = backoff * 2 > FAILOVER_BACKOFF_MAX_MS ? FAILOVER_BACKOFF_MAX_MS : backoff * 2;
    }
    if (wg_etcd_now_ms() >= deadline_ms || cancel_fired(cancel))
      break;
  }
  if (rc == WAGMA_ETIMEDOUT)
    wg_etcd_note_failure(etcd);
  if (rc == WAGMA_EUNAVAIL && note.tls) {
    /* A misconfiguration, not an outage: say so at once rather than retry for ever. */
    char last[WG_ETCD_ERRMSG_MAX];
    snprintf(last, sizeof last, "%s", wagma_etcd_errmsg(etcd));
    wg_etcd_set_error(etcd,
                      "TLS handshake with etcd failed (check the CA file, the client "
                      "certificate and key, and that etcd's certificate names the host): %s",
                      last);
    rc = WAGMA_EPERM;
  } else if (rc == WAGMA_EUNAVAIL) {
    char last[WG_ETCD_ERRMSG_MAX];
    snprintf(last, sizeof last, "%s", wagma_etcd_errmsg(etcd));
    /* With TLS 1.3 a refused client certificate is seen only after the handshake: etcd
     * closes the connection. Say what it may be (an etcd going down looks the same). */
    wg_etcd_set_error(etcd, "no etcd endpoint available after %d attempts; last: %s%s", attempts,
                      last,
                      etcd->tls && strstr(last, "Endpoint read failed") != NULL
                          ? " (with TLS this is also how etcd refuses a missing or untrusted "
                            "client certificate)"
                          : "");
  }
  if (rejected != NULL)
    *rejected = note.rejected;
  return rc;
}

int wg_etcd_unary(wagma_etcd_t *etcd, const char *method, const ProtobufCMessage *request,
                  const ProtobufCMessageDescriptor *response_type, ProtobufCMessage **response,
                  int64_t deadline_ms, wg_etcd_cancel_t *cancel) {
  int rc;
  if (deadline_ms <= 0)
    deadline_ms = wg_etcd_now_ms() + etcd->call_timeout_ms;
  /* At most one re-authentication per call: a token etcd rejects right after it gave it
   * out is not a stale token but a real refusal. */
  for (int attempt = 0;; attempt++) {
    char *token = NULL;
    uint64_t gen = 0;
    int rejected = 0;
    *response = NULL;
    clear_error(etcd);
    if ((rc = wg_etcd_token(etcd, deadline_ms, &token, &gen)) != 0)
      return rc;
    rc = wg_etcd_unary_token(etcd, method, request, response_type, response, deadline_ms, cancel,
                             token, &rejected);
    free(token);
    if (rc == 0 || !rejected || etcd->username == NULL || attempt >= 1)
      return rc;
    wg_etcd_token_reject(etcd, gen);
  }
}

/* ---- streams ------------------------------------------------------------------------ */

int wg_etcd_stream_open(wg_etcd_stream_t *stream, wagma_etcd_t *etcd, size_t endpoint,
                        const char *method, const ProtobufCMessage *first,
                        wg_etcd_cancel_t *cancel) {
  grpc_byte_buffer *buffer = NULL;
  grpc_op ops[2];
  grpc_event event;
  grpc_metadata token_md;
  size_t n_md = 0;
  char *token = NULL;
  int rc = 0;

  memset(stream, 0, sizeof *stream);
  memset(&token_md, 0, sizeof token_md);
  stream->etcd = etcd;
  stream->endpoint = endpoint;
  rc = wg_etcd_token(etcd, wg_etcd_now_ms() + etcd->call_timeout_ms, &token, &stream->token_gen);
  n_md = token_metadata(&token_md, token);
  free(token);
  grpc_metadata_array_init(&stream->initial_md);
  stream->initial_md_pending = 1;
  stream->cq = grpc_completion_queue_create_for_pluck(NULL);
  if (rc != 0)
    goto out; /* no call: close() keeps the authentication's message */
  rotate_tls(etcd);
  stream->channel = channel_hold(etcd, endpoint);
  stream->call = grpc_channel_create_call(stream->channel->channel, NULL, GRPC_PROPAGATE_DEFAULTS,
                                          stream->cq, grpc_slice_from_static_string(method), NULL,
                                          gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  if (stream->call == NULL) {
    rc = WAGMA_EINTERNAL;
    goto out;
  }
  if (cancel_register(cancel, stream->call)) {
    rc = WAGMA_ECANCELED;
    goto out;
  }
  buffer = pack(first);
  if (buffer == NULL) {
    rc = WAGMA_ENOMEM;
    goto out;
  }
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[0].data.send_initial_metadata.count = n_md;
  ops[0].data.send_initial_metadata.metadata = n_md ? &token_md : NULL;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = buffer;
  if (grpc_call_start_batch(stream->call, ops, 2, (void *)1, NULL) != GRPC_CALL_OK) {
    rc = WAGMA_EINTERNAL;
    goto out;
  }
  event =
      grpc_completion_queue_pluck(stream->cq, (void *)1, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  if (!event.success)
    rc = WAGMA_EUNAVAIL; /* the status, collected by close, tells why */
out:
  if (buffer != NULL)
    grpc_byte_buffer_destroy(buffer);
  if (n_md)
    grpc_slice_unref(token_md.value);
  return rc;
}

int wg_etcd_stream_recv(wg_etcd_stream_t *stream, const ProtobufCMessageDescriptor *type,
                        ProtobufCMessage **message, int timeout_ms) {
  grpc_byte_buffer *buffer = NULL;
  grpc_op ops[2];
  size_t n = 0;
  grpc_event event;
  gpr_timespec deadline = timeout_ms < 0 ? gpr_inf_future(GPR_CLOCK_REALTIME)
                                         : deadline_from_ms(wg_etcd_now_ms() + timeout_ms);
  int rc = 0;

  *message = NULL;
  memset(ops, 0, sizeof ops);
  if (stream->initial_md_pending) {
    ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[n].data.recv_initial_metadata.recv_initial_metadata = &stream->initial_md;
    n++;
    stream->initial_md_pending = 0;
  }
  ops[n].op = GRPC_OP_RECV_MESSAGE;
  ops[n].data.recv_message.recv_message = &buffer;
  n++;
  if (grpc_call_start_batch(stream->call, ops, n, (void *)2, NULL) != GRPC_CALL_OK)
    return WAGMA_EINTERNAL;
  event = grpc_completion_queue_pluck(stream->cq, (void *)2, deadline, NULL);
  if (event.type == GRPC_QUEUE_TIMEOUT) {
    grpc_call_cancel(stream->call, NULL);
    event = grpc_completion_queue_pluck(stream->cq, (void *)2, gpr_inf_future(GPR_CLOCK_REALTIME),
                                        NULL);
    rc = WAGMA_ETIMEDOUT;
    goto out;
  }
  if (!event.success || buffer == NULL) {
    rc = WAGMA_EUNAVAIL; /* stream ended or broke: close() tells the status */
    goto out;
  }
  *message = unpack(buffer, type);
  if (*message == NULL)
    rc = WAGMA_EPROTO;
out:
  if (buffer != NULL)
    grpc_byte_buffer_destroy(buffer);
  return rc;
}

int wg_etcd_stream_close(wg_etcd_stream_t *stream, const char *method, wg_etcd_cancel_t *cancel) {
  grpc_metadata_array trailing_md;
  grpc_status_code status = GRPC_STATUS_UNKNOWN;
  grpc_slice details = grpc_empty_slice();
  grpc_op op;
  char *details_text = NULL;
  int rc = 0;

  grpc_metadata_array_init(&trailing_md);
  if (stream->call != NULL) {
    cancel_unregister(cancel);
    /* etcd never ends a watch stream by itself: cancel, then collect the status. */
    grpc_call_cancel(stream->call, NULL);
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    op.data.recv_status_on_client.trailing_metadata = &trailing_md;
    op.data.recv_status_on_client.status = &status;
    op.data.recv_status_on_client.status_details = &details;
    if (grpc_call_start_batch(stream->call, &op, 1, (void *)3, NULL) == GRPC_CALL_OK)
      grpc_completion_queue_pluck(stream->cq, (void *)3, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (status != GRPC_STATUS_OK && status != GRPC_STATUS_CANCELLED) {
      details_text = grpc_slice_to_c_string(details);
      rc = wg_etcd_map_status(status, details_text);
      if (wg_etcd_token_rejected(status, details_text))
        wg_etcd_token_reject(stream->etcd, stream->token_gen);
      wg_etcd_set_error(stream->etcd, "etcd %s %s: %s (%d): %s",
                        stream->etcd->endpoints[stream->endpoint], method, status_name(status),
                        (int)status, details_text);
    }
    grpc_call_unref(stream->call);
    stream->call = NULL;
  }
  channel_release(stream->etcd, stream->channel);
  stream->channel = NULL;
  gpr_free(details_text);
  grpc_slice_unref(details);
  grpc_metadata_array_destroy(&trailing_md);
  grpc_metadata_array_destroy(&stream->initial_md);
  if (stream->cq != NULL)
    destroy_cq(stream->cq);
  stream->cq = NULL;
  return rc;
}

/* ---- helpers shared by kv, watch, election ----------------------------------------- */

int wg_etcd_kv_copy(wagma_etcd_kv_t *dst, const Etcdserverpb__KeyValue *src) {
  memset(dst, 0, sizeof *dst);
  dst->key = malloc(src->key.len + 1);
  dst->value = malloc(src->value.len + 1);
  if (dst->key == NULL || dst->value == NULL) {
    wg_etcd_kv_clear(dst);
    return WAGMA_ENOMEM;
  }
  if (src->key.len > 0)
    memcpy(dst->key, src->key.data, src->key.len);
  dst->key[src->key.len] = '\0';
  dst->key_len = src->key.len;
  if (src->value.len > 0)
    memcpy(dst->value, src->value.data, src->value.len);
  dst->value[src->value.len] = '\0';
  dst->value_len = src->value.len;
  dst->create_revision = src->create_revision;
  dst->mod_revision = src->mod_revision;
  dst->version = src->version;
  dst->lease = src->lease;
  return 0;
}

void wg_etcd_kv_clear(wagma_etcd_kv_t *kv) {
  free(kv->key);
  free(kv->value);
  memset(kv, 0, sizeof *kv);
}

void wagma_etcd_kv_free(wagma_etcd_kv_t *kv) {
  if (kv == NULL)
    return;
  wg_etcd_kv_clear(kv);
  free(kv);
}

int wg_etcd_prefix_end(const char *key, uint8_t **end, size_t *end_len) {
  size_t len = strlen(key);
  uint8_t *bytes = malloc(len + 1);
  if (bytes == NULL)
    return WAGMA_ENOMEM;
  memcpy(bytes, key, len);
  while (len > 0) {
    if (bytes[len - 1] < 0xff) {
      bytes[len - 1]++;
      *end = bytes;
      *end_len = len;
      return 0;
    }
    len--;
  }
  bytes[0] = 0; /* every byte 0xff (or empty key): all keys from key on */
  *end = bytes;
  *end_len = 1;
  return 0;
}
