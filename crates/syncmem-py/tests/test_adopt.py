"""feed_blob(copy=False): syncmem takes the array's memory over. Nothing in Python writes it
behind the head state afterwards: the array cannot be made writable again, its base cannot
write it, and one memory is never adopted by two blobs."""

import gc
import tracemalloc

import numpy
import pytest

import syncmem
from conftest import address, relu_net


def test_adopted_array_cannot_be_made_writable_again(ws):
    a = numpy.arange(4, dtype="float32")
    ws.feed_blob("a", a, copy=False)
    assert address(ws.tensor("a").numpy()) == address(a)  # no copy
    with pytest.raises(ValueError):
        a.setflags(write=True)
    with pytest.raises(ValueError):
        a.flags.writeable = True
    with pytest.raises(ValueError):
        a[0] = 100
    # Resizing in place would move the memory under the tensor.
    with pytest.raises(ValueError):
        a.resize(1 << 16, refcheck=False)
    # The array is a read-only view of the host mirror, whose base is a syncmem.HostView.
    assert isinstance(a.base, syncmem.HostView) and not a.base.writable
    assert not a.flags.owndata
    assert ws.fetch_blob("a").tolist() == [0, 1, 2, 3]
    # Writes go through a guarded view, and the array sees them.
    w = ws.tensor("a").numpy(writable=True)
    w[0] = 7
    del w
    assert a[0] == 7


def test_the_base_of_an_adopted_view_cannot_write_it(ws, device):
    base = numpy.arange(6, dtype="float32")
    a = base.reshape(2, 3)  # a view of the whole of `base`
    ws.feed_blob("a", a, copy=False)
    assert address(ws.tensor("a").numpy()) == address(base)
    for arr in (base, a):
        assert not arr.flags.writeable
        with pytest.raises(ValueError):
            arr.setflags(write=True)
    with pytest.raises(ValueError):
        base[0] = 100
    ws.create_net(relu_net(x="a", y="b"))
    ws.run_net("relu")
    numpy.testing.assert_array_equal(ws.fetch_blob("b"), [[0, 1, 2], [3, 4, 5]])
    # A view of part of an array is refused: the rest of the base could write it.
    whole = numpy.zeros(8, "float32")
    with pytest.raises(syncmem.InvalidStateError, match="part of"):
        ws.feed_blob("half", whole[:4], copy=False)
    assert whole.flags.writeable and whole.flags.owndata  # left as it was
    # So is memory NumPy does not own: another object (here a bytearray) writes it.
    raw = bytearray(16)
    with pytest.raises(syncmem.InvalidStateError, match="does not own"):
        ws.feed_blob("raw", numpy.frombuffer(raw, "float32"), copy=False)
    assert not ws.has_blob("half") and not ws.has_blob("raw")


def test_one_memory_is_adopted_by_one_blob(ws):
    base = numpy.zeros(8, "float32")
    first, second = base.reshape(2, 4), base.reshape(4, 2)
    ws.feed_blob("p", first, copy=False)
    with pytest.raises(syncmem.InvalidStateError, match='already.*"p"'):
        ws.feed_blob("q", second, copy=False)
    # Two halves of one array: both refused, neither blob shares memory with the other.
    other = numpy.zeros(8, "float32")
    for name, part in (("r", other[:4]), ("s", other[4:])):
        with pytest.raises(syncmem.InvalidStateError):
            ws.feed_blob(name, part, copy=False)
    # A writable view of a tensor is not adopted by another blob either (share the tensor:
    # feed_blob(name, ws.tensor("p"))).
    w = ws.tensor("p").numpy(writable=True)
    with pytest.raises(syncmem.InvalidStateError):
        ws.feed_blob("t", w, copy=False)
    del w
    assert ws.blobs() == ["p"]
    # Refused adoptions are still fed with a copy.
    ws.feed_blob("q", second, copy=True)
    assert address(ws.tensor("q").numpy()) != address(base)


def test_adopted_memory_lives_while_either_side_does_and_is_freed_once():
    # NumPy reports its data allocations to tracemalloc: the adopted buffers are counted until
    # both the array and the tensor are gone, then freed (once: a double free would crash).
    tracemalloc.start()
    try:
        at_start = tracemalloc.get_traced_memory()[0]
        ws = syncmem.Workspace()
        a = numpy.full(1 << 20, 3.0, "float32")  # 4 MiB
        ws.feed_blob("a", a, copy=False)
        ws.remove_blob("a")
        gc.collect()
        assert a.sum() == 3.0 * (1 << 20)  # the array keeps the memory alive
        b = numpy.full(1 << 20, 5.0, "float32")
        ws.feed_blob("b", b, copy=False)
        del b
        gc.collect()
        assert ws.fetch_blob("b").sum() == 5.0 * (1 << 20)  # and so does the tensor
        held = tracemalloc.get_traced_memory()[0] - at_start
        assert held >= 2 * (4 << 20), held
        del a
        ws.remove_blob("b")
        gc.collect()
        left = tracemalloc.get_traced_memory()[0] - at_start
    finally:
        tracemalloc.stop()
    assert left < 1 << 20, (held, left)
