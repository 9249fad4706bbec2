/* process.h — child processes for integration tests (CMake target wagma_test_process).
 *
 * Spawns programs with fork/exec, their stdout and stderr appended to a log file; every child
 * gets PR_SET_PDEATHSIG(SIGKILL), so a crashed test leaves nothing running. Stops them BY PID
 * with a grace period and a SIGKILL after it. Also: free 127.0.0.1 ports, waiting until a port
 * accepts connections, a monotonic clock and a sleep that resumes after signals.
 *
 *   pid_t pid = proc_spawn((const char *const[]){"/bin/prog", "--flag", NULL}, "/tmp/x.log", NULL);
 *   ...
 *   proc_stop(pid, SIGTERM, 10.0);
 *
 * Not thread-safe (proc_free_port_low keeps a seed). Functions return 0 / -1 (or a pid / port,
 * -1 on failure) and never abort: callers assert. */
#ifndef WAGMA_TEST_PROCESS_H
#define WAGMA_TEST_PROCESS_H

#include <sys/types.h>

/* Monotonic seconds. */
double proc_now(void);
/* Sleeps s seconds, resuming after signals. */
void proc_sleep(double s);

/* A port the kernel considers free right now on 127.0.0.1 (bind to 0, read, close); -1. */
int proc_free_port(void);
/* n distinct such ports (all held bound until every one is read) into ports; 0 or -1. */
#define PROC_MAX_FREE_PORTS 128
int proc_free_ports(int n, int *ports);
/* A free port below the ephemeral range (20000..31999, randomized): for a port bound only
 * later, which an ephemeral port could be taken by an outgoing connection by then; -1. */
int proc_free_port_low(void);

/* fork + exec argv (argv[0] = path, NULL-terminated) with stdout and stderr appended to log
 * (NULL = inherited). env (NULL-terminated, may be NULL) is applied in the child first:
 * "NAME=value" sets, "NAME" unsets. Returns the child's pid or -1. */
pid_t proc_spawn(const char *const argv[], const char *log, const char *const env[]);

/* Waits for pid up to timeout_s; SIGKILLs and reaps it when that passes. Returns the wait
 * status, or -1 when it had to be killed (or waitpid failed). */
int proc_wait(pid_t pid, double timeout_s);

/* Sends SIGCONT (a stopped child must see sig) and sig, waits up to grace_s, then SIGKILLs;
 * always reaps. pid <= 0 is a no-op. Returns what proc_wait returns. */
int proc_stop(pid_t pid, int sig, double grace_s);

#endif
