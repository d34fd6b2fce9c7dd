"""Shared fixtures: the devices every test runs on, and helpers."""

import os

import numpy
import pytest

import syncmem


def opencl_or_skip(name="opencl:0"):
    """The OpenCL device, or a skip; with SYNCMEM_REQUIRE_OPENCL=1 a missing device fails."""
    try:
        return syncmem.Device(name)
    except syncmem.DeviceError as e:
        if os.environ.get("SYNCMEM_REQUIRE_OPENCL") == "1":
            pytest.fail(f"SYNCMEM_REQUIRE_OPENCL=1 but {name} cannot be opened: {e}")
        pytest.skip(f"SKIPPED: {name} cannot be opened: {e}")


@pytest.fixture(params=["cpu", "opencl:0"])
def device(request):
    """Each test taking `device` runs on cpu and on the first OpenCL device."""
    if request.param == "cpu":
        return syncmem.Device("cpu")
    return opencl_or_skip(request.param)


@pytest.fixture
def opencl():
    """The first OpenCL device (tests that need a device other than the host)."""
    return opencl_or_skip()


@pytest.fixture
def two_mirrors():
    """Zero-copy off on `cpu` and `opencl:0` during the test (restored after), so that tensors
    keep a host and a device mirror with copies between them, as on a discrete GPU: for the
    tests of copies, of the host pool and of its snapshots. test_zero_copy.py tests the
    default, where these devices share one allocation between the sides."""
    devices = [syncmem.Device("cpu")]
    try:
        devices.append(syncmem.Device("opencl:0"))
    except syncmem.DeviceError:
        pass  # the tests that need it skip or fail on their own
    before = [(d, d.zero_copy) for d in devices]
    for d in devices:
        d.zero_copy = "off"
    yield
    for d, setting in before:
        d.zero_copy = setting


@pytest.fixture
def ws(device):
    """A fresh workspace on `device`."""
    return syncmem.Workspace(device=device)


def address(array):
    """The address of an array's first element."""
    return array.__array_interface__["data"][0]


def relu_net(name="relu", x="x", y="y"):
    """A one-operator net: y = relu(x)."""
    return {"name": name, "ops": [{"type": "Relu", "inputs": [x], "outputs": [y]}]}


def fill_net(name, output, shape, value):
    """A net writing `value` into every element of `output` on the device."""
    return {
        "name": name,
        "ops": [
            {
                "type": "ConstantFill",
                "outputs": [output],
                "args": {"shape": list(shape), "value": value},
            }
        ],
    }


numpy.set_printoptions(precision=4)
