"""MemPool and use_mem_pool: a private pool of one device, routed to inside a `with` block."""

import threading

import numpy
import pytest

import syncmem


def mirror(ws, name, n=1024):
    """A tensor of `n` floats fed into `ws` and made current on its device (a device mirror)."""
    ws.feed_blob(name, numpy.arange(n, dtype="float32"))
    ws.tensor(name).to_device()
    return ws.tensor(name)


def test_allocations_in_the_block_land_in_the_pool_and_nowhere_else(device, two_mirrors):
    pool = syncmem.MemPool(device)
    assert pool.label.startswith(f"{device} mempool ")
    assert pool.device == device
    ws = syncmem.Workspace(device=device)
    in_use = f"in_use_bytes.{device}.current"
    before = syncmem.memory_stats(device)[in_use]
    with syncmem.use_mem_pool(pool) as ctx:
        assert ctx.pool.label == pool.label
        mirror(ws, "inside", 1024)
    assert syncmem.memory_stats(device)[in_use] == before + 4096, "the device counts it"
    s = pool.stats()
    assert s["allocations"] == 1, s
    assert s["requested"]["current"] == 4096
    owners = [b["owner"] for seg in pool.snapshot()["segments"] for b in seg["blocks"]]
    assert any(o is not None and "inside" in o for o in owners), owners
    mirror(ws, "outside", 1024)
    assert pool.stats()["allocations"] == 1, "outside the block: the device's pool"
    ws.remove_blob("inside")
    assert pool.stats()["frees"] == 1, "the block went back to the pool it came from"
    assert pool.stats()["allocated"]["current"] == 0


def test_blocks_nest_and_other_threads_are_not_routed(device, two_mirrors):
    outer, inner = syncmem.MemPool(device), syncmem.MemPool(device)
    ws = syncmem.Workspace(device=device)
    errors = []

    def elsewhere():
        try:
            mirror(ws, "thread", 256)
        except Exception as e:  # reported below
            errors.append(e)

    with syncmem.use_mem_pool(outer):
        with syncmem.use_mem_pool(inner):
            mirror(ws, "a", 256)
            t = threading.Thread(target=elsewhere)
            t.start()
            t.join()
        mirror(ws, "b", 256)
    assert not errors, errors
    assert inner.stats()["allocations"] == 1
    assert outer.stats()["allocations"] == 1, "the thread's tensor went to the device's pool"


def test_release_gives_the_cache_back_and_the_pool_is_gone(device, two_mirrors):
    pool = syncmem.MemPool(device)
    ws = syncmem.Workspace(device=device)
    with syncmem.use_mem_pool(pool):
        mirror(ws, "x", 1 << 16)
    ws.remove_blob("x")
    reserved = pool.stats()["reserved"]["current"]
    assert reserved >= 4 << 16
    assert pool.release() == reserved
    with pytest.raises(syncmem.InvalidStateError, match="released"):
        pool.stats()
    assert pool.release() == 0


def test_settings_preallocate_and_errors(device):
    pool = syncmem.MemPool(device, conf="memory_cap=16MiB,preallocate=50%,shards=1")
    s = pool.stats()
    assert s["preallocated_bytes"] == 8 << 20
    assert s["reserved"]["current"] == 8 << 20
    assert s["cap"] == 16 << 20
    assert pool.empty_cache() == 8 << 20
    with pytest.raises(syncmem.ConfigError, match="gc_threshold"):
        syncmem.MemPool(device, conf="gc_threshold=1.5")
    with pytest.raises(syncmem.ConfigError, match="unknown option"):
        syncmem.MemPool(device, conf="no_such_key=1")
    with pytest.raises(syncmem.ConfigError):
        syncmem.MemPool(device, kind="nonsense")
    binned = syncmem.MemPool(device, kind="binned")
    assert binned.stats()["kind"] == "binned"
    with pytest.raises(syncmem.OutOfMemoryError, match="mempool"):
        syncmem.MemPool(device, conf="memory_cap=1MiB,preallocate=2MiB")
