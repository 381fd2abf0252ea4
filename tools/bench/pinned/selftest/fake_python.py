#!/usr/bin/env python3
"""Stands in for `python3 WORKLOAD.py --variant LABEL ...` in the dry run of
pinned_bench.py (selftest/run.sh): prints a RESULT line like the workloads'
and, under LD_PRELOAD with POOLSHIM_STATS_FILE, a shim report with "host"
figures. FAKE_MODE picks what goes wrong:
  ok         every variant agrees, poolshim holds 1.05x
  corrupt    poolshim's checksum differs (torch) / is not the expected (cupy)
  ratio      poolshim holds 1.40x
  refuse     PyTorch refuses pinned_max_cached_size_mb (the driver must fall back)
  nointercept the shim report shows no pinned call
"""
import json
import os
import sys

script, argv = os.path.basename(sys.argv[1]), sys.argv[2:]
variant = argv[argv.index("--variant") + 1]
mode = os.environ.get("FAKE_MODE", "ok")
shim = "libpoolshim" in os.environ.get("LD_PRELOAD", "")
if mode == "refuse" and "pinned_max_cached_size_mb" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
    print("RuntimeError: Unrecognized key 'pinned_max_cached_size_mb' in Caching Allocator Config.")
    sys.exit(1)
if mode == "refuse" and variant != "torch_cache" and script == "torch_loader.py":
    assert "--empty-host-cache" in argv, "the fallback must pass --empty-host-cache"
checksum = 123456789
if mode == "corrupt" and shim:
    checksum += 1
ratio = 1.40 if mode == "ratio" else 1.05
if shim and os.environ.get("POOLSHIM_STATS_FILE"):
    calls = 0 if mode == "nointercept" else 600
    host = {"enabled": 1, "calls": calls, "requested_peak": 100 << 20, "reserved_peak": int(ratio * (100 << 20)),
            "bound_waits": 3}
    with open(os.environ["POOLSHIM_STATS_FILE"], "w") as f:
        json.dump({"poolshim": 1, "devices": [{"device": 0, "host": host}]}, f)
wall = {"torch_cache": 2.0, "torch_uncached": 6.0, "cupy_none": 5.0, "cupy_pool": 1.5}.get(variant, 1.6)
if script == "torch_loader.py":
    print(f"RESULT workload=torch_loader variant={variant} batches=150 wall_s={wall} checksum={checksum} "
          f"torch_reserved_peak={200 << 20} torch_active_peak={120 << 20} "
          f"torch_host_allocs={300 if variant != 'torch_cache' else 12} vmlck_peak=0 vmpin_peak=0")
else:
    expected = 123456789
    print(f"RESULT workload=cupy_pipeline variant={variant} wall_s={wall} checksum={checksum} expected={expected} "
          f"ok={int(checksum == expected)} requested_peak={90 << 20} reserved_peak={(130 if variant == 'cupy_pool' else 90) << 20} "
          f"vmlck_peak=0 vmpin_peak=0")
