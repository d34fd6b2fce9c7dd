"""Every library error arrives as a SyncmemError subclass with the library's message, which
also derives from the matching builtin exception; bad input raises, never crashes the
interpreter."""

import errno
import json
import os
import struct
import subprocess
import sys
import textwrap

import numpy
import pytest

import syncmem
from conftest import relu_net

CLASSES = [
    syncmem.OutOfMemoryError,
    syncmem.DeviceError,
    syncmem.ShapeError,
    syncmem.TypeMismatchError,
    syncmem.NotFoundError,
    syncmem.AlreadyExistsError,
    syncmem.BusyError,
    syncmem.InvalidStateError,
    syncmem.ConfigError,
    syncmem.FileError,
    syncmem.FormatError,
]


# Each class and the builtin it also derives from, so that `except KeyError` (say) works.
BUILTINS = {
    syncmem.OutOfMemoryError: MemoryError,
    syncmem.DeviceError: RuntimeError,
    syncmem.ShapeError: ValueError,
    syncmem.TypeMismatchError: TypeError,
    syncmem.NotFoundError: KeyError,
    syncmem.AlreadyExistsError: ValueError,
    syncmem.BusyError: RuntimeError,
    syncmem.InvalidStateError: ValueError,
    syncmem.ConfigError: ValueError,
    syncmem.FileError: OSError,
    syncmem.FormatError: ValueError,
}


def test_hierarchy():
    assert issubclass(syncmem.SyncmemError, Exception)
    assert set(BUILTINS) == set(CLASSES)
    for cls in CLASSES:
        assert issubclass(cls, syncmem.SyncmemError) and cls.__module__ == "syncmem"
        assert issubclass(cls, BUILTINS[cls]), cls
        assert cls.__doc__ and BUILTINS[cls].__name__ in cls.__doc__
        assert getattr(syncmem, cls.__name__) is cls


def _missing_file(ws, tmp_path):
    ws.load(tmp_path / "missing.safetensors")


def _corrupt_file(ws, tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}")
    ws.load(bad)


def _writable_view_then_device(ws, tmp_path):
    view = ws.tensor("x").numpy(writable=True)
    ws.tensor("x").to_device()
    del view


def _rename_onto_a_blob(ws, tmp_path):
    ws.feed_blob("y", [2.0])
    ws.rename_blob("x", "y")


# A real failure of each kind, caught by the builtin alone.
RAISES = [
    (syncmem.NotFoundError, lambda ws, tmp: ws.tensor("nothing")),
    (syncmem.NotFoundError, lambda ws, tmp: ws.run_net("missing")),
    (syncmem.NotFoundError, lambda ws, tmp: syncmem.get_workspace("no such workspace")),
    (syncmem.FileError, _missing_file),
    (syncmem.FormatError, _corrupt_file),
    (syncmem.ShapeError, lambda ws, tmp: ws.feed_blob("s", numpy.ones((2, 2))[:, 0], copy=False)),
    (syncmem.TypeMismatchError, lambda ws, tmp: ws.feed_blob("c", numpy.zeros(2, "complex64"))),
    (syncmem.InvalidStateError, lambda ws, tmp: ws.create_net("{not json")),
    (syncmem.AlreadyExistsError, _rename_onto_a_blob),
    (syncmem.DeviceError, lambda ws, tmp: syncmem.Device("bogus")),
    (syncmem.DeviceError, lambda ws, tmp: syncmem.memory_stats("opencl:42")),
    (syncmem.BusyError, _writable_view_then_device),
]


@pytest.mark.parametrize(
    "cls, call", RAISES, ids=[f"{c.__name__}-{i}" for i, (c, _) in enumerate(RAISES)]
)
def test_each_error_is_caught_as_its_builtin(cls, call, ws, tmp_path):
    ws.feed_blob("x", [1.0])
    builtin = BUILTINS[cls]
    with pytest.raises(builtin) as caught:
        call(ws, tmp_path)
    e = caught.value
    assert type(e) is cls and isinstance(e, syncmem.SyncmemError), type(e)
    # The message is the library's, as it is (a KeyError would otherwise show it quoted).
    assert str(e) == e.args[0] and not str(e).startswith("'"), str(e)


def test_file_errors_carry_the_errno(ws, tmp_path):
    with pytest.raises(OSError) as caught:
        ws.load(tmp_path / "missing.safetensors")
    assert caught.value.errno == errno.ENOENT
    assert "missing.safetensors" in str(caught.value)


@pytest.mark.parametrize(
    "spec, words",
    [("bogus", "bogus"), ("opencl:99", "no device opencl:99"), ("cpu:1", "one cpu"), ("", "empty")],
)
def test_bad_devices(spec, words):
    with pytest.raises(syncmem.DeviceError, match=words):
        syncmem.Device(spec)
    with pytest.raises(syncmem.DeviceError):
        syncmem.Workspace(device=spec)


def test_device_arguments_of_the_wrong_type(ws):
    with pytest.raises(syncmem.DeviceError, match="int"):
        ws.feed_blob("x", [1], device=3)


@pytest.mark.parametrize(
    "value", [numpy.zeros(2, "complex64"), numpy.zeros(2, "datetime64[s]"), numpy.array([1, "a"], object)]
)
def test_bad_dtypes(ws, value):
    with pytest.raises(syncmem.TypeMismatchError):
        ws.feed_blob("x", value)
    assert not ws.has_blob("x")


def test_wrong_shapes_in_a_net(ws):
    ws.feed_blob("x", numpy.ones((2, 3), "float32"))
    ws.feed_blob("w", numpy.ones((4, 5), "float32"))
    ws.feed_blob("b", numpy.ones(4, "float32"))
    ws.create_net({"name": "fc", "ops": [{"type": "FC", "inputs": ["x", "w", "b"], "outputs": ["y"]}]})
    with pytest.raises(syncmem.ShapeError, match='net "fc".*FC'):
        ws.run_net("fc")
    ws.feed_blob("i", numpy.ones(3, "int32"))
    ws.create_net(relu_net(x="i", y="j"))
    with pytest.raises(syncmem.TypeMismatchError, match="i32"):
        ws.run_net("relu")


def test_bad_nets(ws):
    with pytest.raises(syncmem.InvalidStateError, match="line 1"):
        ws.create_net("{not json")
    with pytest.raises(syncmem.InvalidStateError, match="name"):
        ws.create_net({"ops": []})
    with pytest.raises(syncmem.NotFoundError, match="Frobnicate"):
        ws.create_net({"name": "n", "ops": [{"type": "Frobnicate"}]})
    with pytest.raises(TypeError, match="JSON string or a dict"):
        ws.create_net(42)
    with pytest.raises(TypeError):
        ws.create_net({"name": object()})
    with pytest.raises(syncmem.NotFoundError, match="no nets"):
        ws.run_net("missing")
    assert ws.nets() == []


def test_files(ws, tmp_path):
    with pytest.raises(syncmem.FileError, match="missing.safetensors"):
        ws.load(tmp_path / "missing.safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}")
    with pytest.raises(syncmem.FormatError, match="bad.safetensors"):
        ws.load(bad)
    ws.feed_blob("x", [1.0])
    with pytest.raises(syncmem.FileError):
        ws.save(tmp_path / "no-such-dir" / "x.safetensors")
    with pytest.raises(syncmem.NotFoundError):
        ws.save(tmp_path / "y.safetensors", names=["nope"])


def safetensors_bytes(tensors):
    """A safetensors file from (name, dtype name, shape, raw bytes)."""
    header, offset, data = {}, 0, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        data += raw
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def test_bfloat16(ws, tmp_path):
    path = tmp_path / "bf16.safetensors"
    path.write_bytes(safetensors_bytes([("h", "BF16", [2], bytes([0x80, 0x3F, 0x00, 0xC0]))]))
    ws.load(path)
    t = ws.tensor("h")
    assert t.dtype == "bfloat16"
    out = ws.fetch_blob("h")
    assert out.dtype == numpy.float32 and out.tolist() == [1.0, -2.0]
    with pytest.raises(syncmem.TypeMismatchError, match="bfloat16"):
        t.numpy()
    if t.device.kind == "cpu":
        u = syncmem.from_dlpack(t)  # DLPack carries bfloat16 as it is
        assert u.dtype == "bfloat16" and u.shape == (2,)


def test_uninitialised_and_empty_blobs(ws):
    ws.create_net(relu_net())
    assert ws.has_blob("y")  # created empty by the net
    with pytest.raises(syncmem.TypeMismatchError, match='"y"'):
        ws.fetch_blob("y")
    with pytest.raises(syncmem.NotFoundError):
        ws.tensor("nothing")


def run_python(code, env=None):
    full = dict(os.environ, **(env or {}))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full,
        timeout=120,
    )


def test_out_of_memory_is_an_exception(device):
    r = run_python(
        f"""
        import numpy, syncmem
        ws = syncmem.Workspace(device={str(device)!r})
        ws.feed_blob("big", numpy.ones(4 << 20, "uint8"))
        try:
            ws.tensor("big").to_device()
        except MemoryError as e:
            assert isinstance(e, syncmem.OutOfMemoryError), type(e)
            print("OOM:", e)
        """,
        env={"SYNCMEM_POOL_CONF": "memory_cap=1MiB"},
    )
    assert r.returncode == 0, r.stderr
    assert "OOM: out of memory on " + str(device) in r.stdout


def test_config_errors():
    r = run_python(
        """
        import numpy, syncmem
        try:
            syncmem.Workspace().feed_blob("x", numpy.ones(4))
        except ValueError as e:
            assert isinstance(e, syncmem.SyncmemError), type(e)
            print(type(e).__name__, e)
        """,
        env={"SYNCMEM_HOST_POOL_CONF": "memory_cap=banana"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ConfigError"), r.stdout


def test_misuse_never_crashes_the_interpreter():
    r = run_python(
        """
        import gc, numpy, syncmem
        calls = [
            lambda ws: ws.feed_blob("", None),
            lambda ws: ws.feed_blob("x", numpy.ones((2, 2))[:, 0], copy=False),
            lambda ws: ws.fetch_blob(""),
            lambda ws: ws.tensor("x").numpy(writable=1),
            lambda ws: ws.rename_blob("x", "x"),
            lambda ws: ws.load("/"),
            lambda ws: ws.save(""),
            lambda ws: ws.run_net_once({"name": "n", "ops": [{"type": "FC", "inputs": ["x"]}]}),
            lambda ws: syncmem.from_dlpack(ws.tensor("x").__dlpack__()).numpy(),
            lambda ws: ws.tensor("x").__dlpack__(max_version=(9, 9)),
            lambda ws: ws.tensor("x").__array__(dtype="complex64"),
            lambda ws: syncmem.memory_stats("opencl:42"),
            lambda ws: ws.create_net({"name": "big", "ops": [{"type": "ConstantFill",
                       "outputs": ["z"], "args": {"shape": [1 << 62, 1 << 62]}}]}),
        ]
        for f in calls:
            ws = syncmem.Workspace()
            ws.feed_blob("x", numpy.arange(4.0))
            try:
                f(ws)
            except Exception as e:
                print(type(e).__name__)
            del ws
            gc.collect()
        print("alive")
        """
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("alive"), r.stdout
    assert "PanicException" not in r.stdout, r.stdout
