/* coordinator/scheduler.h — the scheduler (scheduler.c): membership and lifecycle, the reconcile
 * thread. */
#ifndef WAGMA_COORD_SCHEDULER_H
#define WAGMA_COORD_SCHEDULER_H

#include "coord.h"

typedef struct wg_scheduler wg_scheduler_t;

/* Starts the reconcile thread (observes always, writes when the election says we lead). */
int wg_scheduler_start(wg_coord_t *c, wg_scheduler_t **out);
void wg_scheduler_stop(wg_scheduler_t *s);
/* Asks for a reconcile pass soon (e.g. after a REST mutation). */
void wg_scheduler_poke(wg_scheduler_t *s);

#endif
