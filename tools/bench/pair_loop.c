/* The shim's hot path alone, for instruction counts (callgrind): N
 * cudaMalloc+cudaFree pairs of one size on one thread, through either door,
 * over the fake CUDA of tests/shim (make pair-loop builds it).
 *
 *   pair_loop runtime|driver SIZE N
 *
 * runtime: the exported cudaMalloc/cudaFree (a program linked to
 * libcudart.so). driver: cuMemAlloc_v2/cuMemFree_v2 as a static cudart gets
 * them, from cuGetProcAddress_v2 found with dlsym (the shim hands out its
 * hooks). One pair runs first (lazy init), so a profile of N pairs minus a
 * profile of 0 pairs, divided by N, is the cost of one pair:
 *
 *   valgrind --tool=callgrind --callgrind-out-file=cg.N build/pair_loop runtime 256 100000
 *
 * under LD_PRELOAD=build/libpoolshim.so, LD_LIBRARY_PATH=build/fake. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../shim/cuda_abi.h"

extern cudaError_t cudaMalloc(void **p, size_t n);
extern cudaError_t cudaFree(void *p);

typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);

static void *driver_function(const char *name)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    gpa_fn gpa = h ? (gpa_fn)dlsym(h, "cuGetProcAddress_v2") : NULL;
    void *fn = NULL;
    CUdriverProcAddressQueryResult st = 1;
    if (!gpa || gpa(name, &fn, 3020, 0, &st) != CUDA_SUCCESS || st != 0) {
        fprintf(stderr, "pair_loop: cannot get %s\n", name);
        exit(1);
    }
    return fn;
}

int main(int argc, char **argv)
{
    if (argc != 4 || (strcmp(argv[1], "runtime") && strcmp(argv[1], "driver"))) {
        fprintf(stderr, "usage: pair_loop runtime|driver SIZE N\n");
        return 2;
    }
    size_t size = strtoull(argv[2], NULL, 0);
    long n = strtol(argv[3], NULL, 0);
    void *p;
    if (cudaMalloc(&p, size) || cudaFree(p)) { /* lazy init; the context is current from here on */
        fprintf(stderr, "pair_loop: first cudaMalloc+cudaFree failed\n");
        return 1;
    }
    if (!strcmp(argv[1], "runtime")) {
        for (long i = 0; i < n; i++)
            if (cudaMalloc(&p, size) || cudaFree(p))
                return 1;
    } else {
        alloc_fn alloc = (alloc_fn)driver_function("cuMemAlloc");
        free_fn release = (free_fn)driver_function("cuMemFree");
        CUdeviceptr d;
        if (alloc(&d, size) || release(d)) /* the driver door's first pair outside the count too */
            return 1;
        for (long i = 0; i < n; i++)
            if (alloc(&d, size) || release(d))
                return 1;
    }
    return 0;
}
