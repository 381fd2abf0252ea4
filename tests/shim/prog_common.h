/* Helpers shared by the shim's test programs. */
#ifndef PROG_COMMON_H
#define PROG_COMMON_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../shim/cuda_abi.h"
#include "fake_cuda.h"

static int failures;
#define CHECK(cond, ...)                                                          \
    do {                                                                          \
        if (!(cond)) {                                                            \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);       \
            fprintf(stderr, __VA_ARGS__);                                         \
            fprintf(stderr, "\n");                                                \
            failures++;                                                           \
        }                                                                         \
    } while (0)

/* 1 when libpoolshim.so is loaded and interposing. */
static inline int shim_active(void)
{
    int (*active)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "poolshim_active");
    return active ? active() : 0;
}

/* The fake driver's counters (it may be loaded RTLD_LOCAL). */
static inline fake_cuda_counters_t *fake(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h)
        h = dlopen("libcuda.so.1", RTLD_NOW);
    fake_cuda_counters_t *(*f)(void) = h ? (fake_cuda_counters_t * (*)(void)) dlsym(h, "fake_cuda_counters") : NULL;
    static fake_cuda_counters_t none;
    return f ? f() : &none;
}

/* Fills [p, p+n) with a pattern derived from `seed` and checks it back later. */
static inline void fill(void *p, size_t n, unsigned seed)
{
    unsigned char *b = p;
    for (size_t i = 0; i < n; i += 61)
        b[i] = (unsigned char)(seed * 131 + i);
    if (n)
        b[n - 1] = (unsigned char)(seed * 7);
}
static inline int intact(const void *p, size_t n, unsigned seed)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i += 61)
        if (n - 1 != i && b[i] != (unsigned char)(seed * 131 + i))
            return 0;
    return !n || b[n - 1] == (unsigned char)(seed * 7);
}

static inline int finish(const char *name)
{
    if (failures) {
        fprintf(stderr, "FAILED %s (%d checks)\n", name, failures);
        return 1;
    }
    printf("OK %s (shim %s)\n", name, shim_active() ? "active" : "inactive");
    return 0;
}
#endif
