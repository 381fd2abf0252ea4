/* The give-back thread (shim/give_back.c): the decay while the program
 * runs, and answers to neighbour processes. */
#ifndef PS_SHIM_GIVE_BACK_H
#define PS_SHIM_GIVE_BACK_H

/* Starts the thread once (lifecycle.c, when the first stack is built); a
 * no-op when global.decay_ms is 0 and neighbour_release is off. */
void ps_give_back_start(void);
/* Wakes and joins it (lifecycle.c, exit_begins). */
void ps_give_back_stop(void);
/* In a forked child: there is no thread; start none. */
void ps_give_back_atfork_child(void);

#endif
