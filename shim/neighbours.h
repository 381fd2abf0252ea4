/* Neighbours: the processes of this user under poolshim that share a GPU
 * (shim/neighbours.c). One that would fail an allocation for lack of
 * memory asks the others to give back free memory, and tries once more. */
#ifndef PS_SHIM_NEIGHBOURS_H
#define PS_SHIM_NEIGHBOURS_H

#include <stdbool.h>
#include <stdint.h>

/* Joins the registry and opens this process's request socket (the
 * give-back thread, before it starts); PS_OK or an error (then no one can
 * ask this process, and it can still ask others). */
int ps_neighbours_open(void);
/* Leaves the registry and closes the socket (the give-back thread, at exit). */
void ps_neighbours_close(void);
/* The socket the give-back thread polls for requests, or -1. */
int ps_neighbours_fd(void);
/* Serves the requests waiting on the socket (give-back thread). */
void ps_neighbours_serve(void);
/* Asks every neighbour on device d's GPU to give back free memory and waits
 * up to global.neighbour_wait_ms for their answers (less once all answered,
 * or once `wanted` bytes were given; 0: any); returns the bytes they said
 * they gave (0: none answered, or neighbour_release is off). Called by a
 * program's thread that holds no lock of the shim, never inside the shim. */
uint64_t ps_neighbours_ask(int device, uint64_t wanted);

/* The registry as other modules use it (shim/live.c): true when its
 * directory is this user's and private (checked once, made if absent; a
 * refused one was warned about), then *dir is its path and *name this
 * process's entry name, p<pid>-<start>-<pidns>, to which they add a suffix
 * of their own. False also with neighbour_release off. */
bool ps_neighbours_registry(const char **dir, const char **name);

#endif
