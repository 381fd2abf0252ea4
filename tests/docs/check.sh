#!/bin/sh
# make test-docs (part of make test): what README.md and the tracked text promise.
#   1. README.md has at most 250 lines;
#   2. every results file README.md names (DATE_*.txt) exists in tools/bench/results/;
#   3. no text of the project cites issue numbers, machine kinds or a carried
#      folder: git grep over the tracked files (grep -r over the source folders
#      outside a git checkout), docs/design.md and docs/benchmarks.md aside
#      while they are being rewritten.
# Prints each failure; exit 1 when there is one.
set -u
cd "$(dirname "$0")/../.." || exit 1
failed=0
fail() { echo "test-docs: $*"; failed=1; }

lines=$(wc -l < README.md)
[ "$lines" -le 250 ] || fail "README.md has $lines lines (at most 250)"

for f in $(grep -o '20[0-9][0-9]-[0-9][0-9]-[0-9][0-9]_[A-Za-z0-9_]*\.txt' README.md | sort -u); do
    [ -f "tools/bench/results/$f" ] || fail "README.md names $f, which is not in tools/bench/results/"
done

# (written so that this file does not match it)
pattern='[Ii]ssue [0-9]+|nvidia-h[0-9]|[.]carry|lent (GPU|machine)'
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    found=$(git grep -nE "$pattern" -- . ':!docs/design.md' ':!docs/benchmarks.md')
else
    found=$(grep -rnE "$pattern" README.md CHANGELOG.md Makefile mk config core shim tools tests docs python \
        --exclude=design.md --exclude=benchmarks.md)
fi
[ -z "$found" ] || fail "text that cites issues, machine kinds or a carried folder:
$found"

[ "$failed" = 0 ] && echo "test-docs: README.md $lines lines, its results files present, no issue numbers or machine kinds"
exit "$failed"
