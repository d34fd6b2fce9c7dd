#!/usr/bin/env python3
"""Writes a large training-like trace (JSON lines, as `syncmem trace record` writes them) to
measure the memory page on: 4 segments of 64 MiB, six 4 MiB parameters alive throughout, and
per step 8 activations allocated and freed with their placements and a host-to-device copy
each, one device-to-host copy, an out-of-memory failure every 5000 steps. Deterministic.

    python3 scripts/make_large_trace.py OUT.jsonl [EVENTS]   (EVENTS: 1000000 by default)
"""

import json
import random
import sys


def main(path, events):
    rng = random.Random(1)
    out = open(path, "w")
    n = t = bid = 0

    def emit(d):
        nonlocal n, t
        t += rng.randint(1, 5)
        d["t_us"] = t
        out.write(json.dumps(d, separators=(",", ":")) + "\n")
        n += 1

    dev = "opencl:0"
    for s in range(4):
        emit({"op": "segment_alloc", "segment": s, "size": 64 << 20, "stream": 1, "device": dev})
    params = []
    for i in range(6):
        place = {"segment": 0, "offset": i * (4 << 20), "size": 4 << 20}
        emit({"op": "alloc", "id": bid, "size": 4 << 20, "stream": 1, "device": dev,
              "owner": f"w{i}", "place": place})
        params.append(bid)
        bid += 1
    step = 0
    while n < events:
        step += 1
        live = []
        off = 0
        scale = 1 + (step % 7) / 3
        for layer in range(8):
            size = int((2 << 20) * scale * (1 + layer % 3))
            place = {"segment": 1 + layer % 3, "offset": off, "size": size}
            emit({"op": "alloc", "id": bid, "size": size, "stream": 1, "device": dev,
                  "owner": f"act{layer}", "place": place, "step": step})
            live.append(bid)
            bid += 1
            off = (off + size) % (40 << 20)
            emit({"op": "copy", "direction": "host_to_device", "bytes": 4096 * (1 + layer),
                  "device": dev, "stream": 1, "step": step})
        for b in reversed(live):
            emit({"op": "free", "id": b, "device": dev, "step": step})
        emit({"op": "copy", "direction": "device_to_host", "bytes": 4, "device": dev,
              "stream": 1, "step": step})
        if step % 5000 == 0:
            emit({"op": "oom", "size": 1 << 30, "device": dev, "step": step})
    for b in params:
        emit({"op": "free", "id": b, "device": dev})
    print(f"{path}: {n} events, {step} steps")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: make_large_trace.py OUT.jsonl [EVENTS]")
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) == 3 else 1_000_000)
