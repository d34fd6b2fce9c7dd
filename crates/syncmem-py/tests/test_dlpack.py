"""DLPack: host tensors out to NumPy and back, without copies; device tensors out as their
device memory (the `cl_mem` of an OpenCL tensor)."""

import ctypes
import gc
import sys

import numpy
import pytest

import syncmem
from conftest import address, relu_net


def host_ws():
    return syncmem.Workspace(device="cpu")


def test_numpy_from_dlpack_shares_memory():
    ws = host_ws()
    ws.feed_blob("x", numpy.arange(6, dtype="float32").reshape(2, 3))
    t = ws.tensor("x")
    assert t.__dlpack_device__() == (1, 0)
    a = numpy.from_dlpack(t)
    assert a.shape == (2, 3) and a.dtype == numpy.float32
    assert address(a) == address(t.numpy())
    # Written through NumPy, read through syncmem; and the other way.
    a[1, 2] = -7
    assert ws.fetch_blob("x")[1, 2] == -7
    # The export is writable: device access waits until the consumer lets go.
    ws.create_net(relu_net())
    with pytest.raises(syncmem.BusyError):
        ws.run_net("relu")
    del a
    gc.collect()
    ws.run_net("relu")
    assert ws.fetch_blob("y")[1, 2] == 0


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint16", "int32", "uint64", "float16", "float64"])
def test_dtypes_round_trip(dtype):
    ws = host_ws()
    a = (numpy.arange(5) % 2).astype(dtype)
    ws.feed_blob("a", a)
    numpy.testing.assert_array_equal(numpy.from_dlpack(ws.tensor("a")), a)


def test_capsules_versioned_and_legacy():
    ws = host_ws()
    ws.feed_blob("x", numpy.arange(3, dtype="int64"))
    t = ws.tensor("x")
    legacy = t.__dlpack__()
    versioned = t.__dlpack__(max_version=(1, 0))
    assert "dltensor" in repr(legacy) and "dltensor_versioned" in repr(versioned)
    # Capsules nobody consumes free their export (and end the writable view).
    with pytest.raises(syncmem.BusyError):
        t.to_device()
    del legacy, versioned
    gc.collect()
    t.to_device()
    # syncmem consumes either kind; the imported tensor aliases the exported memory.
    for cap in (t.__dlpack__(), t.__dlpack__(max_version=(1, 0))):
        u = syncmem.from_dlpack(cap)
        assert address(u.numpy()) == address(t.numpy())
        with pytest.raises(TypeError, match="consumed"):
            syncmem.from_dlpack(cap)
        del u
    gc.collect()
    t.to_device()  # every export was released through its deleter
    cap = t.__dlpack__(dl_device=(1, 0), copy=False)
    with pytest.raises(syncmem.BusyError):
        t.to_device()
    del cap
    with pytest.raises(BufferError):
        t.__dlpack__(dl_device=(4, 0))


def test_copy_export_is_a_copy():
    ws = host_ws()
    ws.feed_blob("x", numpy.arange(3, dtype="float32"))
    t = ws.tensor("x")
    c = numpy.from_dlpack(t, copy=True) if _numpy_passes_copy() else None
    cap = t.__dlpack__(max_version=(1, 0), copy=True)
    u = syncmem.from_dlpack(cap)
    assert address(u.numpy()) != address(t.numpy())
    t.to_device()  # a copy holds no view of the original
    if c is not None:
        assert address(c) != address(t.numpy())


def _numpy_passes_copy():
    try:
        numpy.from_dlpack(numpy.zeros(1), copy=True)
        return True
    except TypeError:
        return False


def test_from_dlpack_wraps_numpy_memory(device):
    a = numpy.arange(8, dtype="float32").reshape(2, 4)
    before = sys.getrefcount(a)
    t = syncmem.from_dlpack(a, device=device)
    assert t.shape == (2, 4) and t.dtype == "float32" and t.device == device
    assert address(t.numpy()) == address(a)  # no copy
    ws = syncmem.Workspace(device=device)
    ws.feed_blob("a", t)
    ws.create_net({"name": "neg", "ops": [{"type": "Relu", "inputs": ["a"], "outputs": ["a"]}]})
    a[0, 0] = -5  # the producer's memory is the host mirror
    ws.run_net("neg")
    numpy.testing.assert_array_equal(ws.fetch_blob("a")[0], [0, 1, 2, 3])
    ws.tensor("a").numpy()  # copied back into the producer's memory
    assert a[0, 0] == 0
    # Dropping the last tensor calls NumPy's deleter, which releases the array.
    del t, ws
    gc.collect()
    assert sys.getrefcount(a) == before


def test_from_dlpack_copies_read_only_sources_and_refuses_strided_ones():
    a = numpy.arange(4, dtype="int32")
    a.flags.writeable = False
    t = syncmem.from_dlpack(a)
    assert address(t.numpy()) != address(a)
    assert t.numpy().tolist() == [0, 1, 2, 3]
    strided = numpy.arange(10, dtype="float64")[::2]
    with pytest.raises(syncmem.ShapeError, match="C-contiguous"):
        syncmem.from_dlpack(strided)
    with pytest.raises(TypeError, match="__dlpack__"):
        syncmem.from_dlpack([1, 2, 3])
    with pytest.raises(syncmem.TypeMismatchError):
        syncmem.from_dlpack(numpy.zeros(2, "complex64"))
    zero = syncmem.from_dlpack(numpy.zeros((0, 3), "float32"))
    assert zero.shape == (0, 3)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.c_void_p),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _DLTensor),
    ]


def _versioned(capsule):
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return _DLManagedTensorVersioned.from_address(get(capsule, b"dltensor_versioned"))


def _cl_mem_size(handle):
    """clGetMemObjectInfo(CL_MEM_SIZE) of `handle`: (status, bytes)."""
    cl = ctypes.CDLL("libOpenCL.so.1")
    cl.clGetMemObjectInfo.argtypes = [
        ctypes.c_void_p, ctypes.c_uint32, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p
    ]
    size = ctypes.c_size_t(0)
    status = cl.clGetMemObjectInfo(handle, 0x1102, ctypes.sizeof(size), ctypes.byref(size), None)
    return status, size.value


def test_device_tensors_export_their_device_memory(opencl):
    ws = syncmem.Workspace(device=opencl)
    ws.feed_blob("x", numpy.ones(3, "float32"))
    t = ws.tensor("x")
    assert t.__dlpack_device__() == (4, 0)
    cap = t.__dlpack__(max_version=(1, 0))
    m = _versioned(cap)
    d = m.dl_tensor
    assert (m.major, m.flags) == (1, 0)
    assert (d.device.device_type, d.device.device_id) == (4, 0)
    assert (d.ndim, d.shape[0], d.byte_offset) == (1, 3, 0)
    assert (d.dtype.code, d.dtype.bits, d.dtype.lanes) == (2, 32, 1)
    handle = d.data
    # DLPack's data for OpenCL is the cl_mem: the driver knows it, and it holds the 12 bytes.
    status, size = _cl_mem_size(handle)
    assert status == 0 and size >= 12, (status, size)
    # Exported for writing: the device is the only current copy, and the data is intact.
    numpy.testing.assert_array_equal(t.numpy(), [1, 1, 1])
    # The same memory again (no copy), without waiting for its work (stream=-1).
    assert _versioned(t.__dlpack__(max_version=(1, 0), stream=-1)).dl_tensor.data == handle
    # A copy is other memory, flagged as copied.
    c = _versioned(t.__dlpack__(max_version=(1, 0), copy=True))
    assert c.flags & 2 and c.dl_tensor.data != handle
    # The legacy capsule too.
    assert t.__dlpack__().__class__.__name__ == "PyCapsule"
    with pytest.raises(BufferError, match=r"\(1, 0\)"):
        t.__dlpack__(dl_device=(1, 0))
    # NumPy takes host memory only: it refuses the device's.
    with pytest.raises((BufferError, RuntimeError, TypeError, ValueError)):
        numpy.from_dlpack(t)
    del cap, m, d
    gc.collect()
    # The host view is the way to NumPy, and DLPack works on it.
    numpy.testing.assert_array_equal(numpy.from_dlpack(t.numpy()), [1, 1, 1])


def test_device_tensors_export_a_host_copy_when_asked(opencl, two_mirrors):
    ws = syncmem.Workspace(device=opencl)
    ws.run_net_once({"name": "f", "ops": [{"type": "ConstantFill", "outputs": ["x"],
                                           "args": {"shape": [2, 3], "value": 3.0}}]})
    t = ws.tensor("x")
    assert t.head == "device"
    before = t.copy_stats()["device_to_host"]
    cap = t.__dlpack__(max_version=(1, 0), dl_device=(1, 0), copy=True)
    m = _versioned(cap)
    assert (m.dl_tensor.device.device_type, m.dl_tensor.device.device_id) == (1, 0)
    assert m.flags & 2  # copied
    # One device-to-host copy (into the host mirror, then copied), counted.
    after = t.copy_stats()["device_to_host"]
    assert after["count"] - before["count"] == 1 and after["bytes"] - before["bytes"] == 24
    u = syncmem.from_dlpack(cap)
    numpy.testing.assert_array_equal(u.numpy(), numpy.full((2, 3), 3.0))
    assert address(u.numpy()) != address(t.numpy())
    if _numpy_passes_copy():
        a = numpy.from_dlpack(t, device="cpu", copy=True)
        numpy.testing.assert_array_equal(a, numpy.full((2, 3), 3.0))
        a[0, 0] = -1  # a copy: the tensor keeps its data
        assert ws.fetch_blob("x")[0, 0] == 3.0
    # Without copy=True the host is refused, as the protocol says.
    for copy in (False, None):
        with pytest.raises(BufferError, match=r"\(1, 0\)"):
            t.__dlpack__(dl_device=(1, 0), copy=copy)
    with pytest.raises(BufferError):
        t.__dlpack__(dl_device=(2, 0), copy=True)
