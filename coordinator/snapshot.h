/* coordinator/snapshot.h — private to the scheduler: one consistent read of the whole key
 * tree (agents, assignments, jobs, quarantine records, the keys of the data-plane secrets) at
 * one etcd revision, and its rendering for /metrics. */
#ifndef WAGMA_COORD_SNAPSHOT_H
#define WAGMA_COORD_SNAPSHOT_H

#include "coord.h"
#include "store.h"

typedef struct agent_rec {
  char name[WAGMA_API_NAME_MAX];
  wagma_agent_info_t info;
  int64_t create_rev;
  int busy;        /* member of an active job (snapshot), or taken in this pass */
  int touched;     /* assignment written in this pass */
  int quarantined; /* a quarantine record names this registration (create_rev) and its until
                      has not passed: not assigned */
} agent_rec_t;

typedef struct assign_rec {
  char agent[WAGMA_API_NAME_MAX];
  wagma_assignment_t a;
  int64_t mod;
} assign_rec_t;

typedef struct quarantine_rec {
  char agent[WAGMA_API_NAME_MAX];
  wagma_quarantine_t q; /* registration 0 when it did not decode */
  int64_t mod;
} quarantine_rec_t;

/* A data-plane secret key <prefix>/secrets/<job>/<epoch> (its value is not kept). */
typedef struct secret_rec {
  char job[WAGMA_API_NAME_MAX];
  uint64_t epoch;
  int64_t mod;
} secret_rec_t;

typedef struct snapshot {
  agent_rec_t *agents;
  size_t nagents;
  assign_rec_t *assigns;
  size_t nassigns;
  wg_job_record_t *jobs;
  size_t njobs;
  quarantine_rec_t *quarantines;
  size_t nquarantines;
  secret_rec_t *secrets; /* in key order: by job, then epoch */
  size_t nsecrets;
  int64_t revision;
} snapshot_t;

/* Reads everything under <prefix>/ with one Range. Ownership: *s is the caller's
 * (wg_snapshot_free). Records that do not decode are skipped (assignments and quarantine
 * records kept as stale). Marks the agents whose current registration is quarantined. Of the
 * secrets only the keys are kept; the values read are wiped before the Range is freed. */
int wg_snapshot_load(wg_coord_t *c, snapshot_t *s);
void wg_snapshot_free(snapshot_t *s);
/* Binary searches (etcd returns keys sorted); NULL when absent. */
agent_rec_t *wg_snapshot_agent(snapshot_t *s, const char *name);
assign_rec_t *wg_snapshot_assign(snapshot_t *s, const char *name);
/* 1 if agent is in the job's status.members. */
int wg_job_has_member(const wg_job_record_t *j, const char *agent);
/* The cluster gauges of /metrics. Ownership: the caller frees. */
char *wg_snapshot_render(const snapshot_t *s);

#endif
