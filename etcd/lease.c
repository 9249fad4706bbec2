/* lease.c — leases: grant, revoke, time-to-live, one keepalive, and the keepalive thread.
 *
 * A keepalive refresh is one request/one answer on etcd's LeaseKeepAlive bidi stream
 * (send, half-close, receive, status), through the same failover engine as unary calls,
 * so a refresh survives an endpoint failure.
 * Threads: one per wagma_etcd_keepalive_t; it sleeps on a condition variable between
 * refreshes so stop() wakes it at once.
 * Refresh policy: every TTL/3 while etcd answers. After a failed refresh it retries every
 * KEEPALIVE_RETRY_MS, each try's deadline capped at the lease's expiry (last success +
 * TTL), and the last try paced to end at that expiry, never a call whose deadline has
 * already passed. Each running keepalive is on the handle's list: when any call or watch
 * of the handle succeeds after a failure (etcd serves again, wg_etcd_set_preferred), the
 * keepalive is kicked and refreshes at once rather than at its next retry, so an etcd
 * that comes back only briefly (restarted and killed again, a flapping member) still gets
 * the refresh. Only when the expiry passes without a refresh is the lease reported lost
 * (WAGMA_ETIMEDOUT): from then on the holder cannot know that etcd still has it.
 * Lock order: etcd->lock, then a keepalive's lock (the kick); the thread never holds its
 * lock while calling etcd.
 * Invariants: `lost` is called at most once; after it the thread only waits for stop. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "etcd_internal.h"

#define LEASE_GRANT "/etcdserverpb.Lease/LeaseGrant"
#define LEASE_REVOKE "/etcdserverpb.Lease/LeaseRevoke"
#define LEASE_KEEPALIVE "/etcdserverpb.Lease/LeaseKeepAlive"
#define LEASE_TTL "/etcdserverpb.Lease/LeaseTimeToLive"

#define KEEPALIVE_RETRY_MS 500

int wagma_etcd_lease_grant(wagma_etcd_t *etcd, int64_t ttl_s, int64_t *lease) {
  Etcdserverpb__LeaseGrantRequest request = ETCDSERVERPB__LEASE_GRANT_REQUEST__INIT;
  Etcdserverpb__LeaseGrantResponse *response = NULL;
  int rc;
  if (etcd == NULL || lease == NULL || ttl_s <= 0)
    return WAGMA_EINVAL;
  request.ttl = ttl_s;
  rc = wg_etcd_unary(etcd, LEASE_GRANT, &request.base,
                     &etcdserverpb__lease_grant_response__descriptor,
                     (ProtobufCMessage **)&response, 0, NULL);
  if (rc == 0) {
    if (response->error != NULL && response->error[0] != '\0') {
      wg_etcd_set_error(etcd, "etcd LeaseGrant: %s", response->error);
      rc = WAGMA_EIO;
    } else {
      *lease = response->id;
    }
  }
  if (response != NULL)
    protobuf_c_message_free_unpacked(&response->base, NULL);
  return rc;
}

int wagma_etcd_lease_revoke(wagma_etcd_t *etcd, int64_t lease) {
  Etcdserverpb__LeaseRevokeRequest request = ETCDSERVERPB__LEASE_REVOKE_REQUEST__INIT;
  Etcdserverpb__LeaseRevokeResponse *response = NULL;
  int rc;
  if (etcd == NULL)
    return WAGMA_EINVAL;
  request.id = lease;
  rc = wg_etcd_unary(etcd, LEASE_REVOKE, &request.base,
                     &etcdserverpb__lease_revoke_response__descriptor,
                     (ProtobufCMessage **)&response, 0, NULL);
  if (response != NULL)
    protobuf_c_message_free_unpacked(&response->base, NULL);
  return rc;
}

int wagma_etcd_lease_ttl(wagma_etcd_t *etcd, int64_t lease, int64_t *remaining_s,
                         int64_t *granted_s) {
  Etcdserverpb__LeaseTimeToLiveRequest request = ETCDSERVERPB__LEASE_TIME_TO_LIVE_REQUEST__INIT;
  Etcdserverpb__LeaseTimeToLiveResponse *response = NULL;
  int rc;
  if (etcd == NULL)
    return WAGMA_EINVAL;
  request.id = lease;
  rc = wg_etcd_unary(etcd, LEASE_TTL, &request.base,
                     &etcdserverpb__lease_time_to_live_response__descriptor,
                     (ProtobufCMessage **)&response, 0, NULL);
  if (rc == 0) {
    if (response->ttl < 0) { /* etcd answers TTL -1 for an expired or unknown lease */
      wg_etcd_set_error(etcd, "etcd LeaseTimeToLive: lease %lld not found", (long long)lease);
      rc = WAGMA_ENOTFOUND;
    } else {
      if (remaining_s != NULL)
        *remaining_s = response->ttl;
      if (granted_s != NULL)
        *granted_s = response->grantedttl;
    }
  }
  if (response != NULL)
    protobuf_c_message_free_unpacked(&response->base, NULL);
  return rc;
}

static int keepalive_once(wagma_etcd_t *etcd, int64_t lease, int64_t *ttl_s, int64_t deadline_ms) {
  Etcdserverpb__LeaseKeepAliveRequest request = ETCDSERVERPB__LEASE_KEEP_ALIVE_REQUEST__INIT;
  Etcdserverpb__LeaseKeepAliveResponse *response = NULL;
  int rc;
  request.id = lease;
  rc = wg_etcd_unary(etcd, LEASE_KEEPALIVE, &request.base,
                     &etcdserverpb__lease_keep_alive_response__descriptor,
                     (ProtobufCMessage **)&response, deadline_ms, NULL);
  if (rc == 0) {
    if (response->ttl <= 0) {
      wg_etcd_set_error(etcd, "etcd LeaseKeepAlive: lease %lld not found", (long long)lease);
      rc = WAGMA_ENOTFOUND;
    } else if (ttl_s != NULL) {
      *ttl_s = response->ttl;
    }
  }
  if (response != NULL)
    protobuf_c_message_free_unpacked(&response->base, NULL);
  return rc;
}

int wagma_etcd_lease_keepalive_once(wagma_etcd_t *etcd, int64_t lease, int64_t *ttl_s) {
  if (etcd == NULL)
    return WAGMA_EINVAL;
  return keepalive_once(etcd, lease, ttl_s, 0);
}

/* ---- keepalive thread --------------------------------------------------------------- */

struct wagma_etcd_keepalive {
  wagma_etcd_t *etcd;
  int64_t lease;
  int64_t ttl_ms; /* the TTL etcd last reported */
  wagma_etcd_lease_lost_fn lost;
  void *user;
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t wake; /* CLOCK_MONOTONIC */
  int stopping;        /* guarded by lock */
  int kicked;          /* guarded by lock: etcd served the handle again, refresh now */
  struct wagma_etcd_keepalive *next; /* the handle's list, guarded by etcd->lock */
};

void wg_etcd_kick_keepalives_locked(wagma_etcd_t *etcd) {
  for (wagma_etcd_keepalive_t *ka = etcd->keepalives; ka != NULL; ka = ka->next) {
    pthread_mutex_lock(&ka->lock);
    ka->kicked = 1;
    pthread_cond_broadcast(&ka->wake);
    pthread_mutex_unlock(&ka->lock);
  }
}

static void keepalive_unlink(wagma_etcd_keepalive_t *ka) {
  pthread_mutex_lock(&ka->etcd->lock);
  for (wagma_etcd_keepalive_t **link = &ka->etcd->keepalives; *link != NULL;
       link = &(*link)->next) {
    if (*link == ka) {
      *link = ka->next;
      break;
    }
  }
  pthread_mutex_unlock(&ka->etcd->lock);
}

/* Waits until ms pass, a kick (consumed) or stop; returns nonzero when stopping. */
static int wait_or_stop(wagma_etcd_keepalive_t *ka, int64_t ms) {
  struct timespec until;
  int stopping;
  clock_gettime(CLOCK_MONOTONIC, &until);
  until.tv_sec += ms / 1000;
  until.tv_nsec += (ms % 1000) * 1000000;
  if (until.tv_nsec >= 1000000000) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000;
  }
  pthread_mutex_lock(&ka->lock);
  while (!ka->stopping && !ka->kicked) {
    if (pthread_cond_timedwait(&ka->wake, &ka->lock, &until) == ETIMEDOUT)
      break;
  }
  ka->kicked = 0;
  stopping = ka->stopping;
  pthread_mutex_unlock(&ka->lock);
  return stopping;
}

static void *keepalive_main(void *arg) {
  wagma_etcd_keepalive_t *ka = arg;
  int64_t last_ok = wg_etcd_now_ms();
  int64_t pause = ka->ttl_ms / 3;
  int retrying = 0;

  while (!wait_or_stop(ka, pause)) {
    int64_t ttl_s = 0;
    int64_t now = wg_etcd_now_ms();
    int64_t expires = last_ok + ka->ttl_ms;
    int64_t deadline = now + ka->etcd->call_timeout_ms;
    int rc = WAGMA_ETIMEDOUT;
    if (deadline > expires)
      deadline = expires; /* no point in refreshing a lease etcd has already expired */
    if (now < expires)
      rc = keepalive_once(ka->etcd, ka->lease, &ttl_s, deadline);
    if (rc == 0) {
      if (retrying)
        wg_logf(ka->etcd->log_fn, ka->etcd->log_user, WAGMA_LOG_DEBUG,
                "etcd lease %llx refreshed again after %lld ms of a %lld ms TTL",
                (unsigned long long)ka->lease, (long long)(wg_etcd_now_ms() - last_ok),
                (long long)ka->ttl_ms);
      last_ok = wg_etcd_now_ms();
      ka->ttl_ms = ttl_s * 1000;
      pause = ka->ttl_ms / 3;
      retrying = 0;
      continue;
    }
    now = wg_etcd_now_ms();
    if (rc == WAGMA_ENOTFOUND || now >= expires) {
      int status = rc == WAGMA_ENOTFOUND ? WAGMA_ENOTFOUND : WAGMA_ETIMEDOUT;
      wg_logf(ka->etcd->log_fn, ka->etcd->log_user, WAGMA_LOG_WARN,
              "etcd lease %llx lost (%s): no refresh for %lld ms; last: %s",
              (unsigned long long)ka->lease, wagma_strerror(status), (long long)(now - last_ok),
              wagma_etcd_errmsg(ka->etcd));
      if (ka->lost != NULL)
        ka->lost(ka->user, ka->lease, status);
      while (!wait_or_stop(ka, INT64_MAX / 4)) {
      }
      break;
    }
    wg_logf(ka->etcd->log_fn, ka->etcd->log_user, WAGMA_LOG_DEBUG,
            "etcd lease %llx refresh failed, retrying: %s", (unsigned long long)ka->lease,
            wagma_etcd_errmsg(ka->etcd));
    /* retry soon (or at once when kicked), the last try ending at the expiry */
    retrying = 1;
    pause = expires - now < KEEPALIVE_RETRY_MS ? expires - now : KEEPALIVE_RETRY_MS;
  }
  return NULL;
}

int wagma_etcd_keepalive_start(wagma_etcd_t *etcd, int64_t lease, wagma_etcd_lease_lost_fn lost,
                               void *user, wagma_etcd_keepalive_t **out) {
  wagma_etcd_keepalive_t *ka = NULL;
  pthread_condattr_t attr;
  int64_t ttl_s = 0;
  int rc;
  if (etcd == NULL || out == NULL)
    return WAGMA_EINVAL;
  *out = NULL;
  rc = keepalive_once(etcd, lease, &ttl_s, 0);
  if (rc != 0)
    return rc;
  ka = calloc(1, sizeof *ka);
  if (ka == NULL)
    return WAGMA_ENOMEM;
  ka->etcd = etcd;
  ka->lease = lease;
  ka->ttl_ms = ttl_s * 1000;
  ka->lost = lost;
  ka->user = user;
  pthread_mutex_init(&ka->lock, NULL);
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&ka->wake, &attr);
  pthread_condattr_destroy(&attr);
  pthread_mutex_lock(&etcd->lock);
  ka->next = etcd->keepalives;
  etcd->keepalives = ka;
  pthread_mutex_unlock(&etcd->lock);
  if (pthread_create(&ka->thread, NULL, keepalive_main, ka) != 0) {
    keepalive_unlink(ka);
    pthread_cond_destroy(&ka->wake);
    pthread_mutex_destroy(&ka->lock);
    free(ka);
    return WAGMA_ENOMEM;
  }
  *out = ka;
  return 0;
}

void wagma_etcd_keepalive_stop(wagma_etcd_keepalive_t *ka) {
  if (ka == NULL)
    return;
  keepalive_unlink(ka);
  pthread_mutex_lock(&ka->lock);
  ka->stopping = 1;
  pthread_cond_broadcast(&ka->wake);
  pthread_mutex_unlock(&ka->lock);
  pthread_join(ka->thread, NULL);
  pthread_cond_destroy(&ka->wake);
  pthread_mutex_destroy(&ka->lock);
  free(ka);
}
