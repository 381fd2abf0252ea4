/* What the hook files share: the table of hooked names (shim/hook_table.c),
 * which dlsym (hooks_dlsym.c) and cuGetProcAddress (hooks_driver.c) hand
 * out. A hook file calls the router, real.c, this table and the leaves
 * (stats.c; hooks_copy.c: copy_order.c); never another hook file, the
 * GPU-ops table or the registry. */
#ifndef PS_SHIM_HOOKS_H
#define PS_SHIM_HOOKS_H

#include "common.h"

/* Hooks handed out by dlsym and cuGetProcAddress (hook_table.c). */
typedef struct ps_hook {
    const char *name; /* exported symbol name */
    void *hook;       /* our function */
    void **real;      /* where the real function's address is kept */
} ps_hook_t;
/* Our hook for `name`, or NULL. */
const ps_hook_t *ps_hook_by_name(const char *name);
/* Our hook replacing the real function at `fn`, or NULL. */
const ps_hook_t *ps_hook_by_real(void *fn);
/* True when `fn` is one of our hooks. */
bool ps_is_our_hook(void *fn);

#endif
