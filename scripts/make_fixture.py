#!/usr/bin/env python3
"""Writes crates/syncmem/tests/fixtures/python_written.safetensors with Python's safetensors.

Values come from numpy (scripts/interop_table.py); the file is written by the reference
`safetensors` package, so the Rust test that loads it checks syncmem against the reference
writer. Needs `python3 -m pip install safetensors numpy`. Usage, from anywhere:

    python3 scripts/make_fixture.py [OUTPUT]
"""

import os
import sys

import numpy as np
import safetensors

from interop_table import TABLE, expected_array

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(ROOT, "crates", "syncmem", "tests", "fixtures", "python_written.safetensors")


# safetensors dtype -> the dtype name the Python package's writer takes.
SPEC_NAMES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "U16": "uint16",
    "I16": "int16",
    "U32": "uint32",
    "I32": "int32",
    "U64": "uint64",
    "I64": "int64",
    "F16": "float16",
    "BF16": "bfloat16",
    "F32": "float32",
    "F64": "float64",
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else DEFAULT
    arrays = {}
    tensors = {}
    for name, dtype, shape, seed in TABLE:
        # Contiguous little-endian arrays, kept alive in `arrays` while the writer reads them.
        array = np.ascontiguousarray(expected_array(dtype, shape, seed))
        arrays[name] = array
        # The raw form of the reference writer (what safetensors.numpy.save_file calls): numpy
        # has no bfloat16 type, and this way every dtype goes through the same path.
        if hasattr(safetensors, "TensorSpec"):  # safetensors >= 0.8
            tensors[name] = safetensors.TensorSpec(
                dtype=SPEC_NAMES[dtype],
                shape=list(shape),
                data_ptr=array.ctypes.data,
                data_len=array.nbytes,
            )
        else:
            tensors[name] = {
                "dtype": SPEC_NAMES[dtype],
                "shape": list(shape),
                "data": array.tobytes(),
            }
    metadata = {"producer": "scripts/make_fixture.py"}
    safetensors.serialize_file(tensors, out, metadata=metadata)
    del arrays
    print(f"wrote {len(tensors)} tensors to {out} ({os.path.getsize(out)} bytes)")


if __name__ == "__main__":
    main()
