/* The shim's state in this process (shim/process.c keeps it): whether it
 * routes allocations, whether exit() began, the configuration it runs
 * with, and the switches read at load. Every other module reads them
 * through these functions; only the router's initialisation and the
 * device lifecycle (exit, fork) change them. */
#ifndef PS_SHIM_PROCESS_H
#define PS_SHIM_PROCESS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <sys/types.h>

#include "../config/config.h"

/* The two flags every intercepted call reads (ps_shim_ensure_init,
 * router.h), inline; use the functions below, never the fields. */
typedef struct ps_process_flags {
    atomic_int initialised; /* 1 once the first initialisation has run */
    atomic_int active;      /* 1 while the shim routes allocations */
} ps_process_flags_t;
extern ps_process_flags_t ps_process_flags;

/* Whether the first initialisation has run (acquire: what it set is seen). */
static inline bool ps_process_initialised(void)
{
    return atomic_load_explicit(&ps_process_flags.initialised, memory_order_acquire);
}
/* Whether the shim routes allocations: false in passthrough
 * (POOLSHIM_DISABLE, a bad config with on_error=passthrough, a forked
 * child of a CUDA parent) and from the start of exit() on. */
static inline bool ps_process_active(void)
{
    return atomic_load_explicit(&ps_process_flags.active, memory_order_relaxed);
}
void ps_process_set_initialised(void);
void ps_process_set_active(bool active);

/* Whether exit() began (the lifecycle's exit_begins): the shim starts no
 * CUDA call any more; a free of one of its blocks just forgets it. */
bool ps_process_exiting(void);
/* exit() began: exiting from now on, and no longer active. */
void ps_process_begin_exit(void);

/* POOLSHIM_DISABLE=1 was set at load: hooks are never handed out. */
bool ps_process_disabled_early(void);
/* POOLSHIM_TRACE_LOOKUPS=1: every driver/runtime name looked up through
 * dlsym or cuGetProcAddress is printed, with whether it is hooked. */
bool ps_process_traces_lookups(void);
/* The process the shim was loaded in (a forked child has another pid). */
pid_t ps_process_loaded_in(void);

/* The loaded configuration, from which the stacks are built (NULL before
 * the initialisation, or when it could not be loaded). */
ps_config_t *ps_process_config(void);
/* Its [global] section, the effective one (a passthrough default when the
 * configuration failed); valid once ps_process_initialised(). */
const ps_global_config_t *ps_global_config(void);
/* Set by the initialisation: the configuration and the global section. */
void ps_process_set_config(ps_config_t *config, const ps_global_config_t *global);

#endif
