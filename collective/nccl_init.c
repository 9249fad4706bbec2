/* nccl_init.c — the NCCL transport's communicator per epoch (docs/design.md §6.4): the device
 * check, rank 0's word (a fresh ncclUniqueId, SHRINK, or no lane), non-blocking creation
 * (ncclCommInitRankConfig or ncclCommShrink) polled under the epoch's connect deadline, and
 * the process-wide slot that keeps an epoch's communicator for the next one.
 *
 * The slot is the only process-wide state here, under slot_mu; it holds at most one
 * communicator (quiescent: nothing posted on it, revoked if anything was). lane_init runs on
 * the lane thread; keep_or_abort on the thread closing the transport, after the lane thread
 * ended. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_internal.h"
#include "wagma/log_internal.h"

static struct {
  ncclComm_t comm;
  uint64_t epoch;
  int nranks;
  char (*names)[WAGMA_NAME_MAX]; /* by NCCL rank */
  int revoked;
} slot;
static pthread_mutex_t slot_mu = PTHREAD_MUTEX_INITIALIZER;

int WG_NCCL(device_check)(int device, char *err, size_t err_len) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n <= 0) {
    wg_errf(err, err_len, "no usable CUDA device (cudaGetDeviceCount: %s)",
            e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return WAGMA_EUNAVAIL;
  }
  if (device < 0 || device >= n) {
    wg_errf(err, err_len, "CUDA device %d does not exist (%d found)", device, n);
    return WAGMA_EUNAVAIL;
  }
  e = cudaSetDevice(device);
  if (e != cudaSuccess) {
    wg_errf(err, err_len, "cudaSetDevice(%d): %s", device, cudaGetErrorString(e));
    return WAGMA_EUNAVAIL;
  }
  return 0;
}

static int slot_index(int nranks, char (*names)[WAGMA_NAME_MAX], const char *name) {
  for (int i = 0; i < nranks; i++)
    if (strncmp(names[i], name, WAGMA_NAME_MAX) == 0)
      return i;
  return -1;
}

/* With slot_mu held: 1 when the slot's communicator (of epoch `epoch`, or any when epoch is
 * UINT64_MAX) holds every member of this epoch, so it can be shrunk to them. */
static int slot_can_shrink(const nc_t *t, uint64_t epoch) {
  if (!slot.comm || (epoch != UINT64_MAX && slot.epoch != epoch) || slot.nranks < t->nranks)
    return 0;
  for (int r = 0; r < t->nranks; r++)
    if (slot_index(slot.nranks, slot.names, t->names[r]) < 0)
      return 0;
  return 1;
}

static void slot_drop_locked(void) {
  if (slot.comm)
    (void)ncclCommAbort(slot.comm);
  free(slot.names);
  memset(&slot, 0, sizeof slot);
}

static void off(nc_t *t, const char *why) {
  wg_logf(t->log, t->log_user, WAGMA_LOG_WARN,
          "rank %d: no nccl lane in epoch %llu (%s); payloads go on TCP", t->rank,
          (unsigned long long)t->epoch, why);
  if (t->comm) {
    (void)ncclCommAbort(t->comm);
    t->comm = NULL;
  }
  atomic_store(&t->lane_state, NC_LANE_OFF);
}

/* Polls the communicator being created until it is ready, fails, or the deadline. */
static void poll_up(nc_t *t, ncclResult_t started, ncclComm_t parent) {
  char why[160];
  ncclResult_t e = started;
  while (e == ncclInProgress || e == ncclSuccess) {
    if (e == ncclSuccess && ncclCommGetAsyncError(t->comm, &e) == ncclSuccess && e == ncclSuccess)
      break;
    if (e != ncclInProgress && e != ncclSuccess)
      break;
    if (atomic_load(&t->stopping) || wg_now() > t->init_deadline) {
      if (parent)
        (void)ncclCommAbort(parent);
      off(t, atomic_load(&t->stopping) ? "closed while initialising"
                                       : "initialisation missed the connect deadline");
      return;
    }
    WG_NCCL(pump)(t, 0.001);
    if (ncclCommGetAsyncError(t->comm, &e) != ncclSuccess)
      e = ncclInternalError;
  }
  if (parent)
    (void)ncclCommAbort(parent);
  if (e != ncclSuccess) {
    /* seen on one H100 with two agents on it: NCCL refuses two ranks on one GPU */
    snprintf(why, sizeof why, "initialisation: %s%s", ncclGetErrorString(e),
             e == ncclInvalidUsage ? "; do two ranks share a GPU? NCCL needs one GPU per rank"
                                   : "");
    off(t, why);
    return;
  }
  t->comm_ready = 1;
  /* the group communicators, while nothing is posted on the epoch's (nccl_groups.c) */
  if (WG_NCCL(groups_split)(t) != 0) {
    t->comm_ready = 0; /* a split may be in flight on it: not kept */
    off(t, "a group communicator did not come up");
    return;
  }
  atomic_store(&t->lane_state, NC_LANE_UP);
  for (int r = 0; r < t->nranks; r++)
    if (r != t->rank)
      (void)WG_NCCL(control)(t, r, NC_PEER_UP, 0, NULL, 0);
  WG_NCCL(groups_announce)(t);
  wg_logf(t->log, t->log_user, WAGMA_LOG_INFO, "rank %d: nccl lane up in epoch %llu (%d ranks)",
          t->rank, (unsigned long long)t->epoch, t->lane_size);
}

static void fresh(nc_t *t, const ncclUniqueId *id) {
  pthread_mutex_lock(&slot_mu);
  slot_drop_locked(); /* someone joined: the kept communicator is of no use */
  pthread_mutex_unlock(&slot_mu);
  for (int r = 0; r < t->nranks; r++)
    t->lane_rank[r] = r;
  t->lane_size = t->nranks;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t rc = ncclCommInitRankConfig(&t->comm, t->nranks, *id, t->rank, &config);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    char why[160];
    snprintf(why, sizeof why, "ncclCommInitRankConfig: %s", ncclGetErrorString(rc));
    off(t, why);
    return;
  }
  poll_up(t, rc, NULL);
}

static void shrink(nc_t *t, uint64_t epoch) {
  pthread_mutex_lock(&slot_mu);
  if (!slot_can_shrink(t, epoch)) {
    pthread_mutex_unlock(&slot_mu);
    off(t, "asked to shrink a communicator this process does not keep");
    return;
  }
  int *exclude = malloc((size_t)slot.nranks * sizeof(int));
  int *old_of = malloc((size_t)t->nranks * sizeof(int));
  if (!exclude || !old_of) {
    pthread_mutex_unlock(&slot_mu);
    free(exclude);
    free(old_of);
    off(t, "out of memory");
    return;
  }
  int nex = 0;
  for (int o = 0; o < slot.nranks; o++) {
    int kept = 0;
    for (int r = 0; r < t->nranks && !kept; r++)
      kept = strncmp(slot.names[o], t->names[r], WAGMA_NAME_MAX) == 0;
    if (!kept)
      exclude[nex++] = o;
  }
  if (nex == 0) { /* rank 0 asks for a shrink only when someone left: our kept one differs */
    pthread_mutex_unlock(&slot_mu);
    free(exclude);
    free(old_of);
    off(t, "asked to shrink a communicator that lost nobody here");
    return;
  }
  for (int r = 0; r < t->nranks; r++) {
    int o = slot_index(slot.nranks, slot.names, t->names[r]);
    int below = 0; /* new NCCL rank: the kept old ranks below o, in the old order */
    for (int k = 0; k < o; k++) {
      int gone = 0;
      for (int x = 0; x < nex; x++)
        gone |= exclude[x] == k;
      below += !gone;
    }
    t->lane_rank[r] = below;
  }
  t->lane_size = t->nranks;
  ncclComm_t parent = slot.comm;
  int flags = slot.revoked ? NCCL_SHRINK_ABORT : NCCL_SHRINK_DEFAULT;
  free(slot.names);
  memset(&slot, 0, sizeof slot); /* the parent is ours now; aborted once the shrink ended */
  pthread_mutex_unlock(&slot_mu);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t rc = ncclCommShrink(parent, exclude, nex, &t->comm, &config, flags);
  free(exclude);
  free(old_of);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    char why[160];
    snprintf(why, sizeof why, "ncclCommShrink: %s", ncclGetErrorString(rc));
    (void)ncclCommAbort(parent);
    t->comm = NULL;
    off(t, why);
    return;
  }
  wg_logf(t->log, t->log_user, WAGMA_LOG_INFO,
          "rank %d: epoch %llu shrinks the communicator of epoch %llu (%d left)", t->rank,
          (unsigned long long)t->epoch, (unsigned long long)epoch, nex);
  t->shrunk = 1;
  poll_up(t, rc, parent);
}

void WG_NCCL(lane_init)(nc_t *t) {
  int least = 0, greatest = 0; /* the lane's stream at the highest priority, as rounds' */
  if (cudaSetDevice(t->device) != cudaSuccess ||
      cudaDeviceGetStreamPriorityRange(&least, &greatest) != cudaSuccess ||
      cudaStreamCreateWithPriority(&t->stream, cudaStreamNonBlocking, greatest) != cudaSuccess) {
    t->stream = NULL;
    off(t, "no CUDA stream");
    return;
  }
  if (t->rank == 0) {
    pthread_mutex_lock(&slot_mu);
    /* shrink only when someone left: NCCL refuses a shrink that excludes nobody
     * (ncclInvalidArgument, seen with 2.28.3 and 2.28.9), so the same members initialise
     * afresh; and only the previous epoch's communicator: a member that sat out epochs since
     * (rank 0 here) keeps an older one, which the others replaced (they could not shrink it,
     * and the lane would stay off for the epoch) */
    int can =
        slot_can_shrink(t, UINT64_MAX) && slot.nranks > t->nranks && slot.epoch + 1 == t->epoch;
    uint64_t old = slot.epoch;
    pthread_mutex_unlock(&slot_mu);
    int all = 1;
    for (int r = 1; r < t->nranks; r++)
      all &= t->tcp_ops->peer_alive(t->tcp, r);
    if (can && all) {
      for (int r = 1; r < t->nranks; r++)
        (void)WG_NCCL(control)(t, r, NC_SHRINK, old, NULL, 0);
      shrink(t, old);
      return;
    }
    ncclUniqueId id;
    if (!all || ncclGetUniqueId(&id) != ncclSuccess) {
      for (int r = 1; r < t->nranks; r++)
        (void)WG_NCCL(control)(t, r, NC_NOLANE, 0, NULL, 0);
      off(t, all ? "ncclGetUniqueId failed" : "not every member is connected");
      return;
    }
    for (int r = 1; r < t->nranks; r++)
      (void)WG_NCCL(control)(t, r, NC_ID, 0, &id, sizeof id);
    fresh(t, &id);
    return;
  }
  while (t->word == 0) {
    if (atomic_load(&t->stopping) || wg_now() > t->init_deadline || t->dead_done[0]) {
      off(t, "no word from rank 0");
      return;
    }
    WG_NCCL(pump)(t, 0.002);
  }
  if (t->word == NC_ID)
    fresh(t, &t->word_id);
  else if (t->word == NC_SHRINK)
    shrink(t, t->word_aux);
  else
    off(t, "rank 0 could not reach every member");
}

void WG_NCCL(keep_or_abort)(nc_t *t) {
  if (t->comm && t->comm_ready) {
    char(*names)[WAGMA_NAME_MAX] = calloc((size_t)t->lane_size, sizeof *names);
    if (names) {
      for (int r = 0; r < t->nranks; r++)
        if (t->lane_rank[r] >= 0 && t->lane_rank[r] < t->lane_size)
          memcpy(names[t->lane_rank[r]], t->names[r], WAGMA_NAME_MAX);
      pthread_mutex_lock(&slot_mu);
      slot_drop_locked();
      slot.comm = t->comm;
      slot.epoch = t->epoch;
      slot.nranks = t->lane_size;
      slot.names = names;
      slot.revoked = atomic_load(&t->lane_state) == NC_LANE_DOWN;
      pthread_mutex_unlock(&slot_mu);
      t->comm = NULL;
    }
  }
  if (t->comm)
    (void)ncclCommAbort(t->comm);
  t->comm = NULL;
  WG_NCCL(lane_buffer_free)(t);
  if (t->stream && cudaStreamDestroy(t->stream) != cudaSuccess)
    (void)cudaGetLastError(); /* not left behind on the application's thread */
  t->stream = NULL;
}

void WG_NCCL(forget)(void) {
  pthread_mutex_lock(&slot_mu);
  slot_drop_locked();
  pthread_mutex_unlock(&slot_mu);
}
