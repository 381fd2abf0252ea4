#!/usr/bin/env python3
"""The live views beside a real PyTorch loop on the GPU (top, the live page, stats_now).

    live_views.py BUILD_DIR OUT_DIR

1. top: a PyTorch loop (caching off, shapes varying) runs under the shim with a
   JSON exit report and an allocation log; once its loop is done and it idles
   holding its tensors, `poolshim top --once --json` is taken; the process
   then exits. Figures that cannot move while it idles -- requested and
   reserved peaks, device allocation calls (cudaMalloc, cuMemAlloc and their
   stream-ordered twins: cuBLAS allocates through the driver) -- must equal its exit report's (the
   current figures move at exit, as PyTorch frees its tensors; they are printed
   beside what PyTorch says it holds).
2. memory_viz: `poolshim export LOG --memory-viz` of that loop's log, opened
   with PyTorch's own torch.cuda._memory_viz helpers (segsum reads every
   segment and block, trace every event of the device traces).
   `--perfetto` of the same log is parsed as JSON and its counters checked.
3. NVTX ranges: the same loop with debug.nvtx_ranges, under the fake NVTX
   tool of the CPU tests (BUILD/fake/libfake_nvtx.so, FAKE_NVTX_SUMMARY=1):
   growth and barrier ranges seen, none left open, no rule broken.
Prints one "live_views: ok|FAIL ..." line per check; exit status 1 on any
failure."""
import json
import os
import pickle
import re
import subprocess
import sys
import time

LOOP = r"""
import os, sys, time, torch
torch.manual_seed(0)
d = torch.device("cuda")
model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).to(d)
opt = torch.optim.Adam(model.parameters())
for step in range(60):
    x = torch.randn(int(torch.randint(64, 1024, (1,))), 512, device=d)
    loss = model(x).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
torch.cuda.synchronize()
held = [torch.empty(int(n) * 4096, device=d) for n in (1, 3, 7, 250)]
torch.cuda.synchronize()
with open(sys.argv[1], "w") as f:
    f.write(str(torch.cuda.memory_allocated()))
go = sys.argv[2]
for _ in range(600):
    if os.path.exists(go):
        break
    time.sleep(0.05)
"""

failures = 0


def check(ok, what, detail=""):
    global failures
    print("live_views: %s %s%s" % ("ok" if ok else "FAIL", what, (": " + detail) if detail else ""), flush=True)
    if not ok:
        failures += 1


def run_loop(build, out, name, env_extra):
    ready, go = os.path.join(out, name + ".ready"), os.path.join(out, name + ".go")
    for p in (ready, go):
        if os.path.exists(p):
            os.unlink(p)
    script = os.path.join(out, "loop.py")
    with open(script, "w") as f:
        f.write(LOOP)
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1", LD_PRELOAD=os.path.abspath(build + "/libpoolshim.so"))
    env.update(env_extra)
    log = open(os.path.join(out, name + ".stderr"), "w")
    proc = subprocess.Popen([sys.executable, script, ready, go], env=env, stderr=log, stdout=log)
    for _ in range(1200):
        if os.path.exists(ready) or proc.poll() is not None:
            break
        time.sleep(0.05)
    return proc, ready, go, log


def top_and_exit(build, out):
    stats = os.path.join(out, "top.stats.json")
    logf = os.path.join(out, "top.log.csv")
    proc, ready, go, log = run_loop(build, out, "top", {"POOLSHIM_STATS": "json", "POOLSHIM_STATS_FILE": stats,
                                                        "POOLSHIM_LOG": logf})
    check(os.path.exists(ready), "the loop under the shim reached its idle point", "rc %s" % proc.poll())
    if not os.path.exists(ready):
        proc.kill()
        return None
    torch_holds = int(open(ready).read())
    time.sleep(1.2)  # two of the live page's 500 ms periods
    t = subprocess.run([build + "/poolshim", "top", "--once", "--json"], capture_output=True, text=True)
    open(go, "w").close()
    rc = proc.wait(timeout=120)
    log.close()
    check(t.returncode == 0 and rc == 0, "top --once --json and the loop exit 0", "top %d, loop %d: %s" %
          (t.returncode, rc, t.stderr[-500:]))
    try:
        top = json.loads(t.stdout)
    except ValueError as e:
        check(False, "top's JSON parses", str(e))
        return logf
    mine = [p for p in top.get("processes", []) if p.get("pid") == proc.pid]
    check(len(mine) == 1, "top lists the loop's process (pid %d) once" % proc.pid,
          "%d processes listed" % len(top.get("processes", [])))
    if not mine:
        return logf
    dev = (mine[0].get("devices") or [{}])[0]
    report = json.load(open(stats))
    rdev = report["devices"][0]
    print("live_views: top's device 0: %s" % json.dumps(dev))
    pairs = [("requested_peak", rdev["bytes"]["requested_peak"]), ("reserved_peak", rdev["bytes"]["reserved_peak"]),
             ("allocations", sum(rdev["calls"].get(k, 0) for k in ("cudaMalloc", "cudaMallocAsync", "cuMemAlloc",
                                                                   "cuMemAllocAsync")))]
    for key, want in pairs:
        check(dev.get(key) == want, "top's %s is the exit report's" % key, "%s vs %s" % (dev.get(key), want))
    # (for the record; with its cache off PyTorch keeps no count: memory_allocated() says 0)
    print("live_views: top's requested_current %s, torch.cuda.memory_allocated() %d" %
          (dev.get("requested_current"), torch_holds))
    return logf


def exports(build, out, logf):
    snap, trace = os.path.join(out, "snapshot.pickle"), os.path.join(out, "trace.json")
    e = subprocess.run([build + "/poolshim", "export", logf, "--memory-viz", snap, "--perfetto", trace],
                       capture_output=True, text=True)
    check(e.returncode == 0, "poolshim export exits 0", e.stderr[-500:])
    if e.returncode:
        return
    from torch.cuda import _memory_viz as mv
    data = pickle.load(open(snap, "rb"))
    try:
        summary = mv.segsum(data)
        events = mv.trace(data)
        check(bool(summary) and bool(events), "torch.cuda._memory_viz segsum and trace read the snapshot",
              "%d and %d characters" % (len(summary), len(events)))
        print("live_views: segsum, first lines:\n" + "\n".join(summary.splitlines()[:6]))
        html = mv.trace_plot(data)
        check(len(html) > 1000, "torch.cuda._memory_viz.trace_plot makes its HTML page", "%d bytes" % len(html))
        with open(os.path.join(out, "trace_plot.html"), "w") as f:
            f.write(html)
    except Exception as x:  # the helpers' own error is the finding
        check(False, "torch.cuda._memory_viz reads the snapshot", repr(x))
    try:
        t = json.load(open(trace))
        evs = t["traceEvents"] if isinstance(t, dict) else t
        counters = [v for v in evs if v.get("ph") == "C"]
        check(len(counters) > 0, "the Perfetto trace has counter events", "%d events, %d counters" %
              (len(evs), len(counters)))
    except (ValueError, KeyError) as x:
        check(False, "the Perfetto trace parses", repr(x))


def nvtx_ranges(build, out):
    tool = os.path.abspath(build + "/fake/libfake_nvtx.so")
    if not os.path.exists(tool):
        check(False, "the fake NVTX tool is built", tool)
        return
    proc, ready, go, log = run_loop(build, out, "nvtx", {"POOLSHIM_NVTX_RANGES": "1", "NVTX_INJECTION64_PATH": tool,
                                                         "FAKE_NVTX_SUMMARY": "1"})
    open(go, "w").close()
    rc = proc.wait(timeout=120)
    log.close()
    text = open(os.path.join(out, "nvtx.stderr")).read()
    m = re.search(r"fake_nvtx: summary: ranges (\d+): grow (\d+) remap (\d+) release (\d+) barrier (\d+) wait (\d+);"
                  r" marks (\d+); open (-?\d+); errors (\d+)", text)
    check(rc == 0 and m is not None, "the loop with debug.nvtx_ranges exits 0 with the tool's summary",
          "rc %d: %s" % (rc, text[-400:]))
    if m:
        total, grow, remap, release, barrier, wait, marks, opened, errors = map(int, m.groups())
        print("live_views: " + m.group(0))
        check(grow > 0 and barrier > 0, "growth and barrier ranges on the GPU", m.group(0))
        check(opened == 0 and errors == 0, "every range closed, no rule broken", m.group(0))


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    build, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    logf = top_and_exit(build, out)
    if logf and os.path.exists(logf):
        exports(build, out, logf)
    nvtx_ranges(build, out)
    print("live_views: %s (%d failed)" % ("PASS" if not failures else "FAIL", failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
