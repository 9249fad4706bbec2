/* clock.c — the clocks of wagma/clock_internal.h. No state: safe from any thread. */
#include <errno.h>
#include <time.h>

#include "wagma/clock_internal.h"

static double seconds_of(clockid_t clock) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double wg_mono(void) {
  return seconds_of(CLOCK_MONOTONIC);
}

double wg_wall(void) {
  return seconds_of(CLOCK_REALTIME);
}

void wg_sleep_s(double s) {
  if (s <= 0)
    return;
  struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
    ;
}
