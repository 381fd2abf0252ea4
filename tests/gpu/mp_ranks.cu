/* mp_ranks — one rank of a multi-process job (mpirun -np 2, srun, ...), with
 * no MPI library: the rank comes from the launcher's environment and the
 * ranks exchange nothing, so it builds with plain nvcc wherever mpirun runs.
 *
 * 1. The rank is the first set of RANK, OMPI_COMM_WORLD_RANK, SLURM_PROCID,
 *    PMI_RANK, LOCAL_RANK (the variables the shim's %r reads), else 0; the
 *    device is rank % device count.
 * 2. STEPS steps of allocation churn on that device, seeded by the rank:
 *    allocate a block of a random size (up to 8 MiB), fill it with a
 *    pattern, add its bytes into a checksum on the GPU (integer atomics:
 *    the order does not matter), free a random live block; every freed block
 *    is checked byte for byte first.
 * 3. Prints `RESULT mp_ranks rank=R device=D steps=N allocations=A
 *    checksum=0x... wall_s=S`: the checksum depends only on the rank and
 *    the steps, so a run under the shim must print the same as natively,
 *    and the two ranks differ.
 * Usage: mp_ranks [STEPS] (default 3000). Exit 0, 1 (CUDA error), 3 (wrong bytes). */
#include <unistd.h>

#include "gpu_test.h"

/* Adds sum over i of p[i] * (i + 1) (mod 2^64) into *sum. */
__global__ void checksum_kernel(const uint8_t *p, size_t n, unsigned long long *sum)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    unsigned long long s = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        s += (unsigned long long)p[i] * (i + 1);
    atomicAdd(sum, s);
}

static int launcher_rank(const char **from)
{
    static const char *const names[] = {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK", "LOCAL_RANK"};
    for (const char *name : names) {
        const char *value = getenv(name);
        if (value && *value) {
            *from = name;
            return atoi(value);
        }
    }
    *from = "none";
    return 0;
}

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 3000;
    const char *from;
    int rank = launcher_rank(&from);
    int count = 0;
    CK(cudaGetDeviceCount(&count));
    EXPECT(count > 0, "a GPU");
    int device = rank % count;
    CK(cudaSetDevice(device));
    printf("mp_ranks: rank %d (from %s), device %d of %d, pid %d, shim %s\n", rank, from, device, count, (int)getpid(),
           poolshim_is_active() ? "active" : "inactive");

    enum { LIVE = 64 };
    struct { void *p; size_t size; uint32_t seed; } live[LIVE];
    int live_count = 0;
    unsigned long long *sum = nullptr, *wrong = nullptr;
    CK(cudaMalloc((void **)&sum, sizeof *sum));
    CK(cudaMalloc((void **)&wrong, sizeof *wrong));
    CK(cudaMemset(sum, 0, sizeof *sum));
    CK(cudaMemset(wrong, 0, sizeof *wrong));
    uint32_t rng = 2024u + 7919u * (uint32_t)rank;
    unsigned long long allocations = 0;
    CK(cudaDeviceSynchronize());
    double start = now_ns();
    for (int step = 0; step < steps; step++) {
        rng = rng * 1664525u + 1013904223u;
        int allocate = live_count < 8 || (live_count < LIVE && (rng >> 28) & 1);
        if (allocate) {
            size_t size = 1 + (rng >> 4) % (8u << 20);
            uint32_t seed = (uint32_t)step * 31u + (uint32_t)rank;
            void *p = nullptr;
            CK(cudaMalloc(&p, size));
            fill_pattern(p, size, seed, 0);
            checksum_kernel<<<blocks_for(size), 256>>>((const uint8_t *)p, size, sum);
            CK(cudaGetLastError());
            live[live_count++] = {p, size, seed};
            allocations++;
        } else {
            int victim = (int)((rng >> 8) % (uint32_t)live_count);
            count_mismatches(live[victim].p, live[victim].size, live[victim].seed, wrong, 0);
            CK(cudaFree(live[victim].p));
            live[victim] = live[--live_count];
        }
    }
    while (live_count > 0) {
        live_count--;
        count_mismatches(live[live_count].p, live[live_count].size, live[live_count].seed, wrong, 0);
        CK(cudaFree(live[live_count].p));
    }
    unsigned long long checksum = 0, bad = 0;
    CK(cudaMemcpy(&checksum, sum, sizeof checksum, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&bad, wrong, sizeof bad, cudaMemcpyDeviceToHost));
    double wall = (now_ns() - start) / 1e9;
    CK(cudaFree(sum));
    CK(cudaFree(wrong));
    printf("RESULT mp_ranks rank=%d device=%d steps=%d allocations=%llu checksum=0x%016llx wrong=%llu wall_s=%.3f\n",
           rank, device, steps, allocations, checksum, bad, wall);
    if (bad) {
        printf("mp_ranks: rank %d: CORRUPTION (%llu wrong bytes)\n", rank, bad);
        return EXIT_CORRUPTION;
    }
    printf("mp_ranks: rank %d: OK\n", rank);
    return 0;
}
