/* election.c — leader election through etcd's v3electionpb.Election service.
 *
 * etcd runs the election protocol server-side (keys "<name>/<lease hex>" under the
 * candidate's lease; the lowest create revision leads). We keep the LeaderKey etcd returns
 * from Campaign, for Proclaim and Resign.
 * Owns: the election name and our LeaderKey. No threads of its own; a campaign blocks its
 * caller and can be canceled from another thread through `cancel`.
 * Invariants: `leading` is set only after a successful Campaign and cleared by resign. */
#include <stdlib.h>
#include <string.h>

#include "etcd_internal.h"

#define ELECTION_CAMPAIGN "/v3electionpb.Election/Campaign"
#define ELECTION_PROCLAIM "/v3electionpb.Election/Proclaim"
#define ELECTION_LEADER "/v3electionpb.Election/Leader"
#define ELECTION_RESIGN "/v3electionpb.Election/Resign"

#define FOREVER_MS ((int64_t)1 << 50)

struct wagma_etcd_election {
  wagma_etcd_t *etcd;
  char *name;
  pthread_mutex_t lock; /* guards the leader key fields and leading */
  wg_etcd_cancel_t cancel;
  int leading;
  uint8_t *leader_key; /* our candidate key, from Campaign */
  size_t leader_key_len;
  int64_t leader_rev;
  int64_t leader_lease;
};

int wagma_etcd_election_open(wagma_etcd_t *etcd, const char *name, wagma_etcd_election_t **out) {
  wagma_etcd_election_t *e;
  if (out != NULL)
    *out = NULL;
  if (etcd == NULL || name == NULL || name[0] == '\0' || out == NULL)
    return WAGMA_EINVAL;
  e = calloc(1, sizeof *e);
  if (e == NULL)
    return WAGMA_ENOMEM;
  e->etcd = etcd;
  e->name = strdup(name);
  if (e->name == NULL) {
    free(e);
    return WAGMA_ENOMEM;
  }
  pthread_mutex_init(&e->lock, NULL);
  wg_etcd_cancel_init(&e->cancel);
  *out = e;
  return 0;
}

void wagma_etcd_election_close(wagma_etcd_election_t *e) {
  if (e == NULL)
    return;
  wg_etcd_cancel_destroy(&e->cancel);
  pthread_mutex_destroy(&e->lock);
  free(e->leader_key);
  free(e->name);
  free(e);
}

void wagma_etcd_election_cancel(wagma_etcd_election_t *e) {
  if (e != NULL)
    wg_etcd_cancel_fire(&e->cancel);
}

int wagma_etcd_election_is_leader(wagma_etcd_election_t *e) {
  int leading;
  if (e == NULL)
    return 0;
  pthread_mutex_lock(&e->lock);
  leading = e->leading;
  pthread_mutex_unlock(&e->lock);
  return leading;
}

int wagma_etcd_election_campaign(wagma_etcd_election_t *e, int64_t lease, const void *value,
                                 size_t value_len, int timeout_ms) {
  Etcdserverpb__CampaignRequest request = ETCDSERVERPB__CAMPAIGN_REQUEST__INIT;
  Etcdserverpb__CampaignResponse *response = NULL;
  int64_t deadline;
  int rc;
  if (e == NULL || lease == 0 || (value == NULL && value_len > 0))
    return WAGMA_EINVAL;
  deadline = wg_etcd_now_ms() + (timeout_ms > 0 ? timeout_ms : FOREVER_MS);
  pthread_mutex_lock(&e->cancel.lock);
  e->cancel.canceled = 0;
  pthread_mutex_unlock(&e->cancel.lock);

  request.name.data = (uint8_t *)e->name;
  request.name.len = strlen(e->name);
  request.lease = lease;
  request.value.data = (uint8_t *)value;
  request.value.len = value_len;
  rc = wg_etcd_unary(e->etcd, ELECTION_CAMPAIGN, &request.base,
                     &etcdserverpb__campaign_response__descriptor, (ProtobufCMessage **)&response,
                     deadline, &e->cancel);
  if (rc != 0)
    goto out;
  if (response->leader == NULL) {
    wg_etcd_set_error(e->etcd, "etcd Campaign %s: answer without leader key", e->name);
    rc = WAGMA_EPROTO;
    goto out;
  }
  pthread_mutex_lock(&e->lock);
  free(e->leader_key);
  e->leader_key = malloc(response->leader->key.len + 1);
  if (e->leader_key == NULL) {
    rc = WAGMA_ENOMEM;
  } else {
    memcpy(e->leader_key, response->leader->key.data, response->leader->key.len);
    e->leader_key_len = response->leader->key.len;
    e->leader_rev = response->leader->rev;
    e->leader_lease = response->leader->lease;
    e->leading = 1;
  }
  pthread_mutex_unlock(&e->lock);
out:
  if (response != NULL)
    protobuf_c_message_free_unpacked(&response->base, NULL);
  return rc;
}

/* Fills key (pointing into e, valid while e->lock is held by the caller). Returns nonzero
 * when we do not lead. */
static int our_leader_key(wagma_etcd_election_t *e, Etcdserverpb__LeaderKey *key) {
  if (!e->leading)
    return WAGMA_EPERM;
  etcdserverpb__leader_key__init(key);
  key->name.data = (uint8_t *)e->name;
  key->name.len = strlen(e->name);
  key->key.data = e->leader_key;
  key->key.len = e->leader_key_len;
  key->rev = e->leader_rev;
  key->lease = e->leader_lease;
  return 0;
}

int wagma_etcd_election_proclaim(wagma_etcd_election_t *e, const void *value, size_t value_len) {
  Etcdserverpb__ProclaimRequest request = ETCDSERVERPB__PROCLAIM_REQUEST__INIT;
  Etcdserverpb__ProclaimResponse *response = NULL;
  Etcdserverpb__LeaderKey key;
  int rc;
  if (e == NULL || (value == NULL && value_len > 0))
    return WAGMA_EINVAL;
  pthread_mutex_lock(&e->lock);
  rc = our_leader_key(e, &key);
  if (rc != 0) {
    pthread_mutex_unlock(&e->lock);
    wg_etcd_set_error(e->etcd, "etcd Proclaim %s: not the leader", e->name);
    return rc;
  }
  request.leader = &key;
  request.value.data = (uint8_t *)value;
  request.value.len = value_len;
  rc = wg_etcd_unary(e->etcd, ELECTION_PROCLAIM, &request.base,
                     &etcdserverpb__proclaim_response__descriptor, (ProtobufCMessage **)&response,
                     0, NULL);
  pthread_mutex_unlock(&e->lock);
  if (response != NULL)
    protobuf_c_message_free_unpacked(&response->base, NULL);
  return rc;
}

int wagma_etcd_election_resign(wagma_etcd_election_t *e) {
  Etcdserverpb__ResignRequest request = ETCDSERVERPB__RESIGN_REQUEST__INIT;
  Etcdserverpb__ResignResponse *response = NULL;
  Etcdserverpb__LeaderKey key;
  int rc;
  if (e == NULL)
    return WAGMA_EINVAL;
  pthread_mutex_lock(&e->lock);
  if (our_leader_key(e, &key) != 0) {
    pthread_mutex_unlock(&e->lock);
    return 0;
  }
  request.leader = &key;
  rc = wg_etcd_unary(e->etcd, ELECTION_RESIGN, &request.base,
                     &etcdserverpb__resign_response__descriptor, (ProtobufCMessage **)&response, 0,
                     NULL);
  if (rc == 0)
    e->leading = 0;
  pthread_mutex_unlock(&e->lock);
  if (response != NULL)
    protobuf_c_message_free_unpacked(&response->base, NULL);
  return rc;
}

int wagma_etcd_election_leader(wagma_etcd_t *etcd, const char *name, wagma_etcd_kv_t **leader) {
  Etcdserverpb__LeaderRequest request = ETCDSERVERPB__LEADER_REQUEST__INIT;
  Etcdserverpb__LeaderResponse *response = NULL;
  int rc;
  if (leader != NULL)
    *leader = NULL;
  if (etcd == NULL || name == NULL || name[0] == '\0' || leader == NULL)
    return WAGMA_EINVAL;
  request.name.data = (uint8_t *)name;
  request.name.len = strlen(name);
  rc = wg_etcd_unary(etcd, ELECTION_LEADER, &request.base,
                     &etcdserverpb__leader_response__descriptor, (ProtobufCMessage **)&response, 0,
                     NULL);
  if (rc != 0)
    goto out;
  if (response->kv == NULL) {
    wg_etcd_set_error(etcd, "etcd Leader %s: no leader", name);
    rc = WAGMA_ENOTFOUND;
    goto out;
  }
  *leader = malloc(sizeof **leader);
  if (*leader == NULL || wg_etcd_kv_copy(*leader, response->kv) != 0) {
    free(*leader);
    *leader = NULL;
    rc = WAGMA_ENOMEM;
  }
out:
  if (response != NULL)
    protobuf_c_message_free_unpacked(&response->base, NULL);
  return rc;
}

int wagma_etcd_election_observe(wagma_etcd_t *etcd, const char *name, wagma_etcd_leader_fn fn,
                                void *user, wagma_etcd_watch_t **out) {
  char *prefix;
  size_t len;
  int rc;
  if (out != NULL)
    *out = NULL;
  if (etcd == NULL || name == NULL || name[0] == '\0' || fn == NULL || out == NULL)
    return WAGMA_EINVAL;
  len = strlen(name);
  prefix = malloc(len + 2);
  if (prefix == NULL)
    return WAGMA_ENOMEM;
  memcpy(prefix, name, len);
  memcpy(prefix + len, "/", 2);
  rc = wg_etcd_watch_begin(etcd, prefix, 1, 0, 0, NULL, fn, name, user, out);
  free(prefix);
  return rc;
}
