/* overhead — the cost of one cudaMalloc + cudaFree pair, as the program sees it.
 *
 * Steps:
 *   1. Warm up (context, first pool growth) with 1000 pairs.
 *   2. Batches of BATCH pairs of `size` bytes (default 256) in a hot loop,
 *      timed with the host's monotonic clock; stop after `pairs` pairs (default
 *      100000) or after `seconds` (default 1.5 s, so native cudaMalloc, ~60 us
 *      a pair, stays short), at least 10 batches.
 *   3. Print one machine-readable line:
 *      RESULT overhead size=256 pairs=N median_ns=M p10_ns=A p90_ns=B shim=0|1
 * Usage: overhead [size [pairs [seconds]]] */
#include "gpu_test.h"

#include <algorithm>
#include <vector>

int main(int argc, char **argv)
{
    size_t size = argc > 1 ? strtoull(argv[1], nullptr, 0) : 256;
    long max_pairs = argc > 2 ? atol(argv[2]) : 100000;
    double max_seconds = argc > 3 ? atof(argv[3]) : 1.5;
    const int batch = 100;
    void *p = nullptr;
    for (int i = 0; i < 1000; i++) {
        CK(cudaMalloc(&p, size));
        CK(cudaFree(p));
    }
    std::vector<double> per_pair_ns;
    double start = now_ns();
    long pairs = 0;
    while ((pairs < max_pairs && now_ns() - start < max_seconds * 1e9) || per_pair_ns.size() < 10) {
        double t0 = now_ns();
        for (int i = 0; i < batch; i++) {
            CK(cudaMalloc(&p, size));
            CK(cudaFree(p));
        }
        per_pair_ns.push_back((now_ns() - t0) / batch);
        pairs += batch;
    }
    std::sort(per_pair_ns.begin(), per_pair_ns.end());
    size_t count = per_pair_ns.size();
    printf("RESULT overhead size=%zu pairs=%ld median_ns=%.1f p10_ns=%.1f p90_ns=%.1f shim=%d\n", size,
           pairs, per_pair_ns[count / 2], per_pair_ns[count / 10], per_pair_ns[count * 9 / 10],
           poolshim_is_active());
    return 0;
}
