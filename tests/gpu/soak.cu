/* Soak: a randomized GPU workload for a fixed time, every block's content
 * checked.
 *
 *   soak SECONDS [THREADS=8] [MAX_BYTES=4MiB] [SEED=1]
 *
 * THREADS host threads share 4 non-blocking streams and the default stream,
 * each has one non-blocking stream of its own, and they run until SECONDS
 * have passed:
 *   - allocate through both doors, synchronous and stream-ordered:
 *     cudaMalloc, cudaMallocAsync, cuMemAlloc_v2, cuMemAllocAsync (the
 *     driver calls are direct PLT calls, so they reach the shim's driver
 *     door even when cudart is linked shared); sizes 1 B .. MAX_BYTES,
 *     skewed to small;
 *   - each new block is written by a kernel with a pattern derived from
 *     its id (gpu_test.h pattern_byte) on a random stream; a block may be
 *     rewritten later with its id on another stream, ordered by an event;
 *   - before every free a kernel on the block's last stream counts bytes
 *     that differ from its pattern into this thread's device counter, then
 *     the block is freed by the matching call (a cudaMalloc block by
 *     cudaFree or cuMemFree_v2, a stream-ordered one by cudaFreeAsync or
 *     cuMemFreeAsync on its stream);
 *   - every 64 operations a thread captures a CUDA graph on its own
 *     non-blocking stream (thread-local capture mode): a graph memory node
 *     (cudaMallocAsync inside the capture, which the shim passes to CUDA),
 *     a fill and a check of it, its free, and a check of one of the
 *     thread's live blocks (a captured kernel on pool memory); the graph is
 *     launched 3 times and destroyed.
 * At the end every live block is checked and freed, the counters are
 * summed, and the program prints
 *   RESULT soak seconds=S ops=N blocks=B bytes_checked=X graphs=G corrupted_bytes=C
 * It exits 0 when C == 0, 3 when bytes were corrupted, 1 on a CUDA error.
 * Stacks are chosen by the caller (POOLSHIM_RESOURCE / POOLSHIM_OPTIONS). */
#include <cuda.h>
#include <pthread.h>
#include <atomic>
#include <vector>

#include "gpu_test.h"

#define CU(call)                                                                         \
    do {                                                                                 \
        CUresult cu_status_ = (call);                                                    \
        if (cu_status_ != CUDA_SUCCESS) {                                                \
            fprintf(stderr, "FAIL %s:%d: %s returned %d\n", __FILE__, __LINE__, #call,   \
                    (int)cu_status_);                                                    \
            exit(EXIT_CUDA_ERROR);                                                       \
        }                                                                                \
    } while (0)

enum door { RUNTIME_SYNC, RUNTIME_ASYNC, DRIVER_SYNC, DRIVER_ASYNC };

struct block {
    void *ptr;            /* device memory */
    size_t size;          /* bytes */
    uint32_t id;          /* pattern seed */
    door how;             /* which call allocated it */
    cudaStream_t stream;  /* allocation stream (async) and the last stream that wrote it */
};

static const int STREAMS = 4;
static pthread_barrier_t all_ready, all_done; /* every worker set up; every worker's loop ended */
static cudaStream_t shared_streams[STREAMS];
static double deadline;
static size_t max_bytes = 4u << 20;
static std::atomic<uint32_t> next_id{1};
static std::atomic<unsigned long long> total_ops{0}, total_blocks{0}, total_bytes{0}, total_graphs{0};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static uint64_t next_random(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *state = x;
}

static size_t random_size(uint64_t *rng)
{
    unsigned max_log2 = 0;
    while (((size_t)2 << max_log2) <= max_bytes)
        max_log2++;
    unsigned e = (unsigned)(next_random(rng) % (max_log2 + 1));
    size_t size = 1 + (size_t)(next_random(rng) % ((uint64_t)1 << e));
    return size < max_bytes ? size : max_bytes;
}

struct worker {
    int index;                      /* thread number */
    uint64_t rng;                   /* xorshift state */
    unsigned long long *mismatches; /* device counter of this thread */
    cudaStream_t own;               /* this thread's non-blocking stream (graph capture) */
    std::vector<block> live;        /* its live blocks */
};

static cudaStream_t pick_stream(worker *w)
{
    uint64_t r = next_random(&w->rng) % (STREAMS + 2);
    if (r < STREAMS)
        return shared_streams[r];
    return r == STREAMS ? w->own : (cudaStream_t)0;
}

static void check_block(worker *w, const block &b)
{
    if (b.size)
        count_mismatches(b.ptr, b.size, b.id, w->mismatches, b.stream);
    total_bytes += b.size;
}

static void allocate_one(worker *w)
{
    block b;
    b.size = random_size(&w->rng);
    b.id = next_id++;
    b.how = (door)(next_random(&w->rng) % 4);
    b.stream = pick_stream(w);
    CUdeviceptr d = 0;
    switch (b.how) {
    case RUNTIME_SYNC: CK(cudaMalloc(&b.ptr, b.size)); break;
    case RUNTIME_ASYNC: CK(cudaMallocAsync(&b.ptr, b.size, b.stream)); break;
    case DRIVER_SYNC: CU(cuMemAlloc_v2(&d, b.size)); b.ptr = (void *)d; break;
    case DRIVER_ASYNC: CU(cuMemAllocAsync(&d, b.size, (CUstream)b.stream)); b.ptr = (void *)d; break;
    }
    fill_pattern(b.ptr, b.size, b.id, b.stream);
    w->live.push_back(b);
    total_blocks++;
}

static void free_one(worker *w, size_t i)
{
    block b = w->live[i];
    w->live[i] = w->live.back();
    w->live.pop_back();
    check_block(w, b);
    switch (b.how) {
    case RUNTIME_SYNC:
    case DRIVER_SYNC:
        if (next_random(&w->rng) & 1)
            CK(cudaFree(b.ptr));
        else
            CU(cuMemFree_v2((CUdeviceptr)b.ptr));
        break;
    case RUNTIME_ASYNC:
    case DRIVER_ASYNC:
        if (next_random(&w->rng) & 1)
            CK(cudaFreeAsync(b.ptr, b.stream));
        else
            CU(cuMemFreeAsync((CUdeviceptr)b.ptr, (CUstream)b.stream));
        break;
    }
}

/* Moves a live block to another stream: the new stream waits for the old
 * one's work on it (an event), then rewrites the same pattern. */
static void move_one(worker *w, size_t i)
{
    block &b = w->live[i];
    cudaStream_t to = pick_stream(w);
    if (to == b.stream || b.how == RUNTIME_ASYNC || b.how == DRIVER_ASYNC)
        return; /* a stream-ordered block stays on its stream (it is freed there) */
    cudaEvent_t e;
    CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CK(cudaEventRecord(e, b.stream));
    CK(cudaStreamWaitEvent(to, e, 0));
    CK(cudaEventDestroy(e));
    b.stream = to;
    fill_pattern(b.ptr, b.size, b.id, b.stream);
}

static void graph_round(worker *w)
{
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    size_t size = random_size(&w->rng);
    uint32_t id = next_id++;
    /* a live block the graph will check: first ordered after its last writer */
    block *target = NULL;
    if (!w->live.empty()) {
        target = &w->live[next_random(&w->rng) % w->live.size()];
        cudaEvent_t e;
        CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        CK(cudaEventRecord(e, target->stream));
        CK(cudaStreamWaitEvent(w->own, e, 0));
        CK(cudaEventDestroy(e));
    }
    CK(cudaStreamBeginCapture(w->own, cudaStreamCaptureModeThreadLocal));
    void *g = NULL;
    CK(cudaMallocAsync(&g, size, w->own)); /* a graph memory node */
    fill_pattern(g, size, id, w->own);
    count_mismatches(g, size, id, w->mismatches, w->own);
    CK(cudaFreeAsync(g, w->own));
    if (target && target->size)
        count_mismatches(target->ptr, target->size, target->id, w->mismatches, w->own);
    CK(cudaStreamEndCapture(w->own, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 3; i++)
        CK(cudaGraphLaunch(exec, w->own));
    CK(cudaStreamSynchronize(w->own));
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    total_bytes += 3 * (size + (target ? target->size : 0));
    total_graphs++;
}

static void *work(void *arg)
{
    worker *w = (worker *)arg;
    CK(cudaSetDevice(0));
    CK(cudaStreamCreateWithFlags(&w->own, cudaStreamNonBlocking));
    CK(cudaMalloc(&w->mismatches, sizeof *w->mismatches));
    CK(cudaMemset(w->mismatches, 0, sizeof *w->mismatches));
    CK(cudaDeviceSynchronize()); /* the legacy-stream memset before any kernel of a non-blocking stream */
    /* No thread synchronizes the device while another may capture: CUDA
     * invalidates every open capture of a context that is synchronized,
     * whichever thread asks (so workers start, and end, together). */
    pthread_barrier_wait(&all_ready);
    unsigned long long ops = 0;
    while (now_s() < deadline) {
        uint64_t r = next_random(&w->rng) % 100;
        if (ops % 64 == 63)
            graph_round(w);
        else if (w->live.size() < 8 || (w->live.size() < 256 && r < 55))
            allocate_one(w);
        else if (r < 90)
            free_one(w, next_random(&w->rng) % w->live.size());
        else
            move_one(w, next_random(&w->rng) % w->live.size());
        ops++;
    }
    while (!w->live.empty())
        free_one(w, w->live.size() - 1);
    CK(cudaStreamSynchronize(w->own));
    pthread_barrier_wait(&all_done); /* no capture is open past here */
    CK(cudaDeviceSynchronize());
    total_ops += ops;
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: soak SECONDS [THREADS=8] [MAX_BYTES=4194304] [SEED=1]\n");
        return EXIT_CUDA_ERROR;
    }
    double seconds = atof(argv[1]);
    int threads = argc > 2 ? atoi(argv[2]) : 8;
    if (argc > 3)
        max_bytes = strtoull(argv[3], NULL, 0);
    uint64_t seed = argc > 4 ? strtoull(argv[4], NULL, 0) : 1;
    if (seconds <= 0 || threads < 1 || threads > 256 || max_bytes < 1) {
        fprintf(stderr, "soak: bad arguments\n");
        return EXIT_CUDA_ERROR;
    }
    CK(cudaFree(0));
    CU(cuInit(0));
    for (int i = 0; i < STREAMS; i++)
        CK(cudaStreamCreateWithFlags(&shared_streams[i], cudaStreamNonBlocking));
    pthread_barrier_init(&all_ready, NULL, (unsigned)threads);
    pthread_barrier_init(&all_done, NULL, (unsigned)threads);
    std::vector<worker> workers(threads);
    std::vector<pthread_t> ids(threads);
    double start = now_s();
    deadline = start + seconds;
    for (int i = 0; i < threads; i++) {
        workers[i].index = i;
        workers[i].rng = seed * 0x9E3779B97F4A7C15ull + (uint64_t)i * 7919 + 1;
        pthread_create(&ids[i], NULL, work, &workers[i]);
    }
    for (int i = 0; i < threads; i++)
        pthread_join(ids[i], NULL);
    CK(cudaDeviceSynchronize());
    unsigned long long corrupted = 0;
    for (int i = 0; i < threads; i++) {
        unsigned long long c = 0;
        CK(cudaMemcpy(&c, workers[i].mismatches, sizeof c, cudaMemcpyDeviceToHost));
        corrupted += c;
        CK(cudaFree(workers[i].mismatches));
        CK(cudaStreamDestroy(workers[i].own));
    }
    for (int i = 0; i < STREAMS; i++)
        CK(cudaStreamDestroy(shared_streams[i]));
    printf("RESULT soak seconds=%.1f threads=%d ops=%llu blocks=%llu bytes_checked=%llu graphs=%llu "
           "corrupted_bytes=%llu\n",
           now_s() - start, threads, total_ops.load(), total_blocks.load(), total_bytes.load(),
           total_graphs.load(), corrupted);
    if (total_blocks.load() == 0 || total_graphs.load() == 0) {
        fprintf(stderr, "FAIL soak: the workload did nothing\n");
        return EXIT_CUDA_ERROR;
    }
    printf("soak: %s\n", corrupted ? "FAIL (corrupted bytes)" : "OK");
    return corrupted ? EXIT_CORRUPTION : 0;
}
