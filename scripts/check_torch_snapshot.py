#!/usr/bin/env python3
"""Checks a memory snapshot in PyTorch's format (as `syncmem trace export-torch` writes it)
with Python's own pickle: the file is a protocol 2-4 pickle (PyTorch's viewer reads no other),
the dict has the keys PyTorch's tools read, the blocks of every segment tile it, and replaying
each device's history backwards from the final state ends with no segment and no block (what
PyTorch's viewer does to draw the allocator's state at each event).

    python3 scripts/check_torch_snapshot.py FILE [--from-empty]

`--from-empty`: the trace began with empty pools, so the backward replay must end empty.
Prints one line per device and exits non-zero on the first problem.
"""

import pickle
import pickletools
import sys

BLOCK_STATES = {"active_allocated", "active_pending_free", "inactive"}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom"}


def fail(msg):
    print(f"check_torch_snapshot: {msg}", file=sys.stderr)
    sys.exit(1)


def check(path, from_empty):
    data = open(path, "rb").read()
    if data[:1] != b"\x80" or not 2 <= data[1] <= 4:
        fail(f"{path}: not a pickle of protocol 2-4 (starts {data[:2]!r})")
    ops = {op.name for op, _, _ in pickletools.genops(data)}
    # The opcodes PyTorch's viewer (MemoryViz.js) reads.
    allowed = {"PROTO", "FRAME", "STOP", "MARK", "EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE",
               "APPEND", "APPENDS", "SETITEM", "SETITEMS", "DICT", "LIST", "TUPLE", "TUPLE1",
               "TUPLE2", "TUPLE3", "BININT", "BININT1", "BININT2", "LONG1", "NONE", "NEWTRUE",
               "NEWFALSE", "SHORT_BINUNICODE", "BINUNICODE", "BINFLOAT", "MEMOIZE", "BINPUT",
               "LONG_BINPUT", "BINGET", "LONG_BINGET"}
    if not ops <= allowed:
        fail(f"{path}: opcodes the viewer cannot read: {sorted(ops - allowed)}")
    snap = pickle.loads(data)
    if not isinstance(snap, dict) or not {"segments", "device_traces"} <= snap.keys():
        fail(f"{path}: not a snapshot dict: {type(snap).__name__}")
    traces = snap["device_traces"]
    for seg in snap["segments"]:
        for key in ("device", "address", "total_size", "stream", "segment_type", "blocks"):
            if key not in seg:
                fail(f"segment without {key!r}: {seg}")
        if not 0 <= seg["device"] < len(traces):
            fail(f"segment of device {seg['device']}, but {len(traces)} device traces")
        if sum(b["size"] for b in seg["blocks"]) != seg["total_size"]:
            fail(f"the blocks of segment {seg['address']:#x} do not tile it")
        for b in seg["blocks"]:
            if b["state"] not in BLOCK_STATES or "requested_size" not in b:
                fail(f"bad block {b}")
    for device, trace in enumerate(traces):
        segments = {}
        blocks = {}
        for seg in (s for s in snap["segments"] if s["device"] == device):
            segments[seg["address"]] = seg["total_size"]
            addr = seg["address"]
            for b in seg["blocks"]:
                if b["state"] != "inactive":
                    blocks[addr] = b["size"]
                addr += b["size"]

        def inside(addr):
            return any(a <= addr < a + n for a, n in segments.items())

        for e in reversed(trace):
            action = e["action"]
            if action not in ACTIONS:
                fail(f"device {device}: unknown action {action!r}")
            if action != "oom" and "addr" not in e:
                fail(f"device {device}: {action} without addr")
            for key in ("size", "stream", "frames"):
                if key not in e:
                    fail(f"device {device}: {action} without {key!r}")
            if action == "alloc":
                if blocks.pop(e["addr"], None) is None:
                    fail(f"device {device}: alloc of {e['addr']:#x}: no such block")
            elif action == "free_requested":
                if e["addr"] not in blocks:
                    fail(f"device {device}: free_requested of {e['addr']:#x}: no such block")
            elif action == "free_completed":
                if not inside(e["addr"]):
                    fail(f"device {device}: freed block {e['addr']:#x} is in no segment")
                blocks[e["addr"]] = e["size"]
            elif action == "segment_alloc":
                if segments.pop(e["addr"], None) != e["size"]:
                    fail(f"device {device}: segment_alloc of {e['addr']:#x}: no such segment")
                if any(e["addr"] <= b < e["addr"] + e["size"] for b in blocks):
                    fail(f"device {device}: segment {e['addr']:#x} made with blocks in it")
            elif action == "segment_free":
                segments[e["addr"]] = e["size"]
        if from_empty and (blocks or segments):
            fail(f"device {device}: the backward replay ends with {len(segments)} segment(s) "
                 f"and {len(blocks)} block(s)")
        labels = snap.get("device_labels", [])
        label = labels[device] if device < len(labels) else "?"
        print(f"device {device} ({label}): {len(trace)} events, replay ok")
    print(f"{path}: {len(snap['segments'])} segments, protocol {data[1]}, ok")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 1:
        fail("usage: check_torch_snapshot.py FILE [--from-empty]")
    check(args[0], "--from-empty" in sys.argv)
