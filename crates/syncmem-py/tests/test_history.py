"""The always-on history and out-of-memory observers from Python: on_out_of_memory calls its
callable with the report before the error is raised, until remove(); record_memory_history
keeps the newest events, which memory_history returns as trace JSON lines."""

import json

from test_errors import run_python


def test_an_observer_sees_the_failure_before_the_error(device):
    r = run_python(
        f"""
        import json, numpy, syncmem
        syncmem.record_memory_history(1000)
        seen = []
        def observe(report):
            history = syncmem.memory_history()
            last = [json.loads(l) for l in history.splitlines()][-1]
            seen.append((report["device"], report["requested"], last["op"]))
        observer = syncmem.on_out_of_memory(observe)
        ws = syncmem.Workspace(device={str(device)!r})
        ws.feed_blob("big", numpy.ones(4 << 20, "uint8"))
        try:
            ws.tensor("big").to_device()
        except MemoryError:
            print("seen", json.dumps(seen))
        observer.remove()
        n = len(seen)
        ws.feed_blob("big2", numpy.ones(4 << 20, "uint8"))
        try:
            ws.tensor("big2").to_device()
        except MemoryError:
            print("after remove", len(seen) == n)
        # A callable that raises is reported, and the error stays the out-of-memory one.
        with syncmem.on_out_of_memory(lambda report: 1 / 0):
            try:
                ws.tensor("big2").to_device()
            except MemoryError as e:
                print("still", type(e).__name__)
        syncmem.record_memory_history(None)
        print("off", syncmem.memory_history())
        """,
        env={"SYNCMEM_POOL_CONF": "memory_cap=1MiB"},
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    # Once for the one error raised (feeding the blob tries the device first where it shares
    # host memory and falls back to a host mirror: no error, no call), with the failure last
    # in the history.
    seen = json.loads(lines[0].removeprefix("seen "))
    assert seen == [[str(device), 4 << 20, "oom"]], r.stdout
    assert "after remove True" in lines
    assert "still OutOfMemoryError" in lines
    assert "ZeroDivisionError" in r.stderr
    assert "off None" in lines
