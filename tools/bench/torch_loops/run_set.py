#!/usr/bin/env python3
"""The benchmark set: PyTorch loops as users write them (loops.py), every allocator
configuration side by side in alternated rounds, wall time and NVML memory.

  python3 tools/bench/torch_loops/run_set.py --lib build/libpoolshim.so --out DIR
        [--loops a,b,...] [--configs c,d,...] [--steps N] [--rounds R] [--budget S]
        [--variant NAME:VAR=VAL[,VAR=VAL...]]... [--gpu I] [--device cpu --small]

Configurations (a fresh CUDA process per run; see loops.py --serve):
  nocache        PYTORCH_NO_CUDA_MEMORY_CACHING=1, no shim: every tensor a cudaMalloc,
                 the no-cache floor of memory
  torch          PyTorch's caching allocator, default settings
  expandable     PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  async          PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
  poolshim       PyTorch's cache off, LD_PRELOAD=LIB, nothing else
  poolshim_torch poolshim.torch (python/poolshim/torch.py): PyTorch's allocator replaced by
                 a CUDAPluggableAllocator over LIB's torch door (shim/hooks_torch.c), no LD_PRELOAD
  a variant      poolshim with extra variables (LD_PRELOAD=/other/lib.so runs another build
                 in the same rounds)

How it measures:
1. One fork server per configuration (loops.py --serve, started with that configuration's
   environment) imports torch once; each run is a child it forks, which starts CUDA
   afresh, runs one loop and exits. Python's import is the same for every configuration
   and is left out; CUDA's initialisation, the model's construction and every step are in.
2. Rounds alternate: in round r every loop runs under every configuration, the
   configurations in an order rotated by r. The first round is reported apart (cold file
   cache, cuDNN and compile caches), medians over the rounds after it.
3. NVML: the GPU's used memory is sampled every ~1 ms during each run; the peak above the
   idle baseline read just before it. The shim's own answers (cudaMemGetInfo) play no part.
4. Per run the child reports wall_s (whole run), steady_s (last half of the steps), and under
   poolshim the map calls, unmap calls and barriers per quarter of the second half.

Writes DIR/runs.jsonl (one line per run, as it goes: a run cut short keeps the rounds done),
DIR/summary.json and DIR/summary.txt (one table per loop and a summary table), and prints
the summary. Exit status 0 when every run ended well.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "torch_mem"))

BUILTIN = ("nocache", "torch", "expandable", "async", "poolshim", "poolshim_torch")
TORCH_OWN = ("torch", "expandable", "async")
ALLOCATOR_VARS = ("LD_PRELOAD", "PYTORCH_NO_CUDA_MEMORY_CACHING", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def config_env(name, lib):
    return {"nocache": {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},
            "torch": {},
            "expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
            "async": {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
            "poolshim": {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "LD_PRELOAD": lib},
            "poolshim_torch": {}}[name]


def parse_variant(spec, lib):
    name, sep, rest = spec.partition(":")
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise SystemExit("run_set: bad variant %r (want NAME:VAR=VALUE[,VAR=VALUE...])" % spec)
    env = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "LD_PRELOAD": lib}
    # cut only at a comma followed by an upper-case VAR= (values may hold commas)
    items, current = [], ""
    for part in rest.split(","):
        head = part.split("=", 1)[0]
        if current and "=" in part and head.isupper() and head.replace("_", "").isalnum():
            items.append(current)
            current = part
        else:
            current = part if not current else current + "," + part
    if current:
        items.append(current)
    for item in items:
        var, sep2, value = item.partition("=")
        if not sep2:
            raise SystemExit("run_set: bad variable %r in variant %r" % (item, spec))
        env[var] = value
    return name, env


class Sampler:
    """NVML used memory of one GPU, every ~1 ms while running."""

    def __init__(self, gpu):
        from nvml_peak import NVML
        self.nvml = NVML()
        self.handle = self.nvml.handle(gpu)
        self.name = self.nvml.name(self.handle)
        self.peak = 0
        self.stop_flag = threading.Event()
        self.thread = None

    def used(self):
        return self.nvml.memory(self.handle)[0]

    def baseline(self, seconds=0.05):
        samples = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            samples.append(self.used())
            time.sleep(0.001)
        samples.sort()
        return samples[len(samples) // 2]

    def start(self):
        self.peak = 0
        self.stop_flag.clear()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self):
        while not self.stop_flag.is_set():
            used = self.used()
            if used > self.peak:
                self.peak = used
            time.sleep(0.001)

    def stop(self):
        self.stop_flag.set()
        self.thread.join()
        used = self.used()
        return max(self.peak, used)


class Server:
    """One fork server (loops.py --serve) with one configuration's environment."""

    def __init__(self, name, env, log_path, pin=None):
        self.name = name
        full = dict(os.environ)
        for var in ALLOCATOR_VARS:
            full.pop(var, None)
        full.update(env)
        full["PYTHONUNBUFFERED"] = "1"
        self.log = open(log_path, "w")
        cmd = [sys.executable, os.path.join(HERE, "loops.py"), "--serve"]
        if pin:
            cmd = ["taskset", "-c", pin] + cmd
        self.proc = subprocess.Popen(cmd, env=full,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True)

    def wait_ready(self):
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            raise SystemExit("run_set: the %s server did not start (see its log %s)" % (self.name, self.log.name))

    def run(self, command):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line.startswith("done"):
            return 255
        return int(line.split()[1])

    def close(self):
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired, ValueError):
            self.proc.kill()
        self.log.close()


def stats_digest(path):
    """The figures of a statistics file (POOLSHIM_STATS=json) that say where the time went."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    out = {}
    for dev in doc.get("devices", []):
        for kind, v in dev.get("cuda_time", {}).items():
            out["%s_calls" % kind] = out.get("%s_calls" % kind, 0) + v.get("calls", 0)
            out["%s_ms" % kind] = out.get("%s_ms" % kind, 0) + v.get("ns", 0) / 1e6
        for key in ("barriers_issued", "barriers_quiet"):
            out[key] = out.get(key, 0) + dev.get(key, 0)
        out["alloc_ms"] = out.get("alloc_ms", 0) + dev.get("time_ns", {}).get("allocate", 0) / 1e6
        out["free_ms"] = out.get("free_ms", 0) + dev.get("time_ns", {}).get("free", 0) / 1e6
        out["reserved_peak"] = out.get("reserved_peak", 0) + dev.get("bytes", {}).get("reserved_peak", 0)
        out["requested_peak"] = out.get("requested_peak", 0) + dev.get("bytes", {}).get("requested_peak", 0)
    return out


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(runs, configs):
    """Per loop and configuration: medians over rounds after the first, the first apart."""
    out = {}
    loops = []
    for r in runs:
        if r["loop"] not in loops:
            loops.append(r["loop"])
    for loop in loops:
        rows = {}
        for config in configs:
            mine = [r for r in runs if r["loop"] == loop and r["config"] == config and r.get("ok")]
            if not mine:
                continue
            later = [r for r in mine if r["round"] > 0] or mine
            first = [r for r in mine if r["round"] == 0]
            row = {"runs": len(mine),
                   "wall_s": median([r["wall_s"] for r in later]),
                   "steady_s": median([r["steady_s"] for r in later]),
                   "first_round_wall_s": first[0]["wall_s"] if first else None,
                   # the floor: the largest of the no-cache runs (its peaks last microseconds,
                   # and a 1 ms sample can miss them); the others: the median
                   "nvml_peak": (max(r["nvml_peak"] for r in mine) if config == "nocache"
                                 else median([r["nvml_peak"] for r in mine])),
                   "nvml_peak_max": max(r["nvml_peak"] for r in mine),
                   "final_loss": median([r["final_loss"] for r in mine])}
            shim = [r["shim"] for r in mine if r.get("shim")]
            if shim:
                steps_q = max(1, mine[0]["steady_steps"] // 4)
                row["maps_last_quarter_per_step"] = median([s["maps"][-1] / steps_q for s in shim])
                row["unmaps_last_quarter_per_step"] = median([s["unmaps"][-1] / steps_q for s in shim])
                row["barriers_last_quarter_per_step"] = median([s["barriers"][-1] / steps_q for s in shim])
                row["maps_total"] = median([s["total_maps"] for s in shim])
                row["barriers_total"] = median([s["total_barriers"] for s in shim])
            digest = next((r["shim_stats"] for r in first if r.get("shim_stats")), None)
            if digest:
                row["round0_stats"] = digest
            rows[config] = row
        own = [c for c in TORCH_OWN if c in rows and rows[c]["wall_s"]]
        best = min(own, key=lambda c: rows[c]["wall_s"]) if own else None
        best_steady = min(own, key=lambda c: rows[c]["steady_s"] or 1e9) if own else None
        for config, row in rows.items():
            if best:
                row["wall_vs_best"] = row["wall_s"] / rows[best]["wall_s"]
            if best_steady and row["steady_s"] and rows[best_steady]["steady_s"]:
                row["steady_vs_best"] = row["steady_s"] / rows[best_steady]["steady_s"]
            if "nocache" in rows and rows["nocache"]["nvml_peak"]:
                row["nvml_vs_floor"] = row["nvml_peak"] / rows["nocache"]["nvml_peak"]
            if "expandable" in rows and rows["expandable"]["nvml_peak"]:
                row["nvml_vs_expandable"] = row["nvml_peak"] / rows["expandable"]["nvml_peak"]
        out[loop] = {"best_own": best, "best_own_steady": best_steady, "configs": rows}
    return out


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def text_report(summary, meta):
    lines = ["torch_loops: " + " ".join("%s=%s" % kv for kv in meta.items()), ""]
    for loop, s in summary.items():
        lines.append("%s (best own: wall %s, steady %s)" % (loop, s["best_own"], s["best_own_steady"]))
        lines.append("  %-16s %5s %9s %8s %9s %8s %8s %10s %7s %7s %8s %8s %9s" % (
            "config", "runs", "wall_s", "x_best", "steady_s", "x_best", "r0_wall", "nvml_MiB", "x_floor",
            "x_exp", "maps/st", "bars/st", "loss"))
        for config, r in s["configs"].items():
            lines.append("  %-16s %5d %9s %8s %9s %8s %8s %10s %7s %7s %8s %8s %9s" % (
                config, r["runs"], fmt(r["wall_s"], ".3f"), fmt(r.get("wall_vs_best"), ".3f"),
                fmt(r["steady_s"], ".3f"), fmt(r.get("steady_vs_best"), ".3f"),
                fmt(r["first_round_wall_s"], ".2f"), fmt(r["nvml_peak"] / 2**20 if r["nvml_peak"] else None, ".0f"),
                fmt(r.get("nvml_vs_floor"), ".3f"), fmt(r.get("nvml_vs_expandable"), ".3f"),
                fmt(r.get("maps_last_quarter_per_step"), ".2f"), fmt(r.get("barriers_last_quarter_per_step"), ".2f"),
                fmt(r["final_loss"], ".4g")))
        for config, r in s["configs"].items():
            d = r.get("round0_stats")
            if d:
                lines.append("  %-16s round 0 statistics: barriers %d (%d quiet) %.1f ms, maps %d %.1f ms, unmaps %d %.1f ms, "
                             "waits %d %.1f ms; reserved peak %.0f MiB for %.0f MiB requested" % (
                                 config, d.get("barriers_issued", 0), d.get("barriers_quiet", 0), d.get("barrier_ms", 0),
                                 d.get("map_calls", 0), d.get("map_ms", 0), d.get("unmap_calls", 0), d.get("unmap_ms", 0),
                                 d.get("wait_calls", 0), d.get("wait_ms", 0), d.get("reserved_peak", 0) / 2**20,
                                 d.get("requested_peak", 0) / 2**20))
        lines.append("")
    # the summary: poolshim rows against PyTorch's best own configuration
    shim_configs = []
    for s in summary.values():
        for c in s["configs"]:
            if c not in ("nocache",) + TORCH_OWN and c not in shim_configs:
                shim_configs.append(c)
    if shim_configs:
        lines.append("summary: wall / PyTorch's best own (steady / best) [NVML / floor] maps per step, last quarter")
        lines.append("  %-12s " % "loop" + " ".join("%-34s" % c for c in shim_configs))
        for loop, s in summary.items():
            cells = []
            for c in shim_configs:
                r = s["configs"].get(c)
                cells.append("%-34s" % ("-" if not r else "%s (%s) [%s] %s" % (
                    fmt(r.get("wall_vs_best"), ".3f"), fmt(r.get("steady_vs_best"), ".3f"),
                    fmt(r.get("nvml_vs_floor"), ".3f"), fmt(r.get("maps_last_quarter_per_step"), ".2f"))))
            lines.append("  %-12s " % loop + " ".join(cells))
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib", default=os.path.join(REPO, "build", "libpoolshim.so"))
    p.add_argument("--out", help="working folder: runs, servers' logs, summary (required unless --summarize)")
    p.add_argument("--loops", default="convsmall,resnet,transformer,mlp,serve,autocast,compiled,loader")
    p.add_argument("--configs", default="nocache,torch,expandable,async,poolshim,poolshim_torch")
    p.add_argument("--variant", action="append", default=[],
                   help="NAME:VAR=VAL[,VAR=VAL...]: poolshim (LD_PRELOAD) with these variables")
    p.add_argument("--shim-env", action="append", default=[], metavar="VAR=VAL",
                   help="a variable for the poolshim and poolshim_torch configurations (not the variants)")
    p.add_argument("--once", default="", help="configurations run in the first two rounds only (e.g. nocache: "
                   "its memory is the floor; its time is not compared)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--steps-of", action="append", default=[], metavar="LOOP=N", help="steps of one loop")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--budget", type=float, default=0, help="start no round after this many seconds (0: no bound)")
    p.add_argument("--gpu", type=int, default=0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--small", action="store_true")
    p.add_argument("--label", default="", help="a name for this set, in the summary")
    p.add_argument("--runs", metavar="PATH", help="where runs.jsonl goes (default OUT/runs.jsonl); written as "
                   "the runs end, so a set cut short keeps what ran")
    p.add_argument("--summarize", metavar="RUNS", help="print the summary of a runs.jsonl and exit (no GPU)")
    p.add_argument("--pin", help="a CPU list every run is bound to (taskset -c): a fresh process can land in one "
                   "of two speed modes on some hosts, which a host-bound loop shows")
    p.add_argument("--record", metavar="DIR", help="first run every loop once under poolshim with POOLSHIM_LOG "
                   "(DIR/LOOP.csv, gzipped) and its statistics (DIR/LOOP.stats.json); not timed")
    a = p.parse_args(argv)
    if a.summarize:
        with open(a.summarize) as f:
            runs = [json.loads(line) for line in f if line.strip()]
        configs = []
        for r in runs:
            if r["config"] not in configs:
                configs.append(r["config"])
        order = [c for c in BUILTIN if c in configs] + [c for c in configs if c not in BUILTIN]
        summary = summarize(runs, order)
        meta = {"runs": a.summarize, "rounds": len({r["round"] for r in runs})}
        text = text_report(summary, meta)
        sys.stdout.write(text)
        if a.out:
            with open(os.path.join(a.out, "summary.json"), "w") as f:
                json.dump({"meta": meta, "summary": summary}, f, indent=1)
        return 0

    if not a.out:
        p.error("--out is required")
    lib = os.path.abspath(a.lib)
    os.makedirs(a.out, exist_ok=True)
    loops = [x for x in a.loops.split(",") if x]
    configs = [x for x in a.configs.split(",") if x]
    for c in configs:
        if c not in BUILTIN:
            raise SystemExit("run_set: unknown configuration %r (%s)" % (c, " ".join(BUILTIN)))
    envs = {c: config_env(c, lib) for c in configs}
    for item in a.shim_env:
        var, _, value = item.partition("=")
        for c in ("poolshim", "poolshim_torch"):
            if c in envs:
                envs[c][var] = value
    once = set(x for x in a.once.split(",") if x)
    for spec in a.variant:
        name, env = parse_variant(spec, lib)
        configs.append(name)
        envs[name] = env
    steps_of = {}
    for item in a.steps_of:
        loop, _, n = item.partition("=")
        steps_of[loop] = int(n)

    sampler = Sampler(a.gpu)
    t_start = time.time()
    problems = 0
    if a.record:
        os.makedirs(a.record, exist_ok=True)
        recorder = Server("record", config_env("poolshim", lib), os.path.join(a.out, "server_record.log"), a.pin)
        recorder.wait_ready()
        for loop in loops:
            csv = os.path.join(os.path.abspath(a.record), loop + ".csv")
            stats = os.path.join(os.path.abspath(a.record), loop + ".stats.json")
            out = os.path.join(a.out, "record_%s.json" % loop)
            t0 = time.time()
            rc = recorder.run("run %s %d %d %s %s %d - POOLSHIM_LOG=%s POOLSHIM_STATS=json POOLSHIM_STATS_FILE=%s" % (
                loop, steps_of.get(loop, a.steps), a.seed, out, a.device, 1 if a.small else 0, csv, stats))
            if rc == 0 and os.path.exists(csv):
                subprocess.run(["gzip", "-f", csv], check=False)
            else:
                problems += 1
            print("torch_loops: recorded %s in %.1f s (exit %d)" % (loop, time.time() - t0, rc), flush=True)
        recorder.close()
        if a.rounds == 0:
            return 0 if problems == 0 else 1
    servers = {c: Server(c, envs[c], os.path.join(a.out, "server_%s.log" % c), a.pin) for c in configs}
    for s in servers.values():
        s.wait_ready()
    print("torch_loops: %d loops x %d configurations, %d rounds, GPU %s, servers ready in %.1f s" % (
        len(loops), len(configs), a.rounds, sampler.name, time.time() - t_start), flush=True)
    runs = []
    runs_path = a.runs or os.path.join(a.out, "runs.jsonl")
    with open(runs_path, "w") as runs_file:
        for rnd in range(a.rounds):
            if rnd > 0 and a.budget and time.time() - t_start > a.budget:
                print("torch_loops: budget of %.0f s spent; stopping after %d rounds" % (a.budget, rnd), flush=True)
                break
            for loop in loops:
                order = configs[rnd % len(configs):] + configs[:rnd % len(configs)]
                for config in order:
                    if config in once and rnd > 1:
                        continue
                    steps = steps_of.get(loop, a.steps)
                    out = os.path.join(a.out, "run_%s_%s_%d.json" % (loop, config, rnd))
                    lib_arg = lib if config == "poolshim_torch" else "-"
                    # the shim's statistics (CUDA time by kind) in the first round only: the
                    # timed rounds after it run as users would, with statistics off
                    shim = config == "poolshim_torch" or "LD_PRELOAD" in envs[config]
                    stats = out + ".stats.json" if shim and rnd == 0 else None
                    extra = " POOLSHIM_STATS=json POOLSHIM_STATS_FILE=%s" % stats if stats else ""
                    base = sampler.baseline()
                    sampler.start()
                    t0 = time.time()
                    rc = servers[config].run("run %s %d %d %s %s %d %s%s" % (
                        loop, steps, a.seed, out, a.device, 1 if a.small else 0, lib_arg, extra))
                    peak = sampler.stop()
                    record = {"round": rnd, "loop": loop, "config": config, "rc": rc, "ok": False,
                              "nvml_peak": max(0, peak - base), "elapsed_s": time.time() - t0}
                    if rc == 0 and os.path.exists(out):
                        with open(out) as f:
                            record.update(json.load(f))
                        record["ok"] = True
                        if stats and os.path.exists(stats):
                            record["shim_stats"] = stats_digest(stats)
                    else:
                        problems += 1
                        err = out + ".error"
                        record["error"] = open(err).read() if os.path.exists(err) else "exit %d" % rc
                        print("FAIL %s/%s round %d: %s" % (loop, config, rnd, record["error"]), flush=True)
                    runs.append(record)
                    runs_file.write(json.dumps(record) + "\n")
                    runs_file.flush()
            print("torch_loops: round %d done at %.0f s" % (rnd, time.time() - t_start), flush=True)
    for s in servers.values():
        s.close()
    summary = summarize(runs, configs)
    meta = {"label": a.label, "pin": a.pin or "", "shim_env": " ".join(a.shim_env), "variants": " ".join(a.variant), "gpu": sampler.name, "steps": a.steps, "rounds": len({r["round"] for r in runs}),
            "seed": a.seed, "lib": lib, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "wall_s": round(time.time() - t_start)}
    for item in a.steps_of:
        meta["steps_" + item.split("=")[0]] = item.split("=")[1]
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump({"meta": meta, "summary": summary}, f, indent=1)
    text = text_report(summary, meta)
    with open(os.path.join(a.out, "summary.txt"), "w") as f:
        f.write(text)
    sys.stdout.write(text)
    return 0 if problems == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
