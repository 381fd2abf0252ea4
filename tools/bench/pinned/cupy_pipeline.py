"""A CuPy pinned-memory copy pipeline: host fills pinned buffers, the GPU
copies them in asynchronously and reduces them.

One measurement per process; tools/bench/pinned/pinned_bench.py runs it per
variant: --pinned-pool none (CuPy's pinned memory pool off: every buffer is
one cudaHostAlloc, freed by cudaFreeHost), pool (CuPy's PinnedMemoryPool), and
none under poolshim.

Algorithm:
 1. A 64 MiB random base array (numpy, seeded); the expected checksum is
    computed from it on the host before the timed loop.
 2. Step i: a seeded random size n_i (256 KiB .. 24 MiB) and offset o_i;
    allocate a pinned buffer of n_i bytes (cupy.cuda.alloc_pinned_memory:
    whatever pinned allocator is set), fill it from base[o_i:o_i+n_i] on the
    host, cudaMemcpyAsync it into a device buffer on a non-blocking stream,
    spin the GPU --gpu-ms (a clock64 loop: the rest of the work, so the GPU
    lags the host), and add (sum of the bytes) * (i + 1) to an int64
    checksum on the GPU.
 3. Release, default: remember (event recorded after the copy, buffer) and
    drop the buffer once its event completed; with --depth copies in flight,
    wait for the oldest first (CuPy's own rule: keep pinned memory alive until
    the copy is done; every allocator is correct here). --free-early: drop the
    buffer right after issuing its copy, which native cudaFreeHost makes safe
    (it synchronizes the device) and poolshim too (its fences), but CuPy's
    PinnedMemoryPool does not (it hands the block out again at once): the
    driver runs it for none and poolshim only.
 4. Memory: requested = the pinned bytes the script holds (it allocates them,
    so the figure is exact), peak; reserved: with the pool, what the pool took
    from CUDA (counted in its allocator hook; the pool never gives it back
    before free_all_blocks); without it, = requested (one cudaHostAlloc per
    buffer); under poolshim the driver reads the shim's own figures.
 5. RESULT: wall time (after a 5-step warm-up), checksum, expected checksum,
    ok, the memory figures and the VmLck/VmPin maxima.
Exit 77 with a SKIP line when CuPy, numpy or a GPU is missing.
"""
import argparse
import collections
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pinned_common import PinSampler, result, skip  # noqa: E402

WORKLOAD = "cupy_pipeline"
BASE_BYTES = 64 << 20
MIN_BYTES, MAX_BYTES = 256 << 10, 24 << 20
WARMUP_STEPS = 5

SPIN_SRC = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variant", default="cupy")
    ap.add_argument("--pinned-pool", choices=("none", "pool"), default="none")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--depth", type=int, default=8, help="copies in flight at most (default mode)")
    ap.add_argument("--gpu-ms", type=float, default=3.0, help="GPU spin per step")
    ap.add_argument("--free-early", action="store_true")
    ap.add_argument("--seed", type=int, default=4321)
    args = ap.parse_args()
    workload = WORKLOAD + ("_free_early" if args.free_early else "")

    try:
        import numpy as np
    except ImportError as e:
        skip(workload, f"numpy not installed ({e})")
    try:
        import cupy as cp
    except ImportError as e:
        skip(workload, f"CuPy not installed ({e})")
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            skip(workload, "no CUDA device")
    except cp.cuda.runtime.CUDARuntimeError as e:
        skip(workload, f"no CUDA device ({e})")

    pinned_mod = cp.cuda.pinned_memory
    reserved = {"now": 0, "peak": 0, "calls": 0}
    if args.pinned_pool == "none":
        cp.cuda.set_pinned_memory_allocator(None)
    else:
        base_malloc = getattr(pinned_mod, "_malloc", None)

        def counting(size):
            ptr = base_malloc(size)
            reserved["now"] += size
            reserved["calls"] += 1
            reserved["peak"] = max(reserved["peak"], reserved["now"])
            return ptr

        pool = cp.cuda.PinnedMemoryPool(counting) if base_malloc else cp.cuda.PinnedMemoryPool()
        if not base_malloc:
            reserved["peak"] = -1  # this CuPy hides its base allocator: not measurable
        cp.cuda.set_pinned_memory_allocator(pool.malloc)

    rng = np.random.default_rng(args.seed)
    base = rng.integers(0, 256, BASE_BYTES, dtype=np.uint8)
    sizes = rng.integers(MIN_BYTES, MAX_BYTES + 1, args.steps)
    offsets = [int(rng.integers(0, BASE_BYTES - int(n) + 1)) for n in sizes]
    expected = sum(int(base[o:o + int(n)].sum(dtype=np.int64)) * (i + 1)
                   for i, (o, n) in enumerate(zip(offsets, sizes)))

    spin = cp.RawKernel(SPIN_SRC, "spin")
    clock_khz = cp.cuda.runtime.getDeviceProperties(0).get("clockRate", 1500000) or 1500000
    cycles = int(args.gpu_ms * clock_khz)
    stream = cp.cuda.Stream(non_blocking=True)
    device_buf = cp.empty(MAX_BYTES, dtype=cp.uint8)
    checksum = cp.zeros((), dtype=cp.int64)
    in_flight = collections.deque()  # (event, pinned memory, bytes)
    requested = {"now": 0, "peak": 0}

    def release(entry):
        requested["now"] -= entry[2]

    t_first = time.perf_counter()
    t_warm = None
    with PinSampler() as pins, stream:
        for i in range(args.steps):
            if i == WARMUP_STEPS:
                stream.synchronize()
                t_warm = time.perf_counter()
            n, o = int(sizes[i]), offsets[i]
            while in_flight and (in_flight[0][0].done or len(in_flight) >= args.depth):
                entry = in_flight.popleft()
                entry[0].synchronize()
                release(entry)
                del entry  # the pinned buffer goes back to its allocator here
            mem = cp.cuda.alloc_pinned_memory(n)
            requested["now"] += n
            requested["peak"] = max(requested["peak"], requested["now"])
            host = np.ndarray((n,), dtype=np.uint8, buffer=mem)  # as cupyx.empty_pinned does
            host[:] = base[o:o + n]
            cp.cuda.runtime.memcpyAsync(device_buf.data.ptr, mem.ptr, n,
                                        cp.cuda.runtime.memcpyHostToDevice, stream.ptr)
            del host
            if args.free_early:
                requested["now"] -= n
                del mem  # cudaFreeHost (or the shim's pool) while the copy may still run
            else:
                in_flight.append((stream.record(), mem, n))
                del mem
            if cycles:
                spin((1,), (1,), (np.int64(cycles),))
            checksum += device_buf[:n].sum(dtype=cp.int64) * (i + 1)
        while in_flight:
            entry = in_flight.popleft()
            entry[0].synchronize()
            release(entry)
        stream.synchronize()
        t_end = time.perf_counter()
    got = int(checksum.get())
    if args.pinned_pool == "none":
        reserved["peak"] = requested["peak"]  # one cudaHostAlloc per buffer, exact size
    result(workload=workload, variant=args.variant, cupy=cp.__version__, steps=args.steps,
           wall_s=t_end - (t_warm or t_first), total_s=t_end - t_first, checksum=got, expected=expected,
           ok=int(got == expected), requested_peak=requested["peak"], reserved_peak=reserved["peak"],
           pool_host_allocs=reserved["calls"] if args.pinned_pool == "pool" else -1,
           vmlck_peak=pins.peak["VmLck"], vmpin_peak=pins.peak["VmPin"], pinned_pool=args.pinned_pool,
           gpu_ms=args.gpu_ms)
    return 0 if got == expected else 1


if __name__ == "__main__":
    sys.exit(main())
