#!/usr/bin/env python3
"""Per-function totals of a tools/prof/sampler.c output.

    resolve.py SAMPLES OBJECT...

Each "object+0xOFFSET" line is mapped to the function containing OFFSET,
from `nm` of the local OBJECT whose file name matches (the same build that
ran); objects not given (libcuda) stay one line each. Prints the 45 most
frequent functions with their share of the samples."""
import bisect
import collections
import os
import subprocess
import signal
import sys

# piped into head: stop quietly when the reader goes away
signal.signal(signal.SIGPIPE, signal.SIG_DFL)


def symbols(path):
    """(address, name) of the text symbols of path, sorted."""
    out = subprocess.run(['nm', '-C', '--defined-only', path], capture_output=True, text=True).stdout
    table = []
    for line in out.splitlines():
        parts = line.split(' ', 2)
        if len(parts) == 3 and parts[1] in 'tTwW':
            table.append((int(parts[0], 16), parts[2]))
    return sorted(table)


def main():
    lines = open(sys.argv[1]).read().splitlines()[1:]
    objects = {os.path.basename(p): p for p in sys.argv[2:]}
    tables = {}
    totals = collections.Counter()
    all_samples = 0
    for line in lines:
        if not line.strip():
            continue
        _, count, name = line.split(None, 2)
        count = int(count)
        all_samples += count
        if '+0x' in name and ' (' not in name:
            obj, offset = name.split('+0x')
            if obj in objects:
                table = tables.setdefault(obj, symbols(objects[obj]))
                i = bisect.bisect_right(table, (int(offset, 16), '\uffff')) - 1
                name = '%s [%s]' % (table[i][1] if i >= 0 else '?', obj)
            else:
                name = obj
        totals[name] += count
    for name, count in totals.most_common(45):
        print('%6.2f%%  %s' % (100.0 * count / max(all_samples, 1), name))


if __name__ == '__main__':
    main()
