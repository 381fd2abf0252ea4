# shellcheck shell=bash
# What the gdb probes of this folder share (copy_calls.sh, driver_calls.sh);
# sourced, from the repository root, after `set -u`.
#   gdb_probe NAME OUT NVCC_FLAGS...
#                        find_gdb NAME, build_both tools/prof/NAME.cu OUT
#                        NVCC_FLAGS..., and sets $script to the path of the
#                        probe's gdb script, build/prof/NAME.gdb
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
#                        (rbreak; numbered from 2)
#   gdb_each_stop        prints the commands of those breakpoints: silent,
#                        the gdb lines read from stdin, continue
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

gdb_probe() {
    local name=$1
    shift
    find_gdb "$name"
    build_both "tools/prof/$name.cu" "$@"
    # shellcheck disable=SC2034  # read by the script that sources this file
    script=build/prof/$name.gdb
}

gdb_opening() {
    printf 'set pagination off\nset confirm off\nset breakpoint pending on\n'
    printf 'break %s\nrun\nrbreak %s\n' "$1" "$2"
}

gdb_each_stop() {
    printf 'commands 2-2000\nsilent\n'
    cat
    printf 'continue\nend\n'
}

gdb_closing() {
    printf 'break %s\ncommands\nsilent\nkill\nquit\nend\ncontinue\n' "$1"
}
