"""Memory introspection: memory_stats, memory_summary, memory_snapshot, copy_stats."""

import gc

import numpy

import syncmem
from conftest import fill_net

MiB = 1 << 20


def test_memory_stats_count_what_is_fed(device):
    ws = syncmem.Workspace(device=device)
    before = syncmem.memory_stats()
    ws.feed_blob("big", numpy.ones(MiB // 4, "float32"))
    after = syncmem.memory_stats()
    for key in [
        "allocated_bytes.all.current",
        "reserved_bytes.all.peak",
        "requested_bytes.all.current",
        "num_alloc_retries.all",
        "num_ooms.all",
        "allocation.all.current",
        "segment.all.current",
        "allocated_bytes.host.current",
        "in_use_bytes.host.current",
        "copies.host_to_device.count",
    ]:
        assert key in after and isinstance(after[key], int), key
    grown = after["requested_bytes.host.current"] - before.get("requested_bytes.host.current", 0)
    assert grown >= MiB
    assert after["allocated_bytes.all.current"] >= after["allocated_bytes.host.current"]
    assert after["allocation.all.allocated"] > before.get("allocation.all.allocated", 0)
    # The tensor reaches the device on first device access: the device's pool grows.
    ws.tensor("big").to_device()
    label = str(device)
    mine = syncmem.memory_stats(device)
    assert mine[f"requested_bytes.{label}.current"] >= MiB
    assert "allocated_bytes.host.current" not in mine
    assert mine["allocated_bytes.all.current"] == sum(
        v for k, v in mine.items() if k.startswith("allocated_bytes.") and k.endswith(".current")
        and ".all." not in k and "_pool." not in k
    )
    # Small and large blocks apart add up to all of them, figure by figure.
    for stat in ["allocated_bytes", "requested_bytes", "reserved_bytes", "inactive_split_bytes"]:
        for fig in ["current", "peak", "allocated", "freed"]:
            small, large = after[f"{stat}.small_pool.{fig}"], after[f"{stat}.large_pool.{fig}"]
            if fig != "peak":  # a peak of the sum is not the sum of the peaks
                assert small + large == after[f"{stat}.all.{fig}"], (stat, fig)
    assert (after["allocated_bytes.all.allocated"] - after["allocated_bytes.all.freed"]
            == after["allocated_bytes.all.current"])
    # Blocks up to 1 MiB are small (as in PyTorch), bigger ones large.
    ws.feed_blob("huge", numpy.ones(MiB, "float32"))
    bigger = syncmem.memory_stats()
    grown_large = (bigger["allocated_bytes.large_pool.allocated"]
                   - after["allocated_bytes.large_pool.allocated"])
    assert grown_large >= 4 * MiB
    assert bigger["allocated_bytes.small_pool.allocated"] >= MiB


def test_copy_stats_process_and_tensor(device):
    ws = syncmem.Workspace(device=device)
    ws.feed_blob("x", numpy.arange(256, dtype="float32"))
    t = ws.tensor("x")
    assert t.copy_stats()["host_to_device"] == {"count": 0, "bytes": 0}
    before = syncmem.copy_stats()
    t.to_device()
    t.to_device()  # current already: no second copy
    after = syncmem.copy_stats()
    assert t.copy_stats()["host_to_device"] == {"count": 1, "bytes": 1024}
    assert after["host_to_device"]["count"] - before["host_to_device"]["count"] == 1
    assert after["host_to_device"]["bytes"] - before["host_to_device"]["bytes"] == 1024
    assert set(after) == {"host_to_device", "device_to_host", "device_to_device"}


def test_memory_summary(device):
    ws = syncmem.Workspace(device=device)
    ws.feed_blob("summary_x", numpy.ones(64, "float32"))
    ws.tensor("summary_x").to_device()
    view = ws.tensor("summary_x").numpy()
    text = syncmem.memory_summary()
    assert text.startswith("syncmem memory summary")
    for part in ["host", str(device), "copies", "pool", "summary_x", "host views alive"]:
        assert part in text, part
    mine = syncmem.memory_summary(device)
    assert f"({device})" in mine.splitlines()[0]
    del view


def test_memory_snapshot_names_buffers_and_owners(device):
    ws = syncmem.Workspace(device=device, name="snap")
    ws.feed_blob("a", numpy.ones((4, 4), "float32"))
    ws.feed_blob("b", ws.tensor("a"))  # the same buffer under two names
    ws.run_net_once(fill_net("f", "c", (8,), 1.0))
    v = ws.tensor("a").numpy()
    entries = {tuple(e["owners"]): e for e in syncmem.memory_snapshot()}
    a = entries[("snap:a", "snap:b")]
    assert a["device"] == str(device) and a["dtype"] == "float32" and a["shape"] == [4, 4]
    assert a["nbytes"] == 64 and a["capacity_bytes"] == 64 and a["head"] == "host"
    assert a["host_allocated"] and not a["device_allocated"]
    assert a["views"] == {"read_only": 1, "writable": 0}
    c = entries[("snap:c",)]
    assert c["head"] == "device" and c["device_allocated"] and not c["host_allocated"]
    # A device mirror no workspace names any more is listed without owners.
    t = ws.tensor("c")
    ws.remove_blob("c")
    orphans = [e for e in syncmem.memory_snapshot() if e["owners"] == [] and e["label"] == "c"]
    assert orphans and orphans[0]["device"] == str(device) and orphans[0]["capacity_bytes"] == 32
    del t, v
    gc.collect()


def test_pool_snapshot_lists_blocks_with_owners(device):
    ws = syncmem.Workspace(device=device, name="blocks")
    ws.feed_blob("weights", numpy.ones(3 * MiB // 4, "float32"))
    ws.tensor("weights").to_device()
    label = str(device)
    snap = syncmem.pool_snapshot(device)
    assert snap["pools"] and all(
        p["label"] == label or p["label"].startswith(label + " ") for p in snap["pools"]
    )
    pool = next(p for p in snap["pools"] if p["label"] == label)
    blocks = [b for seg in pool["segments"] for b in seg["blocks"]]
    mine = [b for b in blocks if b["owner"] == "weights" and b["state"] == "allocated"]
    assert mine and mine[0]["requested"] == 3 * MiB and mine[0]["size"] >= 3 * MiB
    # The blocks tile their segments, and the segments add up to the pool's reserved bytes.
    for seg in pool["segments"]:
        assert sum(b["size"] for b in seg["blocks"]) == seg["size"]
    assert sum(seg["size"] for seg in pool["segments"]) == pool["stats"]["reserved"]["current"]
    assert {b["state"] for b in blocks} <= {"allocated", "free", "pending"}
    # Once the tensor is gone its block is no longer handed out to it.
    ws.clear()
    gc.collect()
    after = syncmem.pool_snapshot(device)
    still = [
        b for p in after["pools"] if p["label"] == label for seg in p["segments"]
        for b in seg["blocks"] if b["owner"] == "weights" and b["state"] == "allocated"
    ]
    assert still == []
    assert "host" in {p["label"] for p in syncmem.pool_snapshot()["pools"]}


def test_empty_cache_and_peaks(device):
    ws = syncmem.Workspace(device=device)
    ws.feed_blob("x", numpy.ones(MiB, "uint8"))
    ws.tensor("x").to_device()
    ws.clear()
    gc.collect()
    assert syncmem.empty_cache() >= 0
    syncmem.reset_peak_memory_stats()
    s = syncmem.memory_stats(device)
    label = str(device)
    assert s[f"allocated_bytes.{label}.peak"] == s[f"allocated_bytes.{label}.current"]
