/* coordinator/election.c — leader election among coordinator replicas.
 *
 * The leader holds <prefix>/coordinator/leader = {"id","address","since"} attached to its
 * lease (TTL --lease-ttl). One campaign thread per process, every `period` (TTL/10, at least
 * 100 ms, at most 500 ms):
 *   - without a live lease: grant one and start its keepalive;
 *   - not leading: Txn "version(leader) == 0 -> put leader with our lease" (we win if the key
 *     is absent, i.e. the old leader resigned or its lease expired);
 *   - leading: check that the key still carries our lease; if not, step down.
 * The keepalive's lost callback steps down at once. On stop the lease is revoked, so the key
 * disappears and a follower takes over within one period instead of one TTL.
 * A killed leader is replaced after its lease expires: at most TTL + period.
 * Every scheduler write compares LEASE(leader key) == our lease, so a deposed leader that
 * has not noticed yet cannot write. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "election.h"
#include "wagma/log_internal.h"
#include "wagma/clock_internal.h"

struct wg_election {
  wagma_etcd_t *etcd;
  char key[256];
  char id[WAGMA_API_NAME_MAX];
  char address[96];
  int ttl_s;
  double period_s;
  wagma_log_fn log;
  void *log_user;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int stop; /* under mu */
  atomic_int leader;
  atomic_llong leader_lease; /* lease of our leader key while leader */
  atomic_int lease_lost;
  int64_t lease;              /* campaign thread only */
  wagma_etcd_keepalive_t *ka; /* campaign thread only */
};

static void on_lease_lost(void *user, int64_t lease, int status) {
  wg_election_t *e = user;
  atomic_store(&e->lease_lost, 1);
  if (atomic_exchange(&e->leader, 0))
    wg_logf(e->log, e->log_user, WAGMA_LOG_WARN, "lease %llx lost (%s): no longer leader",
            (long long)lease, wagma_strerror(status));
  pthread_mutex_lock(&e->mu);
  pthread_cond_signal(&e->cv);
  pthread_mutex_unlock(&e->mu);
}

static void drop_lease(wg_election_t *e, int revoke) {
  if (e->ka) {
    wagma_etcd_keepalive_stop(e->ka);
    e->ka = NULL;
  }
  if (e->lease && revoke)
    wagma_etcd_lease_revoke(e->etcd, e->lease);
  e->lease = 0;
  atomic_store(&e->lease_lost, 0);
}

static void step(wg_election_t *e) {
  int rc;
  if (atomic_load(&e->lease_lost))
    drop_lease(e, 0);
  if (!e->lease) {
    int64_t lease = 0;
    if ((rc = wagma_etcd_lease_grant(e->etcd, e->ttl_s, &lease)) != 0) {
      wg_logf(e->log, e->log_user, WAGMA_LOG_DEBUG, "election: lease grant: %s",
              wagma_etcd_errmsg(e->etcd));
      return;
    }
    if ((rc = wagma_etcd_keepalive_start(e->etcd, lease, on_lease_lost, e, &e->ka)) != 0) {
      wagma_etcd_lease_revoke(e->etcd, lease);
      return;
    }
    e->lease = lease;
  }
  if (!atomic_load(&e->leader)) {
    char value[256];
    snprintf(value, sizeof value, "{\"id\":\"%s\",\"address\":\"%s\",\"since\":%.3f}", e->id,
             e->address, wg_wall());
    wagma_etcd_cmp_t cmp = {
        .key = e->key, .target = WAGMA_ETCD_CMP_VERSION, .result = WAGMA_ETCD_EQUAL, .number = 0};
    wagma_etcd_op_t op = {.type = WAGMA_ETCD_OP_PUT,
                          .key = e->key,
                          .value = value,
                          .value_len = strlen(value),
                          .lease = e->lease};
    rc = wagma_etcd_txn(e->etcd, &cmp, 1, &op, 1, NULL, 0, NULL);
    if (rc == WAGMA_ECONFLICT) {
      /* An earlier campaign Txn may have committed although its answer was lost (deadline):
       * the key then carries our lease, which we keep alive, and nobody else can win. */
      wagma_etcd_kv_t *kv = NULL;
      if (wagma_etcd_get(e->etcd, e->key, &kv, NULL) == 0 && kv->lease == e->lease)
        rc = 0;
      wagma_etcd_kv_free(kv);
    }
    if (rc == 0) {
      atomic_store(&e->leader_lease, e->lease);
      atomic_store(&e->leader, 1);
      wg_logf(e->log, e->log_user, WAGMA_LOG_INFO, "elected leader (lease %llx)",
              (long long)e->lease);
    }
    return;
  }
  wagma_etcd_kv_t *kv = NULL;
  rc = wagma_etcd_get(e->etcd, e->key, &kv, NULL);
  if (rc == WAGMA_ENOTFOUND || (rc == 0 && kv->lease != e->lease)) {
    atomic_store(&e->leader, 0);
    wg_logf(e->log, e->log_user, WAGMA_LOG_WARN, "leader key lost: stepping down");
  }
  wagma_etcd_kv_free(kv);
}

static void *campaign_main(void *arg) {
  wg_election_t *e = arg;
  pthread_mutex_lock(&e->mu);
  while (!e->stop) {
    pthread_mutex_unlock(&e->mu);
    step(e);
    pthread_mutex_lock(&e->mu);
    if (e->stop)
      break;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    long ns = (long)(e->period_s * 1e9);
    ts.tv_sec += ns / 1000000000L;
    ts.tv_nsec += ns % 1000000000L;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&e->cv, &e->mu, &ts);
  }
  pthread_mutex_unlock(&e->mu);
  atomic_store(&e->leader, 0);
  drop_lease(e, 1);
  return NULL;
}

int wg_election_start(wagma_etcd_t *etcd, const wagma_keys_t *keys, const char *id,
                      const char *address, int ttl_s, wagma_log_fn log, void *log_user,
                      wg_election_t **out) {
  wg_election_t *e = calloc(1, sizeof *e);
  if (!e)
    return WAGMA_ENOMEM;
  e->etcd = etcd;
  wagma_key_leader(keys, e->key, sizeof e->key);
  snprintf(e->id, sizeof e->id, "%s", id);
  snprintf(e->address, sizeof e->address, "%s", address);
  e->ttl_s = ttl_s < 1 ? 1 : ttl_s;
  e->period_s = e->ttl_s / 10.0;
  if (e->period_s < 0.1)
    e->period_s = 0.1;
  if (e->period_s > 0.5)
    e->period_s = 0.5;
  e->log = log;
  e->log_user = log_user;
  pthread_mutex_init(&e->mu, NULL);
  pthread_condattr_t ca; /* timed waits on the monotonic clock: immune to clock steps */
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&e->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (pthread_create(&e->thread, NULL, campaign_main, e) != 0) {
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
    return WAGMA_EIO;
  }
  *out = e;
  return 0;
}

void wg_election_stop(wg_election_t *e) {
  if (!e)
    return;
  pthread_mutex_lock(&e->mu);
  e->stop = 1;
  pthread_cond_signal(&e->cv);
  pthread_mutex_unlock(&e->mu);
  pthread_join(e->thread, NULL);
  pthread_mutex_destroy(&e->mu);
  pthread_cond_destroy(&e->cv);
  free(e);
}

int wg_election_is_leader(wg_election_t *e, int64_t *lease) {
  if (!e)
    return 0;
  int l = atomic_load(&e->leader);
  if (lease)
    *lease = l ? (int64_t)atomic_load(&e->leader_lease) : 0;
  return l;
}
