/* clock.c — the clocks of wagma/clock_internal.h. No state: safe from any thread. */
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
