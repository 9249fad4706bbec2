/* coordinator/scheduler.c — membership, assignment and job lifecycle (the reconcile loop).
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
 * refusal does not quarantine it again). A job that
 * nobody has run and that MAX_REFUSALS agents (or every registered agent of its device, and
 * program if it has one)
 * refused fails: the fault is the job's, and no agent is quarantined for it.
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
 *     and fails FINAL_REPORT_WAIT_S after the job's newest report. A finished job is never
 *     planned again.
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
#include <math.h>
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
#include "reach.h"
#include "scheduler.h"
#include "snapshot.h"
#include "store.h"
#include "reach.h"
#include "snapshot.h"
#include "wagma/log_internal.h"

#define CHUNK 60 /* keys per Txn: 2 compares each stays under etcd's default 128 ops */
/* A job that this many agents refused ("unavailable") and none ran fails: it is the job that
 * cannot run, not the agents (so a bad job does not quarantine the cluster). */
#define MAX_REFUSALS 3
/* How long a job whose members all left at its last iteration waits for their final reports
 * (after the newest report of its epoch) before it fails. */
#define FINAL_REPORT_WAIT_S 30.0
/* A report that a peer is unreachable counts once it says so for this long (reach.h): the
 * silence behind it lasted WG_TCP_SILENCE_S already; the rule itself waits until one side
 * is cut off from most (the first reports of a cut leave out nobody). */
#define REACH_GRACE_S 0.5

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

/* The progress entry of agent in job j, NULL when none. The entries are in key order, i.e.
 * sorted by agent name (wg_job_record_from_kvs keeps etcd's order): a binary search, so a
 * pass stays O(n log n) in the members and agents of a large job. */
static const wg_progress_entry_t *find_entry(const wg_job_record_t *j, const char *agent) {
  int lo = 0, hi = j->nprogress;
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2, d = strcmp(j->progress[mid].agent, agent);
    if (d == 0)
      return &j->progress[mid];
    if (d < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return NULL;
}

static const wagma_progress_t *find_progress(const wg_job_record_t *j, const char *agent) {
  const wg_progress_entry_t *pe = find_entry(j, agent);
  return pe ? &pe->progress : NULL;
}

static int cmp_created(const void *a, const void *b) {
  const wg_job_record_t *x = a, *y = b;
  if (x->status.created != y->status.created)
    return x->status.created < y->status.created ? -1 : 1;
  return strcmp(x->id, y->id);
}

/* ---- writes ------------------------------------------------------------------------------ */

typedef struct pass {
  wg_coord_t *c;
  snapshot_t *s;
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
static int write_job(pass_t *p, wg_job_record_t *j, const wagma_job_status_t *st,
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

/* Puts assignments {job, epoch} for the agents named, in chunks. */
static int reserve(pass_t *p, const char *job, uint64_t epoch, agent_rec_t **agents, int n) {
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
      agent_rec_t *ag = agents[base + k];
      assign_rec_t *old = wg_snapshot_assign(p->s, ag->name);
      wagma_key_assignment(&p->c->keys, ag->name, keys[k][0], sizeof keys[k][0]);
      wagma_key_agent(&p->c->keys, ag->name, keys[k][1], sizeof keys[k][1]);
      cmps[nc++] = (wagma_etcd_cmp_t){.key = keys[k][0],
                                      .target = old ? WAGMA_ETCD_CMP_MOD : WAGMA_ETCD_CMP_VERSION,
                                      .result = WAGMA_ETCD_EQUAL,
                                      .number = old ? old->mod : 0};
      cmps[nc++] = (wagma_etcd_cmp_t){.key = keys[k][1],
                                      .target = WAGMA_ETCD_CMP_CREATE,
                                      .result = WAGMA_ETCD_EQUAL,
                                      .number = ag->create_rev};
      ops[k] = (wagma_etcd_op_t){
          .type = WAGMA_ETCD_OP_PUT, .key = keys[k][0], .value = val, .value_len = strlen(val)};
      ag->touched = 1;
    }
    e = txn(p, cmps, nc, ops, (size_t)m, "assign agents");
  }
  free(val);
  return e;
}

/* ---- per-job decisions ------------------------------------------------------------------- */

/* Parses the members of the current plan (names + addresses). Ownership: *names and
 * *addrs are arrays the caller frees; n entries. */
static int plan_members(const wg_job_record_t *j, char (**names)[WAGMA_API_NAME_MAX],
                        char (**addrs)[WAGMA_API_ADDR_MAX], int *n) {
  *names = NULL;
  *addrs = NULL;
  *n = 0;
  if (!j->plan_json)
    return 0;
  json_t *plan = json_loadb(j->plan_json, j->plan_len, 0, NULL);
  json_t *m = plan ? json_object_get(plan, "members") : NULL;
  size_t cnt = json_array_size(m), i;
  json_t *v;
  if (cnt) {
    *names = calloc(cnt, sizeof **names);
    *addrs = calloc(cnt, sizeof **addrs);
    if (!*names || !*addrs) {
      free(*names);
      free(*addrs);
      json_decref(plan);
      return WAGMA_ENOMEM;
    }
  }
  json_array_foreach(m, i, v) {
    snprintf((*names)[i], WAGMA_API_NAME_MAX, "%s",
             json_string_value(json_object_get(v, "name")) ?: "");
    snprintf((*addrs)[i], WAGMA_API_ADDR_MAX, "%s",
             json_string_value(json_object_get(v, "address")) ?: "");
  }
  *n = (int)cnt;
  json_decref(plan);
  return 0;
}

static void finish_job(pass_t *p, wg_job_record_t *j, wagma_job_state_t state, const char *reason) {
  wagma_job_status_t st = j->status;
  st.state = state;
  snprintf(st.reason, sizeof st.reason, "%s", reason);
  st.finished = wg_wall();
  st.iteration = wg_job_record_iteration(j);
  wg_job_record_summary(j, st.finished, &st.summary);
  if (write_job(p, j, &st, NULL, NULL, NULL, "finish job") == 0) {
    wg_logf(p->c->log, p->c->log_user, WAGMA_LOG_INFO, "job %s %s: %s", j->id,
            wagma_job_state_name(state), reason);
    j->status.state = state; /* so cleanup releases its agents in this pass */
  }
}

/* An agent runs jobs of its own device: cpu jobs on cpu agents (no GPU is tied up by a CPU
 * job), cuda jobs on cuda agents. */
static int device_ok(const wg_job_record_t *j, const agent_rec_t *a) {
  return j->spec.device == a->info.device;
}

/* The refusal of job j by agent (its "unavailable" progress) when written by the agent's
 * current registration, else NULL. */
static const wg_progress_entry_t *refusal(const wg_job_record_t *j, const agent_rec_t *a) {
  const wg_progress_entry_t *pe = a ? find_entry(j, a->name) : NULL;
  return pe && pe->progress.state == WAGMA_PROGRESS_UNAVAILABLE && pe->mod > a->create_rev ? pe
                                                                                           : NULL;
}

/* Some agent other than the one of pe ran job j in pe's epoch or later: the job runs, so a
 * refusal is the refusing agent's fault. */
static int ran_without(const wg_job_record_t *j, const wg_progress_entry_t *pe) {
  for (int i = 0; i < j->nprogress; i++) {
    const wg_progress_entry_t *o = &j->progress[i];
    if (o != pe && o->progress.epoch >= pe->progress.epoch &&
        (o->progress.state == WAGMA_PROGRESS_RUNNING || o->progress.state == WAGMA_PROGRESS_DONE))
      return 1;
  }
  return 0;
}

/* A program job runs only on agents whose registration lists its program (the agent
 * launches it from its --programs directory); a built-in job on any agent. */
static int program_ok(const wg_job_record_t *j, const agent_rec_t *a) {
  return !j->spec.program.name[0] || wagma_agent_has_program(&a->info, j->spec.program.name);
}

/* The member on agent a asks to rejoin job j as a joiner: its program restarted and lost the
 * model of the current epoch (progress "rejoin" = the job's epoch, written by a's current
 * registration; docs/programs.md). */
static int wants_rejoin(const wg_job_record_t *j, const agent_rec_t *a) {
  const wg_progress_entry_t *pe = a ? find_entry(j, a->name) : NULL;
  return pe && pe->progress.rejoin != 0 && pe->progress.rejoin == j->status.epoch &&
         pe->mod > a->create_rev;
}

/* Whether agent a may join job j: same device, has its program, not quarantined, has not
 * refused j. */
static int eligible(const wg_job_record_t *j, const agent_rec_t *a) {
  return device_ok(j, a) && program_ok(j, a) && !a->quarantined && !refusal(j, a);
}

/* The reason of a job that cannot start for want of free agents (constant per situation:
 * pending jobs are not rewritten at every pass). A program job that no registered agent of
 * its device has: "no live <device> agent has program <name>"; otherwise "waiting for N free
 * <device> agents", " with program <name>" for a program job. */
static void waiting_reason(const snapshot_t *s, const wg_job_record_t *j, char *reason,
                           size_t len) {
  const char *device = wagma_device_name(j->spec.device), *prog = j->spec.program.name;
  int has = !prog[0];
  for (size_t i = 0; i < s->nagents && !has; i++)
    has = device_ok(j, &s->agents[i]) && program_ok(j, &s->agents[i]);
  if (!has)
    snprintf(reason, len, "no live %s agent has program %s", device, prog);
  else if (prog[0])
    snprintf(reason, len, "waiting for %d free %s agents with program %s", j->spec.min_workers,
             device, prog);
  else
    snprintf(reason, len, "waiting for %d free %s agents", j->spec.min_workers, device);
}

/* Appends "; agent <a> unavailable: <why>" for the first agent that refused j (current
 * registrations only) to reason (len bytes). */
static void append_refusal(snapshot_t *s, const wg_job_record_t *j, char *reason, size_t len) {
  for (int i = 0; i < j->nprogress; i++) {
    const wg_progress_entry_t *pe = &j->progress[i];
    agent_rec_t *a = wg_snapshot_agent(s, pe->agent);
    if (pe->progress.state != WAGMA_PROGRESS_UNAVAILABLE || !a || pe->mod <= a->create_rev)
      continue;
    size_t n = strlen(reason);
    snprintf(reason + n, len - n, "%sagent %s unavailable: %s", n ? "; " : "", pe->agent,
             pe->progress.error[0] ? pe->progress.error : "no detail");
    return;
  }
}

/* The quarantine record of agent name, NULL when none. */
static quarantine_rec_t *find_quarantine(snapshot_t *s, const char *name) {
  for (size_t i = 0; i < s->nquarantines; i++)
    if (strcmp(s->quarantines[i].agent, name) == 0)
      return &s->quarantines[i];
  return NULL;
}

/* Puts <prefix>/quarantine/<agent> = q, guarded by the agent's registration (create
 * revision) and the record as read; marks a quarantined. 0 or an error. */
static int put_quarantine(pass_t *p, agent_rec_t *a, const wagma_quarantine_t *q,
                          const char *what) {
  wg_coord_t *c = p->c;
  char qkey[256], akey[256], *json = NULL;
  quarantine_rec_t *old = find_quarantine(p->s, a->name);
  if (wagma_key_quarantine(&c->keys, a->name, qkey, sizeof qkey) ||
      wagma_key_agent(&c->keys, a->name, akey, sizeof akey) || wagma_quarantine_to_json(q, &json))
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
  int e = txn(p, cmps, 3, &put, 1, what);
  if (e == 0)
    a->quarantined = 1;
  free(json);
  return e;
}

/* Quarantines agent a for its refusal pe of job (until = now + c->quarantine_s). */
static void quarantine(pass_t *p, agent_rec_t *a, const char *job, const wg_progress_entry_t *pe) {
  wg_coord_t *c = p->c;
  const char *why = pe->progress.error[0] ? pe->progress.error : "no detail";
  wagma_quarantine_t q = {.since = wg_wall(), .registration = a->create_rev, .refusal = pe->mod};
  q.until = q.since + c->quarantine_s;
  snprintf(q.job, sizeof q.job, "%s", job);
  if (snprintf(q.reason, sizeof q.reason, "job %s: %s", job, why) >= (int)sizeof q.reason)
    q.reason[sizeof q.reason - 1] = '\0'; /* truncated: fine */
  if (put_quarantine(p, a, &q, "quarantine agent") == 0)
    wg_logf(c->log, c->log_user, WAGMA_LOG_WARN,
            "agent %s quarantined for %d s (or until it registers again): %s", a->name,
            c->quarantine_s, q.reason);
}

/* ---- members cut off from their peers (docs/design.md §7.3) -------------------------------- */

/* Which members of job j's plan (nplan members, names and addresses in rank order) the
 * partition rule (reach.c) leaves out, in cut[] (nplan entries): a member counts when its
 * agent is registered at the plan's address and its report is of the job's epoch. Returns
 * what wg_reach_decide returns. */
static int cut_members(snapshot_t *s, const wg_job_record_t *j, char (*names)[WAGMA_API_NAME_MAX],
                       char (*addrs)[WAGMA_API_ADDR_MAX], int nplan, int *cut) {
  wg_reach_member_t *m = calloc((size_t)nplan, sizeof *m);
  if (!m)
    return WAGMA_ENOMEM;
  for (int r = 0; r < nplan; r++) {
    const wagma_progress_t *pr = find_progress(j, names[r]);
    agent_rec_t *a = wg_snapshot_agent(s, names[r]);
    m[r].present = a && strcmp(a->info.address, addrs[r]) == 0 && pr &&
                   pr->epoch == j->status.epoch && pr->state == WAGMA_PROGRESS_RUNNING;
    if (m[r].present) {
      m[r].nunreachable = pr->nunreachable;
      m[r].unreachable = pr->unreachable;
    }
  }
  int rc = wg_reach_decide(m, nplan, REACH_GRACE_S, cut);
  free(m);
  return rc;
}

/* Quarantines agent a, member `rank` of job j's plan that the partition rule left out:
 * reason, the addresses it must reach again (those of the members kept, the ones cut off from
 * it first, at most WAGMA_API_UNREACHABLE_MAX), until --quarantine seconds on (300 when 0:
 * it cannot be kept out otherwise). Guarded as quarantine() is. 0 or an error. */
static int quarantine_unreachable(pass_t *p, agent_rec_t *a, const wg_job_record_t *j, int rank,
                                  char (*names)[WAGMA_API_NAME_MAX],
                                  char (*addrs)[WAGMA_API_ADDR_MAX], int nplan, const int *cut) {
  wg_coord_t *c = p->c;
  const wagma_progress_t *mine = find_progress(j, names[rank]);
  wagma_quarantine_t q = {.since = wg_wall(), .registration = a->create_rev};
  q.until = q.since + (c->quarantine_s > 0 ? c->quarantine_s : 300);
  snprintf(q.job, sizeof q.job, "%s", j->id);
  /* its links that are cut: the peers it reported, and those that reported it */
  int ncut = 0, *linked = calloc((size_t)nplan, sizeof *linked);
  if (!linked)
    return WAGMA_ENOMEM;
  for (int i = 0; mine && i < mine->nunreachable; i++)
    if (mine->unreachable[i].rank >= 0 && mine->unreachable[i].rank < nplan)
      linked[mine->unreachable[i].rank] = 1;
  for (int r = 0; r < nplan; r++) {
    const wagma_progress_t *pr = r == rank ? NULL : find_progress(j, names[r]);
    for (int i = 0; pr && pr->epoch == j->status.epoch && i < pr->nunreachable; i++)
      if (pr->unreachable[i].rank == rank)
        linked[r] = 1;
  }
  for (int pass = 1; pass >= 0; pass--) /* the cut links first, then the other members kept */
    for (int r = 0; r < nplan && q.nprobe < WAGMA_API_UNREACHABLE_MAX; r++)
      if (r != rank && !cut[r] && linked[r] == pass)
        snprintf(q.probe[q.nprobe++], sizeof q.probe[0], "%s", addrs[r]);
  for (int r = 0; r < nplan; r++)
    ncut += r != rank && linked[r];
  int n = snprintf(q.reason, sizeof q.reason,
                   "job %s: cut off on the data plane from %d of its %d peers (", j->id, ncut,
                   nplan - 1);
  for (int r = 0, first = 1; r < nplan && n > 0 && (size_t)n < sizeof q.reason; r++)
    if (linked[r] && r != rank) {
      n += snprintf(q.reason + n, sizeof q.reason - (size_t)n, "%s%s", first ? "" : ", ", names[r]);
      first = 0;
    }
  if (n > 0 && (size_t)n < sizeof q.reason)
    snprintf(q.reason + n, sizeof q.reason - (size_t)n, ")");
  free(linked);
  int e = put_quarantine(p, a, &q, "quarantine unreachable agent");
  if (e == 0)
    wg_logf(c->log, c->log_user, WAGMA_LOG_WARN,
            "agent %s quarantined until it reaches its peers again (at most %.0f s): %s", a->name,
            q.until - q.since, q.reason);
  return e;
}

/* The quarantine of an agent cut off from its peers ends when its registration says it reached
 * every address it had to probe (wagma_agent_info_t.reached = the record's since): the record
 * stays, with until and reachable set to now (the timeline says "reachable again"). */
static void end_unreachable_quarantine(pass_t *p, quarantine_rec_t *q, agent_rec_t *a) {
  char key[256], *json = NULL;
  wagma_quarantine_t nq = q->q;
  nq.until = nq.reachable = wg_wall();
  if (wagma_key_quarantine(&p->c->keys, q->agent, key, sizeof key) ||
      wagma_quarantine_to_json(&nq, &json))
    return;
  wagma_etcd_cmp_t cmps[2] = {
      fence(p),
      {.key = key, .target = WAGMA_ETCD_CMP_MOD, .result = WAGMA_ETCD_EQUAL, .number = q->mod}};
  wagma_etcd_op_t put = {
      .type = WAGMA_ETCD_OP_PUT, .key = key, .value = json, .value_len = strlen(json)};
  if (txn(p, cmps, 2, &put, 1, "end quarantine (reachable again)") == 0) {
    wg_logf(p->c->log, p->c->log_user, WAGMA_LOG_INFO,
            "agent %s reaches its peers again: its quarantine ends (job %s)", q->agent, nq.job);
    a->quarantined = 0;
  }
  free(json);
}

/* Quarantines the agents whose refusal of a job another agent ran (leader only; once per
 * refusal), and deletes the quarantine records that no longer apply. */
static void reconcile_quarantine(pass_t *p) {
  snapshot_t *s = p->s;
  double now = wg_wall();
  for (size_t i = 0; i < s->njobs && !p->abort && p->c->quarantine_s > 0; i++) {
    const wg_job_record_t *j = &s->jobs[i];
    for (int k = 0; k < j->nprogress; k++) {
      const wg_progress_entry_t *pe = &j->progress[k];
      agent_rec_t *a = wg_snapshot_agent(s, pe->agent);
      if (!a || a->quarantined || refusal(j, a) != pe || !ran_without(j, pe))
        continue;
      quarantine_rec_t *q = find_quarantine(s, a->name);
      if (q && q->q.registration == a->create_rev &&
          ((q->q.refusal == pe->mod && strcmp(q->q.job, j->id) == 0) || q->mod > pe->mod))
        continue; /* this refusal's quarantine is over, or a newer one (a cut) replaced it */
      quarantine(p, a, j->id, pe);
    }
  }
  for (size_t i = 0; i < s->nquarantines && !p->abort; i++) {
    quarantine_rec_t *q = &s->quarantines[i];
    agent_rec_t *a = wg_snapshot_agent(s, q->agent);
    char key[256];
    if (a && a->create_rev == q->q.registration && q->q.nprobe > 0 && q->q.reachable == 0 &&
        a->info.reached > 0 && a->info.reached == q->q.since) {
      end_unreachable_quarantine(p, q, a);
      continue;
    }
    if (q->q.registration && (a ? a->create_rev == q->q.registration : now < q->q.until))
      continue; /* the agent's current registration, or an agent away whose quarantine runs */
    if (wagma_key_quarantine(&p->c->keys, q->agent, key, sizeof key))
      continue;
    wagma_etcd_cmp_t cmps[2] = {
        fence(p),
        {.key = key, .target = WAGMA_ETCD_CMP_MOD, .result = WAGMA_ETCD_EQUAL, .number = q->mod}};
    wagma_etcd_op_t del = {.type = WAGMA_ETCD_OP_DELETE, .key = key};
    if (txn(p, cmps, 2, &del, 1, "drop quarantine record") == 0 && a)
      wg_logf(p->c->log, p->c->log_user, WAGMA_LOG_INFO,
              "agent %s registered again: its quarantine ends", q->agent);
  }
}

/* The job fails when agents refused it and none ran it: MAX_REFUSALS of them, or every
 * registered agent of its device (and program) (each refused it or is quarantined). 1 with
 * reason set. */
static int refused_by_all(snapshot_t *s, const wg_job_record_t *j, char *reason, size_t len) {
  int refusals = 0, servable = 0;
  for (int i = 0; i < j->nprogress; i++) {
    const wagma_progress_t *pr = &j->progress[i].progress;
    if (pr->state == WAGMA_PROGRESS_RUNNING || pr->state == WAGMA_PROGRESS_DONE)
      return 0; /* it ran */
    refusals += pr->state == WAGMA_PROGRESS_UNAVAILABLE;
  }
  if (refusals == 0)
    return 0;
  for (size_t i = 0; i < s->nagents; i++)
    servable += eligible(j, &s->agents[i]);
  if (refusals < MAX_REFUSALS && servable > 0)
    return 0;
  /* "3 agents cannot serve it and none ran it (a, b, c); a: <why>" */
  const wg_progress_entry_t *first = NULL;
  int n = snprintf(reason, len, "%d agent%s cannot serve it and none ran it (", refusals,
                   refusals > 1 ? "s" : "");
  for (int i = 0; i < j->nprogress && n > 0 && (size_t)n < len; i++) {
    const wg_progress_entry_t *pe = &j->progress[i];
    if (pe->progress.state != WAGMA_PROGRESS_UNAVAILABLE)
      continue;
    n += snprintf(reason + n, len - (size_t)n, "%s%s", first ? ", " : "", pe->agent);
    first = first ? first : pe;
  }
  if (n > 0 && (size_t)n < len && first &&
      snprintf(reason + n, len - (size_t)n, "); %s: %s", first->agent,
               first->progress.error[0] ? first->progress.error : "no detail") < 0)
    reason[n] = '\0';
  return 1;
}

static void reconcile_job(pass_t *p, wg_job_record_t *j) {
  snapshot_t *s = p->s;
  char(*names)[WAGMA_API_NAME_MAX] = NULL;
  char(*addrs)[WAGMA_API_ADDR_MAX] = NULL;
  int ncur = 0;
  agent_rec_t **next = NULL;
  int *joiner = NULL, *cut = NULL;
  char *plan_json = NULL, *record_json = NULL;
  const char **member_names = NULL;
  wg_plan_member_t *pm = NULL;
  char reason[WAGMA_API_REASON_MAX];
  uint8_t secret[WAGMA_API_SECRET_LEN];
  char secret_hex[2 * WAGMA_API_SECRET_LEN + 1];

  /* The members of the last plan decide completion even when the job is pending: they may
   * have finished while their agent keys were gone (an etcd outage longer than their lease
   * TTL at the job's end, their "done" written after they registered again). A pending job
   * has no live membership (ncur 0), even if an old plan exists. */
  int nplan = 0;
  if (plan_members(j, &names, &addrs, &nplan))
    return;
  int running = j->status.state == WAGMA_JOB_RUNNING;
  ncur = running ? nplan : 0;

  /* Completion and failure, from the members' progress. */
  if (refused_by_all(s, j, reason, sizeof reason)) {
    if (p->leader)
      finish_job(p, j, WAGMA_JOB_FAILED, reason);
    goto out;
  }
  int done = 0, gone = 0, done_alive = 0, finishing = 0;
  for (int r = 0; r < nplan; r++) {
    const wagma_progress_t *pr = find_progress(j, names[r]);
    agent_rec_t *a = wg_snapshot_agent(s, names[r]);
    int alive = a && strcmp(a->info.address, addrs[r]) == 0;
    /* (a pending job: only reports of its last plan's epoch) */
    if (pr && !running && pr->epoch < j->status.epoch)
      continue;
    if (pr && pr->state == WAGMA_PROGRESS_FAILED) {
      snprintf(reason, sizeof reason, "agent %s failed: %.160s", names[r],
               pr->error[0] ? pr->error : "no detail");
      if (p->leader)
        finish_job(p, j, WAGMA_JOB_FAILED, reason);
      goto out;
    }
    /* A live member is done when it says so: between its last iteration and its "done" it
     * averages the final model and evaluates it, and its final report carries the result
     * (status.summary). One that died after reaching the last iteration counts as done. */
    if (pr && (pr->state == WAGMA_PROGRESS_DONE ||
               (!alive && j->spec.iterations && pr->iteration >= j->spec.iterations))) {
      done++;
      done_alive += alive;
    } else if (!alive) {
      gone++;
    } else if (pr && j->spec.iterations && pr->iteration >= j->spec.iterations) {
      finishing++; /* at the last iteration: its final average and "done" are on their way */
    }
  }
  /* Every member is done, gone or finishing, and one is finishing: their final reports are
   * on their way. No plan is made at the last iteration meanwhile (a finishing member's
   * frozen agent loses its lease and counts as gone). */
  if (running && finishing > 0 && done + gone + finishing == nplan)
    goto out;
  /* Finished: every member of the plan reported the last iteration, or every one that did
   * not is gone (its agent key expired: it died before the end, its model with it) while one
   * that finished is still here. Those that finished hold the job's final model; planning
   * again would only put a joiner at the last iteration next to them (or alone, once they
   * left: "the job's model is lost"). When every key is gone (an etcd outage outlived the
   * leases), the final reports may still come: the wait below. */
  if (running && done_alive > 0 && gone > 0 && done + gone == nplan && j->spec.iterations &&
      wg_job_record_iteration(j) >= j->spec.iterations) {
    snprintf(reason, sizeof reason,
             "%d of %d members finished at iteration %llu (%d died before the end)", done, nplan,
             (unsigned long long)wg_job_record_iteration(j), gone);
    append_refusal(s, j, reason, sizeof reason);
    if (p->leader)
      finish_job(p, j, WAGMA_JOB_SUCCEEDED, reason);
    goto out;
  }
  if (nplan > 0 && done == nplan) {
    snprintf(reason, sizeof reason, "all %d members finished at iteration %llu", nplan,
             (unsigned long long)wg_job_record_iteration(j));
    append_refusal(s, j, reason, sizeof reason); /* who could not serve it, if anyone */
    if (p->leader)
      finish_job(p, j, WAGMA_JOB_SUCCEEDED, reason);
    goto out;
  }

  /* Members cut off from their peers on the data plane leave (quarantined first, so that
   * they do not come back as joiners at once). */
  if (running && nplan > 1) {
    cut = calloc((size_t)nplan, sizeof *cut);
    if (!cut)
      goto out;
    int ncut = cut_members(s, j, names, addrs, nplan, cut);
    static double last_split_log; /* (the scheduler thread's): at most one line a minute */
    if (ncut == WG_REACH_NO_MAJORITY && p->leader && wg_mono() - last_split_log > 60) {
      last_split_log = wg_mono();
      wg_logf(p->c->log, p->c->log_user, WAGMA_LOG_WARN,
              "job %s: its members cannot reach each other and no side is a majority: nobody "
              "is left out",
              j->id);
    }
    for (int r = 0; r < nplan && ncut > 0; r++) {
      agent_rec_t *a = cut[r] ? wg_snapshot_agent(s, names[r]) : NULL;
      if (a && !a->quarantined &&
          (!p->leader || quarantine_unreachable(p, a, j, r, names, addrs, nplan, cut) != 0))
        goto out; /* (a follower: the leader decides) */
    }
  }

  /* The next membership: survivors in rank order, cut to target, then joiners. */
  int target = j->spec.workers;
  next = calloc((size_t)target, sizeof *next);
  joiner = calloc((size_t)target, sizeof *joiner);
  if (!next || !joiner)
    goto out;
  int n = 0, survivors = 0, rejoining = 0;
  for (int r = 0; r < ncur && n < target; r++) {
    agent_rec_t *a = wg_snapshot_agent(s, names[r]);
    /* same registration address, it did not say it cannot serve the job, and its program did
     * not restart (a rejoiner leaves the survivors and comes back below, as a joiner) */
    if (a && strcmp(a->info.address, addrs[r]) == 0 && !refusal(j, a) && !(cut && cut[r])) {
      if (wants_rejoin(j, a)) {
        rejoining++;
        continue;
      }
      next[n++] = a;
      a->busy = 1;
    }
  }
  survivors = n;
  int nfree = 0;
  for (size_t i = 0; i < s->nagents; i++)
    nfree += !s->agents[i].busy && eligible(j, &s->agents[i]);
  /* Nobody survived, no checkpoint, and the epoch reached the job's last iteration: a fresh
   * plan would start there from the seed and report an untrained model as the result. The
   * members' final reports are on their way (an etcd outage at the job's end outlived their
   * leases; they register again, keep their assignments and the job) or lost: the job keeps
   * its plan and state (completed above when the reports come), up to FINAL_REPORT_WAIT_S
   * after the job's newest report, then fails. The newest of any epoch: an epoch planned at
   * the last iteration may have no report at all (its members were done with the one before
   * and lost their keys while setting it up), and counting from none failed such a job at
   * once (the soak's soak-72, its members' final reports still on their way). */
  uint64_t reached = wg_job_record_iteration(j);
  if (survivors == 0 && !j->has_checkpoint && j->spec.iterations && reached >= j->spec.iterations) {
    double newest = 0;
    for (int r = 0; r < j->nprogress; r++)
      if (j->progress[r].progress.time > newest)
        newest = j->progress[r].progress.time;
    if (wg_wall() - newest > FINAL_REPORT_WAIT_S) {
      snprintf(reason, sizeof reason,
               "its members left at the last iteration %llu without all reporting the final "
               "model, and no checkpoint holds it",
               (unsigned long long)reached);
      if (p->leader)
        finish_job(p, j, WAGMA_JOB_FAILED, reason);
      goto out;
    }
    snprintf(reason, sizeof reason,
             "its members left at the last iteration %llu; waiting for their final reports",
             (unsigned long long)reached);
    if (p->leader && strcmp(j->status.reason, reason) != 0) {
      wagma_job_status_t st = j->status; /* shallow: members shared, not freed here */
      snprintf(st.reason, sizeof st.reason, "%s", reason);
      st.iteration = reached;
      write_job(p, j, &st, NULL, NULL, NULL, "job waits for final reports");
    }
    goto out;
  }
  if (survivors == 0 && nfree < j->spec.min_workers) {
    /* Cannot start (or restart): stay or become pending. */
    /* Constant per job (no free count): pending jobs are not rewritten at every pass. */
    waiting_reason(s, j, reason, sizeof reason);
    append_refusal(s, j, reason, sizeof reason);
    if (p->leader && (j->status.state != WAGMA_JOB_PENDING || j->status.nmembers > 0 ||
                      strcmp(j->status.reason, reason) != 0)) {
      wagma_job_status_t st = j->status;
      st.members = NULL;
      st.nmembers = 0;
      st.state = WAGMA_JOB_PENDING;
      st.iteration = wg_job_record_iteration(j);
      snprintf(st.reason, sizeof st.reason, "%s", reason);
      write_job(p, j, &st, NULL, NULL, NULL, "job pending");
    }
    goto out;
  }
  for (size_t i = 0; i < s->nagents && n < target; i++) {
    agent_rec_t *a = &s->agents[i];
    if (a->busy || !eligible(j, a))
      continue;
    a->busy = 1;
    joiner[n] = survivors > 0;
    next[n++] = a;
  }
  int same = n == ncur && j->status.state == WAGMA_JOB_RUNNING && !rejoining;
  for (int r = 0; same && r < n; r++)
    same = strcmp(next[r]->name, names[r]) == 0 && strcmp(next[r]->info.address, addrs[r]) == 0;
  if (same)
    goto out;
  if (!p->leader)
    goto out;

  /* A new plan. */
  /* start_round: every member sets its iteration to it at the start of the epoch (round ==
   * iteration from there on, docs/agent.md). With survivors: the highest iteration an agent
   * reported in the current epoch (the members of the previous plan), never below the
   * previous start_round; reports of older epochs are stale (their iterations were counted
   * again). A fresh start (nobody survived) with a checkpoint recorded: the checkpoint's
   * iteration, since every member loads that file. Otherwise as with survivors (the first
   * plan of a job: 0). */
  uint64_t start_round = j->status.start_round;
  if (survivors == 0 && j->has_checkpoint) {
    start_round = j->checkpoint.iteration;
  } else {
    for (int r = 0; r < j->nprogress; r++) {
      const wagma_progress_t *pr = &j->progress[r].progress;
      if (pr->epoch >= j->status.epoch && pr->iteration > start_round)
        start_round = pr->iteration;
    }
  }
  pm = calloc((size_t)n, sizeof *pm);
  member_names = calloc((size_t)n, sizeof *member_names);
  agent_rec_t **joiners = calloc((size_t)n + 1, sizeof *joiners);
  if (!pm || !member_names || !joiners) {
    free(joiners);
    goto out;
  }
  int njoin = 0;
  for (int r = 0; r < n; r++) {
    pm[r] = (wg_plan_member_t){
        .name = next[r]->name, .address = next[r]->info.address, .joiner = joiner[r]};
    member_names[r] = next[r]->name;
    if (r >= survivors)
      joiners[njoin++] = next[r];
  }
  uint64_t epoch = j->status.epoch + 1;
  wg_plan_request_t req = {.epoch = epoch,
                           .start_round = start_round,
                           .group_size = j->spec.group_size,
                           .staleness_bound = j->spec.staleness_bound,
                           .global_sync = j->spec.global_sync,
                           .nmembers = n,
                           .members = pm};
  double secs = 0;
  int e = wg_planner_build(&req, &plan_json, &record_json, &secs);
  wg_metrics_plan_time(p->c->metrics, secs);
  if (e) {
    wg_logf(p->c->log, p->c->log_user, WAGMA_LOG_ERROR, "job %s: plan for %d members: %s", j->id, n,
            wagma_strerror(e));
    free(joiners);
    goto out;
  }
  /* The epoch's data-plane secret (docs/collective.md "Peer authentication"): only agents read
   * <prefix>/secrets/; it goes in the plan's Txn, so a member that reads the plan finds it. */
  if (RAND_bytes(secret, sizeof secret) != 1 ||
      wagma_secret_to_hex(secret, sizeof secret, secret_hex, sizeof secret_hex) != 0) {
    wg_logf(p->c->log, p->c->log_user, WAGMA_LOG_ERROR,
            "job %s: no random bytes for the secret of epoch %llu; not publishing the plan", j->id,
            (unsigned long long)epoch);
    free(joiners);
    goto out;
  }
  if (njoin && reserve(p, j->id, epoch, joiners, njoin) != 0) {
    free(joiners);
    goto out;
  }
  free(joiners);
  wagma_job_status_t st = j->status;
  st.members = NULL;
  st.nmembers = 0;
  if (wagma_job_status_set_members(&st, member_names, n))
    goto out;
  st.state = WAGMA_JOB_RUNNING;
  st.epoch = epoch;
  st.start_round = start_round;
  st.iteration = wg_job_record_iteration(j);
  if (st.iteration < start_round)
    st.iteration = start_round;
  if (epoch > 1)
    st.regroupings++;
  if (st.started == 0)
    st.started = wg_wall();
  if (n < target)
    snprintf(st.reason, sizeof st.reason, "running with %d of %d workers; waiting for agents", n,
             target);
  else
    st.reason[0] = '\0';
  append_refusal(s, j, st.reason, sizeof st.reason);
  e = write_job(p, j, &st, plan_json, record_json, secret_hex, "publish plan");
  if (e == 0) {
    wg_logf(p->c->log, p->c->log_user, WAGMA_LOG_INFO,
            "job %s: plan epoch %llu, %d members (%d joined, %d left), start_round %llu, "
            "planned in %.3f ms",
            j->id, (unsigned long long)epoch, n, njoin, ncur - survivors,
            (unsigned long long)start_round, secs * 1e3);
    if (epoch > 1)
      wg_metrics_regrouping(p->c->metrics);
    /* The snapshot now reflects the new membership for the cleanup below. */
    wagma_job_status_t old = j->status;
    j->status = st;
    wagma_job_status_free(&old);
  } else {
    wagma_job_status_free(&st);
  }
out:
  OPENSSL_cleanse(secret, sizeof secret);
  OPENSSL_cleanse(secret_hex, sizeof secret_hex);
  free(names);
  free(addrs);
  free(next);
  free(joiner);
  free(cut);
  free(plan_json);
  free(record_json);
  free(member_names);
  free(pm);
}

/* Deletes assignments whose job is gone or finished, or whose agent is not a member. */
static void cleanup_assignments(pass_t *p) {
  snapshot_t *s = p->s;
  wagma_etcd_cmp_t cmps[1 + CHUNK];
  wagma_etcd_op_t ops[CHUNK];
  char keys[CHUNK][256];
  int n = 0;
  for (size_t i = 0; i <= s->nassigns; i++) {
    if (i < s->nassigns) {
      assign_rec_t *a = &s->assigns[i];
      agent_rec_t *ag = wg_snapshot_agent(s, a->agent);
      if (ag && ag->touched)
        continue;
      wg_job_record_t *job = NULL;
      for (size_t k = 0; k < s->njobs && a->a.job[0]; k++)
        if (strcmp(s->jobs[k].id, a->a.job) == 0)
          job = &s->jobs[k];
      int stale =
          !job || wagma_job_state_terminal(job->status.state) || !wg_job_has_member(job, a->agent);
      if (!stale)
        continue;
      wagma_key_assignment(&p->c->keys, a->agent, keys[n], sizeof keys[n]);
      cmps[1 + n] = (wagma_etcd_cmp_t){.key = keys[n],
                                       .target = WAGMA_ETCD_CMP_MOD,
                                       .result = WAGMA_ETCD_EQUAL,
                                       .number = a->mod};
      ops[n] = (wagma_etcd_op_t){.type = WAGMA_ETCD_OP_DELETE, .key = keys[n]};
      n++;
    }
    if (n == CHUNK || (i == s->nassigns && n > 0)) {
      cmps[0] = fence(p);
      txn(p, cmps, (size_t)n + 1, ops, (size_t)n, "release agents");
      n = 0;
    }
  }
}

static int cmp_job_ptr_id(const void *a, const void *b) {
  return strcmp((*(const wg_job_record_t *const *)a)->id, (*(const wg_job_record_t *const *)b)->id);
}

/* Deletes the secrets no agent needs any more: of a job that is gone (purged) or finished, or
 * of an epoch other than the job's current and previous one (the plan's Txn deletes epoch - 2;
 * this catches anything older that it missed). Each delete is guarded by the key's mod
 * revision. */
static void cleanup_secrets(pass_t *p) {
  snapshot_t *s = p->s;
  wagma_etcd_cmp_t cmps[1 + CHUNK];
  wagma_etcd_op_t ops[CHUNK];
  char keys[CHUNK][256];
  int n = 0;
  if (s->nsecrets == 0)
    return;
  const wg_job_record_t **byid = calloc(s->njobs + 1, sizeof *byid);
  if (!byid)
    return;
  for (size_t i = 0; i < s->njobs; i++)
    byid[i] = &s->jobs[i];
  qsort(byid, s->njobs, sizeof *byid, cmp_job_ptr_id);
  for (size_t i = 0; i <= s->nsecrets && !p->abort; i++) {
    if (i < s->nsecrets) {
      const secret_rec_t *sr = &s->secrets[i];
      wg_job_record_t key_rec;
      const wg_job_record_t *kp = &key_rec, *const * found;
      snprintf(key_rec.id, sizeof key_rec.id, "%s", sr->job);
      found = bsearch(&kp, byid, s->njobs, sizeof *byid, cmp_job_ptr_id);
      const wg_job_record_t *job = found ? *found : NULL;
      /* (epoch + 2 == the job's epoch: the plan written in this pass deleted it already) */
      int stale = !job || wagma_job_state_terminal(job->status.state) ||
                  sr->epoch > job->status.epoch || sr->epoch + 2 < job->status.epoch;
      if (!stale || wagma_key_secret(&p->c->keys, sr->job, sr->epoch, keys[n], sizeof keys[n]) != 0)
        continue;
      cmps[1 + n] = (wagma_etcd_cmp_t){.key = keys[n],
                                       .target = WAGMA_ETCD_CMP_MOD,
                                       .result = WAGMA_ETCD_EQUAL,
                                       .number = sr->mod};
      ops[n] = (wagma_etcd_op_t){.type = WAGMA_ETCD_OP_DELETE, .key = keys[n]};
      n++;
    }
    if (n == CHUNK || (i == s->nsecrets && n > 0)) {
      cmps[0] = fence(p);
      txn(p, cmps, (size_t)n + 1, ops, (size_t)n, "drop stale secrets");
      n = 0;
    }
  }
  free(byid);
}

static void reconcile(wg_scheduler_t *sch) {
  wg_coord_t *c = sch->c;
  snapshot_t s;
  pass_t p = {.c = c, .s = &s, .stopping = &sch->stopping};
  int e = wg_snapshot_load(c, &s);
  if (e) {
    wg_logf(c->log, c->log_user, WAGMA_LOG_DEBUG, "reconcile: read: %s",
            wagma_etcd_errmsg(c->etcd));
    return;
  }
  p.leader = wg_election_is_leader(c->election, &p.lease);
  wagma_key_leader(&c->keys, p.leader_key, sizeof p.leader_key);
  /* Members of active jobs are busy. */
  for (size_t i = 0; i < s.njobs; i++) {
    wg_job_record_t *j = &s.jobs[i];
    if (j->status.state != WAGMA_JOB_RUNNING)
      continue;
    for (int r = 0; r < j->status.nmembers; r++) {
      agent_rec_t *a = wg_snapshot_agent(&s, j->status.members[r]);
      if (a)
        a->busy = 1;
    }
  }
  if (p.leader)
    reconcile_quarantine(&p);
  qsort(s.jobs, s.njobs, sizeof *s.jobs, cmp_created);
  for (size_t i = 0; i < s.njobs && !p.abort; i++) {
    wg_job_record_t *j = &s.jobs[i];
    if (wagma_job_state_terminal(j->status.state))
      continue;
    /* Let this job see its own members as available again. */
    for (int r = 0; r < j->status.nmembers && j->status.state == WAGMA_JOB_RUNNING; r++) {
      agent_rec_t *a = wg_snapshot_agent(&s, j->status.members[r]);
      if (a)
        a->busy = 0;
    }
    reconcile_job(&p, j);
    /* Whatever happened, the job's (new) members are not free for later jobs. */
    for (int r = 0; r < j->status.nmembers && j->status.state == WAGMA_JOB_RUNNING; r++) {
      agent_rec_t *a = wg_snapshot_agent(&s, j->status.members[r]);
      if (a)
        a->busy = 1;
    }
  }
  if (p.leader && !p.abort)
    cleanup_assignments(&p);
  wg_metrics_set_snapshot(c->metrics, wg_snapshot_render(&s));
  /* after the metrics: a finished job's gauges must not wait for its secrets' delete */
  if (p.leader && !p.abort)
    cleanup_secrets(&p);
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
