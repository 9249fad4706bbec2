/* world.c — see world.h. */
#define _GNU_SOURCE
#include "world.h"

#include "tcp_internal.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int world_init(world_t *w, int nranks, size_t shared_len) {
  memset(w, 0, sizeof *w);
  w->nranks = nranks;
  w->epoch = 1;
  w->plan.nranks = nranks;
  w->plan.group_size = 2;
  w->plan.staleness_bound = 8;
  w->plan.members = calloc((size_t)nranks, sizeof *w->plan.members);
  int *fds = calloc((size_t)nranks, sizeof *fds);
  if (w->plan.members == NULL || fds == NULL)
    return -1;
  int rc = 0;
  /* Keep every probe socket open until all are chosen, so the ports are distinct. */
  for (int r = 0; r < nranks; r++) {
    fds[r] = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fds[r] < 0 || bind(fds[r], (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fds[r], (struct sockaddr *)&a, &len) != 0) {
      rc = -1;
      break;
    }
    snprintf(w->plan.members[r].name, WAGMA_NAME_MAX, "w%d", r);
    snprintf(w->plan.members[r].address, WAGMA_ADDRESS_MAX, "127.0.0.1:%u",
             (unsigned)ntohs(a.sin_port));
  }
  for (int r = 0; r < nranks; r++)
    if (fds[r] > 0)
      close(fds[r]);
  free(fds);
  /* A secret per world, as the coordinator makes one per epoch. */
  unsigned seed = (unsigned)getpid() * 2654435761u ^ (unsigned)time(NULL);
  for (size_t i = 0; i < sizeof w->secret; i++)
    w->secret[i] = (uint8_t)(rand_r(&seed) >> 7);
  w->secret_len = sizeof w->secret;
  w->shared_len = shared_len ? shared_len : 4096;
  w->shared = mmap(NULL, w->shared_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (w->shared == MAP_FAILED) {
    w->shared = NULL;
    rc = -1;
  }
  return rc;
}

void world_free(world_t *w) {
  free(w->plan.members);
  if (w->shared != NULL)
    munmap(w->shared, w->shared_len);
  memset(w, 0, sizeof *w);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int world_run(world_t *w, world_fn fn, void *arg, double timeout_s, const int *mode, int *codes,
              int (*parent_fn)(world_t *w, void *arg), int *parent_rc) {
  int n = w->nranks;
  pid_t *pids = calloc((size_t)n, sizeof *pids);
  int rc = 0;
  fflush(NULL);
  for (int r = 0; r < n; r++) {
    codes[r] = -1000;
    int m = mode ? mode[r] : WORLD_SPAWN;
    if (!(m & WORLD_SPAWN))
      continue;
    pid_t pid = fork();
    if (pid == 0) {
      alarm((unsigned)timeout_s + 5); /* belt and braces: a child never outlives the test */
      int code = fn(w, r, arg);
      fflush(NULL);
      /* What the parent allocated before the fork is the child's to free too. */
      free(pids);
      free(w->plan.members);
      w->plan.members = NULL;
      exit(code); /* exit, not _exit: LeakSanitizer checks the child in ASan builds */
    }
    pids[r] = pid;
  }
  if (parent_fn != NULL) {
    int prc = parent_fn(w, arg);
    if (parent_rc != NULL)
      *parent_rc = prc;
  }
  double deadline = now_s() + timeout_s;
  int left = 0;
  for (int r = 0; r < n; r++)
    left += pids[r] > 0;
  while (left > 0) {
    int others_running = 0;
    for (int r = 0; r < n; r++) {
      if (pids[r] <= 0)
        continue;
      int status;
      pid_t p = waitpid(pids[r], &status, WNOHANG);
      if (p == pids[r]) {
        codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
        pids[r] = 0;
        left--;
      } else if (!(mode && (mode[r] & WORLD_KILL_LAST))) {
        others_running++;
      }
    }
    if (left > 0 && others_running == 0) {
      for (int r = 0; r < n; r++)
        if (pids[r] > 0)
          kill(pids[r], SIGKILL);
    }
    if (left > 0 && now_s() > deadline) {
      fprintf(stderr, "world: timeout after %.0f s, killing %d children\n", timeout_s, left);
      for (int r = 0; r < n; r++)
        if (pids[r] > 0)
          kill(pids[r], SIGKILL);
      rc = -1;
      deadline = 1e300;
    }
    if (left > 0)
      usleep(5000);
  }
  free(pids);
  return rc;
}

void world_log(void *user, int level, const char *msg) {
  (void)user;
  if (level >= WAGMA_LOG_WARN || getenv("WAGMA_TEST_VERBOSE") != NULL)
    fprintf(stderr, "[pid %d] %s: %s\n", (int)getpid(), wagma_log_level_name(level), msg);
}

int world_open(world_t *w, int rank, size_t max_payload, double connect_timeout_s,
               wg_transport_t **t) {
  wg_transport_config_t cfg = {0};
  cfg.plan = &w->plan;
  cfg.rank = rank;
  cfg.epoch = w->epoch;
  cfg.max_payload = max_payload;
  cfg.connect_timeout_s = connect_timeout_s;
  cfg.auth.secret = w->secret_len > 0 ? w->secret : NULL;
  cfg.auth.secret_len = w->secret_len;
  cfg.auth.seal = w->seal;
  cfg.log = world_log;
  return wg_tcp_transport.open(&cfg, t);
}

int world_open_as(const wagma_plan_t *plan, uint64_t epoch, int rank, const uint8_t *secret,
                  size_t secret_len, double connect_timeout_s, wg_transport_t **t) {
  wg_transport_config_t cfg = {0};
  cfg.plan = plan;
  cfg.rank = rank;
  cfg.epoch = epoch;
  cfg.connect_timeout_s = connect_timeout_s;
  cfg.auth.secret = secret;
  cfg.auth.secret_len = secret_len;
  cfg.log = world_log;
  return wg_tcp_transport.open(&cfg, t);
}

static int count_dir(const char *path) {
  DIR *d = opendir(path);
  if (d == NULL)
    return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.')
      n++;
  closedir(d);
  return n;
}

int world_count_fds(void) {
  return count_dir("/proc/self/fd");
}

int world_count_threads(void) {
  return count_dir("/proc/self/task");
}

int world_raw_connect(const char *address, double deadline) {
  char host[64];
  unsigned port;
  if (sscanf(address, "%63[^:]:%u", host, &port) != 2)
    return -1;
  while (now_s() < deadline) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, host, &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
      struct timeval tv = {.tv_sec = 10};
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      return fd;
    }
    close(fd);
    usleep(10000);
  }
  return -1;
}

int world_raw_write(int fd, const void *p, size_t n) {
  return send(fd, p, n, MSG_NOSIGNAL) == (ssize_t)n ? 0 : -1;
}

int world_raw_wait_dropped(int fd) {
  char b[256];
  double deadline = now_s() + 10;
  while (now_s() < deadline) {
    ssize_t n = recv(fd, b, sizeof b, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
      return 0;
  }
  return -1;
}

static int raw_send_hello(const world_t *w, int fd, int as, int step, int claim_auth,
                          const uint8_t *payload, size_t len) {
  uint8_t b[WG_FRAME_HEADER_SIZE + WG_HELLO_MAX_LEN];
  wg_frame_header_t h = {.magic = WG_FRAME_MAGIC,
                         .version = WG_FRAME_VERSION,
                         .kind = WG_FRAME_HELLO,
                         .epoch = w->epoch,
                         .src = (uint32_t)as,
                         .seq = (uint64_t)step,
                         .length = len,
                         .aux = (uint64_t)w->nranks,
                         .flags = claim_auth ? WG_HELLO_F_AUTH : 0};
  wg_frame_encode(&h, b);
  memcpy(b + WG_FRAME_HEADER_SIZE, payload, len);
  return world_raw_write(fd, b, WG_FRAME_HEADER_SIZE + len);
}

int world_raw_handshake(const world_t *w, int fd, int as, int dst, const uint8_t *secret,
                        size_t secret_len, int claim_auth) {
  wg_transport_auth_t auth = {.secret = secret, .secret_len = secret_len};
  uint8_t nonce_d[WG_HELLO_NONCE_LEN], reply[WG_FRAME_HEADER_SIZE + WG_HELLO_STEP2_LEN];
  unsigned seed = (unsigned)getpid() ^ (unsigned)(now_s() * 1e6);
  for (size_t i = 0; i < sizeof nonce_d; i++)
    nonce_d[i] = (uint8_t)(rand_r(&seed) >> 7);
  if (raw_send_hello(w, fd, as, 1, claim_auth, nonce_d, sizeof nonce_d) != 0)
    return -1;
  wg_frame_header_t h;
  if (recv(fd, reply, sizeof reply, MSG_WAITALL) != (ssize_t)sizeof reply ||
      wg_frame_decode(reply, WG_FRAME_HEADER_SIZE, w->epoch, (uint32_t)w->nranks, WG_HELLO_MAX_LEN,
                      &h) != 0 ||
      h.kind != WG_FRAME_HELLO || h.seq != 2 || h.src != (uint32_t)dst ||
      h.length != WG_HELLO_STEP2_LEN)
    return -1;
  const uint8_t *nonce_a = reply + WG_FRAME_HEADER_SIZE;
  uint8_t want[WG_HELLO_PROOF_LEN], proof[WG_HELLO_PROOF_LEN];
  if (wg_tcp_hello_proof(&auth, WG_HELLO_ACCEPTOR, w->epoch, as, dst, w->nranks, nonce_d, nonce_a,
                         want) != 0 ||
      wg_tcp_hello_proof(&auth, WG_HELLO_DIALER, w->epoch, as, dst, w->nranks, nonce_d, nonce_a,
                         proof) != 0)
    return -1;
  int verified = memcmp(want, nonce_a + WG_HELLO_NONCE_LEN, sizeof want) == 0;
  if (raw_send_hello(w, fd, as, 3, claim_auth, proof, sizeof proof) != 0)
    return -1;
  return verified ? 0 : 1;
}
