"""Joins psbench's JSON lines into one results file and prints the tables.

Usage: summarize.py RAW.jsonl OUT.json [--meta KEY=VALUE ...] [--stats LABEL=FILE ...]
  RAW.jsonl  lines `JSON {...}` (psbench and run.sh's program timings); other lines are ignored
  OUT.json   written: {"meta": {...}, "results": [...], "shim_stats": {label: {...}}}
Prints a table of medians (rows: workload/case, columns: allocators as they
first appear), tables of ratios poolshim / peer (below 1: poolshim is
faster), the whole-program timings, and what the shim counted. Every metric is a cost (time per operation, or seconds of a whole
program), so lower is better everywhere.
"""
import json
import math
import sys

PEERS = ["cudaMalloc", "cudaMallocAsync", "rmm_pool", "rmm_arena", "rmm_binning", "rmm_async"]


def human(value, unit):
    if unit == "s":
        return f"{value:.2f} s"
    if value >= 1e6:
        return f"{value / 1e6:.2f} ms"
    if value >= 1e3:
        return f"{value / 1e3:.1f} us"
    return f"{value:.0f} ns"


def load_results(path):
    results = []
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if line.startswith("JSON "):
                try:
                    results.append(json.loads(line[5:]))
                except ValueError:
                    print(f"summarize: skipping a bad line: {line.strip()[:120]}")
    return results


def aggregate(entries):
    """One result per (label, workload, case): with several processes of the same
    allocator, the median of their medians, p10/p90 the outermost of theirs, and
    the per-process medians listed (their range is the between-process spread)."""
    groups = {}
    for e in entries:
        groups.setdefault((e["label"], e["workload"], e["case"]), []).append(e)
    merged = []
    for group in groups.values():
        medians = sorted(e["median"] for e in group)
        result = dict(group[0])
        result["median"] = medians[len(medians) // 2] if len(medians) % 2 else \
            (medians[len(medians) // 2 - 1] + medians[len(medians) // 2]) / 2
        result["p10"] = min(e["p10"] for e in group)
        result["p90"] = max(e["p90"] for e in group)
        result["min"] = min(e["min"] for e in group)
        result["max"] = max(e["max"] for e in group)
        result["samples"] = sum(e.get("samples", 1) for e in group)
        result["processes"] = len(group)
        result["process_medians"] = [e["median"] for e in group]
        merged.append(result)
    return merged


def load_stats(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    for candidate in reversed([text] + [l for l in text.splitlines() if l.startswith("{")]):
        try:
            data = json.loads(candidate)
            if isinstance(data, dict) and "devices" in data:
                return data
        except ValueError:
            continue
    return None


def table(rows, header):
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    lines = ["  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in [header] + rows]
    return "\n".join(lines)


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    raw, out = argv[1], argv[2]
    meta, stats = {}, {}
    mode = None
    for arg in argv[3:]:
        if arg in ("--meta", "--stats"):
            mode = arg
        elif mode == "--meta" and "=" in arg:
            key, value = arg.split("=", 1)
            meta[key] = value
        elif mode == "--stats" and "=" in arg:
            label, path = arg.split("=", 1)
            data = load_stats(path)
            if data is not None:
                stats[label] = data
    per_process = load_results(raw)
    results = aggregate(per_process)
    with open(out, "w", encoding="utf-8") as handle:
        json.dump({"meta": meta, "results": results, "per_process": per_process, "shim_stats": stats},
                  handle, indent=1)
        handle.write("\n")
    if not results:
        print("summarize: no results")
        return 1

    micro = [r for r in results if r.get("workload") != "program"]
    programs = [r for r in results if r.get("workload") == "program"]
    labels, cases, cell, units = [], [], {}, {}
    for r in micro:
        key = f"{r['workload']}/{r['case']}"
        if r["label"] not in labels:
            labels.append(r["label"])
        if key not in cases:
            cases.append(key)
        cell[(key, r["label"])] = r["median"]
        units[key] = r["unit"]

    spread = {}
    for r in micro:
        if r.get("processes", 1) > 1 and r["median"] > 0:
            spread[(f"{r['workload']}/{r['case']}", r["label"])] = max(r["process_medians"]) / min(r["process_medians"])
    print("Medians (host clock; median over processes; lower is better):")
    rows = [[key + f" [{units[key]}]"] + [human(cell[(key, l)], units[key]) if (key, l) in cell else "-"
                                          for l in labels] for key in cases]
    print(table(rows, ["workload/case"] + labels))

    shim_labels = [l for l in labels if l.startswith("poolshim")]
    peers = [p for p in PEERS if p in labels]
    main_label = "poolshim_pool" if "poolshim_pool" in labels else (shim_labels[0] if shim_labels else None)
    if main_label and peers:
        print(f"\nRatios {main_label} / peer (below 1: poolshim faster):")
        rows = []
        for key in cases:
            if (key, main_label) not in cell:
                continue
            rows.append([key] + [f"{cell[(key, main_label)] / cell[(key, p)]:.3f}"
                                 if (key, p) in cell and cell[(key, p)] > 0 else "-" for p in peers])
        print(table(rows, ["workload/case"] + peers))
        print("\nGeometric mean of poolshim / peer over the cases both ran:")
        rows = []
        for label in shim_labels:
            row = [label]
            for p in peers:
                ratios = [cell[(k, label)] / cell[(k, p)] for k in cases
                          if (k, label) in cell and (k, p) in cell and cell[(k, p)] > 0 and cell[(k, label)] > 0]
                row.append(f"{math.exp(sum(math.log(x) for x in ratios) / len(ratios)):.3f} ({len(ratios)})"
                           if ratios else "-")
            rows.append(row)
        print(table(rows, ["poolshim stack"] + peers))
    if spread:
        print("\nBetween-process spread (max / min of the processes' medians), worst case per allocator:")
        rows = [[l, f"{max(v for (k, lab), v in spread.items() if lab == l):.2f}"] for l in labels
                if any(lab == l for (_, lab) in spread)]
        print(table(rows, ["allocator", "spread"]))
    if programs:
        print("\nWhole programs (wall time of the timed loop; ratio to the first run of the same program):")
        rows, first = [], {}
        for r in programs:
            base = first.setdefault(r["case"], r["median"])
            rows.append([r["case"], r["label"], f"{r['median']:.2f} s", f"{r['median'] / base:.2f}" if base else "-"])
        print(table(rows, ["program", "run", "wall", "ratio"]))
    if stats:
        print("\nWhat the shim saw (from POOLSHIM_STATS=json):")
        rows = []
        for label, data in stats.items():
            device = (data.get("devices") or [{}])[0]
            calls = device.get("calls", {})
            doors = device.get("doors", {})
            rows.append([label, device.get("stack", "?"), sum(v for v in calls.values() if isinstance(v, (int, float))),
                         doors.get("runtime", 0), doors.get("driver", 0), device.get("passthrough", 0),
                         device.get("failures", 0)])
        print(table(rows, ["run", "stack", "calls", "runtime", "driver", "passthrough", "failures"]))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
