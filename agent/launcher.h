/* agent/launcher.h — the agent's side of a job's program (docs/programs.md): it launches the
 * job's program (from --programs DIR, or wagma-train beside the agent for a built-in job),
 * talks to it over a local socket (worker/proto.h) and
 * supervises it. Private to wagma-agent; runner.c drives it from the runner thread.
 *
 * The program runs in its own process group with a clean environment (the WAGMA_* variables,
 * --program-env, CUDA_VISIBLE_DEVICES when the agent has it), argv = [path, spec args...]
 * (never a shell), and dies with the agent (PR_SET_PDEATHSIG). It inherits the agent's bound
 * data-plane socket (WAGMA_LISTEN_FD). The launcher sends it the job's configuration after
 * its hello, every plan that lists this agent (with the epoch's secret) and "stop"; it relays
 * the program's progress reports to the control thread (wg_shared_t). Its stdout and stderr reach
 * the agent's log line by line, prefixed with the job and the program; the last lines of stderr go
 * into the failure a program's death reports. */
#ifndef WAGMA_AGENT_LAUNCHER_H
#define WAGMA_AGENT_LAUNCHER_H

#include "agent/agent.h"

typedef struct wg_launcher wg_launcher_t;

/* Ownership: *out is the caller's, wg_launcher_free (which stops a program still running). */
int wg_launcher_new(const wg_agent_options_t *opt, wg_shared_t *shared, wg_launcher_t **out);
void wg_launcher_free(wg_launcher_t *l);

/* One turn for the job cfg (runner thread; a built-in job runs wagma-train): launches the program
 * if none runs for it, sends a new plan (plan non-NULL: the newest, with its secret and the job's
 * checkpoint record ck, NULL = none; the launcher keeps copies), relays what the program sent,
 * reaps it when it exited and reports a death. Returns within about wait_s. */
void wg_launcher_turn(wg_launcher_t *l, const wg_job_config_t *cfg, const wagma_plan_t *plan,
                      const uint8_t *secret, size_t secret_len, const wg_checkpoint_rec_t *ck,
                      double wait_s);

/* The job is over for this agent (released, stopped, or the agent stops): "stop" to the
 * program, SIGTERM to its group after half of --program-grace (at once when it is not
 * connected), SIGKILL after the whole of it; returns once it is gone. Then the launcher forgets the
 * job (its plan, its restarts): a later assignment to it launches a new program. */
void wg_launcher_release(wg_launcher_t *l, const char *why);

/* 1 while a program process of this launcher exists. */
int wg_launcher_running(const wg_launcher_t *l);

#endif
