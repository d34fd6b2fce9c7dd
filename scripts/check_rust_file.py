#!/usr/bin/env python3
"""Checks, value by value, a safetensors file that syncmem wrote (see
crates/syncmem/examples/write_fixture.rs) against scripts/interop_table.py.

Reads it twice: with `safetensors.numpy` (every dtype numpy has) and with the raw
`safetensors.deserialize` (all of them, bf16 included). Exits 1 on the first kind of mismatch
with a list of every mismatch, 0 when the file holds exactly the table's tensors. Usage:

    python3 scripts/check_rust_file.py FILE.safetensors
"""

import sys

import numpy as np
import safetensors
from safetensors import safe_open

from interop_table import NUMPY, TABLE, expected_array


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    path = sys.argv[1]
    errors = []
    with open(path, "rb") as f:
        raw = {name: entry for name, entry in safetensors.deserialize(f.read())}
    expected_names = {name for name, *_ in TABLE}
    if set(raw) != expected_names:
        errors.append(
            f"names differ: missing {sorted(expected_names - set(raw))}, "
            f"unexpected {sorted(set(raw) - expected_names)}"
        )
    with safe_open(path, framework="numpy") as f:
        for name, dtype, shape, seed in TABLE:
            if name not in raw:
                continue
            entry = raw[name]
            want = expected_array(dtype, shape, seed)
            if entry["dtype"] != dtype:
                errors.append(f"{name}: dtype {entry['dtype']}, expected {dtype}")
                continue
            if tuple(entry["shape"]) != tuple(shape):
                errors.append(f"{name}: shape {entry['shape']}, expected {list(shape)}")
                continue
            got_raw = np.frombuffer(bytes(entry["data"]), dtype=NUMPY[dtype]).reshape(shape)
            if got_raw.tobytes() != want.tobytes():
                bad = np.flatnonzero(got_raw.reshape(-1) != want.reshape(-1))
                errors.append(
                    f"{name}: {len(bad)} raw element(s) differ, first at {bad[:5].tolist()}: "
                    f"got {got_raw.reshape(-1)[bad[:5]].tolist()}, "
                    f"expected {want.reshape(-1)[bad[:5]].tolist()}"
                )
            if dtype == "BF16":
                continue  # numpy has no bfloat16: checked through the raw bytes above
            got = f.get_tensor(name)
            if got.dtype != want.dtype or got.shape != want.shape or not np.array_equal(got, want):
                errors.append(
                    f"{name}: safetensors.numpy gives {got.dtype} {got.shape} {got.tolist()}, "
                    f"expected {want.dtype} {want.shape} {want.tolist()}"
                )
    if errors:
        print(f"{path}: {len(errors)} mismatch(es):", file=sys.stderr)
        for e in errors:
            print(f"  {e}", file=sys.stderr)
        return 1
    print(f"{path}: all {len(TABLE)} tensors match (dtypes, shapes, every value)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
