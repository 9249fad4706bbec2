/* nccl.c — the NCCL transport's operations table (wg_nccl_transport; docs/design.md §6.4):
 * open (the TCP control channel, the device check, the lane thread), send (a small frame on
 * TCP; a large one's header announced on TCP and its payload queued for the lane), recv
 * from this transport's mailbox, peer_alive and peer_unreachable (TCP's), interrupt, stats, close.
 *
 * Owns the mailbox and the outbound transfer list, both under t->mu, which engine threads and
 * the lane thread share. Threads: send, recv, peer_alive, interrupt, stats from any thread;
 * open and close from one. The NCCL and CUDA calls here: the device check in open, and what
 * close does after the lane thread ended; send makes none (its page-locked buffer comes from
 * the cache, nccl_hostmem.c). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nccl_internal.h"
#include "wagma/log_internal.h"

#ifdef WG_NCCL_FAKE
#define NC_OPS_NAME wg_ncclfake_transport
#else
#define NC_OPS_NAME wg_nccl_transport
#endif

void WG_NCCL(deliver)(nc_t *t, wg_message_t *m) {
  m->next = NULL;
  pthread_mutex_lock(&t->mu);
  if (t->box_tail)
    t->box_tail->next = m;
  else
    t->box_head = m;
  t->box_tail = m;
  pthread_cond_broadcast(&t->cv);
  pthread_mutex_unlock(&t->mu);
}

void WG_NCCL(mark_dead_done)(nc_t *t, int rank) {
  pthread_mutex_lock(&t->mu);
  t->dead_done[rank] = 1;
  pthread_cond_broadcast(&t->cv);
  pthread_mutex_unlock(&t->mu);
}

int WG_NCCL(control)(nc_t *t, int dst, enum nc_op op, uint64_t id, const void *payload,
                     size_t len) {
  wg_frame_header_t h = {0};
  h.kind = WG_FRAME_COLL;
  h.group = NC_GROUP;
  h.seq = (uint64_t)op;
  h.aux = id;
  return t->tcp_ops->send(t->tcp, dst, &h, payload, len);
}

/* Test builds only: pauses between the first look at the lane and the copy, as a large
 * payload's copy does, so that a revoke can come in between (test_nccl_transport). */
static void test_pause(void) {
#ifdef WG_NCCL_FAKE
  const char *us = getenv("WG_NCCL_TEST_SEND_PAUSE_US");
  if (us && *us)
    usleep((useconds_t)strtol(us, NULL, 10));
#endif
}

static int nc_send(wg_transport_t *t, int dst, wg_frame_header_t *header, const void *payload,
                   size_t length) {
  if (dst < 0 || dst >= t->nranks || dst == t->rank)
    return WAGMA_EINVAL;
  int lane = 0;
  if (length >= NC_LANE_MIN_BYTES && atomic_load(&t->lane_state) == NC_LANE_UP) {
    pthread_mutex_lock(&t->mu); /* a first look: no copy for a peer whose lane is not up */
    lane = t->peer_up[dst] && !t->closed;
    pthread_mutex_unlock(&t->mu);
  }
  if (!lane)
    return t->tcp_ops->send(t->tcp, dst, header, payload, length);
  if (!t->tcp_ops->peer_alive(t->tcp, dst))
    return WAGMA_EPEER;
  test_pause();
  nc_xfer_t *x = calloc(1, sizeof *x);
  uint8_t *host = x ? WG_NCCL(payload_buffer)(t->device, length) : NULL;
  if (!x || !host) {
    free(x);
    wg_buf_free(host);
    return WAGMA_ENOMEM;
  }
  memcpy(host, payload, length);
  header->magic = WG_FRAME_MAGIC;
  header->version = WG_FRAME_VERSION;
  header->epoch = t->epoch;
  header->src = (uint32_t)t->rank;
  header->length = length;
  header->reserved = 0;
  wg_frame_encode(header, x->header);
  x->dst = dst;
  x->host = host;
  x->len = length;
  /* Decided and announced under mu, in one hold: lane_down clears peer_up and then re-sends
   * the outbound list, each under mu, so a transfer is either in the list before that re-send
   * or sent whole on TCP here (the receiver holds it behind any earlier transfer of mine).
   * Announcing under mu also keeps the announcements to one peer in the list's order. */
  pthread_mutex_lock(&t->mu);
  lane = atomic_load(&t->lane_state) == NC_LANE_UP && t->peer_up[dst] && !t->closed;
  int rc = 0;
  if (lane) {
    x->id = ++t->next_id;
    rc = WG_NCCL(control)(t, dst, NC_ANNOUNCE, x->id, x->header, WG_FRAME_HEADER_SIZE);
    if (rc == 0) {
      nc_xfer_t **p = &t->out;
      while (*p)
        p = &(*p)->next;
      *p = x;
    }
  }
  pthread_mutex_unlock(&t->mu);
  if (lane && rc == 0)
    return 0;
  wg_buf_free(host);
  free(x);
  return lane ? rc : t->tcp_ops->send(t->tcp, dst, header, payload, length);
}

static int nc_recv(wg_transport_t *t, const wg_match_t *match, double deadline,
                   wg_message_t **out) {
  *out = NULL;
  pthread_mutex_lock(&t->mu);
  for (;;) {
    wg_message_t *prev = NULL;
    for (wg_message_t *m = t->box_head; m; prev = m, m = m->next)
      if (wg_match_frame(match, &m->header)) {
        if (prev)
          prev->next = m->next;
        else
          t->box_head = m->next;
        if (t->box_tail == m)
          t->box_tail = prev;
        m->next = NULL;
        pthread_mutex_unlock(&t->mu);
        *out = m;
        return 0;
      }
    if (t->closed) {
      pthread_mutex_unlock(&t->mu);
      return WAGMA_ECLOSED;
    }
    if (match->src != WG_ANY && match->src < (uint64_t)t->nranks && t->dead_done[match->src]) {
      pthread_mutex_unlock(&t->mu);
      return WAGMA_EPEER;
    }
    double now = wg_now();
    if (now >= deadline) {
      pthread_mutex_unlock(&t->mu);
      return WAGMA_ETIMEDOUT;
    }
    double until = deadline - now > 0.05 ? now + 0.05 : deadline; /* dead_done is re-read */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double abs = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + (until - now);
    ts.tv_sec = (time_t)abs;
    ts.tv_nsec = (long)((abs - (double)ts.tv_sec) * 1e9);
    pthread_cond_timedwait(&t->cv, &t->mu, &ts);
  }
}

static int nc_peer_alive(wg_transport_t *t, int rank) {
  return t->tcp_ops->peer_alive(t->tcp, rank);
}

static int nc_peer_unreachable(wg_transport_t *t, int rank, double *since) {
  return t->tcp_ops->peer_unreachable(t->tcp, rank, since);
}

static void nc_interrupt(wg_transport_t *t) {
  pthread_mutex_lock(&t->mu);
  t->closed = 1;
  pthread_cond_broadcast(&t->cv);
  pthread_mutex_unlock(&t->mu);
}

static void nc_stats(wg_transport_t *t, wg_transport_stats_t *out) {
  t->tcp_ops->stats(t->tcp, out);
  out->bytes_sent += atomic_load(&t->lane_bytes_sent);
  out->bytes_received += atomic_load(&t->lane_bytes_received);
}

static void nc_free(nc_t *t) {
  if (!t)
    return;
  for (int r = 0; t->pending && r < t->nranks; r++)
    while (t->pending[r]) {
      nc_item_t *it = t->pending[r];
      t->pending[r] = it->next;
      wg_message_free(it->msg);
      free(it);
    }
  while (t->out) {
    nc_xfer_t *x = t->out;
    t->out = x->next;
    if (!x->device_reads) /* else leaked: see nc_xfer_t */
      wg_buf_free(x->host);
    free(x);
  }
  while (t->box_head) {
    wg_message_t *m = t->box_head;
    t->box_head = m->next;
    wg_message_free(m);
  }
  WG_NCCL(groups_free)(t);
  pthread_mutex_destroy(&t->mu);
  pthread_cond_destroy(&t->cv);
  free(t->pending);
  free(t->dead_done);
  free(t->peer_up);
  free(t->lane_rank);
  free(t->names);
  free(t->last_done);
  free(t);
}

static void nc_close(wg_transport_t *t) {
  nc_interrupt(t);
  /* A send whose receiver already returned may not have been seen complete yet: let what is
   * posted finish (bounded), start nothing new. */
  atomic_store(&t->draining, 1);
  for (double until = wg_now() + 1.0; t->lane_started && wg_now() < until;) {
    struct timespec ts = {0, 1000000};
    if (!atomic_load(&t->busy))
      break;
    nanosleep(&ts, NULL);
  }
  atomic_store(&t->stopping, 1);
  if (t->lane_started)
    pthread_join(t->lane_thread, NULL);
  /* A transfer still posted is revoked (never destroyed while its peer may be gone); what
   * was not delivered on the lane goes on TCP before the control channel closes. */
  if (t->posted.active || t->reserved.active)
    WG_NCCL(lane_down)(t, "closed with a transfer in flight");
  WG_NCCL(resend_all)(t);
  WG_NCCL(keep_or_abort)(t);
  /* what NCCL carried this epoch: the operator's answer to "did NCCL move the models?" */
  wg_logf(t->log, t->log_user, WAGMA_LOG_INFO,
          "rank %d: epoch %llu closed: %llu transfers on the nccl lane (%.1f MiB sent, %.1f MiB "
          "received), %llu lane failures",
          t->rank, (unsigned long long)t->epoch,
          (unsigned long long)atomic_load(&t->lane_transfers),
          (double)atomic_load(&t->lane_bytes_sent) / (1 << 20),
          (double)atomic_load(&t->lane_bytes_received) / (1 << 20),
          (unsigned long long)atomic_load(&t->lane_failures));
  if (t->nphases > 0)
    wg_logf(t->log, t->log_user, WAGMA_LOG_INFO,
            "rank %d: epoch %llu: %llu rounds as one ncclAllReduce of their group, %llu group "
            "communicators revoked",
            t->rank, (unsigned long long)t->epoch, (unsigned long long)atomic_load(&t->collectives),
            (unsigned long long)atomic_load(&t->collective_failures));
  t->tcp_ops->close(t->tcp);
  nc_free(t);
}

static int nc_open(const wg_transport_config_t *cfg, wg_transport_t **out) {
  char err[256];
  int rc;
  *out = NULL;
  rc = WG_NCCL(device_check)(cfg->device, err, sizeof err);
  if (rc != 0) {
    wg_logf(cfg->log, cfg->log_user, WAGMA_LOG_ERROR, "rank %d: transport nccl: %s", cfg->rank,
            err);
    return rc;
  }
  nc_t *t = calloc(1, sizeof *t);
  if (!t)
    return WAGMA_ENOMEM;
  int n = cfg->plan->nranks;
  t->tcp_ops = &wg_tcp_transport;
  t->rank = cfg->rank;
  t->nranks = n;
  t->epoch = cfg->epoch;
  t->max_payload = cfg->max_payload;
  t->device = cfg->device;
  t->log = cfg->log;
  t->log_user = cfg->log_user;
  t->rng = (unsigned)cfg->rank * 2654435761u + (unsigned)cfg->epoch;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&t->mu, NULL);
  pthread_cond_init(&t->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (WG_NCCL(groups_new)(t, cfg->plan) != 0) {
    nc_free(t);
    return WAGMA_ENOMEM;
  }
  t->dead_done = calloc((size_t)n, 1);
  t->peer_up = calloc((size_t)n, 1);
  t->lane_rank = malloc((size_t)n * sizeof(int));
  t->pending = calloc((size_t)n, sizeof(nc_item_t *));
  t->names = calloc((size_t)n, sizeof *t->names);
  t->last_done = calloc((size_t)n, sizeof(uint64_t));
  if (!t->last_done || !t->dead_done || !t->peer_up || !t->lane_rank || !t->pending || !t->names) {
    nc_free(t);
    return WAGMA_ENOMEM;
  }
  for (int i = 0; i < n; i++) {
    t->lane_rank[i] = -1;
    memcpy(t->names[i], cfg->plan->members[i].name, WAGMA_NAME_MAX);
  }
  atomic_store(&t->lane_state, NC_LANE_INIT);

  wg_transport_config_t tcfg = *cfg;
  tcfg.max_payload = cfg->max_payload + WG_FRAME_HEADER_SIZE + NCCL_UNIQUE_ID_BYTES;
  rc = t->tcp_ops->open(&tcfg, &t->tcp);
  if (rc != 0) {
    nc_free(t);
    return rc;
  }
  t->init_deadline = wg_now() + (cfg->connect_timeout_s > 0 ? cfg->connect_timeout_s : 10.0);
  if (pthread_create(&t->lane_thread, NULL, WG_NCCL(lane_main), t) != 0) {
    t->tcp_ops->close(t->tcp);
    nc_free(t);
    return WAGMA_ENOMEM;
  }
  t->lane_started = 1;
  *out = t;
  return 0;
}

const wg_transport_ops_t NC_OPS_NAME = {
    .name = "nccl",
    .open = nc_open,
    .send = nc_send,
    .recv = nc_recv,
    .reader_begin = NULL,
    .reader_end = NULL,
    .reader_release = NULL,
    .recv_into = NULL,
    .group_ready = WG_NCCL(group_ready),
    .group_allreduce = WG_NCCL(group_allreduce),
    .peer_alive = nc_peer_alive,
    .peer_unreachable = nc_peer_unreachable,
    .interrupt = nc_interrupt,
    .stats = nc_stats,
    .close = nc_close,
};
