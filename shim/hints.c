/* Hints at exit (hints.h: ps_hints_at_exit): a framework whose own cache
 * keeps memory away from poolshim. Runs right after the exit report
 * (router.c, report_at_exit), so it follows its rules: memory only, no
 * CUDA call, not in a forked child. The loaded objects are looked at here, once,
 * with dl_iterate_phdr: nothing on the allocation path.
 *
 *   PyTorch (libc10_cuda.so or libtorch_cuda.so loaded): its caching
 *   allocator is on unless PYTORCH_NO_CUDA_MEMORY_CACHING is set to other
 *   than "0" (or PYTORCH_CUDA_ALLOC_CONF picks the cudaMallocAsync backend,
 *   which allocates per tensor): the environment decides.
 *   CuPy (.../cupy/cuda/memory... or cupy_backends/cuda/... loaded): its
 *   pool cannot be seen from the environment, so fewer than
 *   PS_HINT_CUPY_FEW allocations served decides.
 *
 * Each hint is one warning (POOLSHIM_VERBOSE=0 silences it), printed only
 * when the shim served at least one allocation. */
#include <link.h>
#include <stdlib.h>
#include <string.h>

#include "hints.h"
#include "stats.h"

#define PS_HINT_CUPY_FEW 64

enum { SEEN_PYTORCH = 1, SEEN_CUPY = 2 };

static int look_at_object(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    int *seen = data;
    const char *name = info->dlpi_name;
    if (!name || !*name)
        return 0;
    if (strstr(name, "libc10_cuda.so") || strstr(name, "libtorch_cuda.so"))
        *seen |= SEEN_PYTORCH;
    if (strstr(name, "/cupy/cuda/memory") || strstr(name, "cupy_backends/cuda"))
        *seen |= SEEN_CUPY;
    return 0;
}

/* Is PyTorch's caching allocator on, as the environment says? */
static int pytorch_cache_on(void)
{
    const char *off = getenv("PYTORCH_NO_CUDA_MEMORY_CACHING");
    if (off && strcmp(off, "0") != 0)
        return 0;
    const char *conf[] = {getenv("PYTORCH_CUDA_ALLOC_CONF"), getenv("PYTORCH_ALLOC_CONF")};
    for (int i = 0; i < 2; i++)
        if (conf[i] && strstr(conf[i], "cudaMallocAsync"))
            return 0;
    return 1;
}

void ps_hints_at_exit(void)
{
    static int done;
    if (done || ps_verbosity < PS_MSG_WARNING)
        return;
    done = 1;
    int seen = 0;
    dl_iterate_phdr(look_at_object, &seen);
    if (!seen)
        return;
    unsigned long long served = (unsigned long long)ps_stats_allocations_total();
    if (!served)
        return;
    if ((seen & SEEN_PYTORCH) && pytorch_cache_on())
        ps_warning("PyTorch's caching allocator was on, so poolshim served only %llu allocations (its cache "
                   "holds the memory); run with PYTORCH_NO_CUDA_MEMORY_CACHING=1 to let poolshim serve PyTorch",
                   served);
    if ((seen & SEEN_CUPY) && served < PS_HINT_CUPY_FEW)
        ps_warning("CuPy was loaded and poolshim served only %llu allocations: CuPy's memory pool may be on; "
                   "cupy.cuda.set_allocator(None) lets poolshim serve it",
                   served);
}
