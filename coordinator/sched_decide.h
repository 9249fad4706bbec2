/* coordinator/sched_decide.h — the scheduler's decisions (docs/design.md §7.1): from one
 * snapshot of the key tree (snapshot.h, one etcd revision) and the wall clock, the writes a
 * reconcile pass wants: quarantine records put, ended or dropped; per job (oldest first) its
 * completion or failure, its pending or waiting status, or its next plan with the joiners'
 * assignments; then the stale assignments and secrets to delete. No etcd, no clock, no
 * randomness: the caller (scheduler.c) hands each write to a sink that applies it (or not: a
 * follower applies nothing) and says whether it was written, since what later steps of the
 * same pass decide depends on it (an agent quarantined in this pass is not assigned; a job
 * whose plan was written has its new members busy; a finished job's assignments are
 * released). Rules: the comment at the top of scheduler.c. */
#ifndef WAGMA_COORD_SCHED_DECIDE_H
#define WAGMA_COORD_SCHED_DECIDE_H

#include "coord.h"
#include "planner.h"
#include "snapshot.h"

/* A job that this many agents refused ("unavailable") and none ran fails: it is the job that
 * cannot run, not the agents (so a bad job does not quarantine the cluster). */
#define WG_SCHED_MAX_REFUSALS 3
/* How long a job whose members all left at its last iteration waits for their final reports
 * (after the newest report of its epoch) before it fails. */
#define WG_SCHED_FINAL_REPORT_WAIT_S 30.0
/* A report that a peer is unreachable counts once it says so for this long (reach.h): the
 * silence behind it lasted WG_TCP_SILENCE_S already; the rule itself waits until one side
 * is cut off from most (the first reports of a cut leave out nobody). */
#define WG_SCHED_REACH_GRACE_S 0.5
/* How long a member cut off from its peers stays quarantined at most when --quarantine is 0
 * (it cannot be kept out otherwise). */
#define WG_SCHED_CUT_QUARANTINE_S 300

typedef struct wg_sched_opts {
  double now;       /* the wall clock (unix s); the applier may advance it between writes */
  int quarantine_s; /* --quarantine: how long a refusal keeps an agent out; 0 = never */
} wg_sched_opts_t;

typedef enum wg_sched_write_kind {
  /* put <prefix>/quarantine/<agent> = q, guarded by the agent key's create revision
   * (agent->create_rev) and the record as read (old: its mod revision; NULL: no key) */
  WG_SCHED_QUARANTINE_REFUSAL, /* the agent refused a job another agent ran */
  WG_SCHED_QUARANTINE_CUT,     /* a member the partition rule left out (reach.h) */
  /* put old's record = q (until and reachable now), guarded by old's mod revision */
  WG_SCHED_QUARANTINE_END,
  /* delete old's record, guarded by its mod revision (agent NULL: the agent is gone) */
  WG_SCHED_QUARANTINE_DROP,
  /* not a write: job's members cannot reach each other and no side is a majority */
  WG_SCHED_NO_MAJORITY,
  /* put job's status = status, guarded by the mod revisions of its spec, status and plan */
  WG_SCHED_JOB_STATUS,
  /* the joiners' assignments {job, plan.epoch} (assign[], in chunks), then in one Txn guarded
   * as WG_SCHED_JOB_STATUS: the plan built from `plan`, its history entry (dropping the one
   * WAGMA_API_PLAN_HISTORY epochs older), the epoch's secret (dropping epoch - 2's) and
   * status */
  WG_SCHED_PLAN,
  /* delete the assignments assigns[] (job gone or finished, or agent not a member), each
   * guarded by its mod revision, in chunks */
  WG_SCHED_RELEASE,
  /* delete the secret keys secrets[], each guarded by its mod revision, in chunks */
  WG_SCHED_DROP_SECRETS,
} wg_sched_write_kind_t;

/* One joiner's assignment put and its guards. */
typedef struct wg_sched_assign {
  const char *agent;
  int64_t assign_mod;   /* mod revision of its assignment key as read; 0: none (version 0) */
  int64_t registration; /* create revision of its agent key */
} wg_sched_assign_t;

/* A write the pass wants. Pointers point into the snapshot or the decision's memory: valid
 * during the sink's apply only. */
typedef struct wg_sched_write {
  wg_sched_write_kind_t kind;
  const char *what; /* what the write does, for the log ("publish plan", "finish job", ...) */
  /* QUARANTINE_*: */
  const agent_rec_t *agent;
  const quarantine_rec_t *old;
  wagma_quarantine_t q;
  /* NO_MAJORITY, JOB_STATUS, PLAN: */
  const wg_job_record_t *job;
  /* JOB_STATUS, PLAN: the status to write; finish: the terminal state it reaches (0 = not a
   * finish; the applier logs "job <id> <state>: <reason>") */
  wagma_job_status_t status;
  int finish;
  /* PLAN: the plan to build (epoch, start_round, members), the joiners' assignments, how
   * many of the previous plan's members left (for the log), and, set by the applier, how many
   * joiners' assignments it sent (whether written or not) */
  wg_plan_request_t plan;
  int nassign;
  const wg_sched_assign_t *assign;
  int nleft;
  int nsent;
  /* RELEASE, DROP_SECRETS: */
  size_t nkeys;
  const assign_rec_t *const *assigns;
  const secret_rec_t *const *secrets;
} wg_sched_write_t;

/* Where the decisions go. apply: 0 when w was written, else an error (not written; a
 * follower writes nothing). stopped: 1 when no further write can be made in this pass (etcd
 * unavailable, the scheduler stopping): the pass stops deciding. */
typedef struct wg_sched_sink {
  int (*apply)(void *user, wg_sched_write_t *w);
  int (*stopped)(void *user);
  void *user;
} wg_sched_sink_t;

/* One pass over s: marks the members of running jobs busy; decides the quarantines
 * (refusals of a job another agent ran, records that no longer apply, cut members that reach
 * their peers again); then per job, oldest first, its completion, failure, cut members'
 * quarantine, and next membership; then the stale assignments. Each write goes to sink->apply
 * as it is decided. Ownership: s stays the caller's; the pass sorts s->jobs (oldest first)
 * and updates its bookkeeping from the writes' outcomes (agent_rec_t busy, touched,
 * quarantined; a job's status once its new status is written), which the metrics render. */
void wg_sched_pass(snapshot_t *s, const wg_sched_opts_t *o, const wg_sched_sink_t *sink);

/* The secrets no agent needs any more: of a job that is gone (purged) or finished, or of an
 * epoch other than the job's current and previous one. One WG_SCHED_DROP_SECRETS write when
 * any (run after wg_sched_pass: it reads the statuses the pass wrote). */
void wg_sched_drop_secrets(snapshot_t *s, const wg_sched_sink_t *sink);

#endif
