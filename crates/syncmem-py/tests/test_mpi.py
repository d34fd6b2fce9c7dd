"""mpi4py collectives on syncmem tensors without copies, run under `mpirun -n 2` and `-n 3`.

Each rank fills tensors with rank-dependent values and all-reduces them with mpi4py: through a
writable NumPy view (`Tensor.numpy(writable=True)`, on every device), and on `cpu` through the
tensor itself (mpi4py takes it through DLPack). The ranks report the sums, the tensor's copy
statistics and the host addresses before and after; the test checks the exact sums and that
nothing was copied where the host and the device share memory (`cpu`, PoCL), and that the
same steps with zero copy off (two mirrors, as on a discrete GPU) copy once each way, counted.

Needs mpi4py and Open MPI's `mpirun` (its `--oversubscribe` and `--bind-to none`); without them
the tests skip, unless SYNCMEM_REQUIRE_MPI=1, which makes a missing one a failure.
"""

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

TIMEOUT_S = 60

# Run by every rank: `script.py DEVICE [FAILING_RANK]`. Each rank writes its report to
# `result-RANK.json` in the working directory. Any exception on any rank ends the whole job
# (comm.Abort), so a failing rank never leaves the others waiting in a collective.
SCRIPT = textwrap.dedent(
    '''
    import json
    import sys
    import traceback

    import numpy
    from mpi4py import MPI

    import syncmem

    comm = MPI.COMM_WORLD
    RANK, SIZE = comm.Get_rank(), comm.Get_size()
    N = 16
    KINDS = ("host_to_device", "device_to_host", "mapped")


    def rank_values():
        """(rank + 1) * [1 .. N]: summed over the ranks, SIZE * (SIZE + 1) / 2 * [1 .. N]."""
        return (RANK + 1) * numpy.arange(1, N + 1, dtype="float32")


    def relu(x, y):
        """A net that runs on the device: reads x there, writes y (x >= 0, so y = x)."""
        return {"name": "relu", "ops": [{"type": "Relu", "inputs": [x], "outputs": [y]}]}


    def address(a):
        return a.__array_interface__["data"][0]


    def counts(t):
        """The tensor's copies so far, and the process's."""
        mine, every = t.copy_stats(), syncmem.copy_stats()
        return {k: mine[k]["count"] for k in KINDS}, {k: every[k]["count"] for k in KINDS}


    def diff(before, after):
        return [{k: a[k] - b[k] for k in KINDS} for b, a in zip(before, after)]


    def on_device(dev, name):
        """A workspace whose tensor `name` holds the rank's values, written last on the
        device (the device is its newest side, as after a net's step)."""
        ws = syncmem.Workspace(device=dev)
        ws.feed_blob(name, rank_values())
        ws.run_net_once(relu(name, name))
        return ws, ws.tensor(name)


    def in_place_view(dev):
        ws, t = on_device(dev, "x")
        host_before = address(t.numpy())
        before = counts(t)
        view = t.numpy(writable=True)  # the host side becomes the newest
        mpi_address = MPI.buffer(view).address  # what mpi4py hands to MPI
        comm.Allreduce(MPI.IN_PLACE, view)
        view_address = address(view)
        del view  # ends the writable view: device access is allowed again
        ws.run_net_once(relu("x", "y"))  # the device reads the sums
        after = counts(t)
        return {
            "sums": ws.fetch_blob("y").tolist(),
            "copies": diff(before, after),
            "addresses": [host_before, view_address, mpi_address, address(t.numpy())],
        }


    def views_src_dst(dev):
        ws, src = on_device(dev, "src")
        ws.feed_blob("dst", numpy.zeros(N, "float32"))
        dst = ws.tensor("dst")
        ws.run_net_once(relu("dst", "dst"))
        before = [counts(src), counts(dst)]
        s, d = src.numpy(), dst.numpy(writable=True)  # a send buffer may be read-only
        comm.Allreduce(s, d)
        del s, d
        ws.run_net_once(relu("dst", "y"))
        after = [counts(src), counts(dst)]
        return {
            "sums": ws.fetch_blob("y").tolist(),
            "copies": diff(before[0], after[0]) + diff(before[1], after[1]),
        }


    def in_place_tensor(dev):
        """The tensor itself: mpi4py takes a host tensor's DLPack export (writable)."""
        ws, t = on_device(dev, "x")
        host_before = address(t.numpy())
        before = counts(t)
        comm.Allreduce(MPI.IN_PLACE, t)
        head = t.head  # the export made the host the newest side
        ws.run_net_once(relu("x", "y"))
        after = counts(t)
        return {
            "sums": ws.fetch_blob("y").tolist(),
            "copies": diff(before, after),
            "addresses": [host_before, address(t.numpy())],
            "head": head,
        }


    def tensors_src_dst(dev):
        ws, src = on_device(dev, "src")
        ws.feed_blob("dst", numpy.zeros(N, "float32"))
        dst = ws.tensor("dst")
        before = [counts(src), counts(dst)]
        comm.Allreduce(src, dst)
        after = [counts(src), counts(dst)]
        return {
            "sums": ws.fetch_blob("dst").tolist(),
            "copies": diff(before[0], after[0]) + diff(before[1], after[1]),
        }


    def two_mirrors(dev):
        """The in-place view with zero copy off: a host and a device mirror, as on a discrete
        GPU. The view copies the device's data down, the next device read copies the sums up."""
        setting = dev.zero_copy
        dev.zero_copy = "off"
        try:
            ws, t = on_device(dev, "x")
            before = counts(t)
            view = t.numpy(writable=True)
            comm.Allreduce(MPI.IN_PLACE, view)
            del view
            ws.run_net_once(relu("x", "y"))
            after = counts(t)  # before the fetch, which copies y down
            return {"sums": ws.fetch_blob("y").tolist(), "copies": diff(before, after)}
        finally:
            dev.zero_copy = setting


    def main():
        dev = syncmem.Device(sys.argv[1])
        if len(sys.argv) > 2 and RANK == int(sys.argv[2]):
            raise RuntimeError(f"rank {RANK} fails on purpose")
        cases = {"in_place_view": in_place_view, "views_src_dst": views_src_dst}
        if dev.kind == "cpu":
            cases.update(in_place_tensor=in_place_tensor, tensors_src_dst=tensors_src_dst)
        cases["two_mirrors"] = two_mirrors
        results = {}
        for name, case in cases.items():
            results[name] = case(dev)
        # A file per rank: mpirun interleaves the ranks' output.
        with open(f"result-{RANK}.json", "w") as f:
            json.dump({"rank": RANK, "size": SIZE, "cases": results}, f)


    try:
        main()
    except BaseException:
        # mpi4py's default exit path would leave the other ranks in their collective: end
        # the whole job instead.
        sys.stderr.write(f"rank {RANK} failed:\\n{traceback.format_exc()}")
        sys.stderr.flush()
        comm.Abort(1)
    '''
)


def mpirun_or_skip():
    """`mpirun`'s path, or a skip naming what is missing; with SYNCMEM_REQUIRE_MPI=1 a missing
    mpi4py or mpirun fails instead."""
    missing = []
    if importlib.util.find_spec("mpi4py") is None:
        missing.append(f"mpi4py is not installed for {sys.executable}")
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        missing.append("mpirun is not on PATH")
    if missing:
        why = " and ".join(missing)
        if os.environ.get("SYNCMEM_REQUIRE_MPI") == "1":
            pytest.fail(f"SYNCMEM_REQUIRE_MPI=1 but {why}")
        pytest.skip(f"SKIPPED: {why}")
    return mpirun


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "allreduce.py"
    path.write_text(SCRIPT)
    return path


def run_mpi(n, script, *args):
    """Runs `mpirun -n N python script args` and returns (exit code, output, seconds). The job
    is killed, and the test fails, if it runs past TIMEOUT_S."""
    mpirun = mpirun_or_skip()
    # Open MPI refuses to run as root without these; on a small machine it needs
    # --oversubscribe for more ranks than cores, and --bind-to none to share them.
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = [mpirun, "-n", str(n), "--oversubscribe", "--bind-to", "none", sys.executable,
           str(script), *args]
    start = time.monotonic()
    # A session of its own: on a timeout the whole job (mpirun and its ranks) is killed.
    proc = subprocess.Popen(cmd, cwd=script.parent, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} did not end within {TIMEOUT_S} s; output:\n{out}")
    return proc.returncode, out, time.monotonic() - start


def results(script, n):
    """The ranks' reports, by rank."""
    by_rank = {}
    for rank in range(n):
        report = json.loads((script.parent / f"result-{rank}.json").read_text())
        assert report["rank"] == rank and report["size"] == n, report
        by_rank[rank] = report
    return by_rank


NO_COPY = {"host_to_device": 0, "device_to_host": 0}


def copied(delta):
    return {k: delta[k] for k in NO_COPY}


@pytest.mark.parametrize("n", [2, 3])
def test_allreduce_in_place_without_copies(script, device, n):
    code, out, seconds = run_mpi(n, script, str(device))
    assert code == 0, out
    expected = [n * (n + 1) / 2 * i for i in range(1, 17)]
    for rank, report in results(script, n).items():
        cases = report["cases"]
        assert set(cases) >= {"in_place_view", "views_src_dst", "two_mirrors"}, rank
        if device.kind == "cpu":
            assert {"in_place_tensor", "tensors_src_dst"} <= set(cases), rank
        for name, case in cases.items():
            assert case["sums"] == expected, (rank, name)
            if "addresses" in case:
                # MPI worked on the tensor's own host memory, which stayed where it was.
                assert len(set(case["addresses"])) == 1, (rank, name, case["addresses"])
            if name != "two_mirrors":
                # Neither this tensor's buffer nor any other in the process copied a byte.
                for delta in case["copies"]:
                    assert copied(delta) == NO_COPY, (rank, name, case["copies"])
        if "in_place_tensor" in cases:
            assert cases["in_place_tensor"]["head"] == "host"
        # Two mirrors: one copy down for the view, one up for the next device read.
        mine, every = cases["two_mirrors"]["copies"]
        assert copied(mine) == {"host_to_device": 1, "device_to_host": 1}, (rank, mine)
        assert mine["mapped"] == 0 and copied(every) == copied(mine), (rank, every)
    assert seconds < TIMEOUT_S


def test_a_failing_rank_ends_the_job(script):
    code, out, seconds = run_mpi(2, script, "cpu", "1")
    # Rank 0 waits in its first collective; rank 1's except path aborts the job.
    assert code != 0, out
    assert "rank 1 failed" in out and "RuntimeError: rank 1 fails on purpose" in out, out
    assert not list(script.parent.glob("result-*.json")), out
    assert seconds < TIMEOUT_S
