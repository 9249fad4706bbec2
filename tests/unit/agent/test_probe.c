/* test_probe.c — the reachability probe (agent/probe.c, wg_probe_reach) on loopback: a
 * listening port connects, a closed port and a malformed address do not (named in why), and
 * the connects run at once under one deadline. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "agent/probe.h"

/* A listening socket on 127.0.0.1 (*port set), or a bound one that does not listen. */
static int open_port(int do_listen, int *port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  assert_true(fd >= 0);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  if (do_listen)
    assert_int_equal(listen(fd, 16), 0);
  assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  *port = ntohs(a.sin_port);
  return fd;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void test_reach(void **state) {
  (void)state;
  int up_port, down_port;
  int up = open_port(1, &up_port), down = open_port(0, &down_port);
  char addrs[4][WAGMA_API_ADDR_MAX], why[160];
  snprintf(addrs[0], sizeof addrs[0], "127.0.0.1:%d", up_port);
  snprintf(addrs[1], sizeof addrs[1], "127.0.0.1:%d", up_port);
  assert_int_equal(
      wg_probe_reach((const char(*)[WAGMA_API_ADDR_MAX])addrs, 2, 1.0, why, sizeof why), 2);
  assert_string_equal(why, "");
  snprintf(addrs[1], sizeof addrs[1], "127.0.0.1:%d", down_port); /* refused */
  snprintf(addrs[2], sizeof addrs[2], "no-port-here");
  snprintf(addrs[3], sizeof addrs[3], "[::1]:%d", down_port);
  double t0 = now_s();
  assert_int_equal(
      wg_probe_reach((const char(*)[WAGMA_API_ADDR_MAX])addrs, 4, 1.0, why, sizeof why), 1);
  assert_true(now_s() - t0 < 1.0); /* refusals answer at once: no deadline waited */
  assert_non_null(strstr(why, addrs[1]));
  close(up);
  close(down);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_reach)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
