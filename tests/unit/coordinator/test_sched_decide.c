/* test_sched_decide.c — the scheduler's decisions (coordinator/sched_decide.c), table-driven:
 * each case is a snapshot in plain data (agents, jobs with their status, plan, progress and
 * checkpoint, quarantine records, assignments, secrets), the clock and --quarantine, and the
 * writes the pass must want, in order, rendered as text. Pure: no etcd, no clock. The sink
 * answers every write "written" unless the case names one that fails. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sched_decide.h"

#define MAXA 8
#define MAXJ 3
#define MAXP 6

typedef struct {
  const char *name;
  const char *dev;   /* "cuda", else cpu */
  const char *progs; /* "p,q" (sorted) */
  int64_t rev;       /* create revision, default 10 */
  int quarantined;
  double reached;
} ag_t;

typedef struct {
  const char *agent;
  const char *state; /* running (default), done, failed, unavailable */
  uint64_t epoch, iter;
  int64_t mod; /* default 100 */
  const char *error;
  double time;
  const char *unreach; /* plan ranks it reports unreachable (5 s), "123" */
  uint64_t rejoin;
} pr_t;

typedef struct {
  const char *id;
  double created;
  const char *state; /* pending (default), running, succeeded, failed */
  uint64_t epoch, start_round, iteration;
  const char *members; /* status.members "a,b"; the plan's too unless plan is set */
  const char *plan;    /* the plan's members when they differ (a pending job's last plan) */
  int workers, min_workers;
  uint64_t iterations;
  const char *dev, *prog;
  int64_t ckpt; /* checkpoint iteration + 1; 0 = none */
  const char *reason;
  pr_t progress[MAXP];
} job_t;

typedef struct {
  const char *agent;
  int64_t registration, refusal, mod;
  const char *job;
  double since, until, reachable;
  int nprobe;
} qr_t;

typedef struct {
  const char *agent, *job;
  uint64_t epoch;
  int64_t mod;
} as_t;

typedef struct {
  const char *job;
  uint64_t epoch;
  int64_t mod;
} sec_t;

typedef struct {
  const char *name;
  ag_t agents[MAXA];
  job_t jobs[MAXJ];
  qr_t quar[3];
  as_t assigns[6];
  sec_t secrets[6];
  double now; /* default 1000 */
  int quarantine_s;
  int fail; /* 1-based index of the write the sink refuses; 0 = none */
  const char *want;
} case_t;

/* ---- the cases ------------------------------------------------------------------------------ */

static const case_t cases[] = {
    /* assignment of free agents */
    {.name = "a pending job takes free agents in name order (first plan, no joiners)",
     .agents = {{"a"}, {"b"}, {"c"}},
     .jobs = {{.id = "j1", .workers = 2}},
     .want = "plan j1 e1 sr0 [a,b] assign=a,b \"\""},
    {.name = "oldest job first",
     .agents = {{"a"}, {"b"}},
     .jobs = {{.id = "j1", .created = 2, .workers = 2}, {.id = "j2", .created = 1, .workers = 2}},
     .want = "plan j2 e1 sr0 [a,b] assign=a,b \"\"; "
             "status j1 pending \"waiting for 2 free cpu agents\""},
    {.name = "agents of another device are skipped",
     .agents = {{"a", "cuda"}, {"b"}, {"c"}},
     .jobs = {{.id = "j1", .workers = 2}},
     .want = "plan j1 e1 sr0 [b,c] assign=b,c \"\""},
    {.name = "a program job takes only agents that list its program",
     .agents = {{"a", .progs = "q"}, {"b", .progs = "p,q"}, {"c", .progs = "p"}},
     .jobs = {{.id = "j1", .workers = 2, .prog = "p"}},
     .want = "plan j1 e1 sr0 [b,c] assign=b,c \"\""},
    {.name = "a program job that no agent of its device has",
     .agents = {{"a", .progs = "q"}, {"b", "cuda", "p"}},
     .jobs = {{.id = "j1", .workers = 1, .prog = "p"}},
     .want = "status j1 pending \"no live cpu agent has program p\""},
    {.name = "quarantined agents are skipped",
     .agents = {{"a", .quarantined = 1}, {"b"}, {"c"}},
     .jobs = {{.id = "j1", .workers = 2}},
     .want = "plan j1 e1 sr0 [b,c] assign=b,c \"\""},
    {.name = "an agent that refused the job is skipped, and named in the reason",
     .agents = {{"a"}, {"b"}, {"c"}},
     .jobs = {{.id = "j1",
               .workers = 2,
               .progress = {{"a", "unavailable", .error = "no data set"}}}},
     .want = "plan j1 e1 sr0 [b,c] assign=b,c \"agent a unavailable: no data set\""},
    {.name = "a refusal of an older registration does not count",
     .agents = {{"a", .rev = 200}, {"b"}},
     .jobs = {{.id = "j1", .workers = 2, .progress = {{"a", "unavailable", .error = "x"}}}},
     .want = "plan j1 e1 sr0 [a,b] assign=a,b \"\""},
    {.name = "min_workers: the job waits, its reason says for what",
     .agents = {{"a"}, {"b"}},
     .jobs = {{.id = "j1", .workers = 3, .min_workers = 3}},
     .want = "status j1 pending \"waiting for 3 free cpu agents\""},
    {.name = "min_workers of a program job",
     .agents = {{"a", .progs = "p"}},
     .jobs = {{.id = "j1", .workers = 2, .prog = "p"}},
     .want = "status j1 pending \"waiting for 2 free cpu agents with program p\""},
    {.name = "a pending job whose reason is already said is not rewritten",
     .agents = {{"a"}},
     .jobs = {{.id = "j1", .workers = 2, .reason = "waiting for 2 free cpu agents"}},
     .want = ""},
    {.name = "min_workers reached: it starts below workers",
     .agents = {{"a"}, {"b"}},
     .jobs = {{.id = "j1", .workers = 3, .min_workers = 2}},
     .want = "plan j1 e1 sr0 [a,b] assign=a,b \"running with 2 of 3 workers; waiting for agents\""},
    {.name = "the assignment guard is the old assignment's mod revision",
     .agents = {{"a"}},
     .jobs = {{.id = "j1", .workers = 1}},
     .assigns = {{"a", "gone", 1, 77}},
     .want = "plan j1 e1 sr0 [a] assign=a@77 \"\""},

    /* replanning */
    {.name = "a free agent joins a running job: epoch + 1, start_round the highest report",
     .agents = {{"a"}, {"b"}, {"c"}},
     .jobs = {{.id = "j1",
               .state = "running",
               .epoch = 3,
               .start_round = 10,
               .members = "a,b",
               .workers = 3,
               .min_workers = 1,
               .progress = {{"a", .epoch = 3, .iter = 40}, {"b", .epoch = 3, .iter = 42}}}},
     .want = "plan j1 e4 sr42 [a,b,c+] assign=c \"\""},
    {.name = "a member whose agent key is gone leaves; its assignment is released",
     .agents = {{"a"}, {"b"}},
     .jobs = {{.id = "j1",
               .state = "running",
               .epoch = 2,
               .members = "a,b,c",
               .workers = 3,
               .min_workers = 1,
               .progress = {{"a", .epoch = 2, .iter = 7}, {"c", .epoch = 2, .iter = 9}}}},
     .assigns = {{"a", "j1", 1, 50}, {"b", "j1", 1, 51}, {"c", "j1", 1, 52}},
     .want = "plan j1 e3 sr9 [a,b] \"running with 2 of 3 workers; waiting for agents\"; "
             "release c@52"},
    {.name = "start_round never goes below the previous one; older epochs' reports are stale",
     .agents = {{"a"}, {"b"}},
     .jobs = {{.id = "j1",
               .state = "running",
               .epoch = 5,
               .start_round = 30,
               .members = "a",
               .workers = 2,
               .progress = {{"a", .epoch = 5, .iter = 20}, {"b", .epoch = 4, .iter = 99}}}},
     .want = "plan j1 e6 sr30 [a,b+] assign=b \"\""},
    {.name = "nobody survived: a fresh start, nobody marked joiner",
     .agents = {{"c"}, {"d"}},
     .jobs = {{.id = "j1",
               .state = "running",
               .epoch = 2,
               .members = "a,b",
               .workers = 2,
               .iterations = 100,
               .progress = {{"a", .epoch = 2, .iter = 12}}}},
     .want = "plan j1 e3 sr12 [c,d] assign=c,d \"\""},
    {.name = "the same membership: nothing is written",
     .agents = {{"a"}, {"b"}, {"c"}},
     .jobs = {{.id = "j1", .state = "running", .epoch = 1, .members = "a,b", .workers = 2}},
     .want = ""},
    {.name = "members beyond workers leave (highest ranks first)",
     .agents = {{"a"}, {"b"}, {"c"}},
     .jobs = {{.id = "j1", .state = "running", .epoch = 1, .members = "c,a,b", .workers = 2}},
     .want = "plan j1 e2 sr0 [c,a] \"\""},
    {.name = "a member whose program restarted rejoins as a joiner",
     .agents = {{"a"}, {"b"}},
     .jobs = {{.id = "j1",
               .state = "running",
               .epoch = 4,
               .members = "a,b",
               .workers = 2,
               .progress = {{"b", .epoch = 4, .iter = 3, .rejoin = 4}}}},
     .want = "plan j1 e5 sr3 [a,b+] assign=b \"\""},
    {.name = "members of a running job are not free for a later job",
     .agents = {{"a"}, {"b"}, {"c"}},
     .jobs = {{.id = "j1",
               .created = 1,
               .state = "running",
               .epoch = 1,
               .members = "a,b",
               .workers = 2},
              {.id = "j2", .created = 2, .workers = 2, .min_workers = 1}},
     .want = "plan j2 e1 sr0 [c] assign=c \"running with 1 of 2 workers; waiting for agents\""},
    {.name = "members of a running job are not free for an older job either",
     .agents = {{"a"}, {"b"}, {"c"}},
     .jobs = {{.id = "j1", .created = 1, .workers = 2, .min_workers = 1},
              {.id = "j2",
               .created = 2,
               .state = "running",
               .epoch = 1,
               .members = "a,b",
               .workers = 2}},
     .want = "plan j1 e1 sr0 [c] assign=c \"running with 1 of 2 workers; waiting for agents\""},

    /* completion and failure */
    {.name = "every member done: succeeded",
     .agents = {{"a"}, {"b"}},
     .jobs = {{.id = "j1",
               .state = "running",
               .epoch = 1,
               .members = "a,b",
               .workers = 2,
               .iterations = 100,
               .progress = {{"a", "done", 1, 100}, {"b", "done", 1, 100}}}},
     .assigns = {{"a", "j1", 1, 50}, {"b", "j1", 1, 51}},
     .want = "finish j1 succeeded \"all 2 members finished at iteration 100\"; "
             "release a@50,b@51"},
    {.name = "a pending job whose last plan's members finished in its epoch: succeeded",
     .agents = {{"c"}},
     .jobs = {{.id = "j1",
               .epoch = 2,
               .plan = "a,b",
               .workers = 2,
               .iterations = 100,
               .progress = {{"a", "done", 2, 100}, {"b", "done", 2, 100}}}},
     .want = "finish j1 succeeded \"all 2 members finished at iteration 100\""},
    {.name = "a pending job: reports of older epochs do not complete it",
     .agents = {{"c"}},
     .jobs = {{.id = "j1",
               .epoch = 2,
               .plan = "a,b",
               .workers = 2,
               .reason = "waiting for 2 free cpu agents",
               .progress = {{"a", "done", 2, 100}, {"b", "done", 1, 100}}}},
     .want = ""},
    {.name = "a member reports failed: failed",
     .agents = {{"a"}, {"b"}},
     .jobs = {{.id = "j1",
               .state = "running",
               .epoch = 1,
               .members = "a,b",
               .workers = 2,
               .progress = {{"b", "failed", 1, 5, .error = "boom"}}}},
     .want = "finish j1 failed \"agent b failed: boom\""},
    {.name = "refused by MAX_REFUSALS agents and run by none: failed",
     .agents = {{"a"}, {"b"}, {"c"}, {"d"}},
     .jobs = {{.id = "j1",
               .workers = 1,
               .progress = {{"a", "unavailable", .error = "no data"},
                            {"b", "unavailable"},
                            {"c", "unavailable"}}}},
     .want = "finish j1 failed \"3 agents cannot serve it and none ran it (a, b, c); a: no "
             "data\""},
    {.name = "two refusals of four agents: not yet",
     .agents = {{"a"}, {"b"}, {"c"}, {"d"}},
     .jobs = {{.id = "j1",
               .workers = 1,
               .progress = {{"a", "unavailable", .error = "no data"}, {"b", "unavailable"}}}},
     .want = "plan j1 e1 sr0 [c] assign=c \"agent a unavailable: no data\""},
    {.name = "refused by every agent of its device: failed",
     .agents = {{"a"}, {"b", "cuda"}},
     .jobs = {{.id = "j1", .workers = 1, .progress = {{"a", "unavailable"}}}},
     .want = "finish j1 failed \"1 agent cannot serve it and none ran it (a); a: no detail\""},
    {.name = "done members alive, the others died before the end: succeeded",
     .agents = {{"a"}},
     .jobs = {{.id = "j1",
               .state = "running",
               .epoch = 1,
               .members = "a,b",
               .workers = 2,
               .iterations = 100,
               .progress = {{"a", "done", 1, 100}, {"b", .epoch = 1, .iter = 60}}}},
     .want = "finish j1 succeeded \"1 of 2 members finished at iteration 100 (1 died before the "
             "end)\""},
    {.name = "a member at the last iteration is finishing: no plan meanwhile",
     .agents = {{"a"}, {"b"}, {"c"}},
     .jobs = {{.id = "j1",
               .state = "running",
               .epoch = 1,
               .members = "a,b",
               .workers = 3,
               .iterations = 100,
               .progress = {{"a", "done", 1, 100}, {"b", .epoch = 1, .iter = 100}}}},
     .want = ""},
    {.name = "members gone, one at the last iteration: the job waits for their final reports",
     .agents = {{"c"}},
     .jobs = {{.id = "j1",
               .state = "running",
               .epoch = 1,
               .members = "a,b",
               .workers = 1,
               .iterations = 100,
               .progress = {{"a", .epoch = 1, .iter = 100, .time = 980},
                            {"b", .epoch = 1, .iter = 80, .time = 900}}}},
     .want = "status j1 running \"its members left at the last iteration 100; waiting for their "
             "final reports\""},
    {.name = "members gone, one at the last iteration: after FINAL_REPORT_WAIT_S it fails",
     .agents = {{"c"}},
     .jobs = {{.id = "j1",
               .state = "running",
               .epoch = 1,
               .members = "a,b",
               .workers = 1,
               .iterations = 100,
               .progress = {{"a", .epoch = 1, .iter = 100, .time = 960},
                            {"b", .epoch = 1, .iter = 80, .time = 900}}}},
     .want = "finish j1 failed \"its members left at the last iteration 100 without all "
             "reporting the final model, and no checkpoint holds it\""},

    /* quarantine */
    {.name = "a refusal of a job another agent ran quarantines the agent",
     .agents = {{"a"}, {"b"}, {"c"}},
     .jobs = {{.id = "j1",
               .state = "running",
               .epoch = 1,
               .members = "a,b",
               .workers = 2,
               .progress = {{"a", .epoch = 1, .iter = 3}, {"c", "unavailable", 1, .error = "x"}}}},
     .quarantine_s = 60,
     .want = "qref c j1 since=1000 until=1060 refusal=100 \"job j1: x\""},
    {.name = "--quarantine 0: no refusal quarantines",
     .agents = {{"a"}, {"b"}, {"c"}},
     .jobs = {{.id = "j1",
               .state = "running",
               .epoch = 1,
               .members = "a,b",
               .workers = 2,
               .progress = {{"a", .epoch = 1, .iter = 3}, {"c", "unavailable", 1, .error = "x"}}}},
     .want = ""},
    {.name = "a refusal whose quarantine is over does not quarantine again",
     .agents = {{"a"}, {"b"}, {"c"}},
     .jobs = {{.id = "j1",
               .state = "running",
               .epoch = 1,
               .members = "a,b",
               .workers = 2,
               .progress = {{"a", .epoch = 1, .iter = 3}, {"c", "unavailable", 1, .error = "x"}}}},
     .quar = {{"c", 10, 100, 90, "j1", 500, 560}},
     .quarantine_s = 60,
     .want = ""},
    {.name = "a refused job nobody ran quarantines nobody",
     .agents = {{"a"}, {"b"}, {"c"}},
     .jobs = {{.id = "j1", .workers = 2, .progress = {{"c", "unavailable", .error = "x"}}}},
     .quarantine_s = 60,
     .want = "plan j1 e1 sr0 [a,b] assign=a,b \"agent c unavailable: x\""},
    {.name = "a member cut off from the others is quarantined, then a plan without it",
     .agents = {{"a"}, {"b"}, {"c"}, {"d"}},
     .jobs = {{.id = "j1",
               .state = "running",
               .epoch = 2,
               .members = "a,b,c,d",
               .workers = 4,
               .min_workers = 1,
               .progress = {{"a", .epoch = 2, .iter = 8, .unreach = "123"},
                            {"b", .epoch = 2, .iter = 8},
                            {"c", .epoch = 2, .iter = 8},
                            {"d", .epoch = 2, .iter = 8}}}},
     .want = "qcut a j1 until=1300 probe=b:1,c:1,d:1 \"job j1: cut off on the data plane from 3 "
             "of its 3 peers (b, c, d)\"; "
             "plan j1 e3 sr8 [b,c,d] \"running with 3 of 4 workers; waiting for agents\""},
    {.name = "a cut member whose quarantine fails: no plan",
     .agents = {{"a"}, {"b"}, {"c"}, {"d"}},
     .jobs = {{.id = "j1",
               .state = "running",
               .epoch = 2,
               .members = "a,b,c,d",
               .workers = 4,
               .progress = {{"a", .epoch = 2, .iter = 8, .unreach = "123"},
                            {"b", .epoch = 2, .iter = 8},
                            {"c", .epoch = 2, .iter = 8},
                            {"d", .epoch = 2, .iter = 8}}}},
     .fail = 1,
     .want = "qcut a j1 until=1300 probe=b:1,c:1,d:1 \"job j1: cut off on the data plane from 3 "
             "of its 3 peers (b, c, d)\" FAILED"},
    {.name = "two halves cut off from each other: no majority, nobody leaves",
     .agents = {{"a"}, {"b"}},
     .jobs = {{.id = "j1",
               .state = "running",
               .epoch = 2,
               .members = "a,b",
               .workers = 2,
               .progress = {{"a", .epoch = 2, .iter = 8, .unreach = "1"},
                            {"b", .epoch = 2, .iter = 8, .unreach = "0"}}}},
     .want = "nomaj j1"},
    {.name = "a cut member's quarantine ends when its registration reached its peers",
     .agents = {{"a", .reached = 500}, {"b", .reached = 400}},
     .quar = {{"a", 10, 0, 90, "j1", 500, 800, .nprobe = 1},
              {"b", 10, 0, 91, "j1", 500, 800, .nprobe = 1}},
     .want = "qend a until=1000 reachable=1000"},
    {.name = "records of an older registration, or of an agent gone whose quarantine ended, go",
     .agents = {{"a", .rev = 20}, {"b"}},
     .quar = {{"a", 10, 5, 90, "j1", 500, 2000},
              {"b", 10, 5, 91, "j1", 500, 900},
              {"c", 10, 5, 92, "j1", 500, 900}},
     .want = "qdrop a; qdrop c (gone)"},
    {.name = "the record of an agent gone whose quarantine runs stays",
     .agents = {{"b"}},
     .quar = {{"c", 10, 5, 92, "j1", 500, 2000}},
     .want = ""},

    /* checkpoints */
    {.name = "a fresh start with a checkpoint starts at its iteration",
     .agents = {{"c"}, {"d"}},
     .jobs = {{.id = "j1",
               .state = "running",
               .epoch = 2,
               .start_round = 5,
               .members = "a,b",
               .workers = 2,
               .ckpt = 51,
               .progress = {{"a", .epoch = 2, .iter = 70}}}},
     .want = "plan j1 e3 sr50 [c,d] assign=c,d \"\""},
    {.name = "with survivors the checkpoint does not matter",
     .agents = {{"a"}, {"d"}},
     .jobs = {{.id = "j1",
               .state = "running",
               .epoch = 2,
               .start_round = 5,
               .members = "a,b",
               .workers = 2,
               .ckpt = 51,
               .progress = {{"a", .epoch = 2, .iter = 70}}}},
     .want = "plan j1 e3 sr70 [a,d+] assign=d \"\""},
    {.name = "members gone, one at the last iteration with a checkpoint: a new plan from it",
     .agents = {{"c"}},
     .jobs = {{.id = "j1",
               .state = "running",
               .epoch = 1,
               .members = "a,b",
               .workers = 1,
               .iterations = 100,
               .ckpt = 91,
               .progress = {{"a", .epoch = 1, .iter = 100, .time = 990},
                            {"b", .epoch = 1, .iter = 80, .time = 900}}}},
     .want = "plan j1 e2 sr90 [c] assign=c \"\""},

    /* secrets */
    {.name = "secrets of epochs other than the job's last two, and of finished jobs, go",
     .agents = {{"a"}},
     .jobs = {{.id = "j1", .state = "running", .epoch = 5, .members = "a", .workers = 1},
              {.id = "j2", .state = "succeeded", .epoch = 1, .workers = 1}},
     .secrets =
         {{"j1", 2, 1}, {"j1", 4, 2}, {"j1", 5, 3}, {"j1", 6, 4}, {"j2", 1, 5}, {"j3", 1, 6}},
     .want = "secrets j1/2@1,j1/6@4,j2/1@5,j3/1@6"},
};

/* ---- building the snapshot ------------------------------------------------------------------ */

static char *dup(const char *s) {
  char *d = strdup(s ? s : "");
  assert_non_null(d);
  return d;
}

/* Splits "a,b" into names (static storage of the caller); returns how many. */
static int split(const char *s, char out[][WAGMA_API_NAME_MAX], int max) {
  int n = 0;
  while (s && *s && n < max) {
    const char *e = strchr(s, ',');
    size_t len = e ? (size_t)(e - s) : strlen(s);
    snprintf(out[n++], WAGMA_API_NAME_MAX, "%.*s", (int)len, s);
    s = e ? e + 1 : NULL;
  }
  return n;
}

static wagma_job_state_t job_state(const char *s) {
  if (!s || strcmp(s, "pending") == 0)
    return WAGMA_JOB_PENDING;
  if (strcmp(s, "running") == 0)
    return WAGMA_JOB_RUNNING;
  if (strcmp(s, "succeeded") == 0)
    return WAGMA_JOB_SUCCEEDED;
  return WAGMA_JOB_FAILED;
}

static wagma_progress_state_t progress_state(const char *s) {
  if (!s || strcmp(s, "running") == 0)
    return WAGMA_PROGRESS_RUNNING;
  if (strcmp(s, "done") == 0)
    return WAGMA_PROGRESS_DONE;
  if (strcmp(s, "failed") == 0)
    return WAGMA_PROGRESS_FAILED;
  return WAGMA_PROGRESS_UNAVAILABLE;
}

static int cmp_agent(const void *a, const void *b) {
  return strcmp(((const agent_rec_t *)a)->name, ((const agent_rec_t *)b)->name);
}
static int cmp_assign(const void *a, const void *b) {
  return strcmp(((const assign_rec_t *)a)->agent, ((const assign_rec_t *)b)->agent);
}
static int cmp_progress(const void *a, const void *b) {
  return strcmp(((const wg_progress_entry_t *)a)->agent, ((const wg_progress_entry_t *)b)->agent);
}

static void build_job(const job_t *jt, wg_job_record_t *j) {
  char names[16][WAGMA_API_NAME_MAX];
  const char *ptrs[16];
  memset(j, 0, sizeof *j);
  snprintf(j->id, sizeof j->id, "%s", jt->id);
  j->has_spec = j->has_status = 1;
  wagma_job_spec_init(&j->spec);
  j->spec.workers = jt->workers;
  j->spec.min_workers = jt->min_workers ? jt->min_workers : jt->workers;
  j->spec.max_workers = jt->workers;
  j->spec.iterations = jt->iterations;
  j->spec.device = jt->dev && strcmp(jt->dev, "cuda") == 0 ? WAGMA_DEVICE_CUDA : WAGMA_DEVICE_CPU;
  snprintf(j->spec.program.name, sizeof j->spec.program.name, "%s", jt->prog ? jt->prog : "");
  j->spec_mod = 11;
  j->status.state = job_state(jt->state);
  j->status.epoch = jt->epoch;
  j->status.start_round = jt->start_round;
  j->status.iteration = jt->iteration;
  j->status.created = jt->created;
  snprintf(j->status.reason, sizeof j->status.reason, "%s", jt->reason ? jt->reason : "");
  int n = split(jt->members, names, 16);
  for (int i = 0; i < n; i++)
    ptrs[i] = names[i];
  assert_int_equal(wagma_job_status_set_members(&j->status, ptrs, n), 0);
  j->status_mod = 12;
  if (jt->plan)
    n = split(jt->plan, names, 16);
  if (n > 0) {
    char buf[2048];
    size_t len = (size_t)snprintf(buf, sizeof buf, "{\"epoch\":%llu,\"members\":[",
                                  (unsigned long long)jt->epoch);
    for (int i = 0; i < n; i++)
      len +=
          (size_t)snprintf(buf + len, sizeof buf - len, "%s{\"name\":\"%s\",\"address\":\"%s:1\"}",
                           i ? "," : "", names[i], names[i]);
    snprintf(buf + len, sizeof buf - len, "]}");
    j->plan_json = dup(buf);
    j->plan_len = strlen(buf);
    j->plan_mod = 13;
  }
  if (jt->ckpt) {
    j->has_checkpoint = 1;
    j->checkpoint.iteration = (uint64_t)(jt->ckpt - 1);
    snprintf(j->checkpoint.path, sizeof j->checkpoint.path, "/ck/%s", jt->id);
  }
  for (int i = 0; i < MAXP && jt->progress[i].agent; i++)
    j->nprogress++;
  j->progress = calloc((size_t)j->nprogress + 1, sizeof *j->progress);
  assert_non_null(j->progress);
  for (int i = 0; i < j->nprogress; i++) {
    const pr_t *pt = &jt->progress[i];
    wg_progress_entry_t *pe = &j->progress[i];
    snprintf(pe->agent, sizeof pe->agent, "%s", pt->agent);
    pe->mod = pt->mod ? pt->mod : 100;
    pe->progress.state = progress_state(pt->state);
    pe->progress.epoch = pt->epoch;
    pe->progress.iteration = pt->iter;
    pe->progress.time = pt->time;
    pe->progress.rejoin = pt->rejoin;
    snprintf(pe->progress.error, sizeof pe->progress.error, "%s", pt->error ? pt->error : "");
    for (const char *r = pt->unreach; r && *r; r++) {
      pe->progress.unreachable[pe->progress.nunreachable].rank = *r - '0';
      pe->progress.unreachable[pe->progress.nunreachable++].seconds = 5;
    }
  }
  qsort(j->progress, (size_t)j->nprogress, sizeof *j->progress, cmp_progress);
}

static void build(const case_t *c, snapshot_t *s) {
  memset(s, 0, sizeof *s);
  s->agents = calloc(MAXA, sizeof *s->agents);
  s->jobs = calloc(MAXJ, sizeof *s->jobs);
  s->quarantines = calloc(3, sizeof *s->quarantines);
  s->assigns = calloc(6, sizeof *s->assigns);
  s->secrets = calloc(6, sizeof *s->secrets);
  assert_true(s->agents && s->jobs && s->quarantines && s->assigns && s->secrets);
  for (int i = 0; i < MAXA && c->agents[i].name; i++) {
    const ag_t *at = &c->agents[i];
    agent_rec_t *a = &s->agents[s->nagents++];
    char progs[8][WAGMA_API_NAME_MAX];
    snprintf(a->name, sizeof a->name, "%s", at->name);
    snprintf(a->info.address, sizeof a->info.address, "%s:1", at->name);
    a->info.device = at->dev && strcmp(at->dev, "cuda") == 0 ? WAGMA_DEVICE_CUDA : WAGMA_DEVICE_CPU;
    a->info.capacity = 1;
    a->info.reached = at->reached;
    a->info.nprograms = split(at->progs, progs, 8);
    for (int k = 0; k < a->info.nprograms; k++)
      snprintf(a->info.programs[k], sizeof a->info.programs[k], "%.*s",
               (int)sizeof a->info.programs[k] - 1, progs[k]);
    a->create_rev = at->rev ? at->rev : 10;
    a->quarantined = at->quarantined;
  }
  qsort(s->agents, s->nagents, sizeof *s->agents, cmp_agent);
  for (int i = 0; i < MAXJ && c->jobs[i].id; i++)
    build_job(&c->jobs[i], &s->jobs[s->njobs++]);
  for (int i = 0; i < 3 && c->quar[i].agent; i++) {
    const qr_t *qt = &c->quar[i];
    quarantine_rec_t *q = &s->quarantines[s->nquarantines++];
    snprintf(q->agent, sizeof q->agent, "%s", qt->agent);
    q->mod = qt->mod;
    q->q.registration = qt->registration;
    q->q.refusal = qt->refusal;
    snprintf(q->q.job, sizeof q->q.job, "%s", qt->job);
    q->q.since = qt->since;
    q->q.until = qt->until;
    q->q.reachable = qt->reachable;
    q->q.nprobe = qt->nprobe;
  }
  for (int i = 0; i < 6 && c->assigns[i].agent; i++) {
    assign_rec_t *a = &s->assigns[s->nassigns++];
    snprintf(a->agent, sizeof a->agent, "%s", c->assigns[i].agent);
    snprintf(a->a.job, sizeof a->a.job, "%s", c->assigns[i].job);
    a->a.epoch = c->assigns[i].epoch;
    a->mod = c->assigns[i].mod;
  }
  qsort(s->assigns, s->nassigns, sizeof *s->assigns, cmp_assign);
  for (int i = 0; i < 6 && c->secrets[i].job; i++) {
    secret_rec_t *sr = &s->secrets[s->nsecrets++];
    snprintf(sr->job, sizeof sr->job, "%s", c->secrets[i].job);
    sr->epoch = c->secrets[i].epoch;
    sr->mod = c->secrets[i].mod;
  }
}

/* ---- the sink: renders each write --------------------------------------------------------- */

typedef struct {
  char out[8192];
  size_t len;
  int n, fail;
} sink_t;

static void put(sink_t *k, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(k->out + k->len, sizeof k->out - k->len, fmt, ap);
  va_end(ap);
  assert_true(n >= 0 && (size_t)n < sizeof k->out - k->len);
  k->len += (size_t)n;
}

static int record(void *user, wg_sched_write_t *w) {
  sink_t *k = user;
  put(k, "%s", k->n++ ? "; " : "");
  switch (w->kind) {
  case WG_SCHED_QUARANTINE_REFUSAL:
    assert_int_equal(w->q.registration, w->agent->create_rev);
    put(k, "qref %s %s since=%.0f until=%.0f refusal=%lld \"%s\"", w->agent->name, w->q.job,
        w->q.since, w->q.until, (long long)w->q.refusal, w->q.reason);
    break;
  case WG_SCHED_QUARANTINE_CUT:
    assert_int_equal(w->q.registration, w->agent->create_rev);
    put(k, "qcut %s %s until=%.0f probe=", w->agent->name, w->q.job, w->q.until);
    for (int i = 0; i < w->q.nprobe; i++)
      put(k, "%s%s", i ? "," : "", w->q.probe[i]);
    put(k, " \"%s\"", w->q.reason);
    break;
  case WG_SCHED_QUARANTINE_END:
    put(k, "qend %s until=%.0f reachable=%.0f", w->old->agent, w->q.until, w->q.reachable);
    break;
  case WG_SCHED_QUARANTINE_DROP:
    put(k, "qdrop %s%s", w->old->agent, w->agent ? "" : " (gone)");
    break;
  case WG_SCHED_NO_MAJORITY: put(k, "nomaj %s", w->job->id); break;
  case WG_SCHED_JOB_STATUS:
    put(k, "%s %s %s \"%s\"", w->finish ? "finish" : "status", w->job->id,
        wagma_job_state_name(w->status.state), w->status.reason);
    break;
  case WG_SCHED_PLAN:
    assert_int_equal(w->status.epoch, w->plan.epoch);
    assert_int_equal(w->status.start_round, w->plan.start_round);
    assert_int_equal(w->status.nmembers, w->plan.nmembers);
    assert_int_equal(w->status.state, WAGMA_JOB_RUNNING);
    put(k, "plan %s e%llu sr%llu [", w->job->id, (unsigned long long)w->plan.epoch,
        (unsigned long long)w->plan.start_round);
    for (int i = 0; i < w->plan.nmembers; i++) {
      assert_string_equal(w->status.members[i], w->plan.members[i].name);
      put(k, "%s%s%s", i ? "," : "", w->plan.members[i].name, w->plan.members[i].joiner ? "+" : "");
    }
    put(k, "]");
    for (int i = 0; i < w->nassign; i++) {
      put(k, "%s%s", i ? "," : " assign=", w->assign[i].agent);
      if (w->assign[i].assign_mod)
        put(k, "@%lld", (long long)w->assign[i].assign_mod);
    }
    put(k, " \"%s\"", w->status.reason);
    w->nsent = w->nassign;
    break;
  case WG_SCHED_RELEASE:
    put(k, "release");
    for (size_t i = 0; i < w->nkeys; i++)
      put(k, "%s%s@%lld", i ? "," : " ", w->assigns[i]->agent, (long long)w->assigns[i]->mod);
    break;
  case WG_SCHED_DROP_SECRETS:
    put(k, "secrets");
    for (size_t i = 0; i < w->nkeys; i++)
      put(k, "%s%s/%llu@%lld", i ? "," : " ", w->secrets[i]->job,
          (unsigned long long)w->secrets[i]->epoch, (long long)w->secrets[i]->mod);
    break;
  }
  if (k->n == k->fail) {
    put(k, " FAILED");
    return WAGMA_ECONFLICT;
  }
  return 0;
}

static int run_case(const case_t *c) {
  snapshot_t s;
  sink_t k = {.fail = c->fail};
  wg_sched_sink_t sink = {.apply = record, .user = &k};
  wg_sched_opts_t o = {.now = c->now ? c->now : 1000, .quarantine_s = c->quarantine_s};
  build(c, &s);
  wg_sched_pass(&s, &o, &sink);
  wg_sched_drop_secrets(&s, &sink);
  int bad = strcmp(k.out, c->want) != 0;
  if (bad)
    print_error("case \"%s\":\n   got: %s\n  want: %s\n", c->name, k.out, c->want);
  wg_snapshot_free(&s);
  return bad;
}

static void test_cases(void **state) {
  (void)state;
  int bad = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    bad += run_case(&cases[i]);
  assert_int_equal(bad, 0);
}

/* After a plan is written the snapshot has the job's new members (the cleanup releases none of
 * them); after a failed one, the old ones (and the agents taken stay busy for later jobs). */
static void test_outcomes(void **state) {
  (void)state;
  for (int fail = 0; fail <= 1; fail++) {
    const case_t c = {.agents = {{"a"}, {"b"}}, .jobs = {{.id = "j1", .workers = 2}}, .fail = fail};
    snapshot_t s;
    sink_t k = {.fail = c.fail};
    wg_sched_sink_t sink = {.apply = record, .user = &k};
    wg_sched_opts_t o = {.now = 1000};
    build(&c, &s);
    wg_sched_pass(&s, &o, &sink);
    assert_int_equal(s.jobs[0].status.nmembers, fail ? 0 : 2);
    assert_int_equal(s.jobs[0].status.state, fail ? WAGMA_JOB_PENDING : WAGMA_JOB_RUNNING);
    assert_int_equal(s.jobs[0].status.epoch, fail ? 0 : 1);
    assert_true(s.agents[0].busy && s.agents[1].busy);
    assert_true(s.agents[0].touched && s.agents[1].touched);
    wg_snapshot_free(&s);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cases),
      cmocka_unit_test(test_outcomes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
