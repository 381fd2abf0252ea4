/* What the CUDA probes of this folder share (barrier_cost.cu,
 * idle_barrier.cu): the host clock they time with, and a kernel that keeps
 * a stream busy. (psbench.cu stays one file: run.sh and fetch_rmm.sh tell
 * a prebuilt binary by that file's checksum.) */
#ifndef PS_BENCH_GPU_H
#define PS_BENCH_GPU_H

#include <time.h>

/* Monotonic host time in nanoseconds. */
static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

/* Spins one thread for about `cycles` GPU clock cycles: its stream stays
 * busy that long (~2 s for 4e9 cycles at ~2 GHz). */
__global__ void spin(long long cycles)
{
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
}

#endif
