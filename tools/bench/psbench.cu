/* psbench — allocation benchmarks of poolshim against its peers, one
 * allocator per process, results as JSON lines (tools/bench/run.sh runs it
 * once per allocator and joins the lines into results/latest.json).
 *
 * Allocators (--allocator):
 *   cudaMalloc       cudaMalloc/cudaFree (natively: the baseline; under
 *                    LD_PRELOAD=libpoolshim.so: poolshim, as an unmodified program)
 *   cudaMallocAsync  cudaMallocAsync/cudaFreeAsync on the device's default
 *                    memory pool, release threshold UINT64_MAX
 *   direct           poolshim_allocate/poolshim_deallocate found with dlsym
 *                    (the shim's core without the hooks; needs LD_PRELOAD)
 *   rmm_pool, rmm_arena, rmm_binning, rmm_async
 *                    RMM 24.12 resources (only when built with -DPS_WITH_RMM)
 * Workloads (--workloads, comma-separated; default all):
 *   pairs       allocate+free pair latency, one thread, hot, for 256 B, 64 KiB,
 *               1 MiB, 16 MiB, 256 MiB, 2 GiB: batches of k pairs (k chosen so a
 *               batch lasts >= 50 us), median/p10/p90 of ns per pair
 *   random      DESIGN.md's workload: 20,000 steps, srand(42); allocate
 *               1 + rand() % (4 << 20) bytes when fewer than 16 are live or
 *               (fewer than 512 and rand() & 1), else free a random live one;
 *               free the rest, synchronize. ns per step over repetitions
 *   rmm_random  RMM's random_allocations shape: 2 x N operations, 73 %
 *               allocations (while under N allocations and 16000 MiB live),
 *               sizes uniform in [1, max MiB], minstd_rand with its default
 *               seed; grid N x max = {1000, 10000} x {1 MiB} + 1000 x {64, 1024} MiB
 *   threads     1, 2, 4, 8, 16 threads doing 256 B pairs for a fixed time:
 *               pairs per second of all threads, reported as ns per pair
 *   threads_mixed  1, 2, 4, 8, 16 threads for a fixed time, each with its own
 *               non-blocking stream, mixed sizes 256 B .. 1 MiB (small most
 *               often); every other pair cudaMalloc/cudaFree-style (stream 0),
 *               the others stream-ordered on the thread's stream
 *               (cudaMallocAsync/cudaFreeAsync for the cudaMalloc allocator,
 *               natively and under the shim). ns per pair of all threads, with
 *               pairs_per_s and x_of_one_thread (throughput over 1 thread's)
 *   streams     4 non-blocking streams; per step on each stream: allocate
 *               (stream-ordered where the allocator is), a kernel writes the
 *               block, free; ns per step including the final synchronize
 * --beside NAME: a second allocator in the same process (e.g. --allocator
 *   cudaMalloc --beside rmm_pool under LD_PRELOAD: poolshim and RMM's pool
 *   on one host and one process, whose speed mode they share: some
 *   hosts put a fresh process in one of two modes about 2x apart). Only
 *   pairs and random, taking turns batch by batch (pairs) or run by run
 *   (random); each allocator's lines as usual, then per case a line with
 *   workload "beside" whose median is the ratio of the medians, NAME's over
 *   the allocator's (above 1: the allocator is faster).
 * Output: one line per measurement, `JSON {...}` with label, allocator,
 * workload, case, unit, median, p10, p90, min, max, samples. Exit 0 on success. */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

#ifdef PS_WITH_RMM
#include <rmm/cuda_stream_view.hpp>
#include <rmm/mr/device/arena_memory_resource.hpp>
#include <rmm/mr/device/binning_memory_resource.hpp>
#include <rmm/mr/device/cuda_async_memory_resource.hpp>
#include <rmm/mr/device/cuda_memory_resource.hpp>
#include <rmm/mr/device/pool_memory_resource.hpp>
#endif

#define CK(call)                                                                          \
    do {                                                                                  \
        cudaError_t ck_status_ = (call);                                                  \
        if (ck_status_ != cudaSuccess) {                                                  \
            fprintf(stderr, "psbench: %s:%d: %s returned %s\n", __FILE__, __LINE__, #call, \
                    cudaGetErrorName(ck_status_));                                        \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* ------------------------------------------------------------------ allocators */

/* One allocator under test: allocate returns nullptr when out of memory. */
struct allocator {
    virtual ~allocator() {}
    virtual void *allocate(size_t size, cudaStream_t stream) = 0;
    virtual void deallocate(void *ptr, size_t size, cudaStream_t stream) = 0;
    /* Stream-ordered on `stream` (threads_mixed); the allocator's own
     * allocate/deallocate unless it has a separate stream-ordered call. */
    virtual void *allocate_async(size_t size, cudaStream_t stream) { return allocate(size, stream); }
    virtual void deallocate_async(void *ptr, size_t size, cudaStream_t stream) { deallocate(ptr, size, stream); }
};

struct cuda_malloc_allocator : allocator {
    void *allocate(size_t size, cudaStream_t) override
    {
        void *p = nullptr;
        if (cudaMalloc(&p, size) != cudaSuccess) {
            cudaGetLastError();
            return nullptr;
        }
        return p;
    }
    void deallocate(void *p, size_t, cudaStream_t) override { CK(cudaFree(p)); }
    void *allocate_async(size_t size, cudaStream_t stream) override
    {
        void *p = nullptr;
        if (cudaMallocAsync(&p, size, stream) != cudaSuccess) {
            cudaGetLastError();
            return nullptr;
        }
        return p;
    }
    void deallocate_async(void *p, size_t, cudaStream_t stream) override { CK(cudaFreeAsync(p, stream)); }
};

struct cuda_malloc_async_allocator : allocator {
    cuda_malloc_async_allocator()
    {
        cudaMemPool_t pool;
        CK(cudaDeviceGetDefaultMemPool(&pool, 0));
        uint64_t threshold = UINT64_MAX;
        CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    }
    void *allocate(size_t size, cudaStream_t stream) override
    {
        void *p = nullptr;
        if (cudaMallocAsync(&p, size, stream) != cudaSuccess) {
            cudaGetLastError();
            return nullptr;
        }
        return p;
    }
    void deallocate(void *p, size_t, cudaStream_t stream) override { CK(cudaFreeAsync(p, stream)); }
};

/* poolshim's exported API (shim/poolshim.h), reached through dlsym. */
struct poolshim_direct_allocator : allocator {
    int (*allocate_fn)(void **, size_t, uintptr_t);
    int (*deallocate_fn)(void *, uintptr_t);
    poolshim_direct_allocator()
    {
        allocate_fn = (int (*)(void **, size_t, uintptr_t))dlsym(RTLD_DEFAULT, "poolshim_allocate");
        deallocate_fn = (int (*)(void *, uintptr_t))dlsym(RTLD_DEFAULT, "poolshim_deallocate");
        if (!allocate_fn || !deallocate_fn) {
            fprintf(stderr, "psbench: --allocator direct needs LD_PRELOAD=libpoolshim.so\n");
            exit(1);
        }
        CK(cudaFree(0)); /* the runtime's context first, as a program would have */
    }
    void *allocate(size_t size, cudaStream_t stream) override
    {
        void *p = nullptr;
        return allocate_fn(&p, size, (uintptr_t)stream) == 0 ? p : nullptr;
    }
    void deallocate(void *p, size_t, cudaStream_t stream) override
    {
        int status = deallocate_fn(p, (uintptr_t)stream);
        if (status != 0) {
            fprintf(stderr, "psbench: poolshim_deallocate returned %d\n", status);
            exit(1);
        }
    }
};

#ifdef PS_WITH_RMM
/* An RMM device_memory_resource behind the allocator interface. */
template <typename Resource>
struct rmm_allocator : allocator {
    Resource *resource;
    explicit rmm_allocator(Resource *r) : resource(r) {}
    void *allocate(size_t size, cudaStream_t stream) override
    {
        try {
            return resource->allocate(size, rmm::cuda_stream_view{stream});
        } catch (std::exception const &) {
            return nullptr;
        }
    }
    void deallocate(void *p, size_t size, cudaStream_t stream) override
    {
        resource->deallocate(p, size, rmm::cuda_stream_view{stream});
    }
};
using rmm_cuda = rmm::mr::cuda_memory_resource;
using rmm_pool = rmm::mr::pool_memory_resource<rmm_cuda>;
using rmm_arena = rmm::mr::arena_memory_resource<rmm_cuda>;
using rmm_binning = rmm::mr::binning_memory_resource<rmm_pool>;
static rmm_cuda *rmm_upstream;
#endif

static allocator *make_allocator(const std::string &name)
{
    if (name == "cudaMalloc")
        return new cuda_malloc_allocator();
    if (name == "cudaMallocAsync")
        return new cuda_malloc_async_allocator();
    if (name == "direct")
        return new poolshim_direct_allocator();
#ifdef PS_WITH_RMM
    CK(cudaFree(0));
    rmm_upstream = new rmm_cuda();
    const size_t initial_pool = 1ull << 30; /* grows on demand, no maximum */
    if (name == "rmm_pool")
        return new rmm_allocator<rmm_pool>(new rmm_pool(rmm_upstream, initial_pool));
    if (name == "rmm_arena") /* RMM's default arena size (half the free memory) */
        return new rmm_allocator<rmm_arena>(new rmm_arena(rmm_upstream));
    if (name == "rmm_binning") /* RMM's benchmark shape: 256 KiB .. 4 MiB bins over a pool */
        return new rmm_allocator<rmm_binning>(
            new rmm_binning(new rmm_pool(rmm_upstream, initial_pool), 18, 22));
    if (name == "rmm_async") /* its own pool, release threshold = device memory */
        return new rmm_allocator<rmm::mr::cuda_async_memory_resource>(
            new rmm::mr::cuda_async_memory_resource());
#else
    if (name.rfind("rmm_", 0) == 0) {
        fprintf(stderr, "psbench: built without RMM (-DPS_WITH_RMM)\n");
        exit(2);
    }
#endif
    fprintf(stderr, "psbench: unknown allocator %s\n", name.c_str());
    exit(1);
}

/* ------------------------------------------------------------------ reporting */

static std::string label, allocator_name;

/* Prints one measurement; `values` are per-sample costs in `unit`. */
static void report(const char *workload, const std::string &case_name, const char *unit,
                   std::vector<double> values, const char *extra_json = "")
{
    std::sort(values.begin(), values.end());
    size_t n = values.size();
    printf("JSON {\"label\": \"%s\", \"allocator\": \"%s\", \"workload\": \"%s\", \"case\": \"%s\", "
           "\"unit\": \"%s\", \"median\": %.2f, \"p10\": %.2f, \"p90\": %.2f, \"min\": %.2f, "
           "\"max\": %.2f, \"samples\": %zu%s}\n",
           label.c_str(), allocator_name.c_str(), workload, case_name.c_str(), unit, values[n / 2],
           values[n / 10], values[(n * 9) / 10 < n ? (n * 9) / 10 : n - 1], values[0], values[n - 1], n,
           extra_json);
    fflush(stdout);
}

static std::string size_name(size_t bytes)
{
    char text[32];
    if (bytes >= (1ull << 30) && bytes % (1ull << 30) == 0)
        snprintf(text, sizeof text, "%zuGiB", bytes >> 30);
    else if (bytes >= (1u << 20) && bytes % (1u << 20) == 0)
        snprintf(text, sizeof text, "%zuMiB", bytes >> 20);
    else if (bytes >= 1024 && bytes % 1024 == 0)
        snprintf(text, sizeof text, "%zuKiB", bytes >> 10);
    else
        snprintf(text, sizeof text, "%zuB", bytes);
    return text;
}

static double time_scale = 1.0; /* --quick shortens every time budget */

/* ------------------------------------------------------------------ workloads */

/* Warms pairs of `size` (the pool has grown, the size is cached) and
 * returns the pairs per timed batch: enough for a batch to last ~50 us. */
static long warm_pairs(allocator &a, size_t size)
{
    for (int i = 0; i < 10; i++) {
        void *p = a.allocate(size, 0);
        if (!p) {
            fprintf(stderr, "psbench: pairs: allocation of %zu failed\n", size);
            exit(1);
        }
        a.deallocate(p, size, 0);
    }
    double t0 = now_ns();
    void *p = a.allocate(size, 0);
    a.deallocate(p, size, 0);
    double one = now_ns() - t0;
    long batch = (long)(50e3 / (one > 1 ? one : 1));
    return batch < 1 ? 1 : batch > 1000 ? 1000 : batch;
}

static void workload_pairs(allocator &a)
{
    const size_t sizes[] = {256, 64u << 10, 1u << 20, 16u << 20, 256u << 20, 2ull << 30};
    for (size_t size : sizes) {
        long batch = warm_pairs(a, size);
        std::vector<double> per_pair;
        double start = now_ns(), budget = 0.25e9 * time_scale;
        while ((per_pair.size() < 200 && now_ns() - start < budget) || per_pair.size() < 5) {
            double b0 = now_ns();
            for (long i = 0; i < batch; i++) {
                void *q = a.allocate(size, 0);
                a.deallocate(q, size, 0);
            }
            per_pair.push_back((now_ns() - b0) / batch);
        }
        char extra[64];
        snprintf(extra, sizeof extra, ", \"batch\": %ld", batch);
        report("pairs", size_name(size), "ns/pair", per_pair, extra);
    }
}

struct live_block {
    void *ptr;   /* device address */
    size_t size; /* bytes requested */
};

/* --beside: the allocators of the process, the first one's name in allocator_name */
static std::string beside_name;

static double median_of(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

/* The same measurement of both allocators, reported as usual and as a ratio (--beside). */
static void report_beside(const char *workload, const std::string &case_name, const char *unit,
                          const std::vector<double> &mine, const std::vector<double> &theirs)
{
    report(workload, case_name, unit, mine);
    std::string own = allocator_name;
    allocator_name = beside_name;
    report(workload, case_name, unit, theirs);
    allocator_name = own;
    char extra[160];
    snprintf(extra, sizeof extra, ", \"of\": \"%s\", \"beside\": \"%s\", \"what\": \"%s\"", own.c_str(),
             beside_name.c_str(), workload);
    report("beside", case_name, "ratio", {median_of(theirs) / median_of(mine)}, extra);
}

/* Pairs of both allocators, a batch of each in turn (--beside). */
static void workload_pairs_beside(allocator &a, allocator &b)
{
    const size_t sizes[] = {256, 64u << 10, 1u << 20, 16u << 20};
    allocator *both[2] = {&a, &b};
    for (size_t size : sizes) {
        long batch[2] = {warm_pairs(a, size), warm_pairs(b, size)};
        std::vector<double> per_pair[2];
        double start = now_ns(), budget = 0.5e9 * time_scale;
        while ((per_pair[1].size() < 200 && now_ns() - start < budget) || per_pair[1].size() < 5)
            for (int k = 0; k < 2; k++) {
                double b0 = now_ns();
                for (long i = 0; i < batch[k]; i++) {
                    void *q = both[k]->allocate(size, 0);
                    both[k]->deallocate(q, size, 0);
                }
                per_pair[k].push_back((now_ns() - b0) / batch[k]);
            }
        report_beside("pairs", size_name(size), "ns/pair", per_pair[0], per_pair[1]);
    }
}

static double random_design_once(allocator &a);

/* The random workload of both allocators, a run of each in turn (--beside). */
static void workload_random_beside(allocator &a, allocator &b)
{
    std::vector<double> per_step[2];
    random_design_once(a); /* warm-up: each pool reaches its working size */
    random_design_once(b);
    double start = now_ns();
    while ((per_step[1].size() < 5 && now_ns() - start < 4e9 * time_scale) || per_step[1].size() < 2) {
        per_step[0].push_back(random_design_once(a));
        per_step[1].push_back(random_design_once(b));
    }
    report_beside("random", "20k_steps_le_4MiB", "ns/step", per_step[0], per_step[1]);
}

static double random_design_once(allocator &a)
{
    std::vector<live_block> live;
    live.reserve(512);
    srand(42);
    double t0 = now_ns();
    for (int step = 0; step < 20000; step++) {
        if (live.size() < 16 || (live.size() < 512 && (rand() & 1))) {
            size_t size = 1 + (size_t)rand() % (4u << 20);
            void *p = a.allocate(size, 0);
            if (!p) {
                fprintf(stderr, "psbench: random: allocation of %zu failed\n", size);
                exit(1);
            }
            live.push_back({p, size});
        } else {
            size_t victim = (size_t)rand() % live.size();
            a.deallocate(live[victim].ptr, live[victim].size, 0);
            live[victim] = live.back();
            live.pop_back();
        }
    }
    for (const live_block &b : live)
        a.deallocate(b.ptr, b.size, 0);
    CK(cudaDeviceSynchronize());
    return (now_ns() - t0) / 20000;
}

static void workload_random(allocator &a)
{
    std::vector<double> per_step;
    double start = now_ns();
    random_design_once(a); /* warm-up: the pool reaches its working size */
    while ((per_step.size() < 5 && now_ns() - start < 2e9 * time_scale) || per_step.size() < 2)
        per_step.push_back(random_design_once(a));
    report("random", "20k_steps_le_4MiB", "ns/step", per_step);
}

static double rmm_random_once(allocator &a, int count, size_t max_mib)
{
    std::minstd_rand generator; /* default seed, identical for every allocator */
    std::uniform_int_distribution<size_t> size_distribution(1, max_mib << 20);
    std::uniform_int_distribution<int> operation(0, 99);
    std::uniform_int_distribution<int> index_distribution(0, count - 1);
    const size_t max_usage = 16000ull << 20;
    std::vector<live_block> live;
    size_t live_bytes = 0;
    int allocations = 0;
    double t0 = now_ns();
    for (int i = 0; i < 2 * count; i++) {
        size_t size = size_distribution(generator);
        bool allocate = true;
        if (!live.empty())
            allocate = operation(generator) < 73 && allocations < count && live_bytes + size < max_usage;
        void *p = allocate ? a.allocate(size, 0) : nullptr;
        if (p) {
            live.push_back({p, size});
            live_bytes += size;
            allocations++;
        } else if (!live.empty()) {
            size_t victim = (size_t)index_distribution(generator) % live.size();
            a.deallocate(live[victim].ptr, live[victim].size, 0);
            live_bytes -= live[victim].size;
            live[victim] = live.back();
            live.pop_back();
        }
    }
    for (const live_block &b : live)
        a.deallocate(b.ptr, b.size, 0);
    CK(cudaDeviceSynchronize());
    return (now_ns() - t0) / (2.0 * count);
}

static void workload_rmm_random(allocator &a)
{
    const struct {
        int count;
        size_t max_mib;
    } grid[] = {{1000, 1}, {10000, 1}, {1000, 64}, {1000, 1024}};
    for (const auto &g : grid) {
        std::vector<double> per_op;
        double start = now_ns();
        while ((per_op.size() < 3 && now_ns() - start < 1.5e9 * time_scale) || per_op.empty())
            per_op.push_back(rmm_random_once(a, g.count, g.max_mib));
        char name[64];
        snprintf(name, sizeof name, "n%d_max%zuMiB", g.count, g.max_mib);
        report("rmm_random", name, "ns/op", per_op);
    }
}

static void workload_threads(allocator &a)
{
    for (int thread_count : {1, 2, 4, 8, 16}) {
        std::atomic<int> ready{0};
        std::atomic<bool> go{false}, stop{false};
        std::vector<long> pairs(thread_count, 0);
        std::vector<std::thread> threads;
        for (int t = 0; t < thread_count; t++) {
            threads.emplace_back([&, t]() {
                CK(cudaSetDevice(0));
                for (int i = 0; i < 10; i++) { /* warm this thread's path */
                    void *p = a.allocate(256, 0);
                    a.deallocate(p, 256, 0);
                }
                ready++;
                while (!go.load())
                    std::this_thread::yield();
                long done = 0;
                while (!stop.load(std::memory_order_relaxed)) {
                    for (int i = 0; i < 16; i++) {
                        void *p = a.allocate(256, 0);
                        if (!p) {
                            fprintf(stderr, "psbench: threads: allocation failed\n");
                            exit(1);
                        }
                        a.deallocate(p, 256, 0);
                    }
                    done += 16;
                }
                pairs[t] = done;
            });
        }
        while (ready.load() < thread_count)
            std::this_thread::yield();
        double t0 = now_ns();
        go = true;
        std::this_thread::sleep_for(std::chrono::microseconds((long)(200e3 * time_scale)));
        stop = true;
        for (std::thread &th : threads)
            th.join();
        double elapsed = now_ns() - t0;
        long total = 0;
        for (long p : pairs)
            total += p;
        char name[32], extra[96];
        snprintf(name, sizeof name, "%d_threads", thread_count);
        snprintf(extra, sizeof extra, ", \"pairs_per_s\": %.0f, \"pairs\": %ld", total / (elapsed / 1e9), total);
        report("threads", name, "ns/pair", {total ? elapsed / total : elapsed}, extra);
    }
}

/* Mixed sizes, 256 B .. 1 MiB, the small ones most often (as tensors of a
 * training step); each thread walks them from its own offset. */
static const size_t mixed_sizes[] = {256, 4096, 1024, 65536, 512, 16384, 2048, 300,
                                     8192, 40000, 768, 32768, 262144, 256, 1048576, 131072};
static const int mixed_count = sizeof mixed_sizes / sizeof mixed_sizes[0];

static void workload_threads_mixed(allocator &a)
{
    double one_thread_rate = 0;
    for (int thread_count : {1, 2, 4, 8, 16}) {
        std::atomic<int> ready{0};
        std::atomic<bool> go{false}, stop{false};
        std::vector<long> pairs(thread_count, 0);
        std::vector<std::thread> threads;
        for (int t = 0; t < thread_count; t++) {
            threads.emplace_back([&, t]() {
                CK(cudaSetDevice(0));
                cudaStream_t stream;
                CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
                auto pair = [&](int k) {
                    size_t size = mixed_sizes[(k + t) % mixed_count];
                    void *p = (k & 1) ? a.allocate_async(size, stream) : a.allocate(size, 0);
                    if (!p) {
                        fprintf(stderr, "psbench: threads_mixed: allocation of %zu failed\n", size);
                        exit(1);
                    }
                    if (k & 1)
                        a.deallocate_async(p, size, stream);
                    else
                        a.deallocate(p, size, 0);
                };
                for (int k = 0; k < 2 * mixed_count; k++) /* warm this thread's path */
                    pair(k);
                ready++;
                while (!go.load())
                    std::this_thread::yield();
                long done = 0;
                while (!stop.load(std::memory_order_relaxed)) {
                    for (int k = 0; k < mixed_count; k++)
                        pair(k);
                    done += mixed_count;
                }
                pairs[t] = done;
                CK(cudaStreamSynchronize(stream));
                CK(cudaStreamDestroy(stream));
            });
        }
        while (ready.load() < thread_count)
            std::this_thread::yield();
        double t0 = now_ns();
        go = true;
        std::this_thread::sleep_for(std::chrono::microseconds((long)(300e3 * time_scale)));
        stop = true;
        double elapsed = now_ns() - t0; /* threads finish their last round of 16 pairs after this */
        for (std::thread &th : threads)
            th.join();
        long total = 0;
        for (long p : pairs)
            total += p;
        double rate = total / (elapsed / 1e9);
        if (thread_count == 1)
            one_thread_rate = rate;
        char name[32], extra[160];
        snprintf(name, sizeof name, "%d_threads", thread_count);
        snprintf(extra, sizeof extra, ", \"pairs_per_s\": %.0f, \"pairs\": %ld, \"x_of_one_thread\": %.2f", rate,
                 total, one_thread_rate > 0 ? rate / one_thread_rate : 0.0);
        report("threads_mixed", name, "ns/pair", {total ? elapsed / total : elapsed}, extra);
    }
}

__global__ void touch_kernel(uint32_t *p, size_t words, uint32_t value)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride)
        p[i] = value + (uint32_t)i;
}

static double streams_once(allocator &a, cudaStream_t *streams, int stream_count, int steps)
{
    double t0 = now_ns();
    for (int step = 0; step < steps; step++) {
        for (int s = 0; s < stream_count; s++) {
            size_t size = (size_t)256 << ((step + 3 * s) % 13); /* 256 B .. 1 MiB */
            void *p = a.allocate(size, streams[s]);
            if (!p) {
                fprintf(stderr, "psbench: streams: allocation failed\n");
                exit(1);
            }
            touch_kernel<<<8, 256, 0, streams[s]>>>((uint32_t *)p, size / 4, (uint32_t)step);
            a.deallocate(p, size, streams[s]);
        }
    }
    CK(cudaDeviceSynchronize());
    CK(cudaGetLastError());
    return (now_ns() - t0) / (steps * stream_count);
}

static void workload_streams(allocator &a)
{
    const int stream_count = 4;
    cudaStream_t streams[stream_count];
    for (int s = 0; s < stream_count; s++)
        CK(cudaStreamCreateWithFlags(&streams[s], cudaStreamNonBlocking));
    streams_once(a, streams, stream_count, 20);
    std::vector<double> per_step;
    double start = now_ns();
    while ((per_step.size() < 5 && now_ns() - start < 1e9 * time_scale) || per_step.size() < 2)
        per_step.push_back(streams_once(a, streams, stream_count, 250));
    report("streams", "4_streams_kernels", "ns/step", per_step);
    for (int s = 0; s < stream_count; s++)
        CK(cudaStreamDestroy(streams[s]));
}

int main(int argc, char **argv)
{
    std::string workloads = "pairs,random,rmm_random,threads,threads_mixed,streams";
    for (int i = 1; i < argc; i++) {
        std::string arg = argv[i];
        if (arg == "--allocator" && i + 1 < argc)
            allocator_name = argv[++i];
        else if (arg == "--label" && i + 1 < argc)
            label = argv[++i];
        else if (arg == "--workloads" && i + 1 < argc)
            workloads = argv[++i];
        else if (arg == "--beside" && i + 1 < argc)
            beside_name = argv[++i];
        else if (arg == "--quick")
            time_scale = 0.3;
        else if (arg == "--has-rmm") {
#ifdef PS_WITH_RMM
            return 0;
#else
            return 1;
#endif
        } else {
            fprintf(stderr, "usage: psbench --allocator NAME [--beside NAME] [--label TEXT] [--workloads a,b] [--quick] "
                            "| --has-rmm\n");
            return 1;
        }
    }
    if (allocator_name.empty()) {
        fprintf(stderr, "psbench: --allocator is required\n");
        return 1;
    }
    if (label.empty())
        label = allocator_name;
    CK(cudaSetDevice(0));
    allocator *a = make_allocator(allocator_name);
    std::string list = "," + workloads + ",";
    auto wants = [&](const char *w) { return list.find("," + std::string(w) + ",") != std::string::npos; };
    if (!beside_name.empty()) {
        allocator *b = make_allocator(beside_name);
        if (wants("pairs"))
            workload_pairs_beside(*a, *b);
        if (wants("random"))
            workload_random_beside(*a, *b);
        CK(cudaDeviceSynchronize());
        fprintf(stderr, "psbench %s beside %s: done\n", label.c_str(), beside_name.c_str());
        return 0;
    }
    if (wants("pairs"))
        workload_pairs(*a);
    if (wants("random"))
        workload_random(*a);
    if (wants("rmm_random"))
        workload_rmm_random(*a);
    if (wants("threads"))
        workload_threads(*a);
    if (wants("threads_mixed"))
        workload_threads_mixed(*a);
    if (wants("streams"))
        workload_streams(*a);
    CK(cudaDeviceSynchronize());
    fprintf(stderr, "psbench %s: done\n", label.c_str());
    return 0; /* RMM resources are left to the process's end, like a program would */
}
