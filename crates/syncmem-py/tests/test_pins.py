"""Views keep their addresses: a NumPy view, an operator function's input view or a DLPack
export of a tensor pins its buffer's placement, so filling a memory cap from elsewhere does not
spill the memory under it. Each scenario runs in a fresh process with a capped pool (the cap
applies from the first allocation); a regression reads other tensors' data or crashes there."""

import os
import subprocess
import sys
import textwrap

import pytest

import syncmem
from conftest import fill_net

PRELUDE = textwrap.dedent(
    """
    import numpy as np, sys, syncmem
    dev = syncmem.Device(sys.argv[1])

    def fill_the_cap():
        # Tensors of another workspace, written on the device, until the cap forces spills.
        ws2 = syncmem.Workspace(device=dev)
        for i in range(8):
            ws2.feed_blob(f"y{i}", np.full(4096, i + 2.0, np.float32))
            ws2.create_net({"name": f"n{i}", "ops": [
                {"type": "Relu", "inputs": [f"y{i}"], "outputs": [f"z{i}"]}]})
            ws2.run_net(f"n{i}")
        return ws2

    def check_others(ws2):
        for i in range(8):
            assert (ws2.fetch_blob(f"z{i}") == i + 2.0).all(), i
        assert syncmem.memory_stats(dev)["num_spills"] > 0  # the cap was reached

    ws = syncmem.Workspace(device=dev)
    ws.feed_blob("x", np.full(4096, 1.0, np.float32))
    ws.tensor("x").to_device()
    """
)


def run_capped(device, body):
    """Runs PRELUDE + body in a fresh process under a 64 KiB cap; fails on a crash."""
    env = dict(os.environ, SYNCMEM_POOL_CONF="memory_cap=64KiB")
    script = PRELUDE + textwrap.dedent(body) + "\nprint('ok')\n"
    run = subprocess.run(
        [sys.executable, "-c", script, str(device)],
        env=env,
        cwd=os.path.dirname(os.path.abspath(__file__)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), (run.returncode, run.stderr)


def test_a_writable_view_survives_a_spill(device):
    run_capped(device, """
        w = ws.tensor("x").numpy(writable=True)
        ws2 = fill_the_cap()
        assert (w == 1.0).all()
        w[:] = -123.0
        check_others(ws2)
        del w
        assert (ws.fetch_blob("x") == -123.0).all()
    """)


def test_a_read_only_view_survives_a_spill(device):
    run_capped(device, """
        v = ws.tensor("x").numpy()
        ws2 = fill_the_cap()
        check_others(ws2)
        assert (v == 1.0).all()
        assert ws.tensor("x").numpy().ctypes.data == v.ctypes.data
    """)


def test_a_host_dlpack_export_survives_a_spill(device):
    if device.kind != "cpu":
        pytest.skip("device tensors export device memory: see the device export test")
    run_capped(device, """
        a = np.from_dlpack(ws.tensor("x"))
        ws2 = fill_the_cap()
        check_others(ws2)
        assert (a == 1.0).all()
        a[:] = 7.0
        check_others(ws2)
        del a
        assert (ws.fetch_blob("x") == 7.0).all()
    """)


def test_a_device_dlpack_export_keeps_the_device_memory(opencl):
    run_capped(opencl, """
        cap = ws.tensor("x").__dlpack__()
        ws2 = fill_the_cap()
        check_others(ws2)
        # The device memory handed out is still the tensor's: nothing was spilled under it.
        assert ws.tensor("x").head == "device"
        assert ws.tensor("x").copy_stats()["spilled"]["count"] == 0
        del cap
        assert (ws.fetch_blob("x") == 1.0).all()
    """)


def test_an_operator_functions_input_view_survives_a_spill(device):
    if device.kind != "cpu":
        pytest.skip("operator functions run on cpu")
    run_capped(device, """
        seen = []
        def op(inputs, outputs):
            ws2 = fill_the_cap()
            check_others(ws2)
            seen.append(inputs[0].copy())
            outputs[0][:] = inputs[0] * 2
        syncmem.register_operator("PinsDouble", op)
        ws.create_net({"name": "d", "ops": [
            {"type": "PinsDouble", "inputs": ["x"], "outputs": ["d"]}]})
        ws.run_net("d")
        assert (seen[0] == 1.0).all()
        assert (ws.fetch_blob("d") == 2.0).all()
    """)


def test_a_view_is_live_and_copy_true_is_a_snapshot(device):
    ws = syncmem.Workspace(device=device)
    ws.run_net_once(fill_net("f", "y", (3,), 1.0))
    t = ws.tensor("y")
    view, snapshot = t.numpy(), t.numpy(copy=True)
    assert view.tolist() == snapshot.tolist() == [1.0, 1.0, 1.0]
    assert snapshot.flags.writeable and snapshot.ctypes.data != view.ctypes.data
    ws.run_net_once(fill_net("f", "y", (3,), 2.0))
    assert snapshot.tolist() == [1.0, 1.0, 1.0]  # a copy: the kernel's write does not show
    # The view shows the buffer's memory: at once under zero copy, after a host read otherwise.
    fresh = t.numpy()
    assert fresh.ctypes.data == view.ctypes.data
    assert view.tolist() == [2.0, 2.0, 2.0]
