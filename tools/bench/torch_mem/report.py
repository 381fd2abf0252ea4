"""The tables of a torch_mem run (run.sh calls it): reads OUT_DIR/runs.tsv and the files
it names, prints one table per workload, writes OUT_DIR/torch_mem.json and torch_mem.txt.

Usage: python3 report.py OUT_DIR [--meta KEY=VALUE]...

Columns (see docs/benchmarks.md):
  config      allocator configuration (nocache, torch, expandable, torch_async, poolshim, variants)
  rc          exit status (124: timed out)
  wall_s      the timed steps (RESULT wall_s), not process start-up
  peak_GiB    NVML used memory at its peak, minus the idle baseline taken before the process
  x_nocache   peak_GiB / the nocache row's peak_GiB (the headline: reserved vs what the
              program really holds; the CUDA context is in both)
  x_req       (peak - context) / shim requested peak, an estimate without the context: the
              context is taken as nocache's peak minus the requested peak of the poolshim run
  x_time      wall_s / the torch row's wall_s
  final_loss  and a mark: '=' same digits as nocache, '~' relative difference < 1e-4, '!' more
  shim_req / shim_res   poolshim's own peak requested / peak reserved (GiB, its stats JSON)
  res/req     shim_res / shim_req
  t_alloc     torch.cuda.max_memory_allocated() in GiB, when PyTorch counted (its cache on):
              the program's own peak as PyTorch sees it, to set beside shim_req
"""
import argparse
import json
import math
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import benchlib  # noqa: E402  (tools/bench/benchlib.py)

GIB = float(1 << 30)
RESULT = re.compile(r"^RESULT (.*)$")


def parse_result(log_path):
    """The fields of the last RESULT line of a log (rank 0's for ddp), or {}."""
    fields = {}
    for line in benchlib.log_lines(log_path):
        match = RESULT.match(line.strip())
        if not match:
            continue
        found = dict(item.split("=", 1) for item in match.group(1).split() if "=" in item)
        if found.get("rank", "0") == "0":
            fields = found
    return fields


def quarters(result):
    """What the timed steps' quarters cost poolshim (workloads.py's shim_* fields):
    {"warm_maps": M, "maps": [A, B, C, D], "unmaps": [...], "barriers": [...]}, or None
    for a run without the library (or from before the fields)."""
    if "shim_maps_q" not in result:
        return None
    try:
        found = {"warm_maps": int(result.get("shim_warm_maps", "0"))}
        for name in ("maps", "unmaps", "barriers"):
            found[name] = [int(x) for x in result.get(f"shim_{name}_q", "").split("/")]
    except ValueError:
        return None
    return found


def load_json(path):
    if not path or not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    # the shim's statistics file may hold other lines: take the last JSON object
    for candidate in [line for line in text.splitlines() if line.strip().startswith("{")][::-1] + [text]:
        try:
            data = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(data, dict):
            return data
    return None


def shim_bytes(stats):
    """(requested_peak, reserved_peak) summed over the devices in poolshim's statistics."""
    if not stats or "devices" not in stats:
        return None, None
    req = sum(d.get("bytes", {}).get("requested_peak", 0) for d in stats["devices"])
    res = sum(d.get("bytes", {}).get("reserved_peak", 0) for d in stats["devices"])
    return req, res


def number(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def fmt(value, spec, width):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-".rjust(width)
    return format(value, spec).rjust(width)


def loss_mark(loss, reference):
    if loss is None or reference is None:
        return " "
    if loss == reference:
        return "="
    a, b = number(loss), number(reference)
    if a is None or b is None or math.isnan(a) or math.isnan(b):
        return "!"
    rel = abs(a - b) / max(abs(b), 1e-30)
    return "~" if rel < 1e-4 else "!"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--meta", nargs="*", default=[])
    args = parser.parse_args()
    index = os.path.join(args.out_dir, "runs.tsv")
    rows = []
    with open(index, encoding="utf-8") as handle:
        for line in handle:
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 7 or parts[0] == "workload":
                continue
            workload, config, kind, log, nvml, stats, env = parts[:7]
            rows.append({"workload": workload, "config": config, "kind": kind, "log": log,
                         "nvml_file": nvml, "stats_file": stats or None, "env": env})

    workloads = {}
    for row in rows:
        nvml = load_json(row["nvml_file"]) or {}
        result = parse_result(row["log"])
        stats = load_json(row["stats_file"]) if row["stats_file"] else None
        req, res = shim_bytes(stats)
        entry = {
            "config": row["config"], "kind": row["kind"], "env": row["env"],
            "rc": nvml.get("rc"), "timed_out": nvml.get("timed_out"),
            "wall_s": number(result.get("wall_s")),
            "process_wall_s": nvml.get("wall_s"),
            "final_loss": result.get("final_loss"),
            "steps": result.get("steps"), "warmup": result.get("warmup"),
            "torch_peak_allocated": number(result.get("peak_allocated")),
            "torch_peak_reserved": number(result.get("peak_reserved")),
            "nvml_baseline_used": nvml.get("baseline_used"),
            "nvml_peak_used": nvml.get("peak_used"),
            "nvml_peak_above_baseline": nvml.get("peak_above_baseline"),
            "nvml_peak_process_used": nvml.get("peak_process_used"),
            "nvml_samples": nvml.get("samples"),
            "nvml_mean_interval_ms": nvml.get("mean_interval_ms"),
            "shim_requested_peak": req, "shim_reserved_peak": res,
            "shim_stats": stats, "log": row["log"], "result_line_found": bool(result),
            "shim_quarters": quarters(result),
        }
        workloads.setdefault(row["workload"], []).append(entry)

    lines = []
    problems = []
    summary = {}
    for workload, entries in workloads.items():
        by_name = {e["config"]: e for e in entries}
        floor = by_name.get("nocache", {}).get("nvml_peak_above_baseline") or None  # 0: no GPU use
        base_time = by_name.get("torch", {}).get("wall_s")
        ref_loss = by_name.get("nocache", {}).get("final_loss")
        shim_req = by_name.get("poolshim", {}).get("shim_requested_peak")
        if not shim_req:
            shim_req = next((e["shim_requested_peak"] for e in entries if e["shim_requested_peak"]), None)
        context = floor - shim_req if floor is not None and shim_req else None
        for e in entries:
            peak = e["nvml_peak_above_baseline"]
            e["x_nocache"] = peak / floor if peak is not None and floor else None
            e["x_req"] = ((peak - context) / shim_req if peak is not None and context is not None and shim_req
                          else None)
            e["x_time"] = e["wall_s"] / base_time if e["wall_s"] is not None and base_time else None
            e["loss_mark"] = loss_mark(e["final_loss"], ref_loss)
            e["shim_res_over_req"] = (e["shim_reserved_peak"] / e["shim_requested_peak"]
                                      if e["shim_requested_peak"] and e["shim_reserved_peak"] else None)
            if e["rc"] != 0 or not e["result_line_found"]:
                problems.append(f"{workload}/{e['config']}: rc {e['rc']}, RESULT line "
                                f"{'found' if e['result_line_found'] else 'missing'} (log {e['log']})")
            if e["loss_mark"] == "!":
                problems.append(f"{workload}/{e['config']}: final_loss {e['final_loss']} differs from "
                                f"nocache's {ref_loss}")
        steps = next((e["steps"] for e in entries if e["steps"]), "?")
        lines.append(f"== {workload} ({steps} timed steps)  context estimate: "
                     f"{fmt(context / GIB if context is not None else None, '.3f', 0).strip()} GiB")
        header = (f"{'config':<16} {'rc':>3} {'wall_s':>8} {'x_time':>6} {'peak_GiB':>9} {'x_nocache':>9} "
                  f"{'x_req':>6}  {'final_loss':<18} {'shim_req':>8} {'shim_res':>8} {'res/req':>7} {'t_alloc':>7}")
        lines.append(header)
        lines.append("-" * len(header))
        for e in entries:
            peak = e["nvml_peak_above_baseline"]
            lines.append(
                f"{e['config']:<16} {fmt(e['rc'], 'd', 3)} {fmt(e['wall_s'], '.3f', 8)} {fmt(e['x_time'], '.2f', 6)} "
                f"{fmt(peak / GIB if peak is not None else None, '.3f', 9)} {fmt(e['x_nocache'], '.3f', 9)} "
                f"{fmt(e['x_req'], '.3f', 6)}  {(e['final_loss'] or '-') + ' ' + e['loss_mark']:<18} "
                f"{fmt(e['shim_requested_peak'] / GIB if e['shim_requested_peak'] else None, '.3f', 8)} "
                f"{fmt(e['shim_reserved_peak'] / GIB if e['shim_reserved_peak'] else None, '.3f', 8)} "
                f"{fmt(e['shim_res_over_req'], '.3f', 7)} "
                f"{fmt(e['torch_peak_allocated'] / GIB if e['torch_peak_allocated'] else None, '.3f', 7)}")
        # the target: poolshim's peak <= 1.10x nocache's and <= expandable_segments'
        verdict = {}
        exp_peak = by_name.get("expandable", {}).get("nvml_peak_above_baseline")
        for e in entries:
            if e["kind"] != "poolshim" or e["nvml_peak_above_baseline"] is None:
                continue
            v = {"x_nocache": e["x_nocache"],
                 "within_1_10_of_nocache": e["x_nocache"] is not None and e["x_nocache"] <= 1.10,
                 "not_above_expandable": exp_peak is not None and e["nvml_peak_above_baseline"] <= exp_peak,
                 "shim_res_over_req": e["shim_res_over_req"]}
            verdict[e["config"]] = v
            if e["x_nocache"] is None:
                v["within_1_10_of_nocache"] = None
                first = "n/a (no nocache peak)"
            else:
                first = f"{'yes' if v['within_1_10_of_nocache'] else 'NO'} ({e['x_nocache']:.3f}x)"
            if exp_peak is None:
                v["not_above_expandable"] = None
                second = "n/a (no expandable row)"
            else:
                second = (f"{'yes' if v['not_above_expandable'] else 'NO'} "
                          f"({e['nvml_peak_above_baseline'] / GIB:.3f} vs {exp_peak / GIB:.3f} GiB)")
            lines.append(f"  target {e['config']}: peak <= 1.10x nocache: {first}; <= expandable: {second}")
        lines.append("")
        summary[workload] = {"configs": entries, "context_estimate": context, "target": verdict}
    if problems:
        lines.append("PROBLEMS:")
        lines.extend("  " + p for p in problems)
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    meta = dict(item.split("=", 1) for item in args.meta if "=" in item)
    with open(os.path.join(args.out_dir, "torch_mem.txt"), "w", encoding="utf-8") as handle:
        for key, value in meta.items():
            handle.write(f"# {key}: {value}\n")
        handle.write(text)
    with open(os.path.join(args.out_dir, "torch_mem.json"), "w", encoding="utf-8") as handle:
        json.dump({"meta": meta, "workloads": summary, "problems": problems}, handle, indent=1)
        handle.write("\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
