#!/bin/sh
# A stand-in for torchrun / mpirun -np 2: starts the command twice at once,
# as rank 0 and rank 1 (RANK, as torchrun sets it), waits for both and exits
# with the status of the last one that failed (0 when both succeeded).
RANK=0 "$@" &
first=$!
RANK=1 "$@" &
second=$!
status=0
wait "$first" || status=$?
wait "$second" || status=$?
exit "$status"
