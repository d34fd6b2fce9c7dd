"""Kernels and operators of your own: syncmem.RawKernel (OpenCL C, CUDA C) called as CuPy's,
and operator types defined by a Python function over NumPy views on cpu."""

import numpy
import pytest

import syncmem

SCALE_CL = """
__kernel void scale(const __global float* x, __global float* y, uint n, float a) {
    size_t i = get_global_id(0);
    if (i < n) y[i] = a * x[i];
}
"""

SCALE_CU = """
extern "C" __global__ void scale(const float* x, float* y, unsigned int n, float a) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
"""


def test_raw_kernel_scales_tensors_on_opencl(opencl):
    ws = syncmem.Workspace(device=opencl)
    n = 1000
    x = numpy.arange(n, dtype="float32") - 300
    ws.feed_blob("x", x)
    ws.feed_blob("y", numpy.zeros(n, "float32"))
    k = syncmem.RawKernel(SCALE_CL, "scale")
    assert (k.name, k.backend) == ("scale", "opencl")
    blocks = (n + 63) // 64
    # NumPy scalars of the parameters' types, in CuPy's shape: kernel(grid, block, args).
    k((blocks,), (64,), (ws.tensor("x"), ws.tensor("y"), numpy.uint32(n), numpy.float32(0.5)))
    # The read-only parameter left x synced (made current on the device once: a copy with two
    # mirrors, a zero-copy sync where the device shares host memory); y was written there.
    assert ws.tensor("x").head == "synced"
    assert ws.tensor("y").head == "device"
    c = ws.tensor("x").copy_stats()
    once = (0, 1) if opencl.zero_copy_protocol else (1, 0)
    assert (c["host_to_device"]["count"], c["mapped"]["count"]) == once
    numpy.testing.assert_array_equal(ws.fetch_blob("y"), x * 0.5)
    # Python numbers are typed by the kernel's parameters.
    k(blocks, 64, [ws.tensor("x"), ws.tensor("y"), n, -2.0])
    numpy.testing.assert_array_equal(ws.fetch_blob("y"), x * -2.0)


def test_raw_kernel_errors_name_the_kernel_and_the_argument(opencl):
    ws = syncmem.Workspace(device=opencl)
    ws.feed_blob("x", numpy.ones(8, "float32"))
    ws.feed_blob("y", numpy.zeros(8, "float32"))
    x, y = ws.tensor("x"), ws.tensor("y")
    k = syncmem.RawKernel(SCALE_CL, "scale")
    with pytest.raises(syncmem.SyncmemError, match="takes 4 arguments, the launch passes 3"):
        k(1, 8, (x, y, numpy.uint32(8)))
    with pytest.raises(syncmem.SyncmemError, match=r"argument 3.*double"):
        k(1, 8, (x, y, numpy.uint32(8), numpy.float64(1.0)))
    with pytest.raises(syncmem.SyncmemError, match=r"argument 1.*passed twice"):
        k(1, 8, (x, x, numpy.uint32(8), numpy.float32(1.0)))
    with pytest.raises(TypeError, match="argument 2"):
        k(1, 8, (x, y, "eight", numpy.float32(1.0)))
    numpy.testing.assert_array_equal(ws.fetch_blob("y"), numpy.zeros(8, "float32"))
    bad = syncmem.RawKernel("__kernel void bad(__global float* x) { x[0] = nope; }", "bad")
    with pytest.raises(syncmem.SyncmemError, match=r"(?s)failed to build.*nope"):
        bad.compile(opencl)
    # A CUDA kernel has nothing to run on an OpenCL device.
    cu = syncmem.RawKernel(SCALE_CU, "scale")
    assert cu.backend == "cuda"
    with pytest.raises(syncmem.DeviceError, match="no CUDA C source|no OpenCL C source"):
        cu(1, 8, (x, y, 8, 1.0))


def test_raw_kernel_launches_are_not_blocked_by_read_views(opencl):
    ws = syncmem.Workspace(device=opencl)
    ws.feed_blob("x", numpy.full(4, 3.0, "float32"))
    ws.feed_blob("y", numpy.zeros(4, "float32"))
    y = ws.tensor("y")
    view = y.numpy(writable=True)
    k = syncmem.RawKernel(SCALE_CL, "scale")
    # A writable view of y is alive: the launch would race with writes through it.
    with pytest.raises(syncmem.BusyError):
        k(1, 4, (ws.tensor("x"), y, 4, 2.0))
    del view
    k(1, 4, (ws.tensor("x"), y, 4, 2.0))
    numpy.testing.assert_array_equal(ws.fetch_blob("y"), numpy.full(4, 6.0, "float32"))


def square(inputs, outputs):
    outputs[0][...] = inputs[0] * inputs[0]


def test_python_operators_run_in_nets_on_cpu():
    syncmem.register_operator("PySquare", square, gradient="PySquareGradient")
    assert "PySquare" in syncmem.operator_types()
    with pytest.raises(syncmem.AlreadyExistsError):
        syncmem.register_operator("PySquare", square)
    ws = syncmem.Workspace(device="cpu")
    ws.feed_blob("x", numpy.array([[-1, 2], [3, -4]], "float32"))
    net = {
        "name": "sq",
        "ops": [
            {"type": "PySquare", "inputs": ["x"], "outputs": ["a"]},
            {"type": "Relu", "inputs": ["a"], "outputs": ["b"]},
            {"type": "PySquare", "inputs": ["b"], "outputs": ["y"]},
        ],
    }
    ws.create_net(net)
    ws.run_net("sq")
    numpy.testing.assert_array_equal(
        ws.fetch_blob("y"), numpy.array([[1, 16], [81, 256]], "float32")
    )


def test_python_operators_size_outputs_and_report_errors():
    kept = []

    def first_rows(inputs, outputs):
        kept.append(outputs[0])  # kept beyond the call: it is a copy, not the buffer
        outputs[0][...] = inputs[0][:1]

    syncmem.register_operator(
        "PyFirstRow", first_rows, shapes=lambda shapes: [(1, shapes[0][1])]
    )
    ws = syncmem.Workspace(device="cpu")
    ws.feed_blob("x", numpy.arange(6, dtype="float32").reshape(2, 3))
    ws.run_net_once({"name": "r", "ops": [{"type": "PyFirstRow", "inputs": ["x"], "outputs": ["y"]}]})
    numpy.testing.assert_array_equal(ws.fetch_blob("y"), [[0, 1, 2]])
    kept[0][...] = 99
    numpy.testing.assert_array_equal(ws.fetch_blob("y"), [[0, 1, 2]])

    def broken(inputs, outputs):
        raise ValueError("no luck")

    syncmem.register_operator("PyBroken", broken)
    with pytest.raises(syncmem.SyncmemError, match=r"PyBroken.*no luck"):
        ws.run_net_once({"name": "b", "ops": [{"type": "PyBroken", "inputs": ["x"], "outputs": ["z"]}]})


def test_python_operators_run_on_cpu_only(opencl):
    syncmem.register_operator("PySquareCpuOnly", square)
    ws = syncmem.Workspace(device=opencl)
    ws.feed_blob("x", numpy.ones(3, "float32"))
    net = {"name": "n", "ops": [{"type": "PySquareCpuOnly", "inputs": ["x"], "outputs": ["y"]}]}
    with pytest.raises(syncmem.DeviceError, match="cpu only"):
        ws.create_net(net)


ODD_CL = """
__kernel void odd(__global float* y, char c, float4 v) {
    y[0] = (float)c;
    y[1] = v.x + v.w;
}
"""


def test_raw_kernel_by_value_parameters_take_only_their_size(opencl):
    ws = syncmem.Workspace(device=opencl)
    ws.feed_blob("y", numpy.zeros(4, "float32"))
    y = ws.tensor("y")
    v = numpy.array([1, 2, 3, 4], "float32").tobytes()
    k = syncmem.RawKernel(ODD_CL, "odd")
    with pytest.raises(syncmem.SyncmemError, match=r"argument 1.*char of 1 byte"):
        k(1, 1, (y, numpy.uint32(3), v))
    with pytest.raises(syncmem.SyncmemError, match=r"argument 1.*char of 1 byte"):
        k(1, 1, (y, 3, v))
    with pytest.raises(syncmem.SyncmemError, match=r"argument 2.*float4 of 16 bytes"):
        k(1, 1, (y, numpy.int8(3), numpy.float32(1.0)))
    with pytest.raises(syncmem.SyncmemError, match=r"argument 2.*float4 of 16 bytes"):
        k(1, 1, (y, numpy.int8(3), v[:8]))
    numpy.testing.assert_array_equal(ws.fetch_blob("y"), numpy.zeros(4, "float32"))
    k(1, 1, (y, numpy.int8(3), v))
    numpy.testing.assert_array_equal(ws.fetch_blob("y"), [3, 5, 0, 0])
    k(1, 1, (y, b"\x02", bytearray(v)))
    numpy.testing.assert_array_equal(ws.fetch_blob("y"), [2, 5, 0, 0])


def test_raw_kernel_checks_dtypes_and_float_ranges(opencl):
    ws = syncmem.Workspace(device=opencl)
    ws.feed_blob("x", numpy.ones(8, "int32"))
    ws.feed_blob("f", numpy.ones(8, "float32"))
    ws.feed_blob("y", numpy.zeros(8, "float32"))
    k = syncmem.RawKernel(SCALE_CL, "scale")
    with pytest.raises(syncmem.SyncmemError, match=r"argument 0.*is i32.*points to f32"):
        k(1, 8, (ws.tensor("x"), ws.tensor("y"), 8, 1.0))
    with pytest.raises(syncmem.SyncmemError, match=r"argument 3.*does not fit a float"):
        k(1, 8, (ws.tensor("f"), ws.tensor("y"), 8, 1e300))
    numpy.testing.assert_array_equal(ws.fetch_blob("y"), numpy.zeros(8, "float32"))
    # An infinity asked for is passed as it is.
    k(1, 8, (ws.tensor("f"), ws.tensor("y"), 8, float("inf")))
    assert numpy.isinf(ws.fetch_blob("y")).all()


def test_raw_kernel_refuses_nul_bytes_and_huge_grids(opencl):
    ws = syncmem.Workspace(device=opencl)
    ws.feed_blob("x", numpy.ones(8, "float32"))
    ws.feed_blob("y", numpy.zeros(8, "float32"))
    k = syncmem.RawKernel(SCALE_CL, "sc\0ale")
    with pytest.raises(syncmem.SyncmemError, match="NUL byte"):
        k.compile(opencl)
    with pytest.raises(syncmem.SyncmemError, match="NUL byte"):
        k(1, 8, (ws.tensor("x"), ws.tensor("y"), 8, 1.0))
    k = syncmem.RawKernel(SCALE_CL, "scale")
    with pytest.raises(syncmem.SyncmemError, match="work-items"):
        k((2**32 - 1,) * 3, (1, 1, 1), (ws.tensor("x"), ws.tensor("y"), 8, 1.0))
    numpy.testing.assert_array_equal(ws.fetch_blob("y"), numpy.zeros(8, "float32"))
