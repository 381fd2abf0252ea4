"""Pinned host memory benchmarks: PyTorch's pin_memory DataLoader and a CuPy
copy pipeline, natively with and without their own pinned caches, and with
the cache off under poolshim. `make bench` runs it (tools/bench/run.sh);
alone: python3 tools/bench/pinned/pinned_bench.py --lib build/libpoolshim.so

1. Every (workload, variant) runs as its own process (the allocator settings
   are read once per process), --repeats times, round-robin; the median wall
   time is kept. Variants:
     torch_loader   (batches of 64; torch_loader_varied: 16..128 samples, the same variants)
                    torch_cache     PyTorch's CachingHostAllocator (default)
                    torch_uncached  its cache off: PYTORCH_CUDA_ALLOC_CONF=
                                    pinned_max_cached_size_mb:0 (every freed
                                    block goes back by cudaFreeHost); a PyTorch
                                    that refuses the key gets --empty-host-cache
                                    instead (the cache emptied after every batch)
                    poolshim        torch_uncached under LD_PRELOAD=libpoolshim.so
     cupy_pipeline  cupy_none       set_pinned_memory_allocator(None)
                    cupy_pool       CuPy's PinnedMemoryPool
                    poolshim        cupy_none under poolshim
     cupy_pipeline_free_early (buffers dropped right after their copy is issued)
                    cupy_none, poolshim (CuPy's pool is not safe for it)
2. Under poolshim the run writes the shim's JSON statistics
   (POOLSHIM_STATS=json, POOLSHIM_STATS_FILE); its "host" figures give the
   pinned peak requested (sizes the program asked for) and peak reserved
   (pinned slabs held).
3. Prints, per workload, a table (wall median and range, speed against the
   uncached native run, checksum, pinned peaks and their ratio, where each
   figure comes from) and verdict lines:
     PASS|FAIL <workload>: checksums ...      every variant delivered the same
                                              bytes (CuPy: equal to the host's
                                              expected checksum)
     PASS|FAIL <workload>: poolshim pinned peak reserved X.XXx requested
                                              (target <= 1.15x; a NOTE for the
                                              free-early pipeline, whose frees
                                              leave in-flight buffers out of
                                              "requested")
     PASS|FAIL <workload>: poolshim served N pinned calls (0 = not intercepted)
     SKIP <workload>: why                     module or GPU missing
   --json FILE keeps every run and the verdicts.
Exit status: 0 when nothing FAILed (SKIPs are fine), 1 otherwise.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SKIP_CODE = 77
TARGET = 1.15
UNCACHED_CONF = "pinned_max_cached_size_mb:0"


def parse_result(text):
    for line in reversed(text.splitlines()):
        if line.startswith("RESULT "):
            fields = {}
            for item in line[7:].split():
                k, _, v = item.partition("=")
                try:
                    fields[k] = int(v)
                except ValueError:
                    try:
                        fields[k] = float(v)
                    except ValueError:
                        fields[k] = v
            return fields
    return None


def shim_host_figures(path):
    """(requested peak, reserved peak, pinned calls, bound waits) summed over
    the devices of one shim JSON report, or None."""
    try:
        with open(path) as f:
            report = json.load(f)
    except (OSError, ValueError):
        return None
    req = res = calls = waits = 0
    for dev in report.get("devices", []):
        h = dev.get("host") or {}
        req += h.get("requested_peak", 0)
        res += h.get("reserved_peak", 0)
        calls += h.get("calls", 0)
        waits += h.get("bound_waits", 0)
    return req, res, calls, waits


class Runner:
    def __init__(self, args):
        self.args = args
        self.python = args.python
        self.lib = os.path.realpath(args.lib) if args.lib else None
        self.workdir = tempfile.mkdtemp(prefix="poolshim-pinned-")
        self.logs = []

    def run(self, script, label, extra_args, env_add, shim, rep):
        env = dict(os.environ)
        env.pop("LD_PRELOAD", None)
        for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "POOLSHIM_STATS", "POOLSHIM_STATS_FILE"):
            env.pop(k, None)
        env.update(env_add)
        stats_file = None
        if shim:
            stats_file = os.path.join(self.workdir, f"{label}.{rep}.stats.json")
            env.update(LD_PRELOAD=self.lib, POOLSHIM_STATS="json", POOLSHIM_STATS_FILE=stats_file)
        cmd = [self.python, os.path.join(HERE, script), "--variant", label] + extra_args
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=self.args.timeout)
            out, rc = p.stdout + p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:
            def text(x):
                return x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
            out, rc = text(e.stdout) + text(e.stderr) + f"\n(timed out after {self.args.timeout} s)", 124
        log = os.path.join(self.workdir, f"{label}.{rep}.log")
        with open(log, "w") as f:
            f.write(" ".join(cmd) + "\n" + out)
        self.logs.append(log)
        res = parse_result(out)
        if res is not None and stats_file:
            figs = shim_host_figures(stats_file)
            if figs:
                res["shim_requested_peak"], res["shim_reserved_peak"], res["shim_calls"], res["shim_bound_waits"] = figs
        return rc, out, res


def mib(n):
    return "-" if n is None or n < 0 else f"{n / 2**20:.1f} MiB"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", default=os.path.join(HERE, "..", "..", "..", "build", "libpoolshim.so"))
    ap.add_argument("--python", default=os.environ.get("PYTHON", sys.executable))
    ap.add_argument("--repeats", type=int, default=int(os.environ.get("PINNED_REPEATS", "3")))
    ap.add_argument("--quick", action="store_true", help="fewer batches and steps (about a third)")
    ap.add_argument("--only", default="", help="substring of the workloads to run (torch, cupy)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per run")
    ap.add_argument("--json", default="", help="write every run and verdict here")
    args = ap.parse_args()

    r = Runner(args)
    if not r.lib or not os.path.exists(r.lib):
        print(f"FAIL pinned: {args.lib} is missing (build it: make)")
        return 1
    torch_size = ["--batches", "50"] if args.quick else []
    cupy_size = ["--steps", "100"] if args.quick else []
    # (workload, script, [(label, args, env, shim)], reference label)
    plans = [
        ("torch_loader", "torch_loader.py", [
            ("torch_cache", torch_size, {}, False),
            ("torch_uncached", torch_size, {"PYTORCH_CUDA_ALLOC_CONF": UNCACHED_CONF}, False),
            ("poolshim", torch_size, {"PYTORCH_CUDA_ALLOC_CONF": UNCACHED_CONF}, True),
        ], "torch_uncached"),
        ("torch_loader_varied", "torch_loader.py", [
            ("torch_cache", torch_size + ["--batch-size", "0"], {}, False),
            ("torch_uncached", torch_size + ["--batch-size", "0"], {"PYTORCH_CUDA_ALLOC_CONF": UNCACHED_CONF}, False),
            ("poolshim", torch_size + ["--batch-size", "0"], {"PYTORCH_CUDA_ALLOC_CONF": UNCACHED_CONF}, True),
        ], "torch_uncached"),
        ("cupy_pipeline", "cupy_pipeline.py", [
            ("cupy_none", cupy_size + ["--pinned-pool", "none"], {}, False),
            ("cupy_pool", cupy_size + ["--pinned-pool", "pool"], {}, False),
            ("poolshim", cupy_size + ["--pinned-pool", "none"], {}, True),
        ], "cupy_none"),
        ("cupy_pipeline_free_early", "cupy_pipeline.py", [
            ("cupy_none", cupy_size + ["--pinned-pool", "none", "--free-early"], {}, False),
            ("poolshim", cupy_size + ["--pinned-pool", "none", "--free-early"], {}, True),
        ], "cupy_none"),
    ]
    verdicts, failed, everything = [], False, []

    def say(line):
        nonlocal failed
        print(line, flush=True)
        verdicts.append(line)
        failed |= line.startswith("FAIL")

    for workload, script, variants, reference in plans:
        if args.only and args.only not in workload:
            continue
        print(f"=== {workload}", flush=True)
        runs = {label: [] for label, *_ in variants}
        skipped = None
        uncached_fallback = False
        for rep in range(1, args.repeats + 1):
            for label, extra, env, shim in variants:
                if skipped:
                    break
                if uncached_fallback and "PYTORCH_CUDA_ALLOC_CONF" in env:
                    env, extra = {}, extra + ["--empty-host-cache"]
                rc, out, res = r.run(script, label, extra, env, shim, rep)
                if rc == SKIP_CODE:
                    skipped = next((l for l in out.splitlines() if l.startswith("SKIP")), f"SKIP {workload}")
                    break
                if rc != 0 and "PYTORCH_CUDA_ALLOC_CONF" in env and ("nrecognized" in out or "nknown" in out):
                    # this PyTorch has no pinned_max_cached_size_mb: empty its cache after every batch
                    print(f"NOTE {workload}: this PyTorch refuses {UNCACHED_CONF}; its cache is emptied after "
                          f"every batch instead (--empty-host-cache)", flush=True)
                    uncached_fallback = True
                    env, extra = {}, extra + ["--empty-host-cache"]
                    rc, out, res = r.run(script, label, extra, env, shim, rep)
                if rc != 0 or res is None:
                    tail = "\n    ".join(out.strip().splitlines()[-6:])
                    say(f"FAIL {workload}: {label} (run {rep}) exited {rc}:\n    {tail}")
                    continue
                res["rep"] = rep
                runs[label].append(res)
                everything.append(res)
        if skipped:
            say(skipped)
            continue
        # ---- the table
        ref = runs.get(reference) or []
        ref_wall = statistics.median([x["wall_s"] for x in ref]) if ref else None
        print(f"{'variant':<16} {'wall median':>11} {'min':>8} {'max':>8} {'vs ' + reference:>18} "
              f"{'checksum':>22} {'pinned req. peak':>17} {'reserved peak':>14} {'ratio':>7}  source")
        checks = {}
        for label, *_ in variants:
            rs = runs[label]
            if not rs:
                continue
            walls = [x["wall_s"] for x in rs]
            med = statistics.median(walls)
            last = rs[-1]
            checks[label] = {x["checksum"] for x in rs}
            if "shim_requested_peak" in last:
                req, res_ = last["shim_requested_peak"], last["shim_reserved_peak"]
                source = f"poolshim stats ({last['shim_calls']} pinned calls, {last['shim_bound_waits']} bound waits)"
            elif workload.startswith("cupy"):
                req, res_ = last.get("requested_peak"), last.get("reserved_peak")
                source = "script (exact)" + (", pool's allocator hook" if label == "cupy_pool" else ", no pool")
            else:
                req, res_ = last.get("torch_active_peak"), last.get("torch_reserved_peak")
                source = (f"torch host_memory_stats (in-use/owned peaks, summed per size bucket; "
                          f"{last.get('torch_host_allocs', -1)} cudaHostAlloc)")
            ratio = f"{res_ / req:.2f}x" if req and res_ and req > 0 and res_ > 0 else "-"
            speed = f"{ref_wall / med:.2f}x faster" if ref_wall and med > 0 else "-"
            print(f"{label:<16} {med:>10.3f}s {min(walls):>7.3f}s {max(walls):>7.3f}s {speed:>18} "
                  f"{last['checksum']:>22} {mib(req):>17} {mib(res_):>14} {ratio:>7}  {source}")
            print(f"{'':<16} VmLck peak {mib(last.get('vmlck_peak'))}, VmPin peak {mib(last.get('vmpin_peak'))}"
                  f" (0: the driver's pinned pages are not counted there)")
        # ---- verdicts
        distinct = set().union(*checks.values()) if checks else set()
        if workload.startswith("cupy"):
            bad = [x for label in runs for x in runs[label] if not x.get("ok")]
            say(f"{'FAIL' if bad or not checks else 'PASS'} {workload}: checksums "
                + (f"of {len(bad)} runs differ from the host's expected sum" if bad
                   else f"of every run equal the host's expected sum ({len(checks)} variants)"))
        else:
            say(f"{'PASS' if len(distinct) == 1 and len(checks) == len(variants) else 'FAIL'} {workload}: "
                f"checksums " + ("identical" if len(distinct) == 1 else f"differ: {sorted(distinct)}")
                + f" across {len(checks)} of {len(variants)} variants")
        shim_runs = runs.get("poolshim") or []
        figs = [(x.get("shim_requested_peak", 0), x.get("shim_reserved_peak", 0), x.get("shim_calls", 0))
                for x in shim_runs]
        if figs:
            calls = min(f[2] for f in figs)
            say(f"{'PASS' if calls > 0 else 'FAIL'} {workload}: poolshim served {calls} pinned calls"
                + ("" if calls > 0 else " (the shim did not intercept the pinned allocations)"))
            ratios = [f[1] / f[0] for f in figs if f[0] > 0]
            if ratios and workload.endswith("free_early"):
                # the program frees buffers the GPU still reads: "requested" leaves them out
                print(f"NOTE {workload}: poolshim pinned peak reserved {max(ratios):.2f}x requested (no target: "
                      f"the program frees buffers while their copies run, which requested does not count)",
                      flush=True)
            elif ratios:
                worst = max(ratios)
                say(f"{'PASS' if worst <= TARGET else 'FAIL'} {workload}: poolshim pinned peak reserved "
                    f"{worst:.2f}x requested (worst of {len(ratios)} runs; target <= {TARGET}x)")
        elif "poolshim" in runs:
            say(f"FAIL {workload}: no statistics from the poolshim runs")
        if uncached_fallback:
            print(f"NOTE {workload}: torch_uncached and poolshim ran with --empty-host-cache", flush=True)
        tu = runs.get("torch_uncached") or []
        if tu and tu[-1].get("torch_host_allocs", -1) >= 0:
            n, batches = tu[-1]["torch_host_allocs"], tu[-1].get("batches", 0)
            print(f"NOTE {workload}: with its cache off PyTorch made {n} cudaHostAlloc calls for {batches} "
                  f"batches ({'off as asked' if n >= batches else 'the cache still served most: not really off'})",
                  flush=True)
    print(f"logs: {r.workdir}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": everything, "verdicts": verdicts, "target": TARGET}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
