"""Checks the allocation log's companion and `poolshim replay` on the GPU (tests/gpu/run.sh, section 8).

Usage:
  check_replay.py companion LOG STATS.json   LOG.reserved.csv's highest Peak == the shim's
                                             bytes.reserved_peak of device 0 (what it really held)
  check_replay.py replay LOG REPLAY.json     `poolshim replay LOG --native --json`: every allocation
                                             of the log replayed without failure, natively and under
                                             the default stack; the shim's reserved >= requested, and
                                             within 1.25x of what the recorded run held
  check_replay.py lag LOG REPLAY.json        `... --gpu-lag 1ms --json`: spin kernels ran, their time
                                             is the log's duration, and the replay took at least that
                                             long (the GPU really spun: the driver synchronizes at the end)
Prints what it compared; exits 0 when it holds, 1 otherwise.
"""
import csv
import json
import sys


def log_facts(path):
    allocations, first, last = 0, None, None
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            allocations += row["Action"] == "allocate"
            h, m, s = row["Time"].split(":")
            t = int(h) * 3600 + int(m) * 60 + float(s)
            first = t if first is None else first
            last = t
    return allocations, (last - first) if first is not None else 0.0


def companion_peak(log):
    with open(log + ".reserved.csv", newline="") as handle:
        return max(max(int(r["Reserved"]), int(r["Peak"])) for r in csv.DictReader(handle))


def rows(path):
    with open(path) as handle:
        return {r["stack"]: r for r in json.load(handle)["results"]}


def main(argv):
    what, log, other = argv[1], argv[2], argv[3]
    ok = True

    def check(condition, text):
        nonlocal ok
        print(("ok   " if condition else "FAIL ") + text)
        ok = ok and condition

    if what == "companion":
        with open(other) as handle:
            stats = json.load(handle)
        device0 = [d for d in stats["devices"] if d["device"] == 0][0]
        real, recorded = device0["bytes"]["reserved_peak"], companion_peak(log)
        check(real > 0 and real == recorded, f"companion peak {recorded} == shim reserved_peak {real}")
    elif what == "replay":
        allocations, _ = log_facts(log)
        r = rows(other)
        for stack in ("native", "default"):
            check(int(r[stack]["allocations"]) == allocations and int(r[stack]["failures"]) == 0,
                  f"{stack}: {r[stack]['allocations']} of {allocations} allocations, {r[stack]['failures']} failures")
        shim = r["default"]
        check(shim["reserved_peak"] is not None and shim["reserved_peak"] >= shim["peak_requested"],
              f"shim reserved {shim['reserved_peak']} >= requested {shim['peak_requested']}")
        recorded = shim["recorded_peak_reserved"]
        check(recorded is not None and 0.8 * recorded <= shim["reserved_peak"] <= 1.25 * recorded,
              f"replayed reserved {shim['reserved_peak']} within 1.25x of recorded {recorded}")
        check(shim["device_used_peak"] >= shim["peak_requested"],
              f"device used {shim['device_used_peak']} >= requested {shim['peak_requested']} (cuMemGetInfo)")
        print(f"times: native alloc p50 {r['native']['alloc_median_ns']} ns p99 {r['native']['alloc_p99_ns']} ns; "
              f"shim alloc p50 {shim['alloc_median_ns']} ns p99 {shim['alloc_p99_ns']} ns")
    elif what == "lag":
        _, duration = log_facts(log)
        for stack, r in rows(other).items():
            check(int(r["lag_kernels"]) > 0, f"{stack}: {r['lag_kernels']} spin kernels")
            check(abs(r["gpu_work_s"] - duration) <= 0.01 * duration + 1e-3,
                  f"{stack}: GPU work {r['gpu_work_s']:.6f} s == the log's duration {duration:.6f} s")
            check(r["wall_s"] >= 0.95 * r["gpu_work_s"],
                  f"{stack}: replay took {r['wall_s']:.6f} s >= the GPU work (the kernels really spun)")
    else:
        print(__doc__)
        return 2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
