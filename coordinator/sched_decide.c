/* coordinator/sched_decide.c — the scheduler's decisions (sched_decide.h): from a snapshot of
 * the key tree and the wall clock, which quarantine records, job statuses, plans,
 * assignments and secrets a reconcile pass writes or deletes (the rules: the comment at the
 * top of scheduler.c). Pure: no etcd, no clock, no randomness; each write goes to the
 * caller's sink, whose answer (written or not) later decisions of the pass depend on. No
 * threads of its own: it runs on the scheduler thread. Cost per pass: O(n log n) in the
 * members and agents of a large job. */
#include "sched_decide.h"

#include <stdlib.h>
#include <string.h>

#include "reach.h"

typedef struct pass {
  snapshot_t *s;
  const wg_sched_opts_t *o;
  const wg_sched_sink_t *k;
} pass_t;

static int stopped(pass_t *p) {
  return p->k->stopped && p->k->stopped(p->k->user);
}

static int apply(pass_t *p, wg_sched_write_t *w) {
  return p->k->apply(p->k->user, w);
}

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

/* Ends job j in state with reason (a WG_SCHED_JOB_STATUS write); once written, j's state is
 * the terminal one (so the cleanup releases its agents in this pass). */
static void finish_job(pass_t *p, wg_job_record_t *j, wagma_job_state_t state, const char *reason) {
  wg_sched_write_t w = {
      .kind = WG_SCHED_JOB_STATUS, .what = "finish job", .job = j, .status = j->status};
  w.finish = (int)state;
  w.status.state = state;
  snprintf(w.status.reason, sizeof w.status.reason, "%s", reason);
  w.status.finished = p->o->now;
  w.status.iteration = wg_job_record_iteration(j);
  wg_job_record_summary(j, w.status.finished, &w.status.summary);
  if (apply(p, &w) == 0)
    j->status.state = state;
}

/* Writes st as job j's status (members shared with j: not freed here). */
static void write_status(pass_t *p, wg_job_record_t *j, const wagma_job_status_t *st,
                         const char *what) {
  wg_sched_write_t w = {.kind = WG_SCHED_JOB_STATUS, .what = what, .job = j, .status = *st};
  apply(p, &w);
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

/* Puts the quarantine record q of agent a (a WG_SCHED_QUARANTINE_* write of kind); once
 * written, a is quarantined. 0 or the sink's error. */
static int put_quarantine(pass_t *p, agent_rec_t *a, wg_sched_write_kind_t kind,
                          const wagma_quarantine_t *q, const char *what) {
  wg_sched_write_t w = {.kind = kind, .what = what, .agent = a, .q = *q};
  w.old = find_quarantine(p->s, a->name);
  int e = apply(p, &w);
  if (e == 0)
    a->quarantined = 1;
  return e;
}

/* Quarantines agent a for its refusal pe of job (until = now + quarantine_s). */
static void quarantine(pass_t *p, agent_rec_t *a, const char *job, const wg_progress_entry_t *pe) {
  const char *why = pe->progress.error[0] ? pe->progress.error : "no detail";
  wagma_quarantine_t q = {.since = p->o->now, .registration = a->create_rev, .refusal = pe->mod};
  q.until = q.since + p->o->quarantine_s;
  snprintf(q.job, sizeof q.job, "%s", job);
  if (snprintf(q.reason, sizeof q.reason, "job %s: %s", job, why) >= (int)sizeof q.reason)
    q.reason[sizeof q.reason - 1] = '\0'; /* truncated: fine */
  put_quarantine(p, a, WG_SCHED_QUARANTINE_REFUSAL, &q, "quarantine agent");
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
  int rc = wg_reach_decide(m, nplan, WG_SCHED_REACH_GRACE_S, cut);
  free(m);
  return rc;
}

/* Quarantines agent a, member `rank` of job j's plan that the partition rule left out:
 * reason, the addresses it must reach again (those of the members kept, the ones cut off from
 * it first, at most WAGMA_API_UNREACHABLE_MAX), until --quarantine seconds on
 * (WG_SCHED_CUT_QUARANTINE_S when 0: it cannot be kept out otherwise). 0 or an error. */
static int quarantine_unreachable(pass_t *p, agent_rec_t *a, const wg_job_record_t *j, int rank,
                                  char (*names)[WAGMA_API_NAME_MAX],
                                  char (*addrs)[WAGMA_API_ADDR_MAX], int nplan, const int *cut) {
  const wagma_progress_t *mine = find_progress(j, names[rank]);
  wagma_quarantine_t q = {.since = p->o->now, .registration = a->create_rev};
  q.until = q.since + (p->o->quarantine_s > 0 ? p->o->quarantine_s : WG_SCHED_CUT_QUARANTINE_S);
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
  return put_quarantine(p, a, WG_SCHED_QUARANTINE_CUT, &q, "quarantine unreachable agent");
}

/* The quarantine of an agent cut off from its peers ends when its registration says it reached
 * every address it had to probe (wagma_agent_info_t.reached = the record's since): the record
 * stays, with until and reachable set to now (the timeline says "reachable again"). */
static void end_unreachable_quarantine(pass_t *p, quarantine_rec_t *q, agent_rec_t *a) {
  wg_sched_write_t w = {.kind = WG_SCHED_QUARANTINE_END,
                        .what = "end quarantine (reachable again)",
                        .agent = a,
                        .old = q,
                        .q = q->q};
  w.q.until = w.q.reachable = p->o->now;
  if (apply(p, &w) == 0)
    a->quarantined = 0;
}

/* Quarantines the agents whose refusal of a job another agent ran (once per refusal), and
 * deletes the quarantine records that no longer apply. */
static void decide_quarantines(pass_t *p) {
  snapshot_t *s = p->s;
  double now = p->o->now;
  for (size_t i = 0; i < s->njobs && !stopped(p) && p->o->quarantine_s > 0; i++) {
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
  for (size_t i = 0; i < s->nquarantines && !stopped(p); i++) {
    quarantine_rec_t *q = &s->quarantines[i];
    agent_rec_t *a = wg_snapshot_agent(s, q->agent);
    if (a && a->create_rev == q->q.registration && q->q.nprobe > 0 && q->q.reachable == 0 &&
        a->info.reached > 0 && a->info.reached == q->q.since) {
      end_unreachable_quarantine(p, q, a);
      continue;
    }
    if (q->q.registration && (a ? a->create_rev == q->q.registration : now < q->q.until))
      continue; /* the agent's current registration, or an agent away whose quarantine runs */
    wg_sched_write_t w = {
        .kind = WG_SCHED_QUARANTINE_DROP, .what = "drop quarantine record", .agent = a, .old = q};
    apply(p, &w);
  }
}

/* The job fails when agents refused it and none ran it: WG_SCHED_MAX_REFUSALS of them, or
 * every registered agent of its device (and program) (each refused it or is quarantined). 1
 * with reason set. */
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
  if (refusals < WG_SCHED_MAX_REFUSALS && servable > 0)
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

/* ---- per job ------------------------------------------------------------------------------- */

/* Job j's next plan (n members next[] in rank order, joiner[] marked, the first `survivors`
 * of them kept from the ncur members of the current plan): epoch + 1, its start_round, the
 * new members' assignments, and the status; once written, j's status is the new one. */
static void publish_plan(pass_t *p, wg_job_record_t *j, agent_rec_t **next, const int *joiner,
                         int n, int survivors, int ncur, int target) {
  snapshot_t *s = p->s;
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
  wg_plan_member_t *pm = calloc((size_t)n, sizeof *pm);
  const char **member_names = calloc((size_t)n, sizeof *member_names);
  wg_sched_assign_t *assign = calloc((size_t)n + 1, sizeof *assign);
  agent_rec_t **joiners = calloc((size_t)n + 1, sizeof *joiners);
  if (!pm || !member_names || !assign || !joiners)
    goto out;
  int njoin = 0;
  for (int r = 0; r < n; r++) {
    pm[r] = (wg_plan_member_t){
        .name = next[r]->name, .address = next[r]->info.address, .joiner = joiner[r]};
    member_names[r] = next[r]->name;
    if (r >= survivors) {
      assign_rec_t *old = wg_snapshot_assign(s, next[r]->name);
      assign[njoin] = (wg_sched_assign_t){.agent = next[r]->name,
                                          .assign_mod = old ? old->mod : 0,
                                          .registration = next[r]->create_rev};
      joiners[njoin++] = next[r];
    }
  }
  uint64_t epoch = j->status.epoch + 1;
  wg_sched_write_t w = {.kind = WG_SCHED_PLAN,
                        .what = "publish plan",
                        .job = j,
                        .plan = {.epoch = epoch,
                                 .start_round = start_round,
                                 .group_size = j->spec.group_size,
                                 .staleness_bound = j->spec.staleness_bound,
                                 .global_sync = j->spec.global_sync,
                                 .nmembers = n,
                                 .members = pm},
                        .nassign = njoin,
                        .assign = assign,
                        .nleft = ncur - survivors};
  wagma_job_status_t *st = &w.status;
  *st = j->status;
  st->members = NULL;
  st->nmembers = 0;
  if (wagma_job_status_set_members(st, member_names, n))
    goto out;
  st->state = WAGMA_JOB_RUNNING;
  st->epoch = epoch;
  st->start_round = start_round;
  st->iteration = wg_job_record_iteration(j);
  if (st->iteration < start_round)
    st->iteration = start_round;
  if (epoch > 1)
    st->regroupings++;
  if (st->started == 0)
    st->started = p->o->now;
  if (n < target)
    snprintf(st->reason, sizeof st->reason, "running with %d of %d workers; waiting for agents", n,
             target);
  else
    st->reason[0] = '\0';
  append_refusal(s, j, st->reason, sizeof st->reason);
  int e = apply(p, &w);
  for (int k = 0; k < w.nsent && k < njoin; k++)
    joiners[k]->touched = 1;
  if (e == 0) {
    /* The snapshot now reflects the new membership for the cleanup below. */
    wagma_job_status_t old = j->status;
    j->status = *st;
    wagma_job_status_free(&old);
  } else {
    wagma_job_status_free(st);
  }
out:
  free(pm);
  free(member_names);
  free(assign);
  free(joiners);
}

/* Completion and failure of job j from the progress of its last plan's members (nplan, names
 * and addresses in rank order; a pending job: only reports of that plan's epoch): refused by
 * too many agents and run by none, or a member failed -> failed; every member done, or done
 * and the others died before the end -> succeeded. 1 when the job's pass ends here (it ended,
 * or a member at the last iteration is finishing: no plan meanwhile), 0 to go on. */
static int decide_completion(pass_t *p, wg_job_record_t *j, char (*names)[WAGMA_API_NAME_MAX],
                             char (*addrs)[WAGMA_API_ADDR_MAX], int nplan, int running) {
  snapshot_t *s = p->s;
  char reason[WAGMA_API_REASON_MAX];
  if (refused_by_all(s, j, reason, sizeof reason)) {
    finish_job(p, j, WAGMA_JOB_FAILED, reason);
    return 1;
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
      finish_job(p, j, WAGMA_JOB_FAILED, reason);
      return 1;
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
    return 1;
  /* Finished: every member of the plan reported the last iteration, or every one that did
   * not is gone (its agent key expired: it died before the end, its model with it) while one
   * that finished is still here. Those that finished hold the job's final model; planning
   * again would only put a joiner at the last iteration next to them (or alone, once they
   * left: "the job's model is lost"). When every key is gone (an etcd outage outlived the
   * leases), the final reports may still come: decide_final_wait. */
  if (running && done_alive > 0 && gone > 0 && done + gone == nplan && j->spec.iterations &&
      wg_job_record_iteration(j) >= j->spec.iterations) {
    snprintf(reason, sizeof reason,
             "%d of %d members finished at iteration %llu (%d died before the end)", done, nplan,
             (unsigned long long)wg_job_record_iteration(j), gone);
    append_refusal(s, j, reason, sizeof reason);
    finish_job(p, j, WAGMA_JOB_SUCCEEDED, reason);
    return 1;
  }
  if (nplan > 0 && done == nplan) {
    snprintf(reason, sizeof reason, "all %d members finished at iteration %llu", nplan,
             (unsigned long long)wg_job_record_iteration(j));
    append_refusal(s, j, reason, sizeof reason); /* who could not serve it, if anyone */
    finish_job(p, j, WAGMA_JOB_SUCCEEDED, reason);
    return 1;
  }
  return 0;
}

/* Members of running job j (nplan > 1 in its plan) cut off from their peers on the data plane
 * leave: the partition rule (reach.c) marks them in cut[] (nplan entries), and each is
 * quarantined (unless it is already) before a plan without it, so that it does not come back
 * as a joiner at once. 0 to go on, else a quarantine was not written (a follower: the leader
 * decides): no plan in this pass. */
static int decide_cut(pass_t *p, wg_job_record_t *j, char (*names)[WAGMA_API_NAME_MAX],
                      char (*addrs)[WAGMA_API_ADDR_MAX], int nplan, int *cut) {
  snapshot_t *s = p->s;
  int ncut = cut_members(s, j, names, addrs, nplan, cut);
  if (ncut == WG_REACH_NO_MAJORITY) {
    wg_sched_write_t w = {.kind = WG_SCHED_NO_MAJORITY, .what = "no majority", .job = j};
    apply(p, &w);
  }
  for (int r = 0; r < nplan && ncut > 0; r++) {
    agent_rec_t *a = cut[r] ? wg_snapshot_agent(s, names[r]) : NULL;
    if (a && !a->quarantined && quarantine_unreachable(p, a, j, r, names, addrs, nplan, cut) != 0)
      return 1;
  }
  return 0;
}

/* Nobody survived job j's plan (no survivors), it has no checkpoint, and the epoch reached
 * the job's last iteration: a fresh plan would start there from the seed and report an
 * untrained model as the result. The members' final reports are on their way (an etcd outage
 * at the job's end outlived their leases; they register again, keep their assignments and the
 * job) or lost: the job keeps its plan and state (completed above when the reports come), up
 * to WG_SCHED_FINAL_REPORT_WAIT_S after the job's newest report, then fails. The newest of
 * any epoch: an epoch planned at the last iteration may have no report at all (its members
 * were done with the one before and lost their keys while setting it up), and counting from
 * none failed such a job at once (the soak's soak-72, its members' final reports still on
 * their way). 1 when so (the job waits, or failed), 0 otherwise. */
static int decide_final_wait(pass_t *p, wg_job_record_t *j) {
  char reason[WAGMA_API_REASON_MAX];
  uint64_t reached = wg_job_record_iteration(j);
  if (j->has_checkpoint || !j->spec.iterations || reached < j->spec.iterations)
    return 0;
  double newest = 0;
  for (int r = 0; r < j->nprogress; r++)
    if (j->progress[r].progress.time > newest)
      newest = j->progress[r].progress.time;
  if (p->o->now - newest > WG_SCHED_FINAL_REPORT_WAIT_S) {
    snprintf(reason, sizeof reason,
             "its members left at the last iteration %llu without all reporting the final "
             "model, and no checkpoint holds it",
             (unsigned long long)reached);
    finish_job(p, j, WAGMA_JOB_FAILED, reason);
    return 1;
  }
  snprintf(reason, sizeof reason,
           "its members left at the last iteration %llu; waiting for their final reports",
           (unsigned long long)reached);
  if (strcmp(j->status.reason, reason) != 0) {
    wagma_job_status_t st = j->status; /* shallow: members shared, not freed here */
    snprintf(st.reason, sizeof st.reason, "%s", reason);
    st.iteration = reached;
    write_status(p, j, &st, "job waits for final reports");
  }
  return 1;
}

/* Job j cannot start (or restart) for want of free agents: it stays or becomes pending, its
 * reason constant per situation (no free count), so that pending jobs are not rewritten at
 * every pass. */
static void decide_pending(pass_t *p, wg_job_record_t *j) {
  char reason[WAGMA_API_REASON_MAX];
  waiting_reason(p->s, j, reason, sizeof reason);
  append_refusal(p->s, j, reason, sizeof reason);
  if (j->status.state != WAGMA_JOB_PENDING || j->status.nmembers > 0 ||
      strcmp(j->status.reason, reason) != 0) {
    wagma_job_status_t st = j->status;
    st.members = NULL;
    st.nmembers = 0;
    st.state = WAGMA_JOB_PENDING;
    st.iteration = wg_job_record_iteration(j);
    snprintf(st.reason, sizeof st.reason, "%s", reason);
    write_status(p, j, &st, "job pending");
  }
}

/* Decides job j (not terminal; its own members are not busy): completion or failure, its cut
 * members' quarantine, then its next membership (marking the agents it keeps or takes busy),
 * and its plan, pending or waiting status when that changes. */
static void decide_job(pass_t *p, wg_job_record_t *j) {
  snapshot_t *s = p->s;
  char(*names)[WAGMA_API_NAME_MAX] = NULL;
  char(*addrs)[WAGMA_API_ADDR_MAX] = NULL;
  agent_rec_t **next = NULL;
  int *joiner = NULL, *cut = NULL;

  /* The members of the last plan decide completion even when the job is pending: they may
   * have finished while their agent keys were gone (an etcd outage longer than their lease
   * TTL at the job's end, their "done" written after they registered again). A pending job
   * has no live membership (ncur 0), even if an old plan exists. */
  int nplan = 0;
  if (plan_members(j, &names, &addrs, &nplan))
    return;
  int running = j->status.state == WAGMA_JOB_RUNNING;
  int ncur = running ? nplan : 0;
  if (decide_completion(p, j, names, addrs, nplan, running))
    goto out;
  if (running && nplan > 1) {
    cut = calloc((size_t)nplan, sizeof *cut);
    if (!cut || decide_cut(p, j, names, addrs, nplan, cut))
      goto out;
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
  if (survivors == 0 && decide_final_wait(p, j))
    goto out;
  if (survivors == 0 && nfree < j->spec.min_workers) {
    decide_pending(p, j);
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
  if (!same)
    publish_plan(p, j, next, joiner, n, survivors, ncur, target);
out:
  free(names);
  free(addrs);
  free(next);
  free(joiner);
  free(cut);
}

/* ---- the pass ------------------------------------------------------------------------------ */

/* The assignments whose job is gone or finished, or whose agent is not a member (agents whose
 * assignment this pass wrote excepted). */
static void decide_release(pass_t *p) {
  snapshot_t *s = p->s;
  const assign_rec_t **stale = calloc(s->nassigns + 1, sizeof *stale);
  size_t n = 0;
  if (!stale)
    return;
  for (size_t i = 0; i < s->nassigns; i++) {
    assign_rec_t *a = &s->assigns[i];
    agent_rec_t *ag = wg_snapshot_agent(s, a->agent);
    if (ag && ag->touched)
      continue;
    wg_job_record_t *job = NULL;
    for (size_t k = 0; k < s->njobs && a->a.job[0]; k++)
      if (strcmp(s->jobs[k].id, a->a.job) == 0)
        job = &s->jobs[k];
    if (!job || wagma_job_state_terminal(job->status.state) || !wg_job_has_member(job, a->agent))
      stale[n++] = a;
  }
  if (n > 0) {
    wg_sched_write_t w = {
        .kind = WG_SCHED_RELEASE, .what = "release agents", .nkeys = n, .assigns = stale};
    apply(p, &w);
  }
  free(stale);
}

/* Marks the agents of running job j's members busy (or not). */
static void mark_members(snapshot_t *s, const wg_job_record_t *j, int busy) {
  for (int r = 0; r < j->status.nmembers && j->status.state == WAGMA_JOB_RUNNING; r++) {
    agent_rec_t *a = wg_snapshot_agent(s, j->status.members[r]);
    if (a)
      a->busy = busy;
  }
}

void wg_sched_pass(snapshot_t *s, const wg_sched_opts_t *o, const wg_sched_sink_t *sink) {
  pass_t p = {.s = s, .o = o, .k = sink};
  /* Members of active jobs are busy. */
  for (size_t i = 0; i < s->njobs; i++)
    mark_members(s, &s->jobs[i], 1);
  decide_quarantines(&p);
  qsort(s->jobs, s->njobs, sizeof *s->jobs, cmp_created);
  for (size_t i = 0; i < s->njobs && !stopped(&p); i++) {
    wg_job_record_t *j = &s->jobs[i];
    if (wagma_job_state_terminal(j->status.state))
      continue;
    mark_members(s, j, 0); /* let this job see its own members as available again */
    decide_job(&p, j);
    mark_members(s, j, 1); /* whatever happened, its (new) members are not free for later jobs */
  }
  if (!stopped(&p))
    decide_release(&p);
}

static int cmp_job_ptr_id(const void *a, const void *b) {
  return strcmp((*(const wg_job_record_t *const *)a)->id, (*(const wg_job_record_t *const *)b)->id);
}

void wg_sched_drop_secrets(snapshot_t *s, const wg_sched_sink_t *sink) {
  pass_t p = {.s = s, .k = sink};
  if (s->nsecrets == 0 || stopped(&p))
    return;
  const wg_job_record_t **byid = calloc(s->njobs + 1, sizeof *byid);
  const secret_rec_t **stale = calloc(s->nsecrets, sizeof *stale);
  size_t n = 0;
  if (!byid || !stale)
    goto out;
  for (size_t i = 0; i < s->njobs; i++)
    byid[i] = &s->jobs[i];
  qsort(byid, s->njobs, sizeof *byid, cmp_job_ptr_id);
  for (size_t i = 0; i < s->nsecrets; i++) {
    const secret_rec_t *sr = &s->secrets[i];
    wg_job_record_t key_rec;
    const wg_job_record_t *kp = &key_rec, *const * found;
    snprintf(key_rec.id, sizeof key_rec.id, "%s", sr->job);
    found = bsearch(&kp, byid, s->njobs, sizeof *byid, cmp_job_ptr_id);
    const wg_job_record_t *job = found ? *found : NULL;
    /* (epoch + 2 == the job's epoch: the plan written in this pass deleted it already) */
    if (!job || wagma_job_state_terminal(job->status.state) || sr->epoch > job->status.epoch ||
        sr->epoch + 2 < job->status.epoch)
      stale[n++] = sr;
  }
  if (n > 0) {
    wg_sched_write_t w = {
        .kind = WG_SCHED_DROP_SECRETS, .what = "drop stale secrets", .nkeys = n, .secrets = stale};
    apply(&p, &w);
  }
out:
  free(byid);
  free(stale);
}
