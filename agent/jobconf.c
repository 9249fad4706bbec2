/* agent/jobconf.c — the api.h side of the agent: decodes the stored job spec into the agent's
 * own wg_job_config_t and encodes the records the agent writes (registration, progress,
 * checkpoint). Pure functions, no threads. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "wagma/api.h"

int wg_job_config_from_spec_json(const char *json, size_t len, const char *job,
                                 wg_job_config_t *cfg, char *err, size_t err_len) {
  wagma_job_spec_t spec;
  wagma_api_error_t aerr;
  memset(cfg, 0, sizeof *cfg);
  if (wagma_job_spec_from_json(json, len, &spec, &aerr) != 0) {
    snprintf(err, err_len, "job %s: bad spec: %s: %s", job, aerr.field, aerr.message);
    return WAGMA_EINVAL;
  }
  snprintf(cfg->job, sizeof cfg->job, "%s", job);
  cfg->model = spec.model;
  cfg->dataset = spec.dataset;
  cfg->algorithm = spec.algorithm;
  cfg->optimizer = spec.optimizer.type;
  cfg->lr = spec.optimizer.lr;
  cfg->momentum = spec.optimizer.momentum;
  cfg->nesterov = spec.optimizer.nesterov;
  cfg->weight_decay = spec.optimizer.weight_decay;
  cfg->warmup = spec.optimizer.warmup;
  cfg->batch_size = spec.batch_size;
  cfg->workers = spec.workers;
  cfg->iterations = spec.iterations;
  cfg->epochs = spec.epochs;
  cfg->eval_every = spec.eval_every;
  cfg->seed = spec.seed;
  cfg->staleness_bound = spec.staleness_bound;
  cfg->gradient_delay = spec.gradient_delay;
  cfg->ps_shards = spec.ps_shards;
  cfg->dc_lambda = spec.dc_lambda;
  cfg->dc_adaptive = spec.dc_adaptive;
  cfg->checkpoint_every = spec.checkpoint.every;
  snprintf(cfg->checkpoint_dir, sizeof cfg->checkpoint_dir, "%s", spec.checkpoint.path);
  cfg->device = spec.device; /* the runner checks it against its own --device */
  cfg->program = spec.program;
  cfg->spec = spec;
  return 0;
}

void wg_progress_snap_from_progress(wg_progress_snap_t *s, const wagma_progress_t *p,
                                    const char *job) {
  memset(s, 0, sizeof *s);
  snprintf(s->job, sizeof s->job, "%s", job);
  s->state = p->state == WAGMA_PROGRESS_DONE          ? WG_STATE_DONE
             : p->state == WAGMA_PROGRESS_FAILED      ? WG_STATE_FAILED
             : p->state == WAGMA_PROGRESS_UNAVAILABLE ? WG_STATE_UNAVAILABLE
                                                      : WG_STATE_RUNNING;
  s->epoch = p->epoch;
  s->iteration = p->iteration;
  s->has_round = p->has_round;
  s->round = p->round;
  s->round_global = p->round_global;
  s->ngroup = p->ngroup;
  memcpy(s->group, p->group, sizeof s->group);
  s->nfingerprint = p->nfingerprint;
  memcpy(s->fingerprint, p->fingerprint, sizeof s->fingerprint);
  s->loss = p->loss;
  s->accuracy = p->accuracy;
  s->step_time = p->step_time;
  s->staleness = p->staleness;
  s->rounds_activated = p->rounds_activated;
  s->rounds_joined = p->rounds_joined;
  s->rounds_left_out = p->rounds_left_out;
  s->rounds_skipped = p->rounds_skipped;
  snprintf(s->error, sizeof s->error, "%s", p->error);
  snprintf(s->role, sizeof s->role, "%s", p->role[0] ? p->role : "worker");
  s->rejoin = p->rejoin;
  s->nunreachable = p->nunreachable;
  s->unreachable_total = p->unreachable_total;
  memcpy(s->unreachable, p->unreachable, sizeof s->unreachable);
}

char *wg_progress_snap_to_json(const wg_progress_snap_t *s) {
  wagma_progress_t p;
  char *json = NULL;
  wagma_progress_init(&p);
  p.state = s->state == WG_STATE_DONE          ? WAGMA_PROGRESS_DONE
            : s->state == WG_STATE_FAILED      ? WAGMA_PROGRESS_FAILED
            : s->state == WG_STATE_UNAVAILABLE ? WAGMA_PROGRESS_UNAVAILABLE
                                               : WAGMA_PROGRESS_RUNNING;
  p.epoch = s->epoch;
  p.iteration = s->iteration;
  p.loss = s->loss;
  p.accuracy = s->accuracy;
  p.step_time = isfinite(s->step_time) ? s->step_time : 0;
  p.staleness = s->staleness;
  p.rounds_activated = s->rounds_activated;
  p.rounds_joined = s->rounds_joined;
  p.rounds_left_out = s->rounds_left_out;
  p.rounds_skipped = s->rounds_skipped;
  p.has_round = s->has_round;
  p.round = s->round;
  p.round_global = s->round_global;
  p.ngroup = s->ngroup;
  memcpy(p.group, s->group, sizeof p.group);
  p.nfingerprint = s->nfingerprint;
  memcpy(p.fingerprint, s->fingerprint, sizeof p.fingerprint);
  p.time = wg_wall();
  snprintf(p.error, sizeof p.error, "%s", s->error);
  snprintf(p.role, sizeof p.role, "%s", s->role);
  p.rejoin = s->rejoin;
  p.nunreachable = s->nunreachable;
  p.unreachable_total = s->unreachable_total;
  memcpy(p.unreachable, s->unreachable, sizeof p.unreachable);
  if (wagma_progress_to_json(&p, &json) != 0)
    return NULL;
  return json;
}

/* Ownership: the caller frees the result (NULL on failure, e.g. an empty path). */
char *wg_checkpoint_rec_to_json(const wg_checkpoint_rec_t *r, const char *agent) {
  wagma_checkpoint_record_t rec;
  char *json = NULL;
  memset(&rec, 0, sizeof rec);
  snprintf(rec.path, sizeof rec.path, "%s", r->path);
  rec.iteration = r->iteration;
  rec.epoch = r->epoch;
  snprintf(rec.agent, sizeof rec.agent, "%s", agent ? agent : "");
  rec.time = wg_wall();
  if (wagma_checkpoint_record_to_json(&rec, &json) != 0)
    return NULL;
  return json;
}

/* Fills path, iteration and epoch; job is left empty (the caller knows it). */
int wg_checkpoint_rec_from_json(const char *json, size_t len, wg_checkpoint_rec_t *r) {
  wagma_checkpoint_record_t rec;
  wagma_api_error_t aerr;
  memset(r, 0, sizeof *r);
  if (wagma_checkpoint_record_from_json(json, len, &rec, &aerr) != 0)
    return WAGMA_EINVAL;
  snprintf(r->path, sizeof r->path, "%s", rec.path);
  r->iteration = rec.iteration;
  r->epoch = rec.epoch;
  return 0;
}

char *wg_agent_info_json(const wg_agent_options_t *opt, double started, double reached) {
  wagma_agent_info_t a;
  char *json = NULL;
  memset(&a, 0, sizeof a);
  snprintf(a.address, sizeof a.address, "%s", opt->advertise[0] ? opt->advertise : opt->listen);
  a.device = opt->device_cuda ? WAGMA_DEVICE_CUDA : WAGMA_DEVICE_CPU;
  a.capacity = opt->capacity;
  snprintf(a.version, sizeof a.version, "%s", WG_AGENT_VERSION);
  a.started = started;
  a.nprograms = opt->nprograms;
  memcpy(a.programs, opt->programs, sizeof a.programs);
  a.reached = reached;
  if (wagma_agent_info_to_json(&a, &json) != 0)
    return NULL;
  return json;
}

int wg_assignment_job(const char *json, size_t len, char *job, size_t job_len) {
  wagma_assignment_t a;
  wagma_api_error_t aerr;
  job[0] = '\0';
  if (wagma_assignment_from_json(json, len, &a, &aerr) != 0)
    return WAGMA_EINVAL;
  snprintf(job, job_len, "%s", a.job);
  return 0;
}
