/* The test switches (shim/test_switches.h), read once from the
 * environment when the library is loaded (a constructor: getenv only, no
 * allocation, no CUDA), before any intercepted call can read them. */
#include <stdlib.h>

#include "../config/config.h"
#include "test_switches.h"

ps_test_switches_t ps_test;

/* Whether variable `name` is set to a string beginning with '1'. */
static int switch_on(const char *name)
{
    const char *value = getenv(name);
    return value && *value == '1';
}

__attribute__((constructor)) static void read_test_switches(void)
{
    ps_test.skip_host_wait = switch_on("POOLSHIM_TEST_SKIP_HOST_WAIT");
    ps_test.ipc_skew = switch_on("POOLSHIM_TEST_IPC_SKEW");
    ps_test.ignore_captures = switch_on("POOLSHIM_TEST_IGNORE_CAPTURES");
    ps_test.skip_barrier = switch_on("POOLSHIM_TEST_SKIP_BARRIER");
    ps_test.assume_idle = switch_on("POOLSHIM_TEST_ASSUME_IDLE");
    ps_test.wait_returns = switch_on("POOLSHIM_TEST_WAIT_RETURNS");
    ps_test.return_lent = switch_on("POOLSHIM_TEST_RETURN_LENT");
    ps_test.barrier_no_join = switch_on("POOLSHIM_TEST_BARRIER_NO_JOIN");
    ps_test.skip_peer_grant = switch_on("POOLSHIM_TEST_SKIP_PEER_GRANT");
    ps_test.skip_copy_order = switch_on("POOLSHIM_TEST_SKIP_COPY_ORDER");
    ps_test.torch_no_join = switch_on("POOLSHIM_TEST_TORCH_NO_JOIN");
    /* (read by the parser of the configuration's booleans, as it always was; no report) */
    (void)ps_env_bool("POOLSHIM_TEST_NEIGHBOURS_ONE_ATTEMPT", 0, &ps_test.neighbours_one_attempt);
    const char *name = getenv("POOLSHIM_TEST_IPC_NAME");
    ps_test.ipc_name = name && *name ? name : NULL;
    const char *dir = getenv("POOLSHIM_TEST_NEIGHBOURS_DIR");
    ps_test.neighbours_dir = dir && *dir ? dir : NULL;
}
