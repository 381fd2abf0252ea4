/* barrier_cost: the host cost of the driver calls a barrier makes per
 * non-blocking stream (shim/gpu_ops_cuda.c, live_barrier), natively, with
 * N streams as PyTorch's stream pool creates them (32 per priority, all at
 * once) and B of them busy (a kernel that spins for a while):
 *   nvcc -O2 -o barrier_cost tools/bench/barrier_cost.cu -lcuda
 *   ./barrier_cost [N=128] [B=4] [ROUNDS=200]
 * Prints ns per call, the median round, for: cuStreamQuery of an idle and of
 * a busy stream, cuEventRecord on a stream, cuStreamWaitEvent of the legacy
 * stream for that event, and cuStreamWaitEvent of a stream for an event of
 * the legacy stream (step d). What a barrier costs with N streams follows:
 * the join (step b) is one query per stream, plus a record and a wait per
 * busy one, or a record and a wait per stream without the queries. */
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <vector>

#include "bench_gpu.h"

#define CK(call)                                                                                   \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS && r_ != CUDA_ERROR_NOT_READY) {                                    \
            fprintf(stderr, "%s:%d: %s returned %d\n", __FILE__, __LINE__, #call, (int)r_);       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 128;
    int busy = argc > 2 ? atoi(argv[2]) : 4;
    int rounds = argc > 3 ? atoi(argv[3]) : 200;
    if (busy > n)
        busy = n;
    cudaFree(0);
    std::vector<CUstream> s(n);
    std::vector<CUevent> ev(n);
    CUevent legacy_event;
    for (int i = 0; i < n; i++) {
        CK(cuStreamCreate(&s[i], CU_STREAM_NON_BLOCKING));
        CK(cuEventCreate(&ev[i], CU_EVENT_DISABLE_TIMING));
    }
    CK(cuEventCreate(&legacy_event, CU_EVENT_DISABLE_TIMING));
    /* the busy streams: a kernel of ~2 s each, longer than every round */
    for (int i = 0; i < busy; i++)
        spin<<<1, 1, 0, (cudaStream_t)s[i]>>>(4000000000ll);
    std::vector<double> q_idle, q_busy, rec, wait_legacy, wait_stream;
    for (int r = 0; r < rounds; r++) {
        double t0 = now_ns();
        for (int i = busy; i < n; i++)
            CK(cuStreamQuery(s[i]));
        double t1 = now_ns();
        for (int i = 0; i < busy; i++)
            CK(cuStreamQuery(s[i]));
        double t2 = now_ns();
        for (int i = 0; i < n; i++)
            CK(cuEventRecord(ev[i], s[i]));
        double t3 = now_ns();
        for (int i = 0; i < n; i++)
            CK(cuStreamWaitEvent(CU_STREAM_LEGACY, ev[i], 0));
        double t4 = now_ns();
        CK(cuEventRecord(legacy_event, CU_STREAM_LEGACY));
        double t5 = now_ns();
        for (int i = 0; i < n; i++)
            CK(cuStreamWaitEvent(s[i], legacy_event, 0));
        double t6 = now_ns();
        if (n > busy)
            q_idle.push_back((t1 - t0) / (n - busy));
        if (busy)
            q_busy.push_back((t2 - t1) / busy);
        rec.push_back((t3 - t2) / n);
        wait_legacy.push_back((t4 - t3) / n);
        wait_stream.push_back((t6 - t5) / n);
    }
    printf("barrier_cost: %d non-blocking streams, %d busy, %d rounds, ns per call (median round):\n", n, busy,
           rounds);
    printf("  cuStreamQuery idle stream     %8.1f\n", q_idle.empty() ? 0.0 : median(q_idle));
    printf("  cuStreamQuery busy stream     %8.1f\n", q_busy.empty() ? 0.0 : median(q_busy));
    printf("  cuEventRecord on a stream     %8.1f\n", median(rec));
    printf("  legacy waits a stream's event %8.1f\n", median(wait_legacy));
    printf("  a stream waits legacy's event %8.1f\n", median(wait_stream));
    double query_join = median(q_idle) * (n - busy) + (busy ? median(q_busy) * busy : 0) +
                        (median(rec) + median(wait_legacy)) * busy;
    double record_join = (median(rec) + median(wait_legacy)) * n;
    printf("  step b with queries %.1f us, without (record + wait each) %.1f us; step d %.1f us\n",
           query_join / 1e3, record_join / 1e3, median(wait_stream) * n / 1e3);
    return 0;
}
