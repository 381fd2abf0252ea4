"""Checks report.py's arithmetic on made-up runs (no GPU, no torch needed).
Usage: python3 report_test.py   (exit 0 when every check holds)"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
GIB = 1 << 30


def main():
    out = tempfile.mkdtemp(prefix="torch_mem-report-")
    runs = os.path.join(out, "runs")
    os.makedirs(runs)
    # config: (peak above baseline GiB, wall_s, final_loss, rc, shim (requested, reserved) GiB)
    table = {
        "nocache": (4.0, 10.0, "1.0000000000e+00", 0, None),
        "torch": (6.0, 2.0, "1.0000000000e+00", 0, None),
        "expandable": (4.6, 2.1, "1.0000000001e+00", 0, None),
        "torch_async": (5.0, 2.2, "1.0000000000e+00", 0, None),
        "poolshim": (4.3, 2.3, "1.0000000000e+00", 0, (3.5, 3.75)),
        "bad": (4.8, 3.0, "1.5000000000e+00", 1, (3.5, 4.0)),
        "crashed": (0.5, None, None, 139, None),
    }
    index = ["workload\tconfig\tkind\tlog\tnvml\tstats\tenv"]
    for config, (peak, wall, loss, rc, shim) in table.items():
        base = os.path.join(runs, f"w.{config}")
        with open(base + ".log", "w") as f:
            f.write("noise\n")
            if wall is not None:
                quarters = " shim_warm_maps=7 shim_maps_q=12/3/0/0 shim_unmaps_q=1/0/0/0 shim_barriers_q=5/6/7/8" \
                    if config == "poolshim" else ""
                f.write(f"RESULT name=w steps=10 warmup=1 wall_s={wall} final_loss={loss} peak_allocated=0{quarters}\n")
        with open(base + ".nvml.json", "w") as f:
            json.dump({"baseline_used": GIB, "peak_used": GIB + int(peak * GIB),
                       "peak_above_baseline": int(peak * GIB), "rc": rc, "wall_s": 1.0, "samples": 5}, f)
        stats = ""
        if shim:
            stats = base + ".stats.json"
            with open(stats, "w") as f:
                f.write("poolshim: some text line\n")
                json.dump({"poolshim": 1, "devices": [{"device": 0, "bytes": {
                    "requested_peak": int(shim[0] * GIB), "reserved_peak": int(shim[1] * GIB)}}]}, f)
                f.write("\n")
        kind = "poolshim" if shim else "native"
        index.append(f"w\t{config}\t{kind}\t{base}.log\t{base}.nvml.json\t{stats}\tA=1")
    with open(os.path.join(out, "runs.tsv"), "w") as f:
        f.write("\n".join(index) + "\n")
    proc = subprocess.run([sys.executable, os.path.join(HERE, "..", "report.py"), out, "--meta", "k=v"],
                          capture_output=True, text=True)
    print(proc.stdout, proc.stderr)
    data = json.load(open(os.path.join(out, "torch_mem.json")))
    rows = {e["config"]: e for e in data["workloads"]["w"]["configs"]}
    failures = []

    checks = [0]

    def check(what, ok):
        checks[0] += 1
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    close = lambda a, b: a is not None and abs(a - b) < 1e-6  # noqa: E731
    check("exit 1 (a run failed)", proc.returncode == 1)
    check("x_nocache torch 1.5", close(rows["torch"]["x_nocache"], 1.5))
    check("x_nocache poolshim 1.075", close(rows["poolshim"]["x_nocache"], 4.3 / 4.0))
    # context = 4.0 - 3.5 = 0.5 GiB; poolshim (4.3 - 0.5) / 3.5
    check("x_req poolshim", close(rows["poolshim"]["x_req"], 3.8 / 3.5))
    check("context estimate 0.5 GiB", close(data["workloads"]["w"]["context_estimate"] / GIB, 0.5))
    check("x_time expandable 1.05", close(rows["expandable"]["x_time"], 1.05))
    check("res/req poolshim", close(rows["poolshim"]["shim_res_over_req"], 3.75 / 3.5))
    check("loss marks", [rows[c]["loss_mark"] for c in ("torch", "expandable", "bad")] == ["=", "~", "!"])
    target = data["workloads"]["w"]["target"]["poolshim"]
    check("target poolshim met", target["within_1_10_of_nocache"] and target["not_above_expandable"])
    check("target bad: above expandable", data["workloads"]["w"]["target"]["bad"]["not_above_expandable"] is False)
    check("problems name the failed runs", any(p.startswith("w/bad: rc 1, RESULT line found") for p in data["problems"])
          and any(p.startswith("w/crashed: rc 139, RESULT line missing") for p in data["problems"]))
    check("problems name the loss difference", any(p.startswith("w/bad: final_loss") for p in data["problems"]))
    check("meta kept", data["meta"] == {"k": "v"})
    check("the shim's quarters read from RESULT", rows["poolshim"]["shim_quarters"] == {
        "warm_maps": 7, "maps": [12, 3, 0, 0], "unmaps": [1, 0, 0, 0], "barriers": [5, 6, 7, 8]})
    check("no quarters without the fields", rows["bad"]["shim_quarters"] is None)
    check("text file written", "x_nocache" in open(os.path.join(out, "torch_mem.txt")).read())
    print(f"{checks[0] - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
