#!/usr/bin/env bash
# Which driver (cu*) functions two cudaMalloc+cudaFree pairs reach after warm-up,
# natively and under the shim, static and shared cudart: gdb stops at every cu*
# function (libcuda's exported ones and the shim's hooks) between the program's
# two markers and prints the function and its caller's object. On the GPU machine:
#   tools/prof/driver_calls.sh [SIZE]          (LIB default build/libpoolshim.so)
set -u
cd "$(dirname "$0")/../.." || exit 1
size=${1:-256}
lib=$(readlink -f "${LIB:-build/libpoolshim.so}")
# shellcheck source=tools/prof/gdb_probe.sh
. tools/prof/gdb_probe.sh
gdb_probe driver_calls dc -O2 -g
{
    gdb_opening pairs_begin '^cu[A-Z]'
    gdb_each_stop <<'GDB'
bt 2
GDB
    gdb_closing pairs_end
} >"$script"
for kind in static shared; do
    for pre in "" "$lib"; do
        how=natively
        [ -n "$pre" ] && how="under the shim"
        echo "=== $kind cudart, $how, two $size B pairs"
        env ${pre:+LD_PRELOAD=$pre} timeout 120 "$gdb" -q -batch -x "$script" --args build/prof/dc_$kind "$size" 2>&1 |
            python3 -c '
import re, sys, collections
frame = re.compile(r"^#([01]) +(?:0x[0-9a-f]+ in )?(\S+) \(.*?\)(?: at (\S+)| from (\S+))?")
counts, callee = collections.Counter(), None
for line in sys.stdin:
    m = frame.match(line)
    if not m:
        continue
    name, where = m.group(2), (m.group(3) or m.group(4) or "?").rsplit("/", 1)[-1]
    if m.group(1) == "0":
        callee = name
    elif callee:
        counts[(callee, name if name != "??" else where)] += 1
        callee = None
for (f, c), n in counts.most_common():
    print("%4d  %-28s <- %s" % (n, f, c))
print("(%d calls in two pairs)" % sum(counts.values()))'
    done
done
