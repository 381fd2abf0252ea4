/* A wrapper library in the style of many profilers: it defines getuid()
 * and forwards to the next definition with dlsym(RTLD_NEXT). Preloaded
 * after poolshim, it proves that our dlsym keeps RTLD_NEXT relative to the
 * real caller: otherwise the lookup would find this very function again. */

#include <dlfcn.h>
#include <sys/types.h>

__attribute__((visibility("default"))) int wrapnext_calls;

__attribute__((visibility("default"))) uid_t getuid(void)
{
    static __thread int depth;
    uid_t (*next)(void) = (uid_t(*)(void))dlsym(RTLD_NEXT, "getuid");
    wrapnext_calls++;
    if (++depth > 3 || !next) { /* would recurse forever: report it instead */
        depth--;
        return (uid_t)-2;
    }
    uid_t r = next();
    depth--;
    return r;
}
