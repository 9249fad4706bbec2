/* nccl_lane.c — the NCCL transport's lane thread (docs/design.md §6.4): the only reader of the
 * TCP control channel, it moves frames into the mailbox in each sender's order, runs the
 * per-transfer agreement (ANNOUNCE, CTS, GO / NACK), posts at most one ncclSend or ncclRecv
 * (each in its own ncclGroupStart/ncclGroupEnd, with the payload's copy between the device and
 * page-locked host memory on the same stream) and polls it under a deadline, and on any
 * failure revokes the communicator and falls back to TCP payloads for the rest of the epoch.
 *
 * State: everything here but the mailbox and the outbound list (t->mu, nccl.c) belongs to the
 * lane thread; close runs lane_down/resend_all only after joining it. Invariant: the head of a
 * sender's held list is never a complete message (it is delivered at once), so a held list is
 * empty or starts with the transfer everything behind it waits for. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nccl_internal.h"
#include "wagma/log_internal.h"

/* A posted transfer fails after this. */
static double xfer_deadline_s(size_t len) {
  return 2.0 + (double)len / (256.0 * 1024 * 1024);
}

/* A clear-to-send that got neither GO nor NACK by then fails (the sender answers at once
 * unless it is frozen or starved of CPU; on a loaded machine 1 s is not rare). */
#define CTS_DEADLINE_S 3.0

/* Delivers the complete messages at the head of src's held list. */
static void flush_src(nc_t *t, int src) {
  while (t->pending[src] && t->pending[src]->msg) {
    nc_item_t *it = t->pending[src];
    t->pending[src] = it->next;
    WG_NCCL(deliver)(t, it->msg);
    free(it);
  }
}

static void hold(nc_t *t, int src, nc_item_t *it) {
  it->since = wg_now();
  nc_item_t **p = &t->pending[src];
  while (*p)
    p = &(*p)->next;
  *p = it;
}

static nc_item_t *find_item(nc_t *t, int src, uint64_t id) {
  for (nc_item_t *it = t->pending[src]; it; it = it->next)
    if (!it->msg && it->id == id)
      return it;
  return NULL;
}

void WG_NCCL(nap_us)(long us) {
  struct timespec ts = {.tv_sec = 0, .tv_nsec = us * 1000};
  nanosleep(&ts, NULL);
}

int WG_NCCL(quiesce)(ncclComm_t comm, cudaStream_t stream) {
  double until = wg_now() + 1.0;
  while (wg_now() < until) {
    ncclResult_t e = ncclSuccess;
    if ((ncclCommGetAsyncError(comm, &e) != ncclSuccess || e != ncclInProgress) &&
        cudaStreamQuery(stream) != cudaErrorNotReady)
      return 1;
    WG_NCCL(nap_us)(200);
  }
  return 0;
}

static void role_release(nc_t *t, nc_role_t *r, int quiet) {
  if (r->dev && !quiet && r->dev == t->lane_buf) {
    t->lane_buf = NULL; /* leaked: the device may still write it; the next transfer allocates */
    t->lane_cap = 0;
  }
  if (quiet)
    wg_message_free(r->msg);
  /* else leaked: a copy into its payload may still be queued on the stream */
  if (!quiet && r->send && r->xfer) {
    pthread_mutex_lock(&t->mu);
    r->xfer->device_reads = 1; /* its copy to the device may still be queued: keep its host */
    pthread_mutex_unlock(&t->mu);
  }
  memset(r, 0, sizeof *r);
}

/* Device memory for the lane, ordered on its stream (cudaMallocAsync / cudaFreeAsync): no
 * device-wide synchronization, so the lane thread, which reads the control channel, never
 * waits for the application's compute stream. A device without memory pools
 * (cudaErrorNotSupported) gets cudaMalloc / cudaFree, which do wait for it; that is logged
 * once. */
static void *lane_alloc(nc_t *t, size_t bytes, int *ordered) {
  void *p = NULL;
  *ordered = 0;
  if (!t->no_memory_pools) {
    cudaError_t e = cudaMallocAsync(&p, bytes, t->stream);
    if (e == cudaSuccess) {
      *ordered = 1;
      return p;
    }
    (void)cudaGetLastError();
    if (e != cudaErrorNotSupported)
      return NULL;
    t->no_memory_pools = 1;
    wg_logf(t->log, t->log_user, WAGMA_LOG_WARN,
            "rank %d: device %d has no memory pools: the lane's buffer is allocated with "
            "cudaMalloc, which waits for the compute stream",
            t->rank, t->device);
  }
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return NULL;
  }
  return p;
}

/* Lane thread, or close on the application's thread: a failure is not left behind in that
 * thread's last CUDA error. */
static void lane_release(nc_t *t, void *p, int ordered) {
  cudaError_t e = ordered ? cudaFreeAsync(p, t->stream) : cudaFree(p);
  if (e != cudaSuccess)
    (void)cudaGetLastError();
}

/* The lane's device buffer, at least len bytes: allocated once and grown, so a transfer costs
 * no allocation (a cudaMalloc + cudaFree per transfer made it 2.8-4.1x slower up to 64 KiB
 * on an H100, bench_nccl_gpu). The old one is freed behind the transfers queued on it. NULL
 * when the device is out of memory. */
static void *lane_buffer(nc_t *t, size_t len) {
  if (len == 0)
    len = 1;
  if (t->lane_buf && t->lane_cap >= len)
    return t->lane_buf;
  size_t cap = t->lane_cap ? t->lane_cap : (size_t)1 << 20;
  while (cap < len)
    cap *= 2;
  WG_NCCL(lane_buffer_free)(t);
  t->lane_buf = lane_alloc(t, cap, &t->lane_buf_ordered);
  if (t->lane_buf)
    t->lane_cap = cap;
  return t->lane_buf;
}

void WG_NCCL(lane_buffer_free)(nc_t *t) {
  if (t->lane_buf)
    lane_release(t, t->lane_buf, t->lane_buf_ordered);
  t->lane_buf = NULL;
  t->lane_cap = 0;
}

void WG_NCCL(resend_all)(nc_t *t) {
  pthread_mutex_lock(&t->mu);
  while (t->out) {
    nc_xfer_t *x = t->out;
    t->out = x->next;
    uint8_t *buf = malloc(WG_FRAME_HEADER_SIZE + x->len);
    if (buf) {
      memcpy(buf, x->header, WG_FRAME_HEADER_SIZE);
      memcpy(buf + WG_FRAME_HEADER_SIZE, x->host, x->len);
      (void)WG_NCCL(control)(t, x->dst, NC_RESEND, x->id, buf, WG_FRAME_HEADER_SIZE + x->len);
      free(buf);
    }
    if (!x->device_reads) /* else leaked: see nc_xfer_t */
      wg_buf_free(x->host);
    free(x);
  }
  pthread_mutex_unlock(&t->mu);
}

void WG_NCCL(lane_down)(nc_t *t, const char *why) {
  int state = atomic_load(&t->lane_state);
  int quiet = 1;
  if (state == NC_LANE_UP) {
    wg_logf(t->log, t->log_user, WAGMA_LOG_WARN,
            "rank %d: nccl lane revoked (%s); payloads go on TCP for the rest of epoch %llu",
            t->rank, why, (unsigned long long)t->epoch);
    atomic_fetch_add(&t->lane_failures, 1);
    (void)ncclCommRevoke(t->comm, NCCL_REVOKE_DEFAULT);
    quiet = WG_NCCL(quiesce)(t->comm, t->stream);
    atomic_store(&t->lane_state, NC_LANE_DOWN);
    for (int r = 0; r < t->nranks; r++)
      if (r != t->rank)
        (void)WG_NCCL(control)(t, r, NC_PEER_DOWN, 0, NULL, 0);
  }
  role_release(t, &t->posted, quiet);
  role_release(t, &t->reserved, 1);
  pthread_mutex_lock(&t->mu);
  memset(t->peer_up, 0, (size_t)t->nranks);
  pthread_mutex_unlock(&t->mu);
  WG_NCCL(resend_all)(t);
  for (int r = 0; r < t->nranks; r++)
    for (nc_item_t *it = t->pending[r]; it; it = it->next)
      if (!it->msg)
        it->resend = 1;
}

/* Posts one half of a transfer in its own group. 0, or -1 (the lane then goes down). */
static int post(nc_t *t, int send, int peer, void *dev, size_t len) {
  ncclResult_t rc = ncclGroupStart();
  if (rc == ncclSuccess) {
    rc = send ? ncclSend(dev, len, ncclUint8, t->lane_rank[peer], t->comm, t->stream)
              : ncclRecv(dev, len, ncclUint8, t->lane_rank[peer], t->comm, t->stream);
    ncclResult_t end = ncclGroupEnd();
    if (rc == ncclSuccess || rc == ncclInProgress)
      rc = end;
  }
  if (rc != ncclSuccess && rc != ncclInProgress) {
    char why[160];
    snprintf(why, sizeof why, "posting a %s with rank %d: %s", send ? "send" : "recv", peer,
             ncclGetErrorString(rc));
    WG_NCCL(lane_down)(t, why);
    return -1;
  }
  return 0;
}

static void on_cts(nc_t *t, int src, uint64_t id) {
  nc_xfer_t *x = NULL;
  if (atomic_load(&t->lane_state) == NC_LANE_UP && !t->posted.active && !t->reserved.active &&
      !atomic_load(&t->draining) && WG_NCCL(turn_lane)(t)) {
    pthread_mutex_lock(&t->mu);
    for (x = t->out; x && !(x->id == id && x->dst == src && !x->sent && !x->acked); x = x->next)
      ;
    pthread_mutex_unlock(&t->mu);
  }
  if (!x) {
    (void)WG_NCCL(control)(t, src, NC_NACK, id, NULL, 0);
    return;
  }
  /* the copy and the send are ordered on the lane's stream: no wait here, and none for the
   * compute stream (the lane's is non-blocking). From pageable memory (the page-locked cache
   * was empty when it was sent) the call returns once the bytes are staged. */
  void *dev = lane_buffer(t, x->len);
  if (!dev ||
      cudaMemcpyAsync(dev, x->host, x->len, cudaMemcpyHostToDevice, t->stream) != cudaSuccess) {
    (void)WG_NCCL(control)(t, src, NC_NACK, id, NULL, 0);
    WG_NCCL(lane_down)(t, "device buffer");
    return;
  }
  t->posted = (nc_role_t){.active = 1,
                          .peer = src,
                          .id = id,
                          .send = 1,
                          .dev = dev,
                          .len = x->len,
                          .deadline = wg_now() + xfer_deadline_s(x->len),
                          .xfer = x};
  if (post(t, 1, src, dev, x->len) != 0)
    return;
  (void)WG_NCCL(control)(t, src, NC_GO, id, NULL, 0);
}

static void on_go(nc_t *t, int src, uint64_t id) {
  nc_role_t r = t->reserved;
  if (!r.active || r.peer != src || r.id != id || atomic_load(&t->lane_state) != NC_LANE_UP)
    return; /* stale: the sender's send then misses its deadline and the lane goes down */
  size_t len = (size_t)r.item->header.length;
  memset(&t->reserved, 0, sizeof t->reserved);
  void *dev = lane_buffer(t, len);
  /* the payload's home, page-locked when the cache has one (no allocation here: it would wait
   * for the compute stream); check_posted copies it out of the device (a non-blocking
   * communicator puts the receive on the stream later, in the background: a copy queued now
   * could run before it) */
  wg_message_t *msg = dev ? wg_message_new(&r.item->header, 0) : NULL;
  if (msg && !(msg->payload = WG_NCCL(payload_buffer)(t->device, len))) {
    wg_message_free(msg);
    msg = NULL;
  }
  if (!dev || !msg) {
    wg_message_free(msg);
    WG_NCCL(lane_down)(t, dev ? "host buffer" : "device buffer");
    return;
  }
  t->posted = (nc_role_t){.active = 1,
                          .peer = src,
                          .id = id,
                          .send = 0,
                          .dev = dev,
                          .len = len,
                          .deadline = wg_now() + xfer_deadline_s(len),
                          .item = r.item,
                          .msg = msg};
  (void)post(t, 0, src, dev, len);
}

/* A posted receive's copy to the host, once NCCL reports no error and nothing pending
 * (async == ncclSuccess: its kernel is on the stream). Into page-locked memory it is queued
 * behind the kernel at once; into pageable memory only when the stream is idle (the receive
 * is done), since that call returns only once the copy has completed and it must never wait
 * for a frozen peer. 0 or -1 (failed). */
static int queue_copy_out(nc_t *t, nc_role_t *p, int stream_idle) {
  if (p->send || p->copy_queued)
    return 0;
  if (!WG_NCCL(is_locked)(p->msg->payload) && !stream_idle)
    return 0;
  if (cudaMemcpyAsync(p->msg->payload, p->dev, p->len, cudaMemcpyDeviceToHost, t->stream) !=
      cudaSuccess)
    return -1;
  p->copy_queued = 1;
  return 0;
}

static void on_control(nc_t *t, wg_message_t *m) {
  const wg_frame_header_t *h = &m->header;
  int src = (int)h->src;
  wg_frame_header_t oh;
  switch ((enum nc_op)h->seq) {
  case NC_ANNOUNCE:
  case NC_RESEND:
    if (h->length < WG_FRAME_HEADER_SIZE ||
        wg_frame_decode(m->payload, WG_FRAME_HEADER_SIZE, t->epoch, (uint32_t)t->nranks,
                        t->max_payload, &oh) != 0 ||
        (int)oh.src != src) {
      wg_logf(t->log, t->log_user, WAGMA_LOG_WARN, "rank %d: bad lane frame from %d dropped",
              t->rank, src);
      return;
    }
    if (h->seq == NC_ANNOUNCE) {
      nc_item_t *it = calloc(1, sizeof *it);
      if (!it)
        return;
      it->id = h->aux;
      it->header = oh;
      it->resend = atomic_load(&t->lane_state) != NC_LANE_UP;
      hold(t, src, it);
    } else {
      nc_item_t *it = find_item(t, src, h->aux);
      if (!it || h->length != WG_FRAME_HEADER_SIZE + oh.length)
        return; /* delivered on the lane already: a duplicate */
      wg_message_t *msg = wg_message_new(&oh, (size_t)oh.length);
      if (!msg)
        return;
      memcpy(msg->payload, m->payload + WG_FRAME_HEADER_SIZE, (size_t)oh.length);
      it->msg = msg;
      if (t->reserved.active && t->reserved.item == it)
        memset(&t->reserved, 0, sizeof t->reserved);
      if (t->posted.active && t->posted.item == it)
        t->posted.item = NULL; /* its receive, still posted, fills nothing now (check_posted);
                                  the item is delivered and freed just below */
      if (t->last_done[src] < h->aux)
        t->last_done[src] = h->aux;
      flush_src(t, src);
    }
    return;
  case NC_CTS: on_cts(t, src, h->aux); return;
  case NC_DONE: {
    nc_xfer_t *done = NULL;
    pthread_mutex_lock(&t->mu);
    for (nc_xfer_t **q = &t->out; *q; q = &(*q)->next)
      if ((*q)->id == h->aux && (*q)->dst == src) {
        if (t->posted.active && t->posted.xfer == *q) {
          (*q)->acked = 1; /* the receiver was faster than my poll: check_posted frees it */
          break;
        }
        done = *q;
        *q = done->next;
        break;
      }
    if (done) /* counted before the list shows it gone */
      atomic_fetch_add(&t->lane_transfers, 1);
    pthread_mutex_unlock(&t->mu);
    if (done) {
      wg_buf_free(done->host);
      free(done);
    }
    return;
  }
  case NC_GO: on_go(t, src, h->aux); return;
  case NC_NACK:
    if (t->reserved.active && t->reserved.peer == src && t->reserved.id == h->aux) {
      memset(&t->reserved, 0, sizeof t->reserved);
      t->rng = t->rng * 1103515245u + 12345u;
      t->backoff_until = wg_now() + (50 + (t->rng >> 8) % 350) * 1e-6;
    }
    return;
  case NC_PEER_UP:
    pthread_mutex_lock(&t->mu);
    t->peer_up[src] = 1; /* used only while my lane is up too */
    pthread_mutex_unlock(&t->mu);
    return;
  case NC_PEER_DOWN: {
    pthread_mutex_lock(&t->mu);
    t->peer_up[src] = 0;
    pthread_mutex_unlock(&t->mu);
    if (atomic_load(&t->lane_state) == NC_LANE_UP) {
      char why[64];
      snprintf(why, sizeof why, "rank %d revoked its communicator", src);
      WG_NCCL(lane_down)(t, why);
    }
    return;
  }
  case NC_GROUPS:
  case NC_GROUP_DOWN: WG_NCCL(groups_on_control)(t, src, (enum nc_op)h->seq, h->aux); return;
  case NC_ID:
  case NC_SHRINK:
  case NC_NOLANE:
    if (src != 0 || t->word != 0)
      return;
    if (h->seq == NC_ID) {
      if (h->length != NCCL_UNIQUE_ID_BYTES)
        return;
      memcpy(&t->word_id, m->payload, NCCL_UNIQUE_ID_BYTES);
    }
    t->word = (int)h->seq;
    t->word_aux = h->aux;
    return;
  }
}

static void on_frame(nc_t *t, wg_message_t *m) {
  int src = (int)m->header.src;
  if (m->header.kind == WG_FRAME_COLL && m->header.group == NC_GROUP) {
    on_control(t, m);
    wg_message_free(m);
    return;
  }
  if (t->pending[src]) {
    nc_item_t *it = calloc(1, sizeof *it);
    if (!it) {
      wg_message_free(m);
      return;
    }
    it->msg = m;
    hold(t, src, it);
    return;
  }
  WG_NCCL(deliver)(t, m);
}

/* A peer TCP declared dead: take what it sent, deliver what is complete, drop the rest. */
static void bury(nc_t *t, int r) {
  wg_match_t match;
  wg_match_any(&match);
  match.src = (uint64_t)r;
  wg_message_t *m = NULL;
  while (t->tcp_ops->recv(t->tcp, &match, 0.0, &m) == 0) {
    on_frame(t, m);
    m = NULL;
  }
  if ((t->posted.active && t->posted.peer == r) || (t->reserved.active && t->reserved.peer == r)) {
    char why[64];
    snprintf(why, sizeof why, "rank %d died mid-transfer", r);
    WG_NCCL(lane_down)(t, why);
  }
  while (t->pending[r]) {
    nc_item_t *it = t->pending[r];
    t->pending[r] = it->next;
    if (it->msg)
      WG_NCCL(deliver)(t, it->msg);
    free(it);
  }
  WG_NCCL(mark_dead_done)(t, r);
}

void WG_NCCL(pump)(nc_t *t, double wait_s) {
  wg_match_t any;
  wg_match_any(&any);
  double deadline = wg_now() + wait_s;
  for (int i = 0; i < 64; i++) {
    wg_message_t *m = NULL;
    if (t->tcp_ops->recv(t->tcp, &any, i == 0 ? deadline : 0.0, &m) != 0)
      break;
    on_frame(t, m);
  }
  for (int r = 0; r < t->nranks; r++)
    if (r != t->rank && !t->dead_done[r] && !t->tcp_ops->peer_alive(t->tcp, r))
      bury(t, r);
}

static void check_posted(nc_t *t) {
  nc_role_t *p = &t->posted;
  if (!p->active)
    return;
  const char *fail = NULL;
  char why[160];
  int done = 0;
  ncclResult_t e = ncclSuccess;
  if (ncclCommGetAsyncError(t->comm, &e) != ncclSuccess)
    e = ncclInternalError;
  if (e != ncclSuccess && e != ncclInProgress) {
    snprintf(why, sizeof why, "%s with rank %d: %s", p->send ? "send" : "recv", p->peer,
             ncclGetErrorString(e));
    fail = why;
  } else if (e == ncclSuccess) {
    int copy_failed = queue_copy_out(t, p, 0) != 0;
    cudaError_t q = copy_failed ? cudaSuccess : cudaStreamQuery(t->stream);
    if (!copy_failed && q == cudaSuccess && !p->send && !p->copy_queued) { /* pageable */
      copy_failed = queue_copy_out(t, p, 1) != 0;
      q = copy_failed ? cudaSuccess : cudaStreamQuery(t->stream);
    }
    if (copy_failed) {
      snprintf(why, sizeof why, "copying a received payload to the host");
      fail = why;
    } else if (q == cudaSuccess) {
      done = 1;
    } else if (q != cudaErrorNotReady) {
      snprintf(why, sizeof why, "stream: %s", cudaGetErrorString(q));
      fail = why;
    }
  }
  if (!done && !fail && wg_now() > p->deadline) {
    snprintf(why, sizeof why, "%s with rank %d missed its deadline", p->send ? "send" : "recv",
             p->peer);
    fail = why;
  }
  if (fail) {
    WG_NCCL(lane_down)(t, fail);
    return;
  }
  if (!done)
    return;
  if (p->send) { /* kept until the receiver's NC_DONE: it may not have the data yet */
    nc_xfer_t *x = p->xfer;
    pthread_mutex_lock(&t->mu);
    x->sent = 1;
    int acked = x->acked;
    if (acked) {
      atomic_fetch_add(&t->lane_transfers, 1); /* counted before the list shows it gone */
      for (nc_xfer_t **q = &t->out; *q; q = &(*q)->next)
        if (*q == x) {
          *q = x->next;
          break;
        }
    }
    pthread_mutex_unlock(&t->mu);
    if (acked) {
      wg_buf_free(x->host);
      free(x);
    }
    atomic_fetch_add(&t->lane_bytes_sent, p->len);
  } else {
    nc_item_t *it = p->item;
    if (it) { /* its payload is in: the copy was behind the receive on the stream */
      it->msg = p->msg;
      p->msg = NULL;
    } /* else its RESEND came first and was delivered: this copy is freed below */
    if (t->last_done[p->peer] < p->id)
      t->last_done[p->peer] = p->id;
    atomic_fetch_add(&t->lane_bytes_received, p->len);
    atomic_fetch_add(&t->lane_transfers, 1);
    (void)WG_NCCL(control)(t, p->peer, NC_DONE, p->id, NULL, 0);
  }
  int peer = p->peer, recv = !p->send;
  role_release(t, p, 1);
  if (recv)
    flush_src(t, peer);
}

/* When idle, asks the sender of the oldest held transfer (round robin over senders). */
static void maybe_cts(nc_t *t) {
  if (atomic_load(&t->lane_state) != NC_LANE_UP || t->posted.active)
    return;
  double now = wg_now();
  if (t->reserved.active) {
    if (now > t->reserved.deadline)
      WG_NCCL(lane_down)(t, "no answer to a clear-to-send");
    return;
  }
  if (now < t->backoff_until || atomic_load(&t->draining))
    return;
  for (int k = 0; k < t->nranks; k++) {
    int src = (t->rr + k) % t->nranks;
    nc_item_t *it = t->pending[src];
    if (!it || it->msg || it->resend)
      continue;
    pthread_mutex_lock(&t->mu);
    int up = t->peer_up[src];
    pthread_mutex_unlock(&t->mu);
    if (!up)
      continue;
    if (!WG_NCCL(turn_lane)(t))
      return; /* a collective has (or waits for) the device */
    t->rr = src + 1;
    t->reserved = (nc_role_t){
        .active = 1, .peer = src, .id = it->id, .item = it, .deadline = now + CTS_DEADLINE_S};
    if (WG_NCCL(control)(t, src, NC_CTS, it->id, NULL, 0) != 0)
      memset(&t->reserved, 0, sizeof t->reserved);
    return;
  }
}

/* Logs (at most once a second) what holds a sender's frames for more than a second. */
static void report_stuck(nc_t *t) {
  double now = wg_now();
  if (now < t->next_report)
    return;
  t->next_report = now + 1.0;
  for (int r = 0; r < t->nranks; r++) {
    nc_item_t *it = t->pending[r];
    if (!it || now - it->since < 1.0)
      continue;
    wg_logf(t->log, t->log_user, WAGMA_LOG_WARN,
            "rank %d: transfer %llu from rank %d held %.1f s (lane %d, resend %d, peer up %d, "
            "reserved %d/%d, posted %d/%d)",
            t->rank, (unsigned long long)it->id, r, now - it->since, atomic_load(&t->lane_state),
            it->resend, t->peer_up[r], t->reserved.active, t->reserved.peer, t->posted.active,
            t->posted.peer);
  }
}

void *WG_NCCL(lane_main)(void *arg) {
  nc_t *t = arg;
  WG_NCCL(lane_init)(t);
  while (!atomic_load(&t->stopping)) {
    /* waits for frames unless a posted transfer needs polling (waiting for GO or NACK
     * included: the wait ends when a frame comes, and spinning there took a core from the
     * peers that must answer) */
    WG_NCCL(pump)(t, t->posted.active ? 0.0 : 0.002);
    check_posted(t);
    maybe_cts(t);
    report_stuck(t);
    atomic_store(&t->busy, t->posted.active || t->reserved.active);
    if (!t->posted.active && !t->reserved.active)
      WG_NCCL(turn_lane_release)(t);
    if (t->posted.active)
      WG_NCCL(nap_us)(100);
  }
  return NULL;
}
