"""The workspace API: feed, fetch, blobs, nets, save/load, children, the module-level workspace."""

import json

import numpy
import pytest

import syncmem
from conftest import fill_net, relu_net

DTYPES = [
    "bool",
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float16",
    "float32",
    "float64",
]


@pytest.mark.parametrize("dtype", DTYPES)
def test_feed_fetch_round_trip(ws, device, dtype):
    a = (numpy.arange(12).reshape(3, 4) % 7).astype(dtype)
    ws.feed_blob("a", a)
    t = ws.tensor("a")
    assert (t.shape, t.dtype, t.size, t.ndim, len(t)) == ((3, 4), dtype, 12, 2, 3)
    assert t.nbytes == a.nbytes
    assert t.device == device and str(t.device) == str(device)
    assert t.head == "host"
    out = ws.fetch_blob("a")
    assert out.dtype == a.dtype and out.shape == a.shape
    numpy.testing.assert_array_equal(out, a)
    # A fetch is a copy: writing it leaves the blob alone.
    out[...] = 0
    numpy.testing.assert_array_equal(ws.fetch_blob("a"), a)


def test_the_done_line_prints_ones():
    ws = syncmem.Workspace()
    ws.feed_blob("x", numpy.ones(4, "float32"))
    assert str(ws.fetch_blob("x")) == "[1. 1. 1. 1.]"


def test_feed_accepts_lists_scalars_and_strided_arrays(ws):
    ws.feed_blob("l", [[1.5, 2.5], [3.5, 4.5]])
    assert ws.fetch_blob("l").dtype == numpy.float64
    numpy.testing.assert_array_equal(ws.fetch_blob("l"), [[1.5, 2.5], [3.5, 4.5]])
    ws.feed_blob("s", numpy.float32(7))
    assert ws.fetch_blob("s").shape == () and ws.fetch_blob("s") == 7
    big = numpy.arange(24, dtype="int32").reshape(4, 6)
    ws.feed_blob("strided", big[:, ::2])  # not contiguous: copied once, element by element
    numpy.testing.assert_array_equal(ws.fetch_blob("strided"), big[:, ::2])
    swapped = numpy.arange(5, dtype=">f4")  # big-endian: converted while copied
    ws.feed_blob("swapped", swapped)
    numpy.testing.assert_array_equal(ws.fetch_blob("swapped"), swapped.astype("float32"))
    ws.feed_blob("empty", numpy.zeros((0, 3), "float32"))
    assert ws.fetch_blob("empty").shape == (0, 3)


def test_strings(ws):
    words = numpy.array([["a", "bc"], ["déf", ""]])
    ws.feed_blob("w", words)
    out = ws.fetch_blob("w")
    assert out.dtype == object and out.shape == (2, 2)
    assert out.tolist() == [["a", "bc"], ["déf", ""]]
    assert ws.tensor("w").dtype == "str"
    ws.feed_blob("b", numpy.array([b"x", b"yz"]))
    assert ws.fetch_blob("b").tolist() == ["x", "yz"]
    with pytest.raises(syncmem.TypeMismatchError, match="copy=True"):
        ws.feed_blob("w2", words, copy=False)
    with pytest.raises(syncmem.TypeMismatchError, match="no host view"):
        ws.tensor("w").numpy()


def test_feed_replaces_and_shares_tensors(ws, device):
    ws.feed_blob("a", numpy.arange(3, dtype="int32"))
    ws.feed_blob("a", numpy.ones(2, "float64"))
    assert ws.tensor("a").dtype == "float64"
    # A Tensor is fed by sharing its buffer: no copy.
    ws.feed_blob("b", ws.tensor("a"))
    ws.tensor("b").numpy(writable=True)[0] = 9
    assert ws.fetch_blob("a")[0] == 9
    # On another device it is copied.
    other = syncmem.Workspace(device="cpu")
    other.feed_blob("c", ws.tensor("a"), device=None)
    assert other.tensor("c").device == device
    if device.kind != "cpu":
        other.feed_blob("d", ws.tensor("a"), device="cpu")
        assert str(other.tensor("d").device) == "cpu"
        numpy.testing.assert_array_equal(other.fetch_blob("d"), [9, 1])


def test_blobs_has_remove_rename(ws):
    assert ws.blobs() == [] and not ws.has_blob("a")
    ws.feed_blob("b", [1])
    ws.feed_blob("a", [2])
    ws.create_blob("empty")
    assert ws.blobs() == ["a", "b", "empty"] and ws.local_blobs() == ["a", "b", "empty"]
    assert ws.has_blob("a") and "a" in ws and "zz" not in ws
    ws.rename_blob("a", "c")
    assert ws.blobs() == ["b", "c", "empty"]
    assert ws.fetch_blob("c").tolist() == [2]
    with pytest.raises(syncmem.AlreadyExistsError):
        ws.rename_blob("b", "c")
    with pytest.raises(syncmem.NotFoundError, match='"nope"'):
        ws.rename_blob("nope", "x")
    assert ws.remove_blob("b") is True and ws.remove_blob("b") is False
    assert ws.blobs() == ["c", "empty"]
    with pytest.raises(syncmem.NotFoundError, match='"b"'):
        ws.fetch_blob("b")
    with pytest.raises(syncmem.TypeMismatchError, match="empty"):
        ws.fetch_blob("empty")
    ws.clear()
    assert ws.blobs() == [] and ws.nets() == []


def test_child_workspaces(device):
    parent = syncmem.Workspace(device=device, name="parent")
    parent.feed_blob("w", numpy.arange(4, dtype="float32"))
    parent.feed_blob("hidden", [1])
    child = syncmem.Workspace(parent)
    assert child.parent is parent and child.device == device
    assert child.blobs() == ["hidden", "w"] and child.local_blobs() == []
    numpy.testing.assert_array_equal(child.fetch_blob("w"), numpy.arange(4))
    child.feed_blob("mine", [3.0])
    assert not parent.has_blob("mine")
    # A net in the child reads the parent's blob and writes its own.
    child.create_net(relu_net(x="w", y="out"))
    child.run_net("relu")
    assert child.local_blobs() == ["mine", "out"]
    numpy.testing.assert_array_equal(child.fetch_blob("out"), numpy.arange(4))
    # Forwarded names: only the mapped blobs, under local names.
    fwd = syncmem.Workspace(parent, blob_mapping={"weights": "w"})
    assert fwd.blobs() == ["weights"]
    numpy.testing.assert_array_equal(fwd.fetch_blob("weights"), numpy.arange(4))
    with pytest.raises(syncmem.NotFoundError):
        syncmem.Workspace(parent, blob_mapping={"x": "missing"})
    with pytest.raises(TypeError, match="parent"):
        syncmem.Workspace(blob_mapping={"x": "w"})


def test_nets(ws, device):
    ws.feed_blob("x", numpy.array([-1.0, 2.0, -3.0, 4.0], "float32"))
    assert ws.create_net(relu_net()) == "relu"
    assert ws.nets() == ["relu"] and ws.has_net("relu")
    ws.run_net("relu")
    numpy.testing.assert_array_equal(ws.fetch_blob("y"), [0, 2, 0, 4])
    assert ws.tensor("y").head == "device"
    # JSON strings work as well as dicts; names must be unique unless overwriting.
    with pytest.raises(syncmem.AlreadyExistsError):
        ws.create_net(json.dumps(relu_net()))
    ws.create_net(json.dumps(relu_net(y="z")), overwrite=True, plan_memory=True, seed=3)
    ws.run_net("relu", num_iter=3)
    numpy.testing.assert_array_equal(ws.fetch_blob("z"), [0, 2, 0, 4])
    ws.run_net_once(fill_net("fill", "f", (2, 2), 1.5))
    numpy.testing.assert_array_equal(ws.fetch_blob("f"), numpy.full((2, 2), 1.5))
    assert ws.nets() == ["relu"]
    assert ws.delete_net("relu") and not ws.delete_net("relu")
    with pytest.raises(syncmem.NotFoundError, match="relu"):
        ws.run_net("relu")
    assert "Relu" in syncmem.operator_types() and "FC" in syncmem.operator_types()


def test_fc_net_on_device(ws):
    x = numpy.arange(6, dtype="float32").reshape(2, 3)
    w = numpy.array([[1, 0, 0], [0, 1, 1]], "float32")
    b = numpy.array([0.5, -1], "float32")
    for name, value in [("x", x), ("w", w), ("b", b)]:
        ws.feed_blob(name, value)
    ws.create_net({"name": "fc", "ops": [{"type": "FC", "inputs": ["x", "w", "b"], "outputs": ["y"]}]})
    ws.run_net("fc")
    numpy.testing.assert_allclose(ws.fetch_blob("y"), x @ w.T + b)


def test_save_load(ws, device, tmp_path):
    a = numpy.arange(6, dtype="float32").reshape(2, 3)
    ws.feed_blob("a", a)
    ws.feed_blob("i", numpy.array([1, -2], "int64"))
    ws.run_net_once(fill_net("fill", "f", (3,), 2.0))  # head at the device
    path = tmp_path / "w.safetensors"
    assert ws.save(path) == ["a", "f", "i"]
    assert ws.save(str(tmp_path / "a.safetensors"), names=["a"]) == ["a"]
    fresh = syncmem.Workspace(device=device)
    assert fresh.load(path) == ["a", "f", "i"]
    numpy.testing.assert_array_equal(fresh.fetch_blob("a"), a)
    numpy.testing.assert_array_equal(fresh.fetch_blob("f"), [2, 2, 2])
    assert fresh.tensor("a").device == device
    cpu = syncmem.Workspace()
    assert cpu.load(path, names=["i"], device="cpu") == ["i"]
    assert cpu.fetch_blob("i").tolist() == [1, -2]


def test_module_level_workspace(tmp_path):
    syncmem.switch_workspace("default")
    syncmem.reset_workspace()
    assert syncmem.current_workspace() == "default"
    syncmem.feed_blob("x", numpy.array([-1.0, 1.0], "float32"))
    assert syncmem.blobs() == ["x"] and syncmem.has_blob("x")
    syncmem.create_net(relu_net())
    assert syncmem.nets() == ["relu"]
    syncmem.run_net("relu")
    assert syncmem.fetch_blob("y").tolist() == [0.0, 1.0]
    syncmem.switch_workspace("other")
    assert syncmem.current_workspace() == "other" and syncmem.blobs() == []
    syncmem.feed_blob("o", [1])
    syncmem.rename_blob("o", "p")
    assert syncmem.remove_blob("p") and syncmem.blobs() == []
    syncmem.run_net_once(fill_net("f", "f", (1,), 3.0))
    assert syncmem.save(tmp_path / "f.safetensors") == ["f"]
    with pytest.raises(syncmem.NotFoundError, match="nowhere"):
        syncmem.switch_workspace("nowhere", create_if_missing=False)
    assert syncmem.current_workspace() == "other"
    assert "default" in syncmem.workspaces() and "other" in syncmem.workspaces()
    syncmem.switch_workspace("default", create_if_missing=False)
    assert syncmem.has_blob("x")
    assert syncmem.load(tmp_path / "f.safetensors") == ["f"]
    view = syncmem.get_workspace().tensor("x").numpy()
    syncmem.reset_workspace()
    assert syncmem.blobs() == [] and syncmem.nets() == []
    assert view.tolist() == [-1.0, 1.0]  # views outlive the reset
    assert syncmem.get_workspace("other").name == "other"
    with pytest.raises(syncmem.NotFoundError):
        syncmem.get_workspace("nowhere")


def test_devices():
    found = syncmem.devices()
    assert found[0] == syncmem.Device("cpu") and found[0].kind == "cpu"
    cpu = syncmem.Device("cpu")
    assert cpu.index == 0 and cpu == "cpu" and hash(cpu) == hash(syncmem.Device("host"))
    assert hash(cpu) == hash("cpu") and {cpu: 1}["cpu"] == 1
    assert repr(cpu) == "syncmem.Device('cpu')" and str(cpu) == "cpu"
    assert isinstance(cpu.name, str) and isinstance(cpu.vendor, str)
    assert cpu.total_memory >= 0 and cpu.max_alloc >= 0 and isinstance(cpu.host_unified, bool)
    cpu.synchronize()
    assert cpu.empty_cache() >= 0
    assert {b["backend"] for b in syncmem.backends()} == {"cpu", "opencl", "cuda"}


def test_opencl_device(opencl):
    assert opencl.kind == "opencl" and opencl.index == 0 and str(opencl) == "opencl:0"
    assert opencl in syncmem.devices()
    report = {b["backend"]: b for b in syncmem.backends()}["opencl"]
    assert report["compiled"] and "opencl:0" in report["devices"] and report["error"] is None
    opencl.synchronize()
