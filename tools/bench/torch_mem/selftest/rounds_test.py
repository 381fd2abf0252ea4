"""Checks rounds.py on made-up rounds (no GPU, no torch needed): the medians,
the ratio to expandable_segments, the peak (largest over the rounds), the shim's
counters (barriers and their host time among them), the median piece maps of each quarter,
a failed run left out, a missing file skipped.
Usage: python3 rounds_test.py   (exit 0 when every check holds)"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
GIB = 1 << 30


def config(name, wall, peak_gib, rc=0, alloc_ns=None, waits=None, frees=None, barriers=0, barrier_ns=0, maps_q=None):
    c = {"config": name, "rc": rc, "wall_s": wall, "nvml_peak_above_baseline": int(peak_gib * GIB), "shim_stats": None,
         "shim_quarters": {"warm_maps": 9, "maps": maps_q, "unmaps": [0] * 4, "barriers": [1] * 4} if maps_q else None}
    if alloc_ns is not None:
        c["shim_stats"] = {"devices": [{"time_ns": {"allocate": alloc_ns}, "remap_waits": waits,
                                         "upstream": {"allocs": 1, "frees": frees},
                                         "barriers": barriers, "barriers_quiet": barriers // 2,
                                         "cuda_time": {"barrier": {"calls": barriers, "ns": barrier_ns}}}]}
    return c


def main():
    out = tempfile.mkdtemp(prefix="torch_mem-rounds-")
    rounds = [
        [config("expandable", 5.0, 4.0), config("poolshim", 5.5, 3.9, alloc_ns=2e9, waits=40, frees=100, barriers=10, barrier_ns=5e6,
                                                            maps_q=[30, 5, 0, 1])],
        [config("expandable", 6.0, 4.1), config("poolshim", 6.5, 3.9, alloc_ns=1e9, waits=20, frees=300, barriers=30, barrier_ns=7e6,
                                                            maps_q=[10, 3, 2, 0])],
        [config("expandable", 7.0, 4.0), config("poolshim", 99.0, 3.9, rc=1, alloc_ns=3e9, waits=60, frees=200, barriers=20,
                                        barrier_ns=6e6, maps_q=[20, 4, 1, 0])],
    ]
    paths = []
    for i, configs in enumerate(rounds):
        path = os.path.join(out, "round%d.json" % i)
        with open(path, "w") as f:
            json.dump({"workloads": {"transformer": {"configs": configs}}}, f)
        paths.append(path)
    paths.append(os.path.join(out, "missing.json"))
    text = subprocess.run([sys.executable, os.path.join(HERE, "..", "rounds.py")] + paths, capture_output=True,
                          text=True).stdout
    lines = {l.split()[0]: l.split() for l in text.splitlines() if l and not l.startswith(("==", "config", "rounds:"))}
    checks = [
        ("a missing round is skipped", "skipping" in text and "missing.json" in text),
        ("three rounds read", "(3 rounds)" in text),
        ("expandable's median", lines["expandable"][4] == "6.000"),
        ("the failed run is left out of the median", lines["poolshim"][3] == "6.000" and len(lines["poolshim"]) == 13),
        ("the ratio to expandable_segments", lines["poolshim"][4] == "1.000"),
        ("the peak is the largest", lines["expandable"][6] == "4.100"),
        ("the shim's counters are medians", lines["poolshim"][6:12] == ["2.000", "40", "200", "20", "10", "6.0"]),
        ("each quarter's maps are the median of the rounds", lines["poolshim"][12] == "20/4/1/0"),
        ("no quarters for a run without them", lines["expandable"][-1] == "-"),
    ]
    failed = 0
    for name, ok in checks:
        print("%s %s" % ("ok  " if ok else "FAIL", name))
        failed += not ok
    if failed:
        print(text)
    print("%d passed, %d failed" % (len(checks) - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
