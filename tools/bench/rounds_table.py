"""The median tables of benchmarks that run a program in alternated rounds, each line it
prints prefixed with `LABEL ROUND ` (tools/bench/growth.sh, tools/bench/multigpu.sh):
  python3 rounds_table.py growth FILE   first_malloc's ms per size and stack: the median
                                        of the rounds after the first, the ratio to native
                                        and the first round apart
  python3 rounds_table.py peer FILE     peer_copy_bw's GB/s per copy: the median of every
                                        round natively and under the shim, and their ratio
"""
import re
import statistics
import sys


def read(path, program, unit, name=lambda what: what):
    """{what: {label: [(round, value)]}} of FILE's lines `LABEL ROUND PROGRAM: WHAT VALUE
    UNIT`, in the order first seen; NAME(WHAT) keys the rows."""
    line_re = re.compile(r"(\S+) (\d+) %s: (.+?) ([0-9.]+) %s" % (re.escape(program), re.escape(unit)))
    runs = {}
    for line in open(path):
        m = line_re.match(line)
        if m:
            runs.setdefault(name(m.group(3)), {}).setdefault(m.group(1), []).append(
                (int(m.group(2)), float(m.group(4))))
    return runs


def growth(path):
    runs = read(path, "first_malloc", "ms", lambda what: re.sub(r"fill \d+ blocks", "fill", what))
    for what, by in runs.items():
        def med(label):
            later = [t for r, t in by.get(label, []) if r > 1] or [t for r, t in by.get(label, [])]
            return statistics.median(later) if later else None
        native = med("native")
        cells = []
        for label, values in by.items():
            m = med(label)
            first = [t for r, t in values if r == 1]
            ratio = f" {m / native:6.2f}x" if native and label != "native" else ""
            cells.append(f"{label} {m:9.2f}{ratio} (first {first[0]:.2f})" if first else f"{label} {m:9.2f}{ratio}")
        print(f"  {what:10s} " + " | ".join(cells))


def peer(path):
    for copy, by in read(path, "peer_copy_bw", "GB/s").items():
        if "native" in by and "shim" in by:
            n = statistics.median(t for r, t in by["native"])
            s = statistics.median(t for r, t in by["shim"])
            print(f"  {copy:14s} native {n:7.1f} GB/s  poolshim {s:7.1f} GB/s  ratio {s / n:.3f}")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("growth", "peer"):
        sys.exit(__doc__)
    {"growth": growth, "peer": peer}[sys.argv[1]](sys.argv[2])
