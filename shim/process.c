/* The shim's state in this process (shim/process.h): two flags read on
 * every call (atomics), exit begun (atomic), the configuration (written
 * once by the initialisation, under its pthread_once, before `initialised`
 * is released), and the switches read by the constructor. */
#include <unistd.h>

#include "process.h"

ps_process_flags_t ps_process_flags;

static atomic_int exiting;                    /* 1 once exit() began */
static int disabled_early;                    /* POOLSHIM_DISABLE=1 seen by the constructor */
static int traces_lookups;                    /* POOLSHIM_TRACE_LOOKUPS=1 */
static pid_t loaded_in;                       /* the process the constructor ran in */
static ps_config_t *config;                   /* the loaded configuration */
static const ps_global_config_t *global;      /* its [global], or the passthrough default */

__attribute__((constructor)) static void read_load_switches(void)
{
    loaded_in = getpid();
    /* the parser the configuration uses; a POOLSHIM_DISABLE that is no
     * boolean is left to ps_config_load, which warns once and passes every
     * call through (global.disable) */
    (void)ps_env_bool("POOLSHIM_DISABLE", 0, &disabled_early);
    (void)ps_env_bool("POOLSHIM_TRACE_LOOKUPS", 1, &traces_lookups);
}

void ps_process_set_initialised(void)
{
    atomic_store_explicit(&ps_process_flags.initialised, 1, memory_order_release);
}
void ps_process_set_active(bool active) { atomic_store(&ps_process_flags.active, active); }

bool ps_process_exiting(void) { return atomic_load(&exiting); }
void ps_process_begin_exit(void)
{
    atomic_store(&exiting, 1);
    atomic_store(&ps_process_flags.active, 0);
}

bool ps_process_disabled_early(void) { return disabled_early; }
bool ps_process_traces_lookups(void) { return traces_lookups; }
pid_t ps_process_loaded_in(void) { return loaded_in; }

ps_config_t *ps_process_config(void) { return config; }
const ps_global_config_t *ps_global_config(void) { return global; }
void ps_process_set_config(ps_config_t *loaded, const ps_global_config_t *effective)
{
    config = loaded;
    global = effective;
}
