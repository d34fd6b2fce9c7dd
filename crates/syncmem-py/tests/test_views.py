"""NumPy views without copies: zero-copy checked from both sides, the writable-view guard,
and lifetimes (the view outlives the tensor, its blob and its workspace)."""

import gc

import numpy
import pytest

import syncmem
from conftest import address, fill_net, relu_net


def test_read_only_view_is_the_host_mirror(ws):
    ws.feed_blob("x", numpy.arange(4, dtype="float32"))
    t = ws.tensor("x")
    v = t.numpy()
    assert not v.flags.writeable and v.flags.c_contiguous
    assert isinstance(v.base, syncmem.HostView) and not v.base.writable
    assert v.base.label == "x" and v.base.nbytes == 16
    with pytest.raises(ValueError):
        v[0] = 1
    # Same memory every time: no copy.
    assert address(t.numpy()) == address(v) == address(numpy.asarray(t))
    assert address(ws.fetch_blob("x", copy=False)) == address(v)
    # Written from the other side (a writable view), seen through the read-only one.
    w = t.numpy(writable=True)
    assert address(w) == address(v)
    w[2] = 42
    assert v[2] == 42 and ws.fetch_blob("x")[2] == 42
    del w


def test_writable_view_marks_the_host_and_blocks_device_access(ws):
    ws.feed_blob("x", numpy.array([-1.0, 2.0], "float32"))
    ws.create_net(relu_net())
    ws.run_net("relu")  # x uploaded: synced
    t = ws.tensor("x")
    assert t.head == "synced"
    w = t.numpy(writable=True)
    assert w.flags.writeable and w.base.writable
    assert t.head == "host"
    w[0] = 5.0
    with pytest.raises(syncmem.BusyError, match="writable host view"):
        ws.run_net("relu")
    with pytest.raises(syncmem.BusyError):
        t.to_device()
    with pytest.raises(syncmem.BusyError):
        ws.run_net_once(relu_net("again"))
    # Any array made from the view keeps it alive.
    part = w[:1]
    del w
    with pytest.raises(syncmem.BusyError):
        ws.run_net("relu")
    del part
    ws.run_net("relu")  # the view is gone: the write is uploaded
    numpy.testing.assert_array_equal(ws.fetch_blob("y"), [5.0, 2.0])
    assert t.head == "synced"


def test_read_only_views_do_not_block(ws):
    ws.feed_blob("x", numpy.array([1.0, -2.0], "float32"))
    ws.create_net(relu_net())
    v = ws.tensor("x").numpy()
    ws.run_net("relu")
    ws.tensor("x").to_device()
    assert v.tolist() == [1.0, -2.0]


def test_view_refreshes_after_device_writes(ws, device):
    ws.run_net_once(fill_net("f", "y", (3,), 1.0))
    t = ws.tensor("y")
    assert t.head == "device"
    v = t.numpy()  # one device-to-host copy
    assert t.head == "synced" and v.tolist() == [1.0, 1.0, 1.0]
    ws.run_net_once(fill_net("f", "y", (3,), 2.0))
    # The host mirror stays where it is: a new view refreshes the same memory.
    assert address(t.numpy()) == address(v)
    assert v.tolist() == [2.0, 2.0, 2.0]


def test_feed_without_copy_adopts_the_array(ws, device):
    a = numpy.arange(6, dtype="float32").reshape(2, 3)
    ws.feed_blob("a", a, copy=False)
    assert not a.flags.writeable  # writes must go through a guarded view
    t = ws.tensor("a")
    v = t.numpy(writable=True)
    assert address(v) == address(a)  # the array is the host mirror
    v[0, 0] = 100
    assert a[0, 0] == 100
    del v
    # The tensor keeps the array alive after the caller drops it.
    del a
    gc.collect()
    ws.create_net(relu_net(x="a", y="b"))
    ws.run_net("relu")
    numpy.testing.assert_array_equal(ws.fetch_blob("b"), [[100, 1, 2], [3, 4, 5]])


def test_feed_without_copy_refuses_what_it_cannot_adopt(ws):
    strided = numpy.arange(8, dtype="float32")[::2]
    with pytest.raises(syncmem.ShapeError, match="C-contiguous"):
        ws.feed_blob("s", strided, copy=False)
    frozen = numpy.arange(3, dtype="float32")
    frozen.flags.writeable = False
    with pytest.raises(syncmem.InvalidStateError, match="writable"):
        ws.feed_blob("f", frozen, copy=False)
    with pytest.raises(syncmem.ShapeError):
        ws.feed_blob("b", numpy.arange(3, dtype=">i4"), copy=False)
    assert ws.blobs() == []


def test_view_outlives_tensor_blob_and_workspace(device):
    ws = syncmem.Workspace(device=device)
    ws.feed_blob("x", numpy.arange(5, dtype="float64"))
    t = ws.tensor("x")
    ro = t.numpy()
    rw = t.numpy(writable=True)
    ws.remove_blob("x")
    del t
    gc.collect()
    assert ro.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    rw[1] = 10
    assert ro[1] == 10
    # Replacing the blob and dropping the workspace leave the views valid too.
    ws.feed_blob("y", numpy.ones(3))
    y = ws.tensor("y").numpy()
    ws.feed_blob("y", numpy.zeros(2))
    del ws
    gc.collect()
    assert y.tolist() == [1.0, 1.0, 1.0] and ro[1] == 10
    snapshot = syncmem.memory_snapshot()
    held = [e for e in snapshot if e["owners"] == ["host view"] and e["label"] == "x"]
    assert held and held[0]["views"] == {"read_only": 1, "writable": 1}


def test_tensor_handle_follows_its_blob(ws):
    ws.feed_blob("x", numpy.ones(2, "float32"))
    t = ws.tensor("x")
    ws.feed_blob("x", numpy.zeros(3, "int64"))
    assert t.shape == (3,) and t.dtype == "int64"
    ws.remove_blob("x")
    assert t.shape == (3,)  # the handle keeps the blob
    ws.create_blob("e")
    with pytest.raises(syncmem.TypeMismatchError):
        ws.tensor("e")
    assert "x" in repr(t)


def test_array_protocol(ws):
    ws.feed_blob("x", numpy.arange(3, dtype="float32"))
    t = ws.tensor("x")
    assert address(numpy.asarray(t)) == address(t.numpy())
    copied = numpy.array(t, copy=True)
    assert address(copied) != address(t.numpy())
    as_int = numpy.asarray(t, dtype="int64")
    assert as_int.dtype == numpy.int64 and as_int.tolist() == [0, 1, 2]


def test_empty_and_scalar_views(ws):
    ws.feed_blob("e", numpy.zeros((0, 2), "float32"))
    assert ws.tensor("e").numpy().shape == (0, 2)
    ws.feed_blob("s", numpy.float64(3.5))
    assert ws.tensor("s").numpy(writable=True).shape == ()


def test_host_only_tensor_has_no_device():
    t = syncmem.from_dlpack(numpy.arange(2.0))
    assert t.device == syncmem.Device("cpu")
    ws = syncmem.Workspace()
    ws.feed_blob("x", t)
    assert ws.tensor("x").numpy().tolist() == [0.0, 1.0]


def test_pointer_is_stable_across_device_round_trips(opencl):
    ws = syncmem.Workspace(device=opencl)
    ws.feed_blob("x", numpy.array([-1.0, 1.0], "float32"))
    ws.create_net(relu_net(y="x"))  # in place: the device writes x
    v = ws.tensor("x").numpy()
    before = address(v)
    ws.run_net("relu", num_iter=3)
    assert ws.tensor("x").head == "device"
    assert address(ws.tensor("x").numpy()) == before
    assert v.tolist() == [0.0, 1.0]
