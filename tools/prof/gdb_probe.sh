# shellcheck shell=bash
# What the gdb probes of this folder share (copy_calls.sh, driver_calls.sh);
# sourced, from the repository root, after `set -u`.
#   find_gdb NAME        sets $gdb to gdb or cuda-gdb; without either, says
#                        that NAME has none and exits
#   build_both SOURCE OUT NVCC_FLAGS...
#                        builds SOURCE twice into build/prof: OUT_static
#                        (static cudart, nvcc's default) and OUT_shared
#                        (-cudart shared); exits when either fails
#   gdb_opening BEGIN PATTERN
#                        prints a gdb script's opening: no pagination or
#                        questions, run to the program's marker BEGIN, then a
#                        breakpoint at every function matching PATTERN
#                        (rbreak; numbered from 2), whose commands follow
#   gdb_closing END      prints its end: at the marker END the program is
#                        killed and gdb quits; until then it runs on

find_gdb() {
    gdb=$(command -v gdb || command -v cuda-gdb || ls /usr/local/cuda/bin/cuda-gdb 2>/dev/null)
    [ -n "$gdb" ] || { echo "$1: no gdb here"; exit 1; }
}

build_both() {
    local source=$1 out=$2
    shift 2
    mkdir -p build/prof
    nvcc "$@" -o "build/prof/${out}_static" "$source" &&
        nvcc "$@" -cudart shared -o "build/prof/${out}_shared" "$source" || exit 1
}

gdb_opening() {
    printf 'set pagination off\nset confirm off\nset breakpoint pending on\n'
    printf 'break %s\nrun\nrbreak %s\n' "$1" "$2"
}

gdb_closing() {
    printf 'break %s\ncommands\nsilent\nkill\nquit\nend\ncontinue\n' "$1"
}
