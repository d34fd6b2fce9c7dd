"""Two threads: concurrent use is correct, and long calls release the GIL.

A call that releases the GIL lets the main thread run while it is in progress. The tests see
that without timing: the call makes one host/device copy per step, and the main thread polls
the process's copy counter; it can read a value strictly between the counts before and after
the call only while the call runs, which it cannot do if the call keeps the GIL.
"""

import threading
import time

import numpy
import pytest
import syncmem
from conftest import relu_net

# Copies and the host pool: measured with two mirrors (see conftest.two_mirrors).
pytestmark = pytest.mark.usefixtures("two_mirrors")

STEPS = 200
ELEMENTS = 1 << 14  # per step: 64 KiB drawn on the host and copied


def in_thread(call):
    """Starts `call` in a thread; returns (thread, finished event, list of errors)."""
    done, errors = threading.Event(), []

    def run():
        try:
            call()
        except BaseException as e:  # reported by the test
            errors.append(e)
        finally:
            done.set()

    th = threading.Thread(target=run)
    th.start()
    return th, done, errors


def seen_in_progress(call, counter, steps, setup=None, attempts=5):
    """True when the main thread saw `counter` strictly between its values before and after
    `call`, run in another thread (which makes `steps` counts). A call that keeps the GIL can
    never be seen so; one that releases it almost always is, and is tried `attempts` times in
    case the main thread was not scheduled while it ran (`setup` runs before each try)."""
    for _ in range(attempts):
        if setup is not None:
            setup()
        start = counter()
        th, done, errors = in_thread(call)
        seen = False
        while not done.is_set():
            if 0 < counter() - start < steps:
                seen = True
        th.join()
        assert not errors, errors
        assert counter() - start == steps  # the counter counts exactly the call's steps
        if seen:
            return True
    return False


def h2d():
    return syncmem.copy_stats()["host_to_device"]["count"]


def d2h():
    return syncmem.copy_stats()["device_to_host"]["count"]


def uniform_net(name="noise", outputs=("r",)):
    ops = [{"type": "UniformFill", "outputs": [o], "args": {"shape": [ELEMENTS]}} for o in outputs]
    return {"name": name, "ops": ops}


def test_two_threads_run_nets_and_feed_concurrently(device):
    results, errors = {}, []

    def worker(k):
        try:
            ws = syncmem.Workspace(device=device)
            ws.create_net(relu_net())
            for i in range(50):
                x = numpy.linspace(-1, 1, 33, dtype="float32") * (i + k)
                ws.feed_blob("x", x)
                ws.run_net("relu")
                numpy.testing.assert_array_equal(ws.fetch_blob("y"), numpy.maximum(x, 0))
            results[k] = ws.fetch_blob("y")
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in (1, 2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert sorted(results) == [1, 2]


def test_shared_workspace_from_two_threads(device):
    ws = syncmem.Workspace(device=device)
    ws.feed_blob("x", numpy.ones(16, "float32"))
    ws.create_net(relu_net())

    def runner():
        ws.run_net("relu", num_iter=100)

    th, done, errors = in_thread(runner)
    n = 0
    while not done.is_set() or n < 20:
        ws.feed_blob(f"other{n % 4}", numpy.full(8, n, "int32"))
        assert ws.fetch_blob(f"other{n % 4}")[0] == n
        assert ws.tensor("x").numpy().tolist() == [1.0] * 16
        n += 1
    th.join()
    assert not errors, errors
    numpy.testing.assert_array_equal(ws.fetch_blob("y"), numpy.ones(16))


def test_writable_views_and_nets_never_overlap(device):
    ws = syncmem.Workspace(device=device)
    ws.feed_blob("x", numpy.ones(1024, "float32"))
    ws.create_net(relu_net(y="x"))  # in place: each run writes x on the device
    t = ws.tensor("x")
    ran, viewing = [], threading.Event()

    def runner():
        viewing.wait()  # the first view is alive: runs from now on race with views
        for _ in range(10_000):
            try:
                ws.run_net("relu")
                ran.append(1)
            except syncmem.BusyError:
                pass  # a view was alive when the run began: nothing ran
            if len(ran) == 20:
                return

    th, done, errors = in_thread(runner)
    views = 0
    while not done.is_set():
        w = t.numpy(writable=True)  # waits for a run in progress, never overlaps one
        viewing.set()
        assert t.head == "host"
        w[0] = 1.0
        assert t.head == "host"  # no run wrote the device while the view lived
        del w
        views += 1
        seen = len(ran)
        while len(ran) == seen and not done.is_set():
            time.sleep(0)  # lets the runner through: it runs while no view is alive
    th.join()
    assert not errors, errors
    assert len(ran) == 20 and views > 0


def test_run_net_releases_the_gil(opencl):
    ws = syncmem.Workspace(device=opencl)
    ws.create_net(uniform_net())  # one upload per run on an OpenCL device
    ws.run_net("noise")
    assert seen_in_progress(lambda: ws.run_net("noise", num_iter=STEPS), h2d, STEPS)


def test_load_and_save_release_the_gil(opencl, tmp_path):
    names = [f"t{i}" for i in range(STEPS)]
    ws = syncmem.Workspace(device=opencl)
    path = tmp_path / "many.safetensors"

    def on_device():
        ws.run_net_once(uniform_net("init", names))  # each tensor's head at the device

    # Saving reads each tensor back from the device: one copy each.
    assert seen_in_progress(lambda: ws.save(path), d2h, STEPS, setup=on_device)
    # Loading onto the device writes each tensor there: one copy each.
    fresh = syncmem.Workspace(device=opencl)
    assert seen_in_progress(lambda: fresh.load(path), h2d, STEPS)
    numpy.testing.assert_array_equal(fresh.fetch_blob("t7"), ws.fetch_blob("t7"))
