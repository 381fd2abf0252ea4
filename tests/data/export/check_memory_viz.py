"""Checks a memory_viz snapshot written by `poolshim export --memory-viz`.

usage: python3 check_memory_viz.py SNAPSHOT.pickle

Loads it with Python's pickle and checks what PyTorch's memory_viz reads
(torch/cuda/_memory_viz.py and torch/utils/viz/MemoryViz.js):
  * only the opcodes MemoryViz.js's own unpickler knows, integers of at most
    8 bytes (it turns longer ones into BigInt);
  * a dict with "segments" (device, address, total_size, allocated_size,
    active_size, requested_size, stream, segment_type, blocks: address,
    size, requested_size, state, frames; the blocks tile the segment) and
    "device_traces" (a list indexed by device of lists of events: action,
    addr or device_free for oom, size, stream, time_us, frames);
  * the "Allocator State History" view replays a trace backwards from the
    segments: at every step every live block must lie inside a segment.
Prints one JSON line: {"problems": [...], "device_traces": N,
"devices": {"D": {"alloc": n, "free_requested": n, "free_completed": n,
"oom": n, "segment_alloc": n, "segment_free": n, "segments": n,
"segment_bytes": n, "peak_active": n}}}.
"""
import json
import pickle
import pickletools
import sys

OPCODES = {"PROTO", "STOP", "MARK", "EMPTY_DICT", "SETITEMS", "EMPTY_LIST", "APPENDS", "BININT",
           "BININT1", "BININT2", "LONG1", "BINUNICODE", "SHORT_BINUNICODE", "BINFLOAT", "NONE",
           "NEWTRUE", "NEWFALSE"}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom",
           "segment_map", "segment_unmap", "snapshot"}
STATES = {"active_allocated", "active_pending_free", "inactive"}

problems = []


def problem(text):
    if len(problems) < 20:
        problems.append(text)


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def check_opcodes(data):
    for op, arg, _ in pickletools.genops(data):
        if op.name not in OPCODES:
            problem(f"opcode {op.name} is not one MemoryViz.js reads")
        if op.name == "LONG1" and arg is not None and (arg >= 2**63 or arg < -2**63):
            problem(f"integer {arg} needs more than 8 bytes")


def check_frames(where, frames):
    if not isinstance(frames, list):
        problem(f"{where}: frames is not a list")
        return
    for f in frames:
        if not (isinstance(f, dict) and {"filename", "line", "name"} <= f.keys()):
            problem(f"{where}: a frame without filename/line/name")


def main(path):
    with open(path, "rb") as f:
        data = f.read()
    check_opcodes(data)
    snapshot = pickle.loads(data)
    if not isinstance(snapshot, dict) or not {"segments", "device_traces"} <= snapshot.keys():
        print(json.dumps({"problems": ["not a dict with segments and device_traces"]}))
        return
    segments, traces = snapshot["segments"], snapshot["device_traces"]
    if not isinstance(segments, list) or not isinstance(traces, list):
        print(json.dumps({"problems": ["segments or device_traces is not a list"]}))
        return
    devices = {}
    for number in range(len(traces)):
        devices[number] = dict(alloc=0, free_requested=0, free_completed=0, oom=0, segment_alloc=0,
                               segment_free=0, segments=0, segment_bytes=0, peak_active=0)
    end_segments = {d: {} for d in devices}
    end_blocks = {d: {} for d in devices}
    for i, seg in enumerate(segments):
        where = f"segment {i}"
        keys = {"device", "address", "total_size", "allocated_size", "active_size", "requested_size",
                "stream", "segment_type", "blocks"}
        if not isinstance(seg, dict) or not keys <= seg.keys():
            problem(f"{where}: missing {sorted(keys - set(seg))}")
            continue
        for k in keys - {"segment_type", "blocks"}:
            if not is_int(seg[k]):
                problem(f"{where}: {k} is not an int")
        if seg["segment_type"] not in ("small", "large"):
            problem(f"{where}: segment_type {seg['segment_type']!r}")
        if seg["device"] not in devices:
            problem(f"{where}: device {seg['device']} has no trace list")
            continue
        check_frames(where, seg.get("frames", []))
        address, active = seg["address"], 0
        if not seg["blocks"]:
            problem(f"{where}: no blocks")
        for j, b in enumerate(seg["blocks"]):
            bkeys = {"address", "size", "requested_size", "state", "frames"}
            if not bkeys <= b.keys():
                problem(f"{where} block {j}: missing {sorted(bkeys - set(b))}")
                continue
            if b["address"] != address:
                problem(f"{where} block {j}: at {b['address']:#x}, the previous block ends at {address:#x}")
            if b["state"] not in STATES:
                problem(f"{where} block {j}: state {b['state']!r}")
            if b["requested_size"] > b["size"]:
                problem(f"{where} block {j}: requested_size above size")
            check_frames(f"{where} block {j}", b["frames"])
            if b["state"] == "active_allocated":
                active += b["size"]
                end_blocks[seg["device"]][b["address"]] = b["size"]
            address += b["size"]
        if address - seg["address"] != seg["total_size"]:
            problem(f"{where}: blocks cover {address - seg['address']} of {seg['total_size']} bytes")
        if active != seg["active_size"] or active != seg["allocated_size"]:
            problem(f"{where}: active/allocated size {seg['active_size']}/{seg['allocated_size']}, blocks {active}")
        end_segments[seg["device"]][seg["address"]] = seg["total_size"]
        devices[seg["device"]]["segments"] += 1
        devices[seg["device"]]["segment_bytes"] += seg["total_size"]

    for d, trace in enumerate(traces):
        if not isinstance(trace, list):
            problem(f"device_traces[{d}] is not a list")
            continue
        figures, active, last_time, allocated = devices[d], 0, None, {}
        for k, e in enumerate(trace):
            where = f"device {d} event {k}"
            action = e.get("action")
            if action not in ACTIONS:
                problem(f"{where}: action {action!r}")
                continue
            figures[action] = figures.get(action, 0) + 1
            needed = {"size", "stream", "time_us", "frames", "device_free" if action == "oom" else "addr"}
            if not needed <= e.keys():
                problem(f"{where}: missing {sorted(needed - set(e))}")
                continue
            if not all(is_int(e[x]) for x in needed - {"frames"}):
                problem(f"{where}: a field that should be an int is not")
            check_frames(where, e["frames"])
            if last_time is not None and e["time_us"] < last_time:
                problem(f"{where}: time_us goes back")
            last_time = e["time_us"]
            if action == "alloc":
                allocated[e["addr"]] = e["size"]
                active += e["size"]
                figures["peak_active"] = max(figures["peak_active"], active)
            elif action == "free_completed" and e["addr"] in allocated:
                active -= allocated.pop(e["addr"])
        # the segment view, backwards from the end (MemoryViz.js simulate_memory)
        segs, blocks = dict(end_segments[d]), dict(end_blocks[d])
        for k in range(len(trace) - 1, -1, -1):
            e = trace[k]
            action = e.get("action")
            if action == "segment_free":
                segs[e["addr"]] = e["size"]
            elif action == "segment_alloc":
                if e["addr"] not in segs:
                    problem(f"device {d} event {k}: segment_alloc of a segment that is not there")
                segs.pop(e["addr"], None)
            elif action == "free_completed":
                blocks[e["addr"]] = e["size"]
            elif action == "alloc":
                blocks.pop(e["addr"], None)
            for addr, size in blocks.items():
                if not any(s <= addr and addr + size <= s + n for s, n in segs.items()):
                    problem(f"device {d} before event {k}: block {addr:#x} lies in no segment")
                    break
    print(json.dumps({"problems": problems, "device_traces": len(traces),
                      "devices": {str(d): f for d, f in devices.items()}}))


if __name__ == "__main__":
    main(sys.argv[1])
