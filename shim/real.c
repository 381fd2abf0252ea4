/* The real CUDA functions, found without ever going through our own hooks.
 *
 * 1. dlsym itself: we export dlsym, so the real one comes from dlvsym
 *    (which we do not override), versioned GLIBC_2.34 or GLIBC_2.2.5.
 * 2. Driver functions: dlopen("libcuda.so.1") and the real dlsym on that
 *    handle. A handle lookup searches libcuda and its dependencies only,
 *    never the preloaded shim, so these are libcuda's own functions.
 *    Loaded lazily on first use (no CUDA work in constructors).
 * 3. Runtime functions: RTLD_NEXT from the shim finds libcudart when the
 *    program linked it. Python extensions load libcudart RTLD_LOCAL, which
 *    RTLD_NEXT cannot see: then we look for a loaded "libcudart.so*" with
 *    dl_iterate_phdr and dlopen(RTLD_NOLOAD) it.
 */
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <string.h>

#include "real.h"

ps_real_t ps_real;
void *(*ps_real_dlsym)(void *, const char *);
PS_TLS int ps_in_shim;

static void *libcuda_handle;
static pthread_once_t driver_once = PTHREAD_ONCE_INIT;
static int driver_status = PS_EUPSTREAM;

/* Not instrumented: a sanitizer runtime calls our dlsym before its own
 * shadow memory exists. */
__attribute__((constructor, no_sanitize("address", "undefined", "thread"))) void ps_real_find_dlsym(void)
{
    if (ps_real_dlsym)
        return;
    void *f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!f)
        f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    ps_real_dlsym = (void *(*)(void *, const char *))f;
}

static void load_driver_once(void)
{
    ps_real_find_dlsym();
    libcuda_handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!libcuda_handle)
        libcuda_handle = dlopen("libcuda.so.1", RTLD_NOW);
    if (!libcuda_handle) {
        ps_warning("cannot load libcuda.so.1 (%s): passing every call through", dlerror());
        return;
    }
#define PS_LOAD_REAL(name, ret, params)                                                 \
    if (!ps_real.name)                                                                  \
        ps_real.name = (ps_##name##_fn)ps_real_dlsym(libcuda_handle, #name);
    PS_REAL_DRIVER(PS_LOAD_REAL)
#undef PS_LOAD_REAL
    if (!ps_real.cuMemAlloc_v2 || !ps_real.cuMemFree_v2 || !ps_real.cuCtxGetCurrent ||
        !ps_real.cuEventRecord || !ps_real.cuEventQuery) {
        ps_warning("libcuda.so.1 lacks required functions: passing every call through");
        return;
    }
    driver_status = PS_OK;
}

int ps_real_load_driver(void)
{
    pthread_once(&driver_once, load_driver_once);
    return driver_status;
}

struct find_cudart {
    char path[4096]; /* the first loaded object named libcudart.so* */
};

static int find_cudart_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    struct find_cudart *f = data;
    const char *base = info->dlpi_name ? strrchr(info->dlpi_name, '/') : NULL;
    base = base ? base + 1 : info->dlpi_name;
    if (base && strncmp(base, "libcudart.so", 12) == 0) {
        strncpy(f->path, info->dlpi_name, sizeof f->path - 1);
        return 1;
    }
    return 0;
}

void *ps_real_runtime_lookup(const char *name, void **slot)
{
    ps_real_find_dlsym();
    void *fn = ps_real_dlsym(RTLD_NEXT, name);
    if (!fn) {
        struct find_cudart f = {{0}};
        if (dl_iterate_phdr(find_cudart_cb, &f) && f.path[0]) {
            void *h = dlopen(f.path, RTLD_LAZY | RTLD_NOLOAD);
            if (h) {
                fn = ps_real_dlsym(h, name);
                dlclose(h); /* NOLOAD took a reference; the program still holds its own */
            }
        }
    }
    if (fn)
        __atomic_store_n(slot, fn, __ATOMIC_RELEASE);
    return fn;
}

void ps_real_note(const char *name, void *fn)
{
#define PS_NOTE_REAL(fname, ret, params)                                                \
    if (strcmp(name, #fname) == 0) {                                                    \
        if (!ps_real.fname)                                                             \
            __atomic_store_n((void **)&ps_real.fname, fn, __ATOMIC_RELEASE);            \
        return;                                                                         \
    }
    PS_REAL_DRIVER(PS_NOTE_REAL)
    PS_REAL_RUNTIME(PS_NOTE_REAL)
#undef PS_NOTE_REAL
}
