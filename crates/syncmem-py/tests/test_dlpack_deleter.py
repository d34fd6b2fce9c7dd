"""A DLPack export survives a consumer that calls the deleter and leaves the capsule's name
unchanged (PyTorch does when it refuses the device type): the capsule's destructor then runs
too, and the export is released once. Each case runs in a fresh process, so that a double free
fails the test instead of killing the test run."""

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import ctypes, gc, sys
    import numpy, syncmem

    class DLTensor(ctypes.Structure):
        _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                    ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                    ("dtype", ctypes.c_uint32), ("shape", ctypes.c_void_p),
                    ("strides", ctypes.c_void_p), ("byte_offset", ctypes.c_uint64)]

    class Legacy(ctypes.Structure):
        _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                    ("deleter", ctypes.c_void_p)]

    class Versioned(ctypes.Structure):
        _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                    ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                    ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]

    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

    def call_deleter(cap, versioned):
        name = b"dltensor_versioned" if versioned else b"dltensor"
        ptr = get(cap, name)
        m = (Versioned if versioned else Legacy).from_address(ptr)
        DELETER(m.deleter)(ptr)

    ws = syncmem.Workspace(device=sys.argv[1])
    ws.feed_blob("x", numpy.arange(1024, dtype="float32"))
    ws.create_net({"name": "relu", "ops": [{"type": "Relu", "inputs": ["x"], "outputs": ["y"]}]})
    t = ws.tensor("x")
    for round in range(20):
        for versioned in (False, True):
            cap = t.__dlpack__(max_version=(1, 0) if versioned else None)
            call_deleter(cap, versioned)
            # Released by the deleter: the export's writable view is gone already.
            ws.run_net("relu")
            del cap  # the destructor sees the name unchanged: it must not release again
            gc.collect()
    # The allocator is intact and the tensor holds its data.
    junk = [numpy.ones(n) for n in range(1, 200)]
    assert (ws.fetch_blob("x") == numpy.arange(1024)).all()
    assert syncmem.memory_snapshot() is not None
    print("ok")
    """
)


@pytest.mark.parametrize("where", ["cpu", "opencl:0"])
def test_the_deleter_runs_once_when_the_capsule_keeps_its_name(where):
    if where != "cpu":
        from conftest import opencl_or_skip

        opencl_or_skip(where)
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, where],
        cwd=os.path.dirname(os.path.abspath(__file__)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and run.stdout.strip() == "ok", (run.returncode, run.stderr)
