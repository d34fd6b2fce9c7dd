"""Zero-copy tensors and spills: where the device's memory is host memory one allocation
serves both sides (a NumPy view is the device memory itself); the switch on Device; the
mapped, spill and refill counters of copy_stats() and memory_stats()."""

import json
import os
import subprocess
import sys
import textwrap

import numpy
import pytest

import syncmem
from conftest import fill_net, relu_net


@pytest.fixture
def setting(device):
    """Restores the device's zero-copy setting after the test."""
    before = device.zero_copy
    yield device
    device.zero_copy = before


def test_the_switch_reads_sets_and_refuses_bad_values(setting):
    dev = setting
    dev.zero_copy = "off"
    assert dev.zero_copy == "off" and dev.zero_copy_protocol is None
    dev.zero_copy = "auto"
    assert dev.zero_copy == "auto"
    # cpu and PoCL share host memory: the host uses the device memory in place.
    assert dev.host_unified
    assert dev.zero_copy_protocol == "in-place"
    dev.zero_copy = "map"
    assert dev.zero_copy_protocol == ("map" if dev.kind == "opencl" else "in-place")
    with pytest.raises(syncmem.ConfigError, match="expected auto, off or map"):
        dev.zero_copy = "sometimes"
    assert dev.zero_copy == "map"  # a refused value changes nothing


VIEW_SCRIPT = textwrap.dedent(
    """
    import json, sys, syncmem
    from conftest import fill_net, relu_net
    dev = syncmem.Device(sys.argv[1])
    dev.zero_copy = sys.argv[2]  # before the first allocation: every segment of that kind
    ws = syncmem.Workspace(device=dev)
    ws.run_net_once(fill_net("f", "x", (4,), 1.0))  # x's memory allocated on the device
    t = ws.tensor("x")
    before = t.copy_stats()
    w = t.numpy(writable=True)
    assert w.tolist() == [1.0] * 4
    w[:] = [-1.0, 2.0, -3.0, 4.0]
    del w
    ws.run_net_once(relu_net())  # reads x on the device
    print(json.dumps([ws.fetch_blob("y").tolist(), before, t.copy_stats()]))
    """
)


def write_view_then_relu_on_device(dev, setting):
    """In a fresh process (the device's first memory of that kind): x written on the device,
    rewritten through a writable NumPy view, then read by an operator on the device. Returns
    (y, x's copy_stats() before the view, after the relu)."""
    run = subprocess.run(
        [sys.executable, "-c", VIEW_SCRIPT, str(dev), setting],
        cwd=os.path.dirname(os.path.abspath(__file__)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_numpy_view_of_a_zero_copy_tensor_is_the_device_memory(device):
    y, before, after = write_view_then_relu_on_device(device, "auto")
    assert y == [0.0, 2.0, 0.0, 4.0]
    # The view was the device memory: nothing was copied either way, the syncs are `mapped`.
    for direction in ("host_to_device", "device_to_host"):
        assert after[direction] == before[direction] == {"count": 0, "bytes": 0}, direction
    assert after["mapped"]["count"] - before["mapped"]["count"] == 2  # to the host and back


def test_with_zero_copy_off_the_same_steps_copy(device):
    y, before, after = write_view_then_relu_on_device(device, "off")
    assert y == [0.0, 2.0, 0.0, 4.0]
    # Two mirrors: down for the view, up for the relu.
    assert after["device_to_host"]["count"] - before["device_to_host"]["count"] == 1
    assert after["host_to_device"]["count"] - before["host_to_device"]["count"] == 1
    assert after["mapped"] == before["mapped"] == {"count": 0, "bytes": 0}


def test_copy_stats_name_every_direction(device):
    t = syncmem.Workspace(device=device)
    t.feed_blob("x", numpy.ones(4, "float32"))
    keys = {"host_to_device", "device_to_host", "device_to_device", "mapped", "spilled",
            "refilled"}
    assert set(t.tensor("x").copy_stats()) == keys
    assert set(syncmem.copy_stats()) == keys


SPILL_SCRIPT = textwrap.dedent(
    """
    import numpy, syncmem
    dev = syncmem.Device("opencl:0")
    dev.zero_copy = "off"  # two mirrors, so the device memory is the capped pool's
    ws = syncmem.Workspace(device=dev)
    n = (1 << 20) // 4  # 1 MiB tensors under a 3 MiB cap
    for i in range(6):
        ws.run_net_once({"name": "f", "ops": [{"type": "ConstantFill", "outputs": [f"t{i}"],
                         "args": {"shape": [n], "value": float(i)}}]})
    s = syncmem.memory_stats(dev)
    assert s["num_spills"] >= 3 and s["spilled_bytes"] >= 3 << 20, s
    # Every tensor still holds what the device wrote: spilled ones from the host.
    for i in range(6):
        assert (ws.fetch_blob(f"t{i}") == i).all(), i
    ws.tensor("t0").to_device()  # spilled: brought back
    s = syncmem.memory_stats(dev)
    assert s["num_refills"] >= 1 and s["refilled_bytes"] >= 1 << 20, s
    print("spills", s["num_spills"], "refills", s["num_refills"])
    """
)


def test_a_capped_device_spills_and_refills_with_memory_stats_counting(opencl):
    env = dict(os.environ, SYNCMEM_POOL_CONF="memory_cap=3MiB")
    run = subprocess.run([sys.executable, "-c", SPILL_SCRIPT], env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("spills ")


@pytest.mark.parametrize("value", ["", " auto", "off ", "on", "1", "0", "none", "OFF x"])
def test_the_switch_takes_exactly_auto_off_or_map(setting, value):
    dev = setting
    dev.zero_copy = "off"
    with pytest.raises(syncmem.ConfigError, match="expected auto, off or map"):
        dev.zero_copy = value
    assert dev.zero_copy == "off"
    dev.zero_copy = "MAP"  # in any case
    assert dev.zero_copy == "map"


@pytest.mark.parametrize("value,ok", [("Off", True), ("map", True), (" auto", False),
                                      ("on", False), ("1", False), ("", False)])
def test_the_environment_variable_follows_the_same_rule(value, ok):
    code = "import syncmem; print(syncmem.Device('cpu').zero_copy)"
    env = dict(os.environ, SYNCMEM_ZERO_COPY=value)
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    if ok:
        assert run.returncode == 0 and run.stdout.strip() == value.lower(), run.stderr
    else:
        assert run.returncode != 0 and "SYNCMEM_ZERO_COPY" in run.stderr, run.stdout
