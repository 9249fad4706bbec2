/* fake_transport.c — see fake_transport.h. One world mutex guards every mailbox; each
 * endpoint has its own condition variable (CLOCK_MONOTONIC). */
#include "fake_transport.h"
#include "transport.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct fake_ep {
  int rank;
  int alive;
  int closed;
  int interrupted;
  int frozen;
  wg_message_t *head, *tail;
  pthread_cond_t cv;
  wg_transport_stats_t stats;
  uint64_t epoch;
} fake_ep_t;

static pthread_mutex_t world_mu = PTHREAD_MUTEX_INITIALIZER;
static fake_tap_fn tap_fn;
static void *tap_user;

void fake_set_tap(fake_tap_fn fn, void *user) {
  pthread_mutex_lock(&world_mu);
  tap_fn = fn;
  tap_user = user;
  pthread_mutex_unlock(&world_mu);
}
static fake_ep_t *world;
static int world_n;

void fake_world_init(int nranks) {
  world = calloc((size_t)nranks, sizeof(*world));
  world_n = nranks;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  for (int i = 0; i < nranks; i++) {
    world[i].rank = i;
    world[i].alive = 1;
    pthread_cond_init(&world[i].cv, &ca);
  }
  pthread_condattr_destroy(&ca);
}

static void drain(fake_ep_t *ep) {
  wg_message_t *m = ep->head;
  while (m) {
    wg_message_t *n = m->next;
    wg_message_free(m);
    m = n;
  }
  ep->head = ep->tail = NULL;
}

void fake_world_free(void) {
  for (int i = 0; i < world_n; i++) {
    drain(&world[i]);
    pthread_cond_destroy(&world[i].cv);
  }
  free(world);
  world = NULL;
  world_n = 0;
}

void fake_kill(int rank) {
  pthread_mutex_lock(&world_mu);
  world[rank].alive = 0;
  drain(&world[rank]);
  pthread_cond_broadcast(&world[rank].cv);
  pthread_mutex_unlock(&world_mu);
}

void fake_freeze(int rank, int frozen) {
  pthread_mutex_lock(&world_mu);
  world[rank].frozen = frozen;
  pthread_cond_broadcast(&world[rank].cv);
  pthread_mutex_unlock(&world_mu);
}

static int fake_open(const wg_transport_config_t *cfg, wg_transport_t **out) {
  if (!world || cfg->rank < 0 || cfg->rank >= world_n)
    return WAGMA_EINVAL;
  pthread_mutex_lock(&world_mu);
  world[cfg->rank].epoch = cfg->epoch;
  pthread_mutex_unlock(&world_mu);
  *out = (wg_transport_t *)&world[cfg->rank];
  return 0;
}

static int fake_send(wg_transport_t *t, int dst, wg_frame_header_t *h, const void *payload,
                     size_t length) {
  fake_ep_t *ep = (fake_ep_t *)t;
  int rc = 0;
  pthread_mutex_lock(&world_mu);
  if (ep->closed || ep->interrupted) {
    rc = WAGMA_ECLOSED;
    goto out;
  }
  if (dst < 0 || dst >= world_n || !world[dst].alive || world[dst].closed) {
    rc = WAGMA_EPEER;
    goto out;
  }
  if (!ep->alive)
    goto out; /* a dead rank's frames vanish */
  wg_message_t *m = wg_message_new(h, length);
  if (m == NULL) {
    rc = WAGMA_ENOMEM;
    goto out;
  }
  m->header.magic = WG_FRAME_MAGIC;
  m->header.version = WG_FRAME_VERSION;
  m->header.epoch = ep->epoch;
  m->header.src = (uint32_t)ep->rank;
  m->header.length = length;
  if (length)
    memcpy(m->payload, payload, length);
  if (tap_fn)
    tap_fn(dst, &m->header, m->payload, length, tap_user);
  fake_ep_t *d = &world[dst];
  if (d->tail)
    d->tail->next = m;
  else
    d->head = m;
  d->tail = m;
  ep->stats.bytes_sent += length + WG_FRAME_HEADER_SIZE;
  d->stats.bytes_received += length + WG_FRAME_HEADER_SIZE;
  pthread_cond_broadcast(&d->cv);
out:
  pthread_mutex_unlock(&world_mu);
  return rc;
}

static int matches(const wg_match_t *k, const wg_frame_header_t *h) {
  return (k->src == WG_ANY || k->src == h->src) && (k->kinds == 0 || (k->kinds >> h->kind) & 1) &&
         (k->round == WG_ANY || k->round == h->round) &&
         (k->group == WG_ANY || k->group == h->group) && (k->seq == WG_ANY || k->seq == h->seq);
}

static int fake_recv(wg_transport_t *t, const wg_match_t *k, double deadline, wg_message_t **out) {
  fake_ep_t *ep = (fake_ep_t *)t;
  struct timespec ts;
  ts.tv_sec = (time_t)deadline;
  ts.tv_nsec = (long)((deadline - (double)ts.tv_sec) * 1e9);
  int rc = 0;
  pthread_mutex_lock(&world_mu);
  for (;;) {
    if (ep->closed || ep->interrupted) {
      rc = WAGMA_ECLOSED;
      break;
    }
    if (!ep->frozen) {
      wg_message_t *prev = NULL;
      for (wg_message_t *m = ep->head; m; prev = m, m = m->next) {
        if (!matches(k, &m->header))
          continue;
        if (prev)
          prev->next = m->next;
        else
          ep->head = m->next;
        if (ep->tail == m)
          ep->tail = prev;
        m->next = NULL;
        *out = m;
        goto done;
      }
      if (k->src != WG_ANY && k->src < (uint64_t)world_n && !world[k->src].alive) {
        rc = WAGMA_EPEER;
        break;
      }
    }
    if (pthread_cond_timedwait(&ep->cv, &world_mu, &ts) != 0) {
      rc = WAGMA_ETIMEDOUT;
      break;
    }
  }
done:
  pthread_mutex_unlock(&world_mu);
  return rc;
}

static int fake_peer_alive(wg_transport_t *t, int rank) {
  (void)t;
  pthread_mutex_lock(&world_mu);
  int alive = rank >= 0 && rank < world_n && world[rank].alive && !world[rank].closed;
  pthread_mutex_unlock(&world_mu);
  return alive;
}

static void fake_interrupt(wg_transport_t *t) {
  fake_ep_t *ep = (fake_ep_t *)t;
  pthread_mutex_lock(&world_mu);
  ep->interrupted = 1;
  pthread_cond_broadcast(&ep->cv);
  pthread_mutex_unlock(&world_mu);
}

static void fake_stats(wg_transport_t *t, wg_transport_stats_t *out) {
  fake_ep_t *ep = (fake_ep_t *)t;
  pthread_mutex_lock(&world_mu);
  *out = ep->stats;
  pthread_mutex_unlock(&world_mu);
}

static void fake_close(wg_transport_t *t) {
  fake_ep_t *ep = (fake_ep_t *)t;
  pthread_mutex_lock(&world_mu);
  ep->closed = 1;
  drain(ep);
  pthread_cond_broadcast(&ep->cv);
  pthread_mutex_unlock(&world_mu);
}

const wg_transport_ops_t fake_transport = {
    .name = "fake",
    .open = fake_open,
    .send = fake_send,
    .recv = fake_recv,
    .peer_alive = fake_peer_alive,
    .interrupt = fake_interrupt,
    .stats = fake_stats,
    .close = fake_close,
};

int fake_plan(int P, int S, int tau, wagma_global_sync_t mode, wagma_plan_t *plan) {
  int rc = wagma_plan_build(P, S, NULL, plan);
  if (rc != 0)
    return rc;
  plan->epoch = 1;
  plan->start_round = 0;
  plan->staleness_bound = tau;
  plan->global_sync = mode;
  for (int i = 0; i < P; i++) {
    snprintf(plan->members[i].name, WAGMA_NAME_MAX, "r%d", i);
    snprintf(plan->members[i].address, WAGMA_ADDRESS_MAX, "fake:%d", i);
  }
  return 0;
}
