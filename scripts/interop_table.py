"""The tensors of the safetensors interop check, shared by make_fixture.py and check_rust_file.py.

The same table lives in Rust in crates/syncmem/tests/fixtures/interop.rs: keep the two equal.
Element i (row-major index) of a tensor holds value(dtype, seed + i); the formulas use exact
integer arithmetic, and floats are exact or correctly rounded, so both languages agree bit for bit.
"""

import numpy as np

# (name, safetensors dtype, shape, seed)
TABLE = [
    ("bool", "BOOL", (2, 3), 0),
    ("u8", "U8", (5,), 0),
    ("i8", "I8", (2, 2, 2), 0),
    ("u16", "U16", (3,), 0),
    ("i16", "I16", (2, 3), 0),
    ("u32", "U32", (4,), 0),
    ("i32", "I32", (3, 2), 0),
    ("u64", "U64", (3,), 0),
    ("i64", "I64", (2, 2), 0),
    ("f16", "F16", (7,), 0),
    ("bf16", "BF16", (2, 3), 0),
    ("f32", "F32", (2, 3, 4), 0),
    ("f64", "F64", (5,), 0),
    ("scalar_f32", "F32", (), 7),
    ("scalar_i64", "I64", (), 5),
    ("scalar_bool", "BOOL", (), 1),
    ("empty_f32", "F32", (0, 3), 0),
    ("empty_u8", "U8", (0,), 0),
    ("empty_i64", "I64", (2, 0), 0),
]

GOLDEN = 0x9E3779B97F4A7C15

# Little-endian numpy types (bf16 is stored as its raw 16 bits).
NUMPY = {
    "BOOL": np.dtype("?"),
    "U8": np.dtype("u1"),
    "I8": np.dtype("i1"),
    "U16": np.dtype("<u2"),
    "I16": np.dtype("<i2"),
    "U32": np.dtype("<u4"),
    "I32": np.dtype("<i4"),
    "U64": np.dtype("<u8"),
    "I64": np.dtype("<i8"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
}


def value(dtype, i):
    """Element value: bool, int, or a Python float (f64) to be rounded to the element type."""
    if dtype == "BOOL":
        return i % 3 == 1
    if dtype == "U8":
        return (37 * i + 11) % 2**8
    if dtype == "I8":
        return (29 * i) % 2**8 - 2**7
    if dtype == "U16":
        return (4099 * i + 7) % 2**16
    if dtype == "I16":
        return (1021 * i) % 2**16 - 2**15
    if dtype == "U32":
        return (2654435761 * i + 5) % 2**32
    if dtype == "I32":
        return (2654435761 * i) % 2**32 - 2**31
    if dtype == "U64":
        return (GOLDEN * i + 3) % 2**64
    if dtype == "I64":
        return (GOLDEN * i) % 2**64 - 2**63
    if dtype == "F16":
        return (i - 3) * 0.25
    if dtype == "BF16":
        return (i - 2) * 0.5
    if dtype == "F32":
        return i / 3  # rounded to f32
    if dtype == "F64":
        return i / 3 - 1
    raise ValueError(f"unknown dtype {dtype}")


def expected_array(dtype, shape, seed):
    """The tensor as a numpy array of NUMPY[dtype] (bf16 as raw bits)."""
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    values = [value(dtype, seed + i) for i in range(n)]
    if dtype == "BF16":
        f32 = np.array(values, dtype="<f4")
        bits = (f32.view("<u4") >> 16).astype("<u2")
        # Every bf16 value of the table is exact: truncating the f32 loses nothing.
        back = (bits.astype("<u4") << 16).view("<f4")
        assert np.array_equal(back, f32), "bf16 table values must be exact"
        return bits.reshape(shape)
    return np.array(values, dtype=NUMPY[dtype]).reshape(shape)
