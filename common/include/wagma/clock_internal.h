/* wagma/clock_internal.h — the clocks every wagma part reads, in seconds as doubles.
 * Internal to wagma (wg_ prefix); not part of any public API. Thread-safe. */
#ifndef WAGMA_CLOCK_INTERNAL_H
#define WAGMA_CLOCK_INTERNAL_H

double wg_mono(void);      /* CLOCK_MONOTONIC seconds: deadlines and durations */
double wg_wall(void);      /* CLOCK_REALTIME seconds since the Unix epoch: timestamps */
void wg_sleep_s(double s); /* sleeps s seconds (resumed after a signal); s <= 0: returns */

#endif
