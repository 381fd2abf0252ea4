/* Our dlsym: the way into programs that link cudart statically.
 *
 * 1. Exported twice, as dlsym@GLIBC_2.2.5 (programs built against older
 *    glibc) and dlsym@@GLIBC_2.34 (newer): a preloaded library that
 *    defines only one of them misses half the programs.
 * 2. For a name we hook (cuGetProcAddress*, cuMemAlloc_v2, cudaMalloc...),
 *    look up the real symbol on the caller's handle; if it exists, note it
 *    as the real function (unless it is our own export) and return our hook.
 * 3. Everything else goes to the real dlsym as a *tail call*: glibc's dlsym
 *    resolves RTLD_NEXT relative to its return address, which after a tail
 *    call is still the original caller's. An ordinary call would make
 *    RTLD_NEXT relative to the shim and could send a wrapper library's
 *    RTLD_NEXT lookup back into itself (the recursion trap HAMi-core hit).
 *    tests/shim checks RTLD_NEXT through a wrapper library.
 * 4. The real dlsym comes from dlvsym (real.c), never from dlsym itself.
 */
#include <dlfcn.h>
#include <stdio.h>

#include "hooks.h"
#include "real.h"

static void *hooked_lookup(void *handle, const char *symbol)
{
    const ps_hook_t *h = ps_hook_by_name(symbol);
    if (ps_process_traces_lookups())
        dprintf(2, "poolshim: trace: dlsym(%s)%s\n", symbol, h ? " -> hooked" : "");
    if (!h)
        return NULL;
    void *real = ps_real_dlsym(handle, symbol);
    if (!real)
        return NULL;
    if (!ps_is_our_hook(real))
        ps_real_note(symbol, real);
    return h->hook;
}

#define DLSYM_BODY                                                                   \
    if (PS_UNLIKELY(!ps_real_dlsym))                                                 \
        ps_real_find_dlsym(); /* called before our constructor (another preload) */  \
    if (symbol && symbol[0] == 'c' && symbol[1] == 'u' && !ps_process_disabled_early()) {      \
        void *hook = hooked_lookup(handle, symbol);                                  \
        if (hook)                                                                    \
            return hook;                                                             \
    }                                                                                \
    return ps_real_dlsym(handle, symbol); /* tail call: keeps RTLD_NEXT right */

__attribute__((optimize("optimize-sibling-calls"), no_sanitize("address", "undefined", "thread"))) PS_EXPORT void *ps_dlsym_234(void *handle, const char *symbol)
{
    DLSYM_BODY
}

__attribute__((optimize("optimize-sibling-calls"), no_sanitize("address", "undefined", "thread"))) PS_EXPORT void *ps_dlsym_225(void *handle, const char *symbol)
{
    DLSYM_BODY
}

__asm__(".symver ps_dlsym_234, dlsym@@GLIBC_2.34");
__asm__(".symver ps_dlsym_225, dlsym@GLIBC_2.2.5");
