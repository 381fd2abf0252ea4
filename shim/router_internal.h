/* What the router's two files share: shim/router.c (init, routing) and
 * shim/oom.c (the out-of-memory retry). No other file includes it. */
#ifndef PS_SHIM_ROUTER_INTERNAL_H
#define PS_SHIM_ROUTER_INTERNAL_H

#include "router.h"

/* ---- oom.c ---- */
/* An allocation on device d found no memory after this process's own
 * give-back: asks the neighbours (10. of router.c); true when it is worth
 * making once more. */
bool ps_route_neighbours_gave(int d, uint64_t wanted, uint64_t epoch);

#endif
