"""CuPy with its memory pool turned off: every array is a cudaMalloc/cudaFree.

Array operations are checked against NumPy; prints 'cupy_test: OK' and exits 0
only if all results match.
"""
import sys

import numpy as np
import cupy as cp


def main():
    cp.cuda.set_allocator(None)  # no CuPy pool: straight to cudaMalloc
    cp.cuda.set_pinned_memory_allocator(None)
    rng = np.random.default_rng(7)
    failures = 0
    for round_index in range(30):
        n = int(rng.integers(1, 1 << 20))
        host = rng.standard_normal(n).astype(np.float32)
        device = cp.asarray(host)
        doubled = (device * 2 + 1).get()
        if not np.allclose(doubled, host * 2 + 1):
            print(f"cupy_test round {round_index}: elementwise mismatch")
            failures += 1
        total = float(cp.sum(device, dtype=cp.float64).get())
        if not np.isclose(total, float(host.sum(dtype=np.float64)), rtol=1e-6, atol=1e-3):
            print(f"cupy_test round {round_index}: sum {total} != {host.sum()}")
            failures += 1
        if not np.array_equal(cp.sort(device).get(), np.sort(host)):
            print(f"cupy_test round {round_index}: sort mismatch")
            failures += 1
    a = rng.standard_normal((512, 384)).astype(np.float64)
    b = rng.standard_normal((384, 256)).astype(np.float64)
    product = (cp.asarray(a) @ cp.asarray(b)).get()
    if not np.allclose(product, a @ b, rtol=1e-10, atol=1e-10):
        print("cupy_test: matmul mismatch")
        failures += 1
    chunks = [cp.full(int(k) * 1000 + 1, k, dtype=cp.int32) for k in range(200)]
    for k, chunk in enumerate(chunks):
        if int(chunk.sum()) != k * (k * 1000 + 1):
            print(f"cupy_test: chunk {k} holds the wrong values")
            failures += 1
    del chunks
    cp.cuda.Device().synchronize()
    print("cupy_test: " + ("OK" if failures == 0 else f"FAIL ({failures} mismatches)"))
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
