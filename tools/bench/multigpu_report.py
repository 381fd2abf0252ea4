"""The table of tools/bench/multigpu.sh: one row per job and rank.

Usage: multigpu_report.py JOB NATIVE_LOG SHIM_LOG STATS.json... [--json OUT]
(repeat the four-part group separated by '--' for several jobs).

From the programs' own output (RESULT lines with rank=R and wall_s=S, and a
result: checksum=... or final_loss=...), natively and under the shim, and from
the shim's per-rank JSON statistics (POOLSHIM_STATS_FILE=..._%r.json): allocation
calls the shim served on the rank's devices (the eight device functions),
time inside them, peak requested and peak reserved bytes, wall time native and
under the shim, and whether the rank's result matched the native one. A rank
missing on either side shows '-'; the exit status is 1 when any result differs
or is missing, else 0.
"""
import json
import re
import sys

import benchlib  # tools/bench/benchlib.py, beside this script

DEVICE_CALLS = ("cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync",
                "cuMemAlloc", "cuMemFree", "cuMemAllocAsync", "cuMemFreeAsync")
RESULT = re.compile(r"^RESULT .*\brank=(\d+)\b.*")


def results(path):
    """rank -> (wall_s, result text) from a log's RESULT lines."""
    found = {}
    for line in benchlib.log_lines(path):
        match = RESULT.match(line)
        if not match:
            continue
        wall = re.search(r"\bwall_s=([0-9.]+)", line)
        value = re.search(r"\b(checksum|final_loss)=(\S+)", line)
        found[int(match.group(1))] = (float(wall.group(1)) if wall else None,
                                      value.group(2) if value else None)
    return found


def stats(paths):
    """rank -> summed figures of that rank's statistics file."""
    found = {}
    for path in paths:
        try:
            with open(path, encoding="utf-8") as handle:
                data = json.loads([line for line in handle if line.startswith("{")][-1])
        except (OSError, ValueError, IndexError):
            continue
        if "rank" not in data:
            continue  # a launcher's own report
        devices = data.get("devices", [])
        found[data["rank"]] = {
            "devices": ",".join(str(d["device"]) for d in devices),
            "calls": sum(d.get("calls", {}).get(name, 0) for d in devices for name in DEVICE_CALLS),
            "shim_ms": sum(d["time_ns"]["allocate"] + d["time_ns"]["free"] for d in devices) / 1e6,
            "requested_peak": sum(d["bytes"]["requested_peak"] for d in devices),
            "reserved_peak": sum(d["bytes"]["reserved_peak"] for d in devices),
        }
    return found


def mib(n):
    return f"{n / 2**20:.1f}"


def main(argv):
    out_json = None
    if "--json" in argv:
        at = argv.index("--json")
        out_json = argv[at + 1]
        argv = argv[:at] + argv[at + 2:]
    groups, group = [], []
    for arg in argv:
        if arg == "--":
            groups.append(group)
            group = []
        else:
            group.append(arg)
    groups.append(group)
    rows, ok = [], True
    for group in groups:
        if len(group) < 3:
            print(__doc__)
            return 2
        job, native_log, shim_log, stat_files = group[0], group[1], group[2], group[3:]
        native, shim, figures = results(native_log), results(shim_log), stats(stat_files)
        for rank in sorted(set(native) | set(shim) | set(figures)):
            n_wall, n_result = native.get(rank, (None, None))
            s_wall, s_result = shim.get(rank, (None, None))
            same = n_result is not None and n_result == s_result
            ok = ok and same
            f = figures.get(rank, {})
            rows.append({"job": job, "rank": rank, "devices": f.get("devices"), "calls": f.get("calls"),
                         "shim_ms": f.get("shim_ms"), "requested_peak": f.get("requested_peak"),
                         "reserved_peak": f.get("reserved_peak"), "native_s": n_wall, "shim_s": s_wall,
                         "result_native": n_result, "result_shim": s_result, "same_result": same})
    header = ("job", "rank", "device", "alloc calls", "in shim ms", "peak req MiB", "peak res MiB", "res/req",
              "native s", "shim s", "native/shim", "same result")
    print("%-8s %4s %6s %12s %10s %12s %12s %7s %9s %9s %11s %11s" % header)
    for r in rows:
        ratio = (f"{r['reserved_peak'] / r['requested_peak']:.2f}x" if r["requested_peak"] else "-")
        speed = (f"{r['native_s'] / r['shim_s']:.2f}x" if r["native_s"] and r["shim_s"] else "-")
        print("%-8s %4s %6s %12s %10s %12s %12s %7s %9s %9s %11s %11s" % (
            r["job"], r["rank"], r["devices"] or "-", f"{r['calls']:,}" if r["calls"] is not None else "-",
            f"{r['shim_ms']:.2f}" if r["shim_ms"] is not None else "-",
            mib(r["requested_peak"]) if r["requested_peak"] is not None else "-",
            mib(r["reserved_peak"]) if r["reserved_peak"] is not None else "-", ratio,
            r["native_s"] if r["native_s"] is not None else "-", r["shim_s"] if r["shim_s"] is not None else "-",
            speed, "yes" if r["same_result"] else "NO"))
    if out_json:
        with open(out_json, "w", encoding="utf-8") as handle:
            json.dump({"multigpu": rows}, handle, indent=1)
    return 0 if ok and rows else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
