/* Neighbours (shim/neighbours.h): not yet built. No registry: no one can
 * ask this process, and it asks no one. */
#include "neighbours.h"

#include "../core/common.h"

int ps_neighbours_open(void) { return PS_EUNSUPPORTED; }
void ps_neighbours_close(void) {}
int ps_neighbours_fd(void) { return -1; }
void ps_neighbours_serve(void) {}
uint64_t ps_neighbours_ask(int device)
{
    (void)device;
    return 0;
}
