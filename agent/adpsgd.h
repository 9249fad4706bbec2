/* agent/adpsgd.h — AD-PSGD's pairwise averaging (Lian et al. 2018, asynchronous decentralized
 * parallel SGD), private to wagma-agent: the endpoint in adpsgd.c and its tests.
 *
 * Roles: the ranks of a plan form a bipartite graph. Even ranks are ACTIVE, odd ranks PASSIVE.
 * After each local step an active worker averages its model with one passive peer drawn at
 * random: it sends its model, the passive's endpoint thread answers at once with its latest
 * snapshot s and both take the mean m = (w_a + s) / 2. Actives only ask, passives only answer,
 * so no two averagings ever wait for each other (no deadlock, no global barrier) and a
 * passive's compute never delays an active.
 *
 * Atomicity on the passive: its endpoint thread averages against the snapshot (the model as of
 * the passive's last step, published by its training thread) and keeps the passive's share of
 * the change, (w_a - s) / 2, in a pending correction; the next publish() adds the correction to
 * the training model and publishes the result. Averagings that reach one passive in between are
 * applied one after the other to the snapshot (each active sees the result of the previous
 * one). The sum of all models is conserved exactly: the active moves by (s - w_a) / 2, the
 * passive by (w_a - s) / 2.
 *
 * Failures: every exchange has a deadline. A passive that does not answer in time (stopped,
 * dead, partitioned) is skipped: the active keeps its model, marks the peer suspect for a
 * back-off period and picks among the other passives from then on. A request that went out
 * whole may still be answered (a stopped passive that resumes has then taken its half): the
 * active keeps that connection and a copy of the model it sent, and when the late reply comes
 * (checked at each later average()) applies its own half, (s - w_sent) / 2, so the sum stays
 * conserved. Until then the peer is not asked again. Requests of another epoch
 * or with a wrong token are refused.
 *
 * Every wait of the passive's connection threads is bounded too (agent/peer_io.h): a request's
 * bytes within the frame bound (twice the epoch's exchange deadline, at least 2 s), requests at
 * most WG_PEER_IDLE_S apart, TCP keepalive for a vanished host. A connection that misses one is
 * closed and its thread ends; an active that finds its idle connection closed connects afresh.
 *
 * Wire format (little-endian, native float32): a 40-byte header {magic "WGAD", version 1,
 * kind, epoch, token, count} then count floats. Kinds: average request (active -> passive,
 * the active's model), average reply (the passive's snapshot before the averaging), refused
 * (no payload). The token is the passive's per-epoch secret, exchanged over the epoch's
 * authenticated collective; the port too (adpsgd endpoints listen on an ephemeral port of the
 * agent's --listen host). */
#ifndef WAGMA_AGENT_ADPSGD_H
#define WAGMA_AGENT_ADPSGD_H

#include <stddef.h>
#include <stdint.h>

#include "agent/train/train.h"
#include "wagma/status.h"

typedef struct wg_adpsgd wg_adpsgd_t;

/* A peer of the epoch: where its endpoint listens and its token. port 0 = unknown (skipped). */
typedef struct wg_adpsgd_peer {
  char host[256];
  uint16_t port;
  uint64_t token;
} wg_adpsgd_peer_t;

typedef struct wg_adpsgd_counters {
  uint64_t averaged;    /* active: averagings done */
  uint64_t skipped;     /* active: averagings given up (deadline, refusal, no peer) */
  uint64_t served;      /* passive: averagings answered */
  uint64_t refused;     /* passive: requests of another epoch or with a bad token */
  uint64_t late;        /* active: replies collected after their deadline (in averaged too) */
  uint64_t dropped;     /* passive: connections closed on a missed bound, a lost peer or a
                           protocol error (peer_io.h) */
  uint64_t connections; /* passive: connections held now (their threads not yet joined) */
} wg_adpsgd_counters_t;

/* 1 when rank is active (even), 0 when passive (odd). */
static inline int wg_adpsgd_rank_active(int rank) {
  return rank % 2 == 0;
}

/* Binds an ephemeral TCP port on bind_host ("127.0.0.1", "0.0.0.0", "::", a name) and starts
 * the endpoint's accept thread; models have count floats. log may be NULL. Ownership: *out is
 * the caller's (wg_adpsgd_close). */
int wg_adpsgd_open(const char *bind_host, size_t count, wagma_log_fn log, void *log_user,
                   wg_adpsgd_t **out);
/* Stops the threads, closes every socket, frees. NULL is a no-op. */
void wg_adpsgd_close(wg_adpsgd_t *g);
uint16_t wg_adpsgd_port(const wg_adpsgd_t *g);
/* The idle bound of the passive's connections (seconds between two requests; <= 0 = the
 * default, WG_PEER_IDLE_S), from the next wait on. Tests shorten it. Any thread. */
void wg_adpsgd_set_idle_bound(wg_adpsgd_t *g, double idle_s);

/* Enters an epoch: my rank among nranks, the peers (nranks entries, mine ignored; copied),
 * my token (passives check it), the deadline of one exchange and the back-off of a suspect
 * peer, in seconds, and model (count floats, host) as the first snapshot. Requests of other
 * epochs are refused from now on, the pending correction is dropped (call publish() first to
 * keep it) and the active side's connections are closed. The frame bound of the passive's
 * connections becomes wg_peer_frame_bound(deadline_s). */
int wg_adpsgd_set_epoch(wg_adpsgd_t *g, uint64_t epoch, int rank, int nranks,
                        const wg_adpsgd_peer_t *peers, uint64_t my_token, double deadline_s,
                        double backoff_s, const float *model);

/* Passive, training thread, after each step: model += the pending correction (the
 * averagings served since the last call), then model becomes the snapshot. Returns the number
 * of averagings applied. An active may call it too (it has nothing pending). */
int wg_adpsgd_publish(wg_adpsgd_t *g, float *model);

/* Active, training thread, after each step: averages model (count floats, host) with one
 * passive peer drawn with rng among those not suspect. 0 when averaged (*peer = its rank);
 * WAGMA_ETIMEDOUT (deadline), WAGMA_EPEER (connection failed or refused) or WAGMA_ENOTFOUND
 * (no passive peer to ask) when skipped: model is then unchanged. peer may be NULL. */
int wg_adpsgd_average(wg_adpsgd_t *g, float *model, wagma_rng_t *rng, int *peer);

void wg_adpsgd_counters(wg_adpsgd_t *g, wg_adpsgd_counters_t *out);

/* The per-epoch exchange of ports and tokens over a SUM allreduce of floats: rank r writes
 * its port and its token (four 16-bit pieces, exact in float32) at [5r, 5r + 5) of a zeroed
 * buffer of 5 * nranks floats; after the allreduce every rank decodes every peer's. */
#define WG_ADPSGD_EXCHANGE_FLOATS 5
void wg_adpsgd_exchange_encode(float *buf, int rank, uint16_t port, uint64_t token);
void wg_adpsgd_exchange_decode(const float *buf, int rank, uint16_t *port, uint64_t *token);

#endif
