/* agent/ps.h — the parameter server of asgd / dc-asgd (Downpour; DC-ASGD, Zheng et al. 2017),
 * private to wagma-agent: the endpoint in ps.c and its tests.
 *
 * Roles: the first `shards` ranks of a plan are parameter-server SHARDS, the others WORKERS.
 * Shard k holds slice k of the model, [k n / S, (k + 1) n / S). A worker's step: pull every
 * slice (the model as the shards hold it, with each shard's version = updates applied so far),
 * compute a gradient on its minibatch there, push each slice of the gradient to its shard with
 * the version it pulled. A shard applies each push at once, no barrier: g' = g for asgd, and
 * for dc-asgd g' = g + lambda g (.) g (.) (w_now - w_pulled) with w_pulled the slice this
 * worker last pulled (the shard keeps a copy per worker); then the job's optimizer takes g' on
 * the slice. The push's delay = the shard's version at the push - the version pulled (updates
 * of other workers in between), returned to the worker and kept for progress.
 *
 * Recovery: a new epoch reassigns the shards (the first ranks of the new plan); every member
 * enters it with the epoch's opening global sync, so a slice restarts from the mean of the
 * members' copies (a dead shard's slice from the workers' latest pulls). The shards' optimizer
 * state starts afresh (docs/agent.md states what is lost). A shard's connection threads wait
 * under the bounds of agent/peer_io.h (a stalled or vanished worker's connection is closed).
 *
 * Wire format: a 64-byte header {magic "WGPS", version 1, kind, epoch, token, a, b, count,
 * loss, rank} then count floats; the token is the shard's per-epoch secret (exchanged like
 * adpsgd's). Kinds: pull (a = worker rank) -> slice (a = version, the floats); push (a =
 * version pulled, b = the worker's iteration, loss = its batch loss, rank, the gradient) -> pushed
 * (a = delay); done (a = worker rank: it reached the job's end) -> ack; refused (a = 1: the
 * shard has not entered the request's epoch yet, 0: it will not serve it). */
#ifndef WAGMA_AGENT_PS_H
#define WAGMA_AGENT_PS_H

#include <stddef.h>
#include <stdint.h>

#include "agent/adpsgd.h" /* wg_adpsgd_peer_t: a peer's endpoint */
#include "agent/train/train.h"
#include "wagma/status.h"

typedef struct wg_ps wg_ps_t;

/* Slice k of n floats over s shards: [*first, *first + *len). */
void wg_ps_slice(size_t n, int shards, int k, size_t *first, size_t *len);
/* Shards of a plan of nranks members for a spec asking for `want`: min(want, nranks - 1). */
int wg_ps_shards(int want, int nranks);

typedef struct wg_ps_shard_stats {
  uint64_t version;       /* updates applied in this epoch */
  uint64_t max_delay;     /* largest push delay since the last call (then reset) */
  uint64_t pushes;        /* pushes applied (whole job) */
  uint64_t max_iteration; /* largest worker iteration pushed in this epoch */
  double loss;            /* mean of the pushes' batch losses (recent), NaN = none */
  int workers_done;       /* workers of this epoch that said done */
  uint64_t dropped;       /* connections closed on a missed bound, a lost peer or a protocol
                             error (peer_io.h; whole life, any role) */
  int connections;        /* connections held now (their threads not yet joined) */
} wg_ps_shard_stats_t;

/* Binds an ephemeral port on bind_host and starts the endpoint's threads; n = model floats,
 * optim = the job's optimizer settings (run on the shard's slice), lambda = dc-asgd's
 * compensation (0 = asgd). Ownership: *out is the caller's (wg_ps_close). */
int wg_ps_open(const char *bind_host, size_t n, const wagma_optim_config_t *optim, double lambda,
               wagma_log_fn log, void *log_user, wg_ps_t **out);
void wg_ps_close(wg_ps_t *p);
uint16_t wg_ps_port(const wg_ps_t *p);
/* dc-asgd-a (the paper's adaptive variant), from the next epoch on: the shard keeps
 * MeanSquare = 0.95 MeanSquare + 0.05 g^2 per element (from 0 at each epoch) and uses
 * lambda / sqrt(MeanSquare + 1e-7) in place of lambda. */
#define WG_PS_MEANSQ_DECAY 0.95f
#define WG_PS_MEANSQ_EPS 1e-7f
void wg_ps_set_adaptive(wg_ps_t *p, int on);
/* The idle bound of the endpoint's connections (seconds between two requests; <= 0 = the
 * default, WG_PEER_IDLE_S), from the next wait on. Tests shorten it. Any thread. */
void wg_ps_set_idle_bound(wg_ps_t *p, double idle_s);

/* Enters an epoch: rank among nranks, shards, the peers (their endpoints and tokens), my token,
 * the deadline of one exchange (s), and model (n floats, host): a shard takes its slice from it
 * and a fresh optimizer; a worker forgets its connections. The frame bound of the endpoint's
 * connections becomes wg_peer_frame_bound(deadline_s) (agent/peer_io.h). */
int wg_ps_set_epoch(wg_ps_t *p, uint64_t epoch, int rank, int nranks, int shards,
                    const wg_adpsgd_peer_t *peers, uint64_t my_token, double deadline_s,
                    const float *model);

/* Worker: pulls every slice into model (n floats, host). 0, or the first shard's failure
 * (WAGMA_ETIMEDOUT, WAGMA_EPEER; WAGMA_EBUSY: the shard has not entered this epoch yet, as
 * happens for a moment at each epoch's start): the slices that came are in model, the others
 * unchanged. */
int wg_ps_pull(wg_ps_t *p, float *model);
/* Worker: pushes grads (n floats, host) to every shard with the versions of the last pull,
 * iteration and loss; *max_delay = the largest delay the shards measured. 0 or the first
 * failure. */
int wg_ps_push(wg_ps_t *p, const float *grads, uint64_t iteration, double loss,
               uint64_t *max_delay);
/* Worker: tells every shard it reached the job's end. */
int wg_ps_done(wg_ps_t *p);
/* Worker: what the last failed pull, push or done met ("shard 0 at host:port: ..."), "" if
 * none yet. Borrowed; valid until the next call on the worker side. */
const char *wg_ps_last_error(const wg_ps_t *p);

/* Shard: statistics (resets max_delay); its slice into model (n floats, host: the slice part
 * is written, the rest left alone). */
void wg_ps_shard_stats(wg_ps_t *p, wg_ps_shard_stats_t *out);
void wg_ps_shard_slice(wg_ps_t *p, float *model);

#endif
