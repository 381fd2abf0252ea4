#!/usr/bin/env python3
"""Wall time of the same PyTorch loops over several alternated rounds.

    rounds.py OUT_DIR/round1/torch_mem.json OUT_DIR/round2/torch_mem.json ...

Each argument is one run of tools/bench/torch_mem/run.sh (same workloads and
configurations). Single runs move by 5-25 % (docs/benchmarks.md), so a verdict
on "no slower than expandable_segments" needs the rounds side by side: per
workload and configuration, the wall time of the timed steps in each round, the
median, the median against expandable_segments' median, the NVML peak above the
baseline (GiB, largest over the rounds), and for poolshim runs the seconds spent
inside allocation calls, the remap waits, the pieces unmapped, the barriers, how
many of them were quiet (joined no busy stream) and their host time in ms (medians), and
the piece maps in each quarter of the timed steps (maps_q: the median of each quarter over
the rounds, from workloads.py's shim_maps_q; '-' for runs from before it)."""
import json
import statistics
import sys


def shim_device(config):
    stats = config.get("shim_stats") or {}
    devices = stats.get("devices") or []
    return devices[0] if devices else None


def main(paths):
    rounds = []
    for path in paths:
        try:
            with open(path) as f:
                rounds.append(json.load(f))
        except (OSError, ValueError) as e:
            print("rounds: skipping %s: %s" % (path, e))
    if not rounds:
        print("rounds: no results")
        return 1
    workloads = []
    for r in rounds:
        for w in r.get("workloads", {}):
            if w not in workloads:
                workloads.append(w)
    for w in workloads:
        rows = {}
        for r in rounds:
            for c in r.get("workloads", {}).get(w, {}).get("configs", []):
                row = rows.setdefault(c["config"], {"wall": [], "peak": [], "alloc": [], "waits": [], "unmaps": [],
                                                    "barriers": [], "quiet": [], "bar_ms": [], "maps_q": []})
                if c.get("rc") == 0 and c.get("wall_s") is not None:
                    row["wall"].append(c["wall_s"])
                if c.get("nvml_peak_above_baseline") is not None:
                    row["peak"].append(c["nvml_peak_above_baseline"] / 2**30)
                d = shim_device(c)
                if d:
                    row["alloc"].append(d["time_ns"]["allocate"] / 1e9)
                    row["waits"].append(d.get("remap_waits", 0))
                    row["unmaps"].append(d.get("upstream", {}).get("frees", 0))
                    row["barriers"].append(d.get("barriers", 0))
                    if "barriers_quiet" in d:
                        row["quiet"].append(d["barriers_quiet"])
                    row["bar_ms"].append(d.get("cuda_time", {}).get("barrier", {}).get("ns", 0) / 1e6)
                if c.get("shim_quarters"):
                    row["maps_q"].append(c["shim_quarters"]["maps"])
        ref = rows.get("expandable", {}).get("wall")
        ref_median = statistics.median(ref) if ref else None
        print("== %s: wall_s of the timed steps per round (%d rounds)" % (w, len(rounds)))
        print("%-12s %-34s %8s %8s %9s %8s %6s %7s %8s %6s %7s  %s" %
              ("config", "rounds", "median", "x_expand", "peak_GiB", "alloc_s", "waits", "unmaps", "barriers",
               "quiet", "bar_ms", "maps_q"))
        for name, row in rows.items():
            if not row["wall"]:
                print("%-12s (no successful run)" % name)
                continue
            median = statistics.median(row["wall"])
            ratio = "%.3f" % (median / ref_median) if ref_median else "-"
            def med(xs, fmt):
                return (fmt % statistics.median(xs)) if xs else "-"
            maps_q = "/".join("%g" % statistics.median(q) for q in zip(*row["maps_q"])) if row["maps_q"] else "-"
            print("%-12s %-34s %8.3f %8s %9s %8s %6s %7s %8s %6s %7s  %s" % (
                name, " ".join("%.3f" % x for x in row["wall"]), median, ratio,
                "%.3f" % max(row["peak"]) if row["peak"] else "-",
                med(row["alloc"], "%.3f"), med(row["waits"], "%d"), med(row["unmaps"], "%d"),
                med(row["barriers"], "%d"), med(row["quiet"], "%d"), med(row["bar_ms"], "%.1f"), maps_q))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
