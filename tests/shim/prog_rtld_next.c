/* Calls getuid() through libwrapnext (preloaded after poolshim) and checks
 * that the wrapper's RTLD_NEXT lookup reached libc once, not itself. */
#include <sys/syscall.h>
#include <unistd.h>

#include "prog_common.h"

int main(void)
{
    int *calls = (int *)dlsym(RTLD_DEFAULT, "wrapnext_calls");
    CHECK(calls != NULL, "libwrapnext.so must be preloaded");
    uid_t u = getuid();
    CHECK(u == (uid_t)syscall(SYS_getuid), "getuid through the wrapper returned %d", (int)u);
    CHECK(calls && *calls == 1, "the wrapper ran %d times (RTLD_NEXT resolved back into it)", calls ? *calls : -1);
    return finish("rtld_next");
}
