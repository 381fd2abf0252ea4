#!/usr/bin/env bash
# Which driver functions each runtime copy reaches (cuMemcpy*, cuMemset*), static and
# shared cudart: cuda-gdb (or gdb) stops at tools/prof/copy_calls.cu's marks and at
# every cuMemcpy*/cuMemset* function between its two markers. On the GPU machine:
#   tools/prof/copy_calls.sh
# The shim must hook every function printed here to see the program's copies.
set -u
cd "$(dirname "$0")/../.." || exit 1
# shellcheck source=tools/prof/gdb_probe.sh
. tools/prof/gdb_probe.sh
gdb_probe copy_calls cc -O0 -g
{
    gdb_opening copies_begin '^cuMem[cs]'
    gdb_each_stop <<'GDB'
printf "  -> %s\n", $_as_string($pc)
GDB
    cat <<'GDB'
break mark
commands
silent
printf "%s\n", what
continue
end
GDB
    gdb_closing copies_end
} >"$script"
for kind in static shared; do
    echo "== $kind cudart"
    "$gdb" -q -batch -x "$script" "build/prof/cc_$kind" 2>&1 |
        grep -E '^(cuda|end|  -> )' | sed -E 's/  -> 0x[0-9a-f]+ <([A-Za-z0-9_]+)(\+[0-9]+)?>.*/  -> \1/' | uniq
done
