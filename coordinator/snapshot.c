/* coordinator/snapshot.c — the scheduler's view of the cluster: one Range over <prefix>/
 * (a consistent snapshot at one revision) split into agents, assignments, job records,
 * quarantine records and the keys of the data-plane secrets (values wiped, never kept), plus
 * the rendering of the cluster gauges for /metrics. No threads, no state. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "snapshot.h"
#include "wagma/log_internal.h"

void wg_snapshot_free(snapshot_t *s) {
  for (size_t i = 0; i < s->njobs; i++)
    wg_job_record_free(&s->jobs[i]);
  free(s->jobs);
  free(s->agents);
  free(s->assigns);
  free(s->quarantines);
  free(s->secrets);
  memset(s, 0, sizeof *s);
}

int wg_snapshot_load(wg_coord_t *c, snapshot_t *s) {
  char root[256];
  wagma_etcd_range_t range = {0};
  wagma_etcd_range_options_t opt = {.prefix = 1};
  int e;
  memset(s, 0, sizeof *s);
  wagma_key_root(&c->keys, root, sizeof root);
  if ((e = wagma_etcd_range(c->etcd, root, &opt, &range)))
    return e;
  s->revision = range.revision;
  /* Sized by kind: an agent record (its programs) and a job record (its program's arguments)
   * are several KiB each, too many to allocate one per key of a large cluster's tree. A job's
   * keys are read into the slot after the last kept job, kept when it has a spec: at most
   * one slot per spec key, plus one. */
  size_t nkind[64] = {0}; /* by wagma_key_kind_t */
  for (size_t k = 0; k < range.n; k++) {
    wagma_key_kind_t kind =
        wagma_key_parse(&c->keys, range.kvs[k].key, range.kvs[k].key_len, NULL, NULL);
    if ((int)kind >= 0 && (int)kind < 64)
      nkind[kind]++;
  }
  s->agents = calloc(nkind[WAGMA_KEY_AGENT] + 1, sizeof *s->agents);
  s->assigns = calloc(nkind[WAGMA_KEY_ASSIGNMENT] + 1, sizeof *s->assigns);
  s->jobs = calloc(nkind[WAGMA_KEY_JOB_SPEC] + 1, sizeof *s->jobs);
  s->quarantines = calloc(nkind[WAGMA_KEY_QUARANTINE] + 1, sizeof *s->quarantines);
  s->secrets = calloc(nkind[WAGMA_KEY_SECRET] + 1, sizeof *s->secrets);
  if (!s->agents || !s->assigns || !s->jobs || !s->quarantines || !s->secrets) {
    e = WAGMA_ENOMEM;
    goto out;
  }
  size_t i = 0;
  while (i < range.n) {
    const wagma_etcd_kv_t *kv = &range.kvs[i];
    char job[WAGMA_API_NAME_MAX] = "", agent[WAGMA_API_NAME_MAX] = "";
    wagma_api_error_t err;
    wagma_key_kind_t kind = wagma_key_parse(&c->keys, kv->key, kv->key_len, job, agent);
    if (kind == WAGMA_KEY_AGENT) {
      agent_rec_t *a = &s->agents[s->nagents];
      if (wagma_agent_info_from_json(kv->value, kv->value_len, &a->info, &err) == 0) {
        snprintf(a->name, sizeof a->name, "%s", agent);
        a->create_rev = kv->create_revision;
        s->nagents++;
      } else {
        wg_logf(c->log, c->log_user, WAGMA_LOG_DEBUG, "%s: bad registration (%s: %s)", kv->key,
                err.field, err.message);
      }
      i++;
    } else if (kind == WAGMA_KEY_ASSIGNMENT) {
      assign_rec_t *a = &s->assigns[s->nassigns];
      if (wagma_assignment_from_json(kv->value, kv->value_len, &a->a, &err) != 0)
        memset(&a->a, 0, sizeof a->a); /* undecodable: treated as stale, deleted */
      snprintf(a->agent, sizeof a->agent, "%s", agent);
      a->mod = kv->mod_revision;
      s->nassigns++;
      i++;
    } else if (kind == WAGMA_KEY_QUARANTINE) {
      quarantine_rec_t *q = &s->quarantines[s->nquarantines++];
      if (wagma_quarantine_from_json(kv->value, kv->value_len, &q->q, &err) != 0)
        memset(&q->q, 0, sizeof q->q); /* undecodable: stale, deleted */
      snprintf(q->agent, sizeof q->agent, "%s", agent);
      q->mod = kv->mod_revision;
      i++;
    } else if (kind == WAGMA_KEY_SECRET) {
      secret_rec_t *sr = &s->secrets[s->nsecrets];
      if (wagma_key_secret_epoch(kv->key, kv->key_len, &sr->epoch) == 0) {
        snprintf(sr->job, sizeof sr->job, "%s", job);
        sr->mod = kv->mod_revision;
        s->nsecrets++;
      }
      OPENSSL_cleanse(range.kvs[i].value, range.kvs[i].value_len);
      i++;
    } else if (job[0]) {
      /* the job's keys: those under <prefix>/jobs/<job>/ (not, say, its secrets) */
      char jprefix[256];
      size_t jl = 0;
      if (wagma_key_job_prefix(&c->keys, job, jprefix, sizeof jprefix) == 0)
        jl = strlen(jprefix);
      size_t j = i + 1;
      while (j < range.n) {
        char other[WAGMA_API_NAME_MAX] = "";
        wagma_key_parse(&c->keys, range.kvs[j].key, range.kvs[j].key_len, other, NULL);
        if (strcmp(other, job) != 0 || range.kvs[j].key_len < jl ||
            memcmp(range.kvs[j].key, jprefix, jl) != 0)
          break;
        j++;
      }
      if ((e = wg_job_record_from_kvs(c, job, range.kvs + i, j - i, &s->jobs[s->njobs])))
        goto out;
      if (s->jobs[s->njobs].has_spec && s->jobs[s->njobs].has_status)
        s->njobs++;
      else
        wg_job_record_free(&s->jobs[s->njobs]);
      i = j;
    } else {
      i++;
    }
  }
  double now = wg_wall();
  for (size_t k = 0; k < s->nquarantines; k++) {
    agent_rec_t *a = wg_snapshot_agent(s, s->quarantines[k].agent);
    if (a && s->quarantines[k].q.registration == a->create_rev && now < s->quarantines[k].q.until)
      a->quarantined = 1;
  }
out:
  wagma_etcd_range_free(&range);
  if (e)
    wg_snapshot_free(s);
  return e;
}

agent_rec_t *wg_snapshot_agent(snapshot_t *s, const char *name) {
  size_t lo = 0, hi = s->nagents;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    int d = strcmp(s->agents[mid].name, name);
    if (d == 0)
      return &s->agents[mid];
    if (d < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return NULL;
}

assign_rec_t *wg_snapshot_assign(snapshot_t *s, const char *name) {
  size_t lo = 0, hi = s->nassigns;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    int d = strcmp(s->assigns[mid].agent, name);
    if (d == 0)
      return &s->assigns[mid];
    if (d < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return NULL;
}

int wg_job_has_member(const wg_job_record_t *j, const char *agent) {
  for (int i = 0; i < j->status.nmembers; i++)
    if (strcmp(j->status.members[i], agent) == 0)
      return 1;
  return 0;
}

/* Renders the cluster view for /metrics. Ownership: the caller frees. */
char *wg_snapshot_render(const snapshot_t *s) {
  /* Per job: 5 lines of at most ~50 bytes of text + the name + a 20-digit number; per
   * member reporting unreachable peers one line with two names; 256 for that metric's HELP. */
  size_t cap = 1024 + 256 + s->njobs * 5 * (64 + WAGMA_API_NAME_MAX);
  for (size_t i = 0; i < s->njobs; i++)
    for (int k = 0; k < s->jobs[i].nprogress; k++)
      cap +=
          s->jobs[i].progress[k].progress.unreachable_total > 0 ? 64 + 2 * WAGMA_API_NAME_MAX : 0;
  char *b = malloc(cap);
  size_t len = 0;
  int counts[5] = {0};
  size_t busy = 0, quarantined = 0;
  if (!b)
    return NULL;
  for (size_t i = 0; i < s->njobs; i++)
    if ((int)s->jobs[i].status.state >= 0 && s->jobs[i].status.state <= WAGMA_JOB_STOPPED)
      counts[s->jobs[i].status.state]++;
  for (size_t i = 0; i < s->nagents; i++) {
    busy += s->agents[i].busy != 0;
    quarantined += s->agents[i].quarantined != 0;
  }
#define OUT(...)                                                                                   \
  do {                                                                                             \
    int w_ = snprintf(b + len, cap - len, __VA_ARGS__);                                            \
    if (w_ > 0 && (size_t)w_ < cap - len)                                                          \
      len += (size_t)w_;                                                                           \
    else                                                                                           \
      b[len] = '\0'; /* drop a truncated line whole */                                             \
  } while (0)
  OUT("# HELP wagma_jobs Jobs by state\n# TYPE wagma_jobs gauge\n");
  for (int st = 0; st <= WAGMA_JOB_STOPPED; st++)
    OUT("wagma_jobs{state=\"%s\"} %d\n", wagma_job_state_name(st), counts[st]);
  OUT("# HELP wagma_agents Registered agents\n# TYPE wagma_agents gauge\nwagma_agents %zu\n",
      s->nagents);
  OUT("# HELP wagma_agents_free Agents not in an active job\n# TYPE wagma_agents_free gauge\n"
      "wagma_agents_free %zu\n",
      s->nagents - busy);
  OUT("# HELP wagma_agents_quarantined Agents the scheduler does not assign (quarantined)\n"
      "# TYPE wagma_agents_quarantined gauge\nwagma_agents_quarantined %zu\n",
      quarantined);
  OUT("# HELP wagma_plan_epoch Current plan epoch per job\n# TYPE wagma_plan_epoch gauge\n");
  for (size_t i = 0; i < s->njobs; i++)
    OUT("wagma_plan_epoch{job=\"%s\"} %llu\n", s->jobs[i].id,
        (unsigned long long)s->jobs[i].status.epoch);
  OUT("# HELP wagma_job_regroupings Plans after the first per job\n"
      "# TYPE wagma_job_regroupings gauge\n");
  for (size_t i = 0; i < s->njobs; i++)
    OUT("wagma_job_regroupings{job=\"%s\"} %llu\n", s->jobs[i].id,
        (unsigned long long)s->jobs[i].status.regroupings);
  OUT("# HELP wagma_job_iteration Highest iteration reported per job\n"
      "# TYPE wagma_job_iteration gauge\n");
  for (size_t i = 0; i < s->njobs; i++)
    OUT("wagma_job_iteration{job=\"%s\"} %llu\n", s->jobs[i].id,
        (unsigned long long)wg_job_record_iteration(&s->jobs[i]));
  OUT("# HELP wagma_job_loss Mean training loss reported by the members\n"
      "# TYPE wagma_job_loss gauge\n");
  for (size_t i = 0; i < s->njobs; i++) {
    const wg_job_record_t *j = &s->jobs[i];
    double sum = 0;
    int cnt = 0;
    for (int k = 0; k < j->nprogress; k++)
      if (isfinite(j->progress[k].progress.loss) && wg_job_has_member(j, j->progress[k].agent)) {
        sum += j->progress[k].progress.loss;
        cnt++;
      }
    if (cnt)
      OUT("wagma_job_loss{job=\"%s\"} %.6g\n", j->id, sum / cnt);
  }
  OUT("# HELP wagma_job_staleness Largest staleness reported by the members: rounds behind "
      "(wagma), "
      "updates applied between a pull and its push (asgd, dc-asgd)\n"
      "# TYPE wagma_job_staleness gauge\n");
  for (size_t i = 0; i < s->njobs; i++) {
    const wg_job_record_t *j = &s->jobs[i];
    uint64_t most = 0;
    int cnt = 0;
    for (int k = 0; k < j->nprogress; k++)
      if (wg_job_has_member(j, j->progress[k].agent)) {
        if (j->progress[k].progress.staleness > most)
          most = j->progress[k].progress.staleness;
        cnt++;
      }
    if (cnt)
      OUT("wagma_job_staleness{job=\"%s\"} %llu\n", j->id, (unsigned long long)most);
  }
  /* Members cut off (docs/design.md §7.3): what each member's report of its job's epoch says;
   * only agents that report some, so that a large healthy cluster adds no series. */
  OUT("# HELP wagma_agent_unreachable_peers Peers of its job's epoch an agent's member cannot "
      "reach on the data plane (absent when none)\n"
      "# TYPE wagma_agent_unreachable_peers gauge\n");
  for (size_t i = 0; i < s->njobs; i++) {
    const wg_job_record_t *j = &s->jobs[i];
    for (int k = 0; k < j->nprogress; k++) {
      const wagma_progress_t *pr = &j->progress[k].progress;
      if (pr->unreachable_total > 0 && pr->epoch == j->status.epoch &&
          wg_job_has_member(j, j->progress[k].agent))
        OUT("wagma_agent_unreachable_peers{agent=\"%s\",job=\"%s\"} %d\n", j->progress[k].agent,
            j->id, pr->unreachable_total);
    }
  }
#undef OUT
  return b;
}
