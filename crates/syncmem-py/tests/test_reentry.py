"""Calls into the package from inside a Python operator function: what would wait for the
blobs the running operator holds (its input read-locked, its output write-locked) raises
BusyError naming the blob; the rest works. Each run happens in a thread joined with a timeout,
so that a regression (a deadlock) fails the test instead of hanging the run."""

import itertools
import threading

import numpy
import pytest

import syncmem

_types = itertools.count()


def run_outer(ws, got, hung):
    """Runs net "outer" of `ws` in a thread joined with a timeout (a deadlock fails with
    `hung`); the run must not raise."""
    done = threading.Event()

    def runner():
        try:
            ws.run_net("outer")
        except Exception as e:  # noqa: BLE001 - handed to the test
            got["run_error"] = e
        done.set()

    threading.Thread(target=runner, daemon=True).start()
    assert done.wait(timeout=60), hung
    assert "run_error" not in got, got["run_error"]


def run_inside(call):
    """Runs a net whose one operator, a Python function, calls `call(ws)` while it runs on
    input "x" and output "y"; returns what the call returned or raised."""
    ws = syncmem.Workspace(device="cpu")
    ws.feed_blob("x", numpy.arange(4, dtype="float32"))
    ws.feed_blob("other", numpy.ones(4, "float32"))
    got = {}

    def op(inputs, outputs):
        try:
            got["value"] = call(ws)
        except Exception as e:  # noqa: BLE001 - handed to the test
            got["error"] = e
        outputs[0][:] = inputs[0] + 1

    op_type = f"Reentry{next(_types)}"
    syncmem.register_operator(op_type, op)
    ws.create_net({"name": "outer", "ops": [{"type": op_type, "inputs": ["x"], "outputs": ["y"]}]})
    ws.create_net({"name": "uses_x", "ops": [{"type": "Relu", "inputs": ["x"], "outputs": ["z"]}]})
    ws.create_net({"name": "apart", "ops": [
        {"type": "Relu", "inputs": ["other"], "outputs": ["other2"]}]})
    run_outer(ws, got, "the call from inside the operator function hung")
    numpy.testing.assert_array_equal(ws.fetch_blob("y"), [1, 2, 3, 4])
    return ws, got


def busy_naming(got, blob):
    assert isinstance(got.get("error"), syncmem.BusyError), got
    assert repr(blob) in str(got["error"]) or f'"{blob}"' in str(got["error"]), got["error"]


def test_run_net_of_a_net_using_the_operators_blobs_is_busy():
    _, got = run_inside(lambda ws: ws.run_net("uses_x"))
    busy_naming(got, "x")


def test_run_net_of_the_running_net_is_busy():
    _, got = run_inside(lambda ws: ws.run_net("outer"))
    assert isinstance(got.get("error"), syncmem.BusyError), got


def test_run_net_of_another_net_runs():
    ws, got = run_inside(lambda ws: ws.run_net("apart"))
    assert "error" not in got, got
    numpy.testing.assert_array_equal(ws.fetch_blob("other2"), [1, 1, 1, 1])


@pytest.mark.parametrize("blob", ["x", "y"])
def test_feed_blob_of_the_operators_input_or_output_is_busy(blob):
    _, got = run_inside(lambda ws: ws.feed_blob(blob, numpy.zeros(4, "float32")))
    busy_naming(got, blob)


def test_a_writable_view_is_busy():
    _, got = run_inside(lambda ws: ws.tensor("other").numpy(writable=True))
    assert isinstance(got.get("error"), syncmem.BusyError), got


def test_reading_the_output_is_busy_and_reading_the_input_works():
    _, got = run_inside(lambda ws: ws.fetch_blob("y"))
    busy_naming(got, "y")
    _, got = run_inside(lambda ws: (ws.fetch_blob("x"), ws.tensor("x").numpy().tolist()))
    assert "error" not in got, got
    assert got["value"][1] == [0, 1, 2, 3]


def test_save_is_busy(tmp_path):
    _, got = run_inside(lambda ws: ws.save(str(tmp_path / "w.safetensors")))
    assert isinstance(got.get("error"), syncmem.BusyError), got


def test_memory_snapshot_lists_the_output_as_busy():
    _, got = run_inside(lambda ws: (ws.name, syncmem.memory_snapshot()))
    assert "error" not in got, got
    name, snapshot = got["value"]
    y = [e for e in snapshot if f"{name}:y" in e["owners"]]
    assert len(y) == 1 and y[0]["busy"] is True, y
    x = [e for e in snapshot if f"{name}:x" in e["owners"]]
    assert len(x) == 1 and x[0]["busy"] is False and x[0]["nbytes"] == 16, x


SCALE_CL = """
__kernel void scale(const __global float* x, __global float* y, uint n, float a) {
    size_t i = get_global_id(0);
    if (i < n) y[i] = a * x[i];
}
"""


def test_a_raw_kernel_on_the_operators_output_is_busy():
    """A RawKernel called from inside an operator function (which runs on cpu) with tensors
    taken before the run: the running operator's output, which it holds for writing, is busy
    at once; its input, which it holds for reading, is not (the call goes on to the launch,
    which a kernel without host code cannot make on cpu: an error, not a hang)."""
    ws = syncmem.Workspace(device="cpu")
    ws.feed_blob("x", numpy.arange(4, dtype="float32"))
    ws.feed_blob("y", numpy.zeros(4, "float32"))
    ws.feed_blob("z", numpy.zeros(4, "float32"))
    x, y, z = ws.tensor("x"), ws.tensor("y"), ws.tensor("z")
    k = syncmem.RawKernel(SCALE_CL, "scale")
    got = {}

    def op(inputs, outputs):
        try:
            k((1,), (4,), (z, y, numpy.uint32(4), numpy.float32(2)))
        except Exception as e:  # noqa: BLE001 - handed to the test
            got["write"] = e
        try:
            k((1,), (4,), (x, z, numpy.uint32(4), numpy.float32(2)))
        except Exception as e:  # noqa: BLE001
            got["read"] = e
        outputs[0][:] = inputs[0] + 1

    op_type = f"Reentry{next(_types)}"
    syncmem.register_operator(op_type, op)
    ws.create_net({"name": "outer", "ops": [{"type": op_type, "inputs": ["x"], "outputs": ["y"]}]})
    run_outer(ws, got, "the kernel call from inside the operator function hung")
    assert isinstance(got.get("write"), syncmem.BusyError), got
    assert '"y"' in str(got["write"]), got["write"]
    assert not isinstance(got.get("read"), syncmem.BusyError), got
    numpy.testing.assert_array_equal(ws.fetch_blob("y"), [1, 2, 3, 4])
