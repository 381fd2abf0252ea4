"""PyTorch DataLoader(pin_memory=True) feeding the GPU with non_blocking copies.

One measurement per process; tools/bench/pinned/pinned_bench.py runs it per
variant (PyTorch's host cache on, off, and off under poolshim) and compares.

Algorithm:
 1. A map-style dataset: sample i is a 3x224x224 uint8 image drawn from a
    generator seeded with i, and the label i (int64): the data do not depend
    on which worker made them or when.
 2. Batches of --batch-size samples (64: 9.2 MiB of pinned images and one
    small label tensor per batch, the usual DataLoader), or with
    --batch-size 0 of seeded random sizes (16..128 samples, a batch_sampler),
    so pinned requests vary from 2.4 to 19 MiB: what a loader with variable
    batches or crops asks for (workload torch_loader_varied).
 3. DataLoader(num_workers, pin_memory=True, prefetch_factor): its pin thread
    page-locks every batch through PyTorch's host allocator (cudaHostAlloc
    when its cache misses, or always when the cache is off).
 4. The loop copies each batch with .cuda(non_blocking=True), runs a
    half-precision matmul on it and spins the GPU --gpu-ms more
    (torch.cuda._sleep: the rest of a training step; the host runs ahead,
    so freed pinned blocks are still being read), and folds an exact int64 checksum
    on the GPU: sum over samples of (sum of the sample's bytes) * (label+1).
    A lost or reordered batch, or bytes overwritten before the copy read
    them, change it.
 5. --sync-every N (10): a synchronize every N batches, as a loop that
    reads its loss for logging has; the GPU lags the host by at most that.
 6. --empty-host-cache: after every batch, ask PyTorch to give its cached
    pinned blocks back (torch's empty_host_cache): the cache "off" for a
    PyTorch that has no knob for it.
 7. Prints RESULT with the wall time (after a 5-batch warm-up), the
    checksum, PyTorch's host-allocator figures (host_memory_stats: reserved
    and in-use peaks, cudaHostAlloc calls; -1 where this PyTorch has none)
    and the VmLck/VmPin maxima.
Exit 77 with a SKIP line when torch or a GPU is missing.
"""
import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pinned_common import PinSampler, result, skip  # noqa: E402

WORKLOAD = "torch_loader"
SAMPLE_SHAPE = (3, 224, 224)
WARMUP_BATCHES = 5


class Images:
    """Sample i: a 3x224x224 uint8 image from a generator seeded with i, and
    the label i. At module level, so workers started by spawn or forkserver
    can unpickle it."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch
        g = torch.Generator().manual_seed(i)
        return torch.randint(0, 256, SAMPLE_SHAPE, dtype=torch.uint8, generator=g), i


def host_empty_cache_fn(torch):
    """PyTorch's 'give cached pinned memory back', or None."""
    for owner, name in ((getattr(torch, "accelerator", None), "memory.empty_host_cache"),
                        (torch.cuda, "memory.empty_host_cache"),
                        (torch._C, "_host_emptyCache")):
        obj = owner
        for part in name.split("."):
            obj = getattr(obj, part, None) if obj is not None else None
        if callable(obj):
            return obj
    return None


def host_figures(torch):
    """(reserved peak, in-use peak, cudaHostAlloc calls) from PyTorch's host
    allocator; -1 for what this version does not report."""
    fn = getattr(torch.cuda, "host_memory_stats", None)
    if fn is None:
        return -1, -1, -1
    try:
        s = fn()
    except Exception:  # noqa: BLE001 (older builds raise for unsupported stats)
        return -1, -1, -1
    if "reserved_bytes.peak" in s:  # HostStats: reserved = owned, allocated = in use
        reserved, active = s["reserved_bytes.peak"], s.get("allocated_bytes.peak", -1)
    elif "active_bytes.peak" in s:  # newer: allocated = owned (active + cached)
        reserved, active = s.get("allocated_bytes.peak", -1), s["active_bytes.peak"]
    else:
        reserved, active = -1, -1
    return int(reserved), int(active), int(s.get("num_host_alloc", -1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variant", default="torch")
    ap.add_argument("--batches", type=int, default=150)
    ap.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1))
    ap.add_argument("--prefetch", type=int, default=4)
    ap.add_argument("--gpu-ms", type=float, default=15.0,
                    help="GPU time per batch (torch.cuda._sleep), so the GPU lags the loader")
    ap.add_argument("--sync-every", type=int, default=10,
                    help="synchronize every N batches, as reading a loss for logging does (0: never)")
    ap.add_argument("--empty-host-cache", action="store_true")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--batch-size", type=int, default=64, help="samples per batch; 0: random 16..128")
    args = ap.parse_args()
    workload = WORKLOAD + ("_varied" if args.batch_size <= 0 else "")

    try:
        import torch
        from torch.utils.data import DataLoader
    except ImportError as e:
        skip(workload, f"PyTorch not installed ({e})")
    if not torch.cuda.is_available():
        skip(workload, "PyTorch sees no CUDA GPU")

    rng = random.Random(args.seed)
    batches, start = [], 0
    for _ in range(args.batches):
        b = args.batch_size if args.batch_size > 0 else rng.randint(16, 128)
        batches.append(list(range(start, start + b)))
        start += b
    empty_cache = host_empty_cache_fn(torch) if args.empty_host_cache else None
    if args.empty_host_cache and empty_cache is None:
        skip(workload, f"torch {torch.__version__} has no empty_host_cache")

    dev = torch.device("cuda")
    features = 1
    for d in SAMPLE_SHAPE:
        features *= d
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    weight = torch.randn(features, 64, device=dev, dtype=torch.float16, generator=gen) / 512
    checksum = torch.zeros((), dtype=torch.int64, device=dev)
    sleep = getattr(torch.cuda, "_sleep", None) if args.gpu_ms > 0 else None
    # cycles for gpu_ms at the SM clock (nvidia-smi's; 1.5 GHz when unknown)
    try:
        clock_mhz = torch.cuda.clock_rate() if hasattr(torch.cuda, "clock_rate") else 1500
    except Exception:  # noqa: BLE001 (needs pynvml)
        clock_mhz = 1500
    cycles = int(args.gpu_ms * 1e3 * (clock_mhz or 1500))
    loader = DataLoader(Images(start), batch_sampler=batches, num_workers=args.workers, pin_memory=True,
                        prefetch_factor=args.prefetch if args.workers else None,
                        persistent_workers=False)
    t_first = t_warm = None
    samples = 0
    with PinSampler() as pins:
        t_first = time.perf_counter()
        for step, (x, y) in enumerate(loader):
            if step == WARMUP_BATCHES:
                torch.cuda.synchronize()
                t_warm = time.perf_counter()
            if not x.is_pinned():
                print(f"FAIL {workload}: batch {step} is not in pinned memory", flush=True)
                return 1
            xg = x.to(dev, non_blocking=True)
            yg = y.to(dev, non_blocking=True)
            del x, y  # the pinned batch goes back to the host allocator now
            flat = xg.view(xg.shape[0], -1)
            features_out = flat.half() @ weight  # some real work on the batch
            if sleep is not None:
                sleep(cycles)  # the rest of a training step: the GPU lags the host
            del features_out
            per_sample = flat.sum(dim=1, dtype=torch.int64)
            checksum += (per_sample * (yg + 1)).sum()
            samples += flat.shape[0]
            if args.sync_every and (step + 1) % args.sync_every == 0:
                torch.cuda.synchronize()  # the loop's own sync point: the GPU lags at most this far
            if empty_cache is not None:
                empty_cache()
        torch.cuda.synchronize()
        t_end = time.perf_counter()
    total = checksum.item()
    reserved, active, host_allocs = host_figures(torch)
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") or os.environ.get("PYTORCH_ALLOC_CONF", "")
    result(workload=workload, variant=args.variant, torch=torch.__version__, batches=len(batches),
           samples=samples, wall_s=t_end - (t_warm or t_first), total_s=t_end - t_first,
           checksum=total, torch_reserved_peak=reserved, torch_active_peak=active,
           torch_host_allocs=host_allocs, vmlck_peak=pins.peak["VmLck"], vmpin_peak=pins.peak["VmPin"],
           empty_host_cache=int(empty_cache is not None), gpu_ms=args.gpu_ms if sleep else 0.0,
           sync_every=args.sync_every,
           alloc_conf=conf or "-")
    return 0


if __name__ == "__main__":
    sys.exit(main())
