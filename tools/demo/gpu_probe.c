/* gpu_probe: whether `make demo` can run its CUDA program here.
 *
 *   gpu_probe [LIBCUDA]     (default libcuda.so.1, the driver's library)
 *
 * Loads the driver's library, calls cuInit(0) and cuDeviceGetCount: exit 0
 * and nothing printed when at least one GPU answers; otherwise exit 1 with
 * one line on stdout saying what is missing (no driver, a driver that does
 * not start, no device). Needs no CUDA toolkit: built with the C compiler.
 */
#include <dlfcn.h>
#include <stdio.h>

typedef int (*cu_init_fn)(unsigned int flags);
typedef int (*cu_device_get_count_fn)(int *count);

int main(int argc, char **argv)
{
    const char *name = argc > 1 ? argv[1] : "libcuda.so.1";
    void *driver = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!driver) {
        printf("no NVIDIA driver (%s cannot be loaded)\n", name);
        return 1;
    }
    cu_init_fn init = (cu_init_fn)dlsym(driver, "cuInit");
    cu_device_get_count_fn count_devices = (cu_device_get_count_fn)dlsym(driver, "cuDeviceGetCount");
    int rc = init ? init(0) : -1, count = 0;
    if (rc != 0) {
        printf("the NVIDIA driver does not start (cuInit: error %d)\n", rc);
        return 1;
    }
    if (!count_devices || count_devices(&count) != 0 || count < 1) {
        printf("no GPU (the NVIDIA driver sees none)\n");
        return 1;
    }
    return 0;
}
