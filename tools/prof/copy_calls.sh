#!/usr/bin/env bash
# Which driver functions each runtime copy reaches (cuMemcpy*, cuMemset*), static and
# shared cudart: cuda-gdb (or gdb) stops at tools/prof/copy_calls.cu's marks and at
# every cuMemcpy*/cuMemset* function between its two markers. On the GPU machine:
#   tools/prof/copy_calls.sh
# The shim must hook every function printed here to see the program's copies.
set -u
cd "$(dirname "$0")/../.." || exit 1
gdb=$(command -v gdb || command -v cuda-gdb || ls /usr/local/cuda/bin/cuda-gdb 2>/dev/null)
[ -n "$gdb" ] || { echo "copy_calls: no gdb here"; exit 1; }
mkdir -p build/prof
nvcc -O0 -g -o build/prof/cc_static tools/prof/copy_calls.cu &&
    nvcc -O0 -g -cudart shared -o build/prof/cc_shared tools/prof/copy_calls.cu || exit 1
script=build/prof/copy_calls.gdb
cat > "$script" <<'GDB'
set pagination off
set confirm off
set breakpoint pending on
break copies_begin
run
rbreak ^cuMem[cs]
commands 2-2000
silent
printf "  -> %s\n", $_as_string($pc)
continue
end
break mark
commands
silent
printf "%s\n", what
continue
end
break copies_end
commands
silent
kill
quit
end
continue
GDB
for kind in static shared; do
    echo "== $kind cudart"
    "$gdb" -q -batch -x "$script" "build/prof/cc_$kind" 2>&1 |
        grep -E '^(cuda|end|  -> )' | sed -E 's/  -> 0x[0-9a-f]+ <([A-Za-z0-9_]+)(\+[0-9]+)?>.*/  -> \1/' | uniq
done
