/* coordinator/scheduler.c — membership, assignment and job lifecycle (the reconcile loop):
 * the thread, the read, and the writes. What to write is decided in sched_decide.c (a pure
 * function of the snapshot read and the clock); this file applies each write in etcd.
 *
 * One thread. It watches everything under <prefix>/ and runs a reconcile pass after each
 * burst of changes (at most every 50 ms; progress reports count only when they say "done",
 * "failed" or "unavailable") and at least once a second. A pass reads the whole
 * tree with ONE Range (a consistent snapshot at one revision) and, when this replica leads,
 * writes the differences; a follower only refreshes its metrics. Because every decision is
 * recomputed from etcd, a restarted or newly elected coordinator simply resumes.
 *
 * Agents that cannot serve a job (docs/agent.md): an agent whose progress in job J says
 * "unavailable" (its data set, its --listen address), written by its current registration
 * (the progress key's mod revision is above the agent key's create revision), has REFUSED J:
 * it is never a member of J again (it drops out like a dead member) until it registers anew.
 * When another agent has run J (progress "running" or "done" of an epoch >= the refusal's),
 * the fault is the agent's: the leader QUARANTINES it, <prefix>/quarantine/<agent> naming its
 * registration, the refusal and an end --quarantine seconds on, and no job gets it until then
 * or until it registers anew (records of an older registration, or expired ones of agents
 * that are gone, are deleted; an expired one of a present agent stays, so that the same
 * refusal does not quarantine it again). A job that nobody has run and that
 * WG_SCHED_MAX_REFUSALS agents (or every registered agent of its device, and program if it has
 * one) refused fails: the fault is the job's, and no agent is quarantined for it.
 *
 * Per job, oldest first (free agents go to the oldest jobs first):
 *   - terminal: nothing (its assignments are cleaned up below).
 *   - a current member reported progress state "failed" -> failed.
 *   - refused as above by too many agents and run by none -> failed.
 *   - every current member reported "done" (a dead one: or iteration >= spec.iterations)
 *     -> succeeded;
 *     so does a running job whose members all did except some whose agent key is gone (they
 *     died before the end), when a finished one is still registered (it holds the final
 *     model: no plan is made past the last iteration);
 *     so does a pending job whose last plan's members all did in that plan's epoch (they
 *     finished while their agent keys were gone, e.g. an etcd outage at the job's end).
 *   - nobody survived, no checkpoint, and an agent reported the last iteration: no new plan
 *     (it would start there from the seed); the job waits for the final reports with its plan,
 *     and fails WG_SCHED_FINAL_REPORT_WAIT_S after the job's newest report. A finished job is
 *     never planned again.
 *   - else the next membership: the live members in rank order (dead ones - agent key gone,
 *     i.e. lease expired - and those that refused the job drop out), cut to spec.workers
 *     (highest ranks leave), then free agents (name order, same device as the job, listing
 *     the job's program in their registration when it has one, neither quarantined nor
 *     having refused the job) appended as joiners up to spec.workers. A job without members
 *     starts only when min_workers agents are free; while it waits its reason says for what
 *     ("waiting for N free cpu agents [with program P]", or "no live cpu agent has program P"
 *     when no registered agent of its device has it). The status reason names an agent that
 *     refused the job and why.
 *     If the membership changed: plan epoch + 1, start_round = the highest iteration an
 *     agent reported in the current epoch (never below the previous start_round), or on a
 *     fresh start with a checkpoint recorded the checkpoint's iteration; joiners marked (none
 *     when nobody survived: a fresh start or a restart from a checkpoint).
 *   Writes: the joiners' assignment keys first, in chunks (each put guarded by the
 *   assignment's version / mod revision and the agent key's create revision), then the plan,
 *   its history entry plans/<epoch> (the entry WAGMA_API_PLAN_HISTORY epochs older deleted),
 *   the epoch's data-plane secret <prefix>/secrets/<job>/<epoch> (WAGMA_API_SECRET_LEN bytes
 *   from RAND_bytes, hex; the secret of epoch - 2 deleted) and the status in ONE Txn guarded
 *   by the mod revisions of spec, status and plan as read: an agent that reads a plan finds
 *   its secret. Then stale assignments (job gone or finished, or agent not a member) are
 *   deleted in chunks, each guarded by the assignment's mod revision, and so are stale
 *   secrets (job gone or finished, or an epoch other than the job's last two).
 * Every write also compares LEASE(<prefix>/coordinator/leader) == our lease: a coordinator
 * that lost leadership cannot write. A failed compare just schedules another pass.
 *
 * Members cut off from their peers on the data plane (docs/design.md §7.3): the partition
 * rule (reach.c) picks them from the members' reports of unreachable peers; each is
 * quarantined (the addresses it must reach again in the record) before a plan without it is
 * written, and the quarantine ends when its registration says it reached them all.
 *
 * Agents: an assignment only tells an agent which plan to watch; it trains in a job only
 * while that job's plan lists it (docs/api.md). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "coord.h"
#include "election.h"
#include "metrics.h"
#include "planner.h"
#include "sched_decide.h"
#include "scheduler.h"
#include "store.h"
#include "snapshot.h"
#include "wagma/log_internal.h"

#define CHUNK 60 /* keys per Txn: 2 compares each stays under etcd's default 128 ops */

struct wg_scheduler {
  wg_coord_t *c;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int stop;                  /* under mu */
  atomic_int stopping;       /* read by a pass in progress */
  int dirty;                 /* under mu */
  int watch_dead;            /* under mu: the watch ended (compaction); restart it */
  wagma_etcd_watch_t *watch; /* scheduler thread only */
};

/* ---- writes ------------------------------------------------------------------------------ */

typedef struct pass {
  wg_coord_t *c;
  snapshot_t *s;
  wg_sched_opts_t opts; /* what the decisions see; now advances after each write */
  int leader;
  int64_t lease;
  char leader_key[256];
  int again; /* another pass is needed soon */
  int abort; /* etcd unavailable or stopping: no more writes in this pass */
  atomic_int *stopping;
} pass_t;

static wagma_etcd_cmp_t fence(pass_t *p) {
  return (wagma_etcd_cmp_t){.key = p->leader_key,
                            .target = WAGMA_ETCD_CMP_LEASE,
                            .result = WAGMA_ETCD_EQUAL,
                            .number = p->lease};
}

static int txn(pass_t *p, const wagma_etcd_cmp_t *cmps, size_t ncmps, const wagma_etcd_op_t *ops,
               size_t nops, const char *what) {
  if (p->abort || atomic_load(p->stopping)) {
    p->abort = 1;
    return WAGMA_ECANCELED;
  }
  int e = wagma_etcd_txn(p->c->etcd, cmps, ncmps, ops, nops, NULL, 0, NULL);
  p->opts.now = wg_wall();
  if (e == WAGMA_EUNAVAIL || e == WAGMA_ETIMEDOUT)
    p->abort = 1; /* every further write would wait for the same deadline */
  if (e == WAGMA_ECONFLICT) {
    wg_logf(p->c->log, p->c->log_user, WAGMA_LOG_DEBUG, "%s: changed meanwhile, retrying", what);
    p->again = 1;
  } else if (e) {
    wg_logf(p->c->log, p->c->log_user, WAGMA_LOG_WARN, "%s: %s", what,
            wagma_etcd_errmsg(p->c->etcd));
  }
  return e;
}

/* Writes st (and plan_json when not NULL, with the history entry record_json of its epoch
 * st->epoch, dropping the entry WAGMA_API_PLAN_HISTORY epochs older, and the epoch's secret
 * secret_hex when not NULL, dropping the secret of epoch - 2) guarded by the job's
 * revisions. */
static int write_job(pass_t *p, const wg_job_record_t *j, const wagma_job_status_t *st,
                     const char *plan_json, const char *record_json, const char *secret_hex,
                     const char *what) {
  char skey[256], pkey[256], speckey[256], rkey[256], oldkey[256], *sjson = NULL;
  char secret_key[256], old_secret_key[256];
  int e;
  wagma_key_job_status(&p->c->keys, j->id, skey, sizeof skey);
  wagma_key_job_plan(&p->c->keys, j->id, pkey, sizeof pkey);
  wagma_key_job_spec(&p->c->keys, j->id, speckey, sizeof speckey);
  wagma_key_job_plan_record(&p->c->keys, j->id, st->epoch, rkey, sizeof rkey);
  wagma_key_job_plan_record(&p->c->keys, j->id,
                            st->epoch > WAGMA_API_PLAN_HISTORY ? st->epoch - WAGMA_API_PLAN_HISTORY
                                                               : 0,
                            oldkey, sizeof oldkey);
  wagma_key_secret(&p->c->keys, j->id, st->epoch, secret_key, sizeof secret_key);
  wagma_key_secret(&p->c->keys, j->id, st->epoch > 2 ? st->epoch - 2 : 0, old_secret_key,
                   sizeof old_secret_key);
  if ((e = wagma_job_status_to_json(st, &sjson)))
    return e;
  wagma_etcd_cmp_t cmps[4] = {
      fence(p),
      {.key = skey,
       .target = WAGMA_ETCD_CMP_MOD,
       .result = WAGMA_ETCD_EQUAL,
       .number = j->status_mod},
      {.key = speckey,
       .target = WAGMA_ETCD_CMP_MOD,
       .result = WAGMA_ETCD_EQUAL,
       .number = j->spec_mod},
      {.key = pkey,
       .target = j->plan_json ? WAGMA_ETCD_CMP_MOD : WAGMA_ETCD_CMP_VERSION,
       .result = WAGMA_ETCD_EQUAL,
       .number = j->plan_json ? j->plan_mod : 0},
  };
  wagma_etcd_op_t ops[6];
  size_t nops = 0;
  ops[nops++] = (wagma_etcd_op_t){
      .type = WAGMA_ETCD_OP_PUT, .key = skey, .value = sjson, .value_len = strlen(sjson)};
  if (plan_json) {
    ops[nops++] = (wagma_etcd_op_t){
        .type = WAGMA_ETCD_OP_PUT, .key = pkey, .value = plan_json, .value_len = strlen(plan_json)};
    if (record_json) {
      ops[nops++] = (wagma_etcd_op_t){.type = WAGMA_ETCD_OP_PUT,
                                      .key = rkey,
                                      .value = record_json,
                                      .value_len = strlen(record_json)};
      if (st->epoch > WAGMA_API_PLAN_HISTORY)
        ops[nops++] = (wagma_etcd_op_t){.type = WAGMA_ETCD_OP_DELETE, .key = oldkey};
    }
    if (secret_hex) {
      ops[nops++] = (wagma_etcd_op_t){.type = WAGMA_ETCD_OP_PUT,
                                      .key = secret_key,
                                      .value = secret_hex,
                                      .value_len = strlen(secret_hex)};
      if (st->epoch > 2)
        ops[nops++] = (wagma_etcd_op_t){.type = WAGMA_ETCD_OP_DELETE, .key = old_secret_key};
    }
  }
  e = txn(p, cmps, 4, ops, nops, what);
  free(sjson);
  return e;
}

/* Puts assignments {job, epoch} for the agents of as[] (n), in chunks, each put guarded by
 * the assignment as read and the agent's registration. *sent: how many were in chunks sent. */
static int reserve(pass_t *p, const char *job, uint64_t epoch, const wg_sched_assign_t *as, int n,
                   int *sent) {
  wagma_etcd_cmp_t cmps[1 + 2 * CHUNK];
  wagma_etcd_op_t ops[CHUNK];
  char keys[CHUNK][2][256];
  char *val = NULL;
  wagma_assignment_t a = {.epoch = epoch};
  int e = 0;
  snprintf(a.job, sizeof a.job, "%s", job);
  if ((e = wagma_assignment_to_json(&a, &val)))
    return e;
  for (int base = 0; base < n && !e; base += CHUNK) {
    int m = n - base < CHUNK ? n - base : CHUNK;
    size_t nc = 0;
    cmps[nc++] = fence(p);
    for (int k = 0; k < m; k++) {
      const wg_sched_assign_t *ag = &as[base + k];
      wagma_key_assignment(&p->c->keys, ag->agent, keys[k][0], sizeof keys[k][0]);
      wagma_key_agent(&p->c->keys, ag->agent, keys[k][1], sizeof keys[k][1]);
      cmps[nc++] =
          (wagma_etcd_cmp_t){.key = keys[k][0],
                             .target = ag->assign_mod ? WAGMA_ETCD_CMP_MOD : WAGMA_ETCD_CMP_VERSION,
                             .result = WAGMA_ETCD_EQUAL,
                             .number = ag->assign_mod};
      cmps[nc++] = (wagma_etcd_cmp_t){.key = keys[k][1],
                                      .target = WAGMA_ETCD_CMP_CREATE,
                                      .result = WAGMA_ETCD_EQUAL,
                                      .number = ag->registration};
      ops[k] = (wagma_etcd_op_t){
          .type = WAGMA_ETCD_OP_PUT, .key = keys[k][0], .value = val, .value_len = strlen(val)};
    }
    *sent = base + m;
    e = txn(p, cmps, nc, ops, (size_t)m, "assign agents");
  }
  free(val);
  return e;
}

/* Puts <prefix>/quarantine/<agent> = w->q, guarded by the agent's registration (create
 * revision) and the record as read. 0 or an error. */
static int put_quarantine(pass_t *p, const wg_sched_write_t *w) {
  wg_coord_t *c = p->c;
  char qkey[256], akey[256], *json = NULL;
  const agent_rec_t *a = w->agent;
  const quarantine_rec_t *old = w->old;
  if (wagma_key_quarantine(&c->keys, a->name, qkey, sizeof qkey) ||
      wagma_key_agent(&c->keys, a->name, akey, sizeof akey) ||
      wagma_quarantine_to_json(&w->q, &json))
    return WAGMA_ENOMEM;
  wagma_etcd_cmp_t cmps[3] = {
      fence(p),
      {.key = akey,
       .target = WAGMA_ETCD_CMP_CREATE,
       .result = WAGMA_ETCD_EQUAL,
       .number = a->create_rev},
      {.key = qkey,
       .target = old ? WAGMA_ETCD_CMP_MOD : WAGMA_ETCD_CMP_VERSION,
       .result = WAGMA_ETCD_EQUAL,
       .number = old ? old->mod : 0},
  };
  wagma_etcd_op_t put = {
      .type = WAGMA_ETCD_OP_PUT, .key = qkey, .value = json, .value_len = strlen(json)};
  int e = txn(p, cmps, 3, &put, 1, w->what);
  free(json);
  if (e == 0 && w->kind == WG_SCHED_QUARANTINE_REFUSAL)
    wg_logf(c->log, c->log_user, WAGMA_LOG_WARN,
            "agent %s quarantined for %d s (or until it registers again): %s", a->name,
            c->quarantine_s, w->q.reason);
  else if (e == 0)
    wg_logf(c->log, c->log_user, WAGMA_LOG_WARN,
            "agent %s quarantined until it reaches its peers again (at most %.0f s): %s", a->name,
            w->q.until - w->q.since, w->q.reason);
  return e;
}

/* Rewrites (end) or deletes (drop) the quarantine record w->old, guarded by its mod
 * revision. */
static int update_quarantine(pass_t *p, const wg_sched_write_t *w) {
  char key[256], *json = NULL;
  const quarantine_rec_t *q = w->old;
  int end = w->kind == WG_SCHED_QUARANTINE_END;
  if (wagma_key_quarantine(&p->c->keys, q->agent, key, sizeof key) ||
      (end && wagma_quarantine_to_json(&w->q, &json)))
    return WAGMA_ENOMEM;
  wagma_etcd_cmp_t cmps[2] = {
      fence(p),
      {.key = key, .target = WAGMA_ETCD_CMP_MOD, .result = WAGMA_ETCD_EQUAL, .number = q->mod}};
  wagma_etcd_op_t op = {.type = WAGMA_ETCD_OP_DELETE, .key = key};
  if (end)
    op = (wagma_etcd_op_t){
        .type = WAGMA_ETCD_OP_PUT, .key = key, .value = json, .value_len = strlen(json)};
  int e = txn(p, cmps, 2, &op, 1, w->what);
  if (e == 0 && end)
    wg_logf(p->c->log, p->c->log_user, WAGMA_LOG_INFO,
            "agent %s reaches its peers again: its quarantine ends (job %s)", q->agent, w->q.job);
  else if (e == 0 && w->agent)
    wg_logf(p->c->log, p->c->log_user, WAGMA_LOG_INFO,
            "agent %s registered again: its quarantine ends", q->agent);
  free(json);
  return e;
}

/* Builds w's plan and the epoch's secret, puts the joiners' assignments, then writes plan,
 * history entry, secret and status in one Txn. */
static int publish_plan(pass_t *p, wg_sched_write_t *w) {
  const wg_job_record_t *j = w->job;
  char *plan_json = NULL, *record_json = NULL;
  uint8_t secret[WAGMA_API_SECRET_LEN];
  char secret_hex[2 * WAGMA_API_SECRET_LEN + 1];
  uint64_t epoch = w->plan.epoch;
  int n = w->plan.nmembers;
  double secs = 0;
  int e = wg_planner_build(&w->plan, &plan_json, &record_json, &secs);
  wg_metrics_plan_time(p->c->metrics, secs);
  if (e) {
    wg_logf(p->c->log, p->c->log_user, WAGMA_LOG_ERROR, "job %s: plan for %d members: %s", j->id, n,
            wagma_strerror(e));
    goto out;
  }
  /* The epoch's data-plane secret (docs/collective.md "Peer authentication"): only agents read
   * <prefix>/secrets/; it goes in the plan's Txn, so a member that reads the plan finds it. */
  if (RAND_bytes(secret, sizeof secret) != 1 ||
      wagma_secret_to_hex(secret, sizeof secret, secret_hex, sizeof secret_hex) != 0) {
    wg_logf(p->c->log, p->c->log_user, WAGMA_LOG_ERROR,
            "job %s: no random bytes for the secret of epoch %llu; not publishing the plan", j->id,
            (unsigned long long)epoch);
    e = WAGMA_EIO;
    goto out;
  }
  if (w->nassign && (e = reserve(p, j->id, epoch, w->assign, w->nassign, &w->nsent)) != 0)
    goto out;
  e = write_job(p, j, &w->status, plan_json, record_json, secret_hex, w->what);
  if (e == 0) {
    wg_logf(p->c->log, p->c->log_user, WAGMA_LOG_INFO,
            "job %s: plan epoch %llu, %d members (%d joined, %d left), start_round %llu, "
            "planned in %.3f ms",
            j->id, (unsigned long long)epoch, n, w->nassign, w->nleft,
            (unsigned long long)w->plan.start_round, secs * 1e3);
    if (epoch > 1)
      wg_metrics_regrouping(p->c->metrics);
  }
out:
  OPENSSL_cleanse(secret, sizeof secret);
  OPENSSL_cleanse(secret_hex, sizeof secret_hex);
  free(plan_json);
  free(record_json);
  return e;
}

/* Deletes the keys of w (stale assignments or secrets), in chunks, each delete guarded by the
 * key's mod revision. */
static int delete_keys(pass_t *p, const wg_sched_write_t *w) {
  wagma_etcd_cmp_t cmps[1 + CHUNK];
  wagma_etcd_op_t ops[CHUNK];
  char keys[CHUNK][256];
  int n = 0, secrets = w->kind == WG_SCHED_DROP_SECRETS;
  for (size_t i = 0; i <= w->nkeys && !(secrets && p->abort); i++) {
    if (i < w->nkeys) {
      int64_t mod;
      if (secrets) {
        const secret_rec_t *sr = w->secrets[i];
        if (wagma_key_secret(&p->c->keys, sr->job, sr->epoch, keys[n], sizeof keys[n]) != 0)
          continue;
        mod = sr->mod;
      } else {
        wagma_key_assignment(&p->c->keys, w->assigns[i]->agent, keys[n], sizeof keys[n]);
        mod = w->assigns[i]->mod;
      }
      cmps[1 + n] = (wagma_etcd_cmp_t){
          .key = keys[n], .target = WAGMA_ETCD_CMP_MOD, .result = WAGMA_ETCD_EQUAL, .number = mod};
      ops[n] = (wagma_etcd_op_t){.type = WAGMA_ETCD_OP_DELETE, .key = keys[n]};
      n++;
    }
    if (n == CHUNK || (i == w->nkeys && n > 0)) {
      cmps[0] = fence(p);
      txn(p, cmps, (size_t)n + 1, ops, (size_t)n, w->what);
      n = 0;
    }
  }
  return 0;
}

/* The sink of the decisions (sched_decide.h): a follower writes nothing. */
static int apply_write(void *user, wg_sched_write_t *w) {
  pass_t *p = user;
  static double last_split_log; /* (the scheduler thread's): at most one line a minute */
  if (!p->leader)
    return WAGMA_ECANCELED;
  switch (w->kind) {
  case WG_SCHED_QUARANTINE_REFUSAL:
  case WG_SCHED_QUARANTINE_CUT: return put_quarantine(p, w);
  case WG_SCHED_QUARANTINE_END:
  case WG_SCHED_QUARANTINE_DROP: return update_quarantine(p, w);
  case WG_SCHED_NO_MAJORITY:
    if (wg_mono() - last_split_log > 60) {
      last_split_log = wg_mono();
      wg_logf(p->c->log, p->c->log_user, WAGMA_LOG_WARN,
              "job %s: its members cannot reach each other and no side is a majority: nobody "
              "is left out",
              w->job->id);
    }
    return 0;
  case WG_SCHED_JOB_STATUS: {
    int e = write_job(p, w->job, &w->status, NULL, NULL, NULL, w->what);
    if (e == 0 && w->finish)
      wg_logf(p->c->log, p->c->log_user, WAGMA_LOG_INFO, "job %s %s: %s", w->job->id,
              wagma_job_state_name((wagma_job_state_t)w->finish), w->status.reason);
    return e;
  }
  case WG_SCHED_PLAN: return publish_plan(p, w);
  case WG_SCHED_RELEASE:
  case WG_SCHED_DROP_SECRETS: return delete_keys(p, w);
  }
  return WAGMA_EINVAL;
}

static int pass_stopped(void *user) {
  return ((pass_t *)user)->abort;
}

static void reconcile(wg_scheduler_t *sch) {
  wg_coord_t *c = sch->c;
  snapshot_t s;
  pass_t p = {.c = c, .s = &s, .stopping = &sch->stopping};
  wg_sched_sink_t sink = {.apply = apply_write, .stopped = pass_stopped, .user = &p};
  int e = wg_snapshot_load(c, &s);
  if (e) {
    wg_logf(c->log, c->log_user, WAGMA_LOG_DEBUG, "reconcile: read: %s",
            wagma_etcd_errmsg(c->etcd));
    return;
  }
  p.leader = wg_election_is_leader(c->election, &p.lease);
  wagma_key_leader(&c->keys, p.leader_key, sizeof p.leader_key);
  p.opts = (wg_sched_opts_t){.now = wg_wall(), .quarantine_s = c->quarantine_s};
  wg_sched_pass(&s, &p.opts, &sink);
  wg_metrics_set_snapshot(c->metrics, wg_snapshot_render(&s));
  /* after the metrics: a finished job's gauges must not wait for its secrets' delete */
  wg_sched_drop_secrets(&s, &sink);
  wg_snapshot_free(&s);
  if (p.again) {
    pthread_mutex_lock(&sch->mu);
    sch->dirty = 1;
    pthread_mutex_unlock(&sch->mu);
  }
}

/* ---- thread and watch ---------------------------------------------------------------------- */

/* Progress reports (about one per agent per second) only matter to the scheduler when they
 * signal completion, failure or an agent that cannot serve its job; the others wait for the
 * periodic pass, so a large job does not make the scheduler re-read the tree continuously. */
static int event_matters(wg_scheduler_t *s, const wagma_etcd_event_t *ev) {
  if (wagma_key_parse(&s->c->keys, ev->kv.key, ev->kv.key_len, NULL, NULL) !=
          WAGMA_KEY_JOB_PROGRESS ||
      ev->type != WAGMA_ETCD_EVENT_PUT)
    return 1;
  return ev->kv.value && (strstr(ev->kv.value, "done") || strstr(ev->kv.value, "failed") ||
                          strstr(ev->kv.value, "unavailable"));
}

static void on_watch(void *user, int status, const wagma_etcd_event_t *events, size_t n,
                     int64_t revision) {
  (void)revision;
  wg_scheduler_t *s = user;
  int matters = status != 0;
  for (size_t i = 0; i < n && !matters; i++)
    matters = event_matters(s, &events[i]);
  if (!matters)
    return;
  pthread_mutex_lock(&s->mu);
  s->dirty = 1;
  if (status != 0)
    s->watch_dead = 1;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

static void start_watch(wg_scheduler_t *s) {
  char root[256];
  wagma_etcd_watch_options_t opt = {.prefix = 1};
  wagma_key_root(&s->c->keys, root, sizeof root);
  if (wagma_etcd_watch_start(s->c->etcd, root, &opt, on_watch, s, &s->watch) != 0) {
    s->watch = NULL;
    wg_logf(s->c->log, s->c->log_user, WAGMA_LOG_DEBUG, "watch: %s (polling meanwhile)",
            wagma_etcd_errmsg(s->c->etcd));
  }
}

static void timed_wait(wg_scheduler_t *s, double seconds) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  long ns = (long)(seconds * 1e9);
  ts.tv_sec += ns / 1000000000L;
  ts.tv_nsec += ns % 1000000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  pthread_cond_timedwait(&s->cv, &s->mu, &ts);
}

static void *scheduler_main(void *arg) {
  wg_scheduler_t *s = arg;
  pthread_mutex_lock(&s->mu);
  while (!s->stop) {
    int restart = !s->watch || s->watch_dead;
    s->watch_dead = 0;
    pthread_mutex_unlock(&s->mu);
    if (restart) {
      wagma_etcd_watch_stop(s->watch);
      s->watch = NULL;
      start_watch(s);
    }
    pthread_mutex_lock(&s->mu);
    s->dirty = 0;
    pthread_mutex_unlock(&s->mu);
    reconcile(s);
    pthread_mutex_lock(&s->mu);
    if (s->stop)
      break;
    timed_wait(s, 0.05); /* debounce: gather a burst of changes */
    if (!s->dirty && !s->stop)
      timed_wait(s, s->watch ? 1.0 : 0.25);
  }
  pthread_mutex_unlock(&s->mu);
  wagma_etcd_watch_stop(s->watch);
  s->watch = NULL;
  return NULL;
}

int wg_scheduler_start(wg_coord_t *c, wg_scheduler_t **out) {
  wg_scheduler_t *s = calloc(1, sizeof *s);
  if (!s)
    return WAGMA_ENOMEM;
  s->c = c;
  pthread_mutex_init(&s->mu, NULL);
  pthread_condattr_t ca; /* timed waits on the monotonic clock: immune to clock steps */
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&s->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (pthread_create(&s->thread, NULL, scheduler_main, s) != 0) {
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
    return WAGMA_EIO;
  }
  *out = s;
  return 0;
}

void wg_scheduler_stop(wg_scheduler_t *s) {
  if (!s)
    return;
  pthread_mutex_lock(&s->mu);
  s->stop = 1;
  atomic_store(&s->stopping, 1);
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->thread, NULL);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s);
}

void wg_scheduler_poke(wg_scheduler_t *s) {
  if (!s)
    return;
  pthread_mutex_lock(&s->mu);
  s->dirty = 1;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
}
