/* test_agent_device: `wagma-agent --device cuda` where CUDA cannot be used (no GPU, no driver, or
 * a build without the CUDA backend) exits at once (< 2 s) with status 3 and a message naming the
 * cause, and registers nothing (and `--gpu N`'s refusals, status 2 or 3, the same way): the etcd
 * endpoint it is given is a listening socket of this test, which must see no connection. `--device
 * cpu` against the same socket does connect (so the check above can see a registration attempt).
 * Where CUDA is usable the first case is skipped.
 *
 * The agent binary comes from $WAGMA_AGENT_BIN (set by CMake). */
#define _GNU_SOURCE /* accept4, pipe2 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent/train/train.h"
#include "test_train.h"

static const char *agent_bin;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A listening socket on 127.0.0.1 (non-blocking); its port in *port. */
static int listen_any(int *port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  assert_true(fd >= 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
  assert_int_equal(listen(fd, 16), 0);
  socklen_t len = sizeof(a);
  assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  *port = ntohs(a.sin_port);
  return fd;
}

/* 1 when a connection is pending or arrives within wait_s. */
static int connection_seen(int lfd, double wait_s) {
  struct pollfd p = {.fd = lfd, .events = POLLIN};
  if (poll(&p, 1, (int)(wait_s * 1000)) <= 0)
    return 0;
  int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
  if (c >= 0)
    close(c);
  return c >= 0;
}

/* Starts the agent with --device dev and --transport transport against etcd 127.0.0.1:port;
 * stderr into *err_fd. */
static pid_t start_agent_gpu(const char *dev, const char *transport, const char *gpu,
                             const char *cvd, int port, int *err_fd);

static pid_t start_agent(const char *dev, const char *transport, int port, int *err_fd) {
  return start_agent_gpu(dev, transport, NULL, NULL, port, err_fd);
}

/* The same with --gpu gpu (NULL: none) and CUDA_VISIBLE_DEVICES=cvd (NULL: unset). */
static pid_t start_agent_gpu(const char *dev, const char *transport, const char *gpu,
                             const char *cvd, int port, int *err_fd) {
  int pipefd[2];
  assert_int_equal(pipe2(pipefd, O_CLOEXEC), 0);
  char etcd[64];
  snprintf(etcd, sizeof(etcd), "127.0.0.1:%d", port);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(pipefd[1], 2);
    if (cvd)
      setenv("CUDA_VISIBLE_DEVICES", cvd, 1);
    else
      unsetenv("CUDA_VISIBLE_DEVICES");
    execl(agent_bin, agent_bin, "--etcd", etcd, "--name", "device-test", "--listen", "127.0.0.1:1",
          "--device", dev, "--transport", transport, "--etcd-timeout-ms", "500",
          gpu ? "--gpu" : (char *)NULL, gpu, (char *)NULL);
    _exit(127);
  }
  close(pipefd[1]);
  *err_fd = pipefd[0];
  return pid;
}

/* Waits up to limit_s for pid; returns its wait status, or -1 (then it was killed). */
static int wait_for(pid_t pid, double limit_s, double *took) {
  double t0 = now_s();
  int status;
  for (;;) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      *took = now_s() - t0;
      return status;
    }
    if (now_s() - t0 > limit_s) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      *took = now_s() - t0;
      return -1;
    }
    usleep(10000);
  }
}

static void read_all(int fd, char *buf, size_t len) {
  size_t used = 0;
  ssize_t r;
  while (used + 1 < len && (r = read(fd, buf + used, len - 1 - used)) > 0)
    used += (size_t)r;
  buf[used] = '\0';
  close(fd);
}

static void cuda_without_gpu_exits_at_once_and_registers_nothing(void **state) {
  (void)state;
  char why[512] = "";
  int probe = wagma_backend_probe("cuda", why, sizeof(why));
  if (probe == 0) {
    print_message("a CUDA GPU is usable here: the refusal case does not apply\n");
    skip();
  }
  int port, err_fd;
  int lfd = listen_any(&port);
  double t0 = now_s();
  pid_t pid = start_agent("cuda", "tcp", port, &err_fd);
  double took;
  int status = wait_for(pid, 10.0, &took);
  char err[4096];
  read_all(err_fd, err, sizeof(err));
  print_message("wagma-agent --device cuda: %.3f s, status %d, stderr: %s", took,
                status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1, err);
  assert_true(status >= 0 && WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 3);
  assert_true(now_s() - t0 < 2.0);
  assert_non_null(strstr(err, "--device cuda"));
  assert_non_null(strstr(err, why)); /* the cause, as the library states it */
  assert_non_null(strstr(err, "not registering"));
  assert_false(connection_seen(lfd, 0.2)); /* it never talked to "etcd" */
  close(lfd);
}

static void cpu_device_does_contact_etcd(void **state) {
  (void)state;
  int port, err_fd;
  int lfd = listen_any(&port);
  pid_t pid = start_agent("cpu", "tcp", port, &err_fd);
  int seen = connection_seen(lfd, 15.0);
  kill(pid, SIGTERM);
  double took;
  int status = wait_for(pid, 30.0, &took);
  char err[8192];
  read_all(err_fd, err, sizeof(err));
  if (!seen)
    print_error("no connection from wagma-agent --device cpu; stderr: %s\n", err);
  assert_true(seen);
  assert_true(status >= 0); /* it stopped on SIGTERM */
  close(lfd);
}

/* NCCL averages GPU buffers: --transport nccl on a CPU agent is a usage error (status 2), said
 * at once, before anything is registered. */
static void nccl_without_cuda_device_is_a_usage_error(void **state) {
  (void)state;
  int port, err_fd;
  int lfd = listen_any(&port);
  double t0 = now_s();
  pid_t pid = start_agent("cpu", "nccl", port, &err_fd);
  double took;
  int status = wait_for(pid, 10.0, &took);
  char err[4096];
  read_all(err_fd, err, sizeof(err));
  print_message("wagma-agent --device cpu --transport nccl: %.3f s, status %d, stderr: %s", took,
                status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1, err);
  assert_true(status >= 0 && WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 2);
  assert_true(now_s() - t0 < 2.0);
  assert_non_null(strstr(err, "--transport nccl needs --device cuda"));
  assert_false(connection_seen(lfd, 0.2));
  close(lfd);
}

/* Runs the agent with --gpu and the environment given; it must exit with `code` within 2 s,
 * having said `says` and registered nothing. */
static void gpu_refused(const char *dev, const char *gpu, const char *cvd, int code,
                        const char *says, const char *says_too) {
  int port, err_fd;
  int lfd = listen_any(&port);
  double t0 = now_s();
  pid_t pid = start_agent_gpu(dev, "tcp", gpu, cvd, port, &err_fd);
  double took;
  int status = wait_for(pid, 10.0, &took);
  char err[4096];
  read_all(err_fd, err, sizeof(err));
  print_message("wagma-agent --device %s --gpu %s (CUDA_VISIBLE_DEVICES %s): %.3f s, status %d, "
                "stderr: %s",
                dev, gpu, cvd ? cvd : "unset", took,
                status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1, err);
  assert_true(status >= 0 && WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), code);
  assert_true(now_s() - t0 < 2.0);
  assert_non_null(strstr(err, says));
  if (says_too)
    assert_non_null(strstr(err, says_too));
  assert_false(connection_seen(lfd, 0.2));
  close(lfd);
}

/* --gpu: a usage error on a CPU agent and for a GPU its CUDA_VISIBLE_DEVICES does not list or
 * leaves empty (status 2); where CUDA is not usable, GPU N is named in the refusal (status 3,
 * with CUDA_VISIBLE_DEVICES=N as the agent set it). */
static void gpu_choice_is_checked_before_registering(void **state) {
  (void)state;
  gpu_refused("cpu", "1", NULL, 2, "--gpu needs --device cuda", NULL);
  gpu_refused("cuda", "2", "0,1", 2, "--gpu 2: CUDA_VISIBLE_DEVICES='0,1' lists 2 devices", NULL);
  gpu_refused("cuda", "0", "", 2, "no GPU is visible", NULL);
  gpu_refused("cuda", "x", NULL, 2, "--gpu must be an integer", NULL);
  char why[512] = "";
  if (wagma_backend_probe("cuda", why, sizeof(why)) != 0) /* no GPU here: the probe's refusal */
    gpu_refused("cuda", "5", NULL, 3, "--device cuda --gpu 5 (CUDA_VISIBLE_DEVICES=5)",
                "not registering");
  else
    print_message("a CUDA GPU is usable here: the --gpu 5 refusal is not checked\n");
}

int main(void) {
  agent_bin = getenv("WAGMA_AGENT_BIN");
  if (!agent_bin || access(agent_bin, X_OK) != 0) {
    printf("SKIP: WAGMA_AGENT_BIN (%s) is not an executable wagma-agent\n",
           agent_bin ? agent_bin : "unset");
    return 77;
  }
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(cuda_without_gpu_exits_at_once_and_registers_nothing),
      cmocka_unit_test(cpu_device_does_contact_etcd),
      cmocka_unit_test(nccl_without_cuda_device_is_a_usage_error),
      cmocka_unit_test(gpu_choice_is_checked_before_registering),
  };
  return cmocka_run_group_tests_name("agent --device", tests, NULL, NULL);
}
