/* Live statistics (shim/live.c): what this process holds, requested and
 * spent in allocation, published for `poolshim top` by the give-back thread. */
#ifndef PS_SHIM_LIVE_H
#define PS_SHIM_LIVE_H

#include <stdbool.h>
#include <stdint.h>

/* How often the give-back thread publishes (shim/give_back.c). */
#define PS_LIVE_PERIOD_MS 500

/* Writes this process's page (the give-back thread only). The first call
 * decides whether there is a registry to publish in; without one (or with
 * neighbour_release off) it says so once at info level and returns false:
 * then there is no need to call it again. */
bool ps_live_publish(void);
/* Removes the page (the give-back thread's stop, after the join). */
void ps_live_remove(void);

#endif
