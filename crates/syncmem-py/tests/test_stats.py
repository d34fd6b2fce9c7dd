"""Memory introspection: memory_stats (its keys are the README's table), the torch.cuda
functions, memory_summary, memory_snapshot, copy_stats."""

import gc
import json
import pathlib
import re

import numpy
import pytest

import syncmem
from conftest import fill_net
from test_errors import run_python

# Copies and the host pool: measured with two mirrors (see conftest.two_mirrors).
pytestmark = pytest.mark.usefixtures("two_mirrors")

MiB = 1 << 20
README = pathlib.Path(__file__).resolve().parents[3] / "README.md"
FIGURES = "{current,peak,allocated,freed}"


def readme_key_patterns():
    """The key patterns of the README's table of memory_stats keys (Python section)."""
    text = README.read_text()
    section = text[text.index("\n## Python\n"):]
    section = section[: section.index("\n## ", 1)]
    lines = section.splitlines()
    start = lines.index("| key | value |")
    assert lines[start + 1] == "|---|---|"
    patterns = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        first_cell = line.split("|")[1]
        patterns += re.findall(r"`([^`]+)`", first_cell)
    assert patterns, "no key patterns in the README's table"
    return patterns


def expand(pattern, pools, spaces):
    """Every key a pattern stands for: {a,b} alternatives, FIG, POOL and SPACE labels."""
    keys = [pattern.replace("FIG", FIGURES)]
    while any("{" in k for k in keys):
        done = []
        for k in keys:
            m = re.search(r"\{([^{}]*)\}", k)
            if m is None:
                done.append(k)
                continue
            done += [k[: m.start()] + alt + k[m.end():] for alt in m.group(1).split(",")]
        keys = done
    for placeholder, labels in (("POOL", pools), ("SPACE", spaces)):
        keys = [k.replace(placeholder, label) for k in keys for label in labels] if any(
            placeholder in k for k in keys
        ) else keys
    return set(keys)


def documented_keys(stats, device=None):
    """The keys the README promises for memory_stats(device), given the memory spaces: each
    has its pool's keys, used or not."""
    spaces = {k.split(".")[1] for k in stats if k.startswith("in_use_bytes.")}
    used = {p["label"].replace(" ", "_") for p in syncmem.pool_snapshot(device)["pools"]}
    assert used <= spaces, f"pools without a memory space: {used - spaces}"
    pools = sorted(spaces)
    keys = set()
    for pattern in readme_key_patterns():
        keys |= expand(pattern, pools, spaces)
    return keys, pools, spaces


def label(device):
    return str(device).replace(" ", "_")


def test_memory_stats_keys_are_the_readme_table(device):
    ws = syncmem.Workspace(device=device)
    ws.feed_blob("keys", numpy.ones(MiB // 4, "float32"))
    ws.tensor("keys").to_device()
    for dev in (None, device):
        stats = syncmem.memory_stats(dev)
        keys, pools, spaces = documented_keys(stats, dev)
        assert set(stats) == keys, (
            f"memory_stats({dev}): missing {sorted(keys - set(stats))}, "
            f"undocumented {sorted(set(stats) - keys)}"
        )
        assert all(type(v) is int for v in stats.values())
        assert label(device) in pools and label(device) in spaces
        if dev is None:
            assert "host" in pools and "host" in spaces
        else:
            mine = {label(device)}
            if device.kind != "cpu":
                mine.add(f"{label(device)}_pinned")
            assert spaces == mine and set(pools) <= mine
    # The keys PyTorch code reads are there.
    stats = syncmem.memory_stats(device)
    for key in ["num_ooms", "num_alloc_retries", "active_bytes.all.peak", "allocation.all.peak",
                "segment.large_pool.current", "allocated_bytes.small_pool.freed"]:
        assert key in stats, key


def test_memory_stats_keys_are_there_before_the_first_use(device):
    """A fresh process: the keys of every pool are there before the pool is used (zeros), the
    same keys as after."""
    r = run_python(
        f"""
        import json, numpy, syncmem
        dev = syncmem.Device({str(device)!r})
        before = [syncmem.memory_stats(dev), syncmem.memory_stats()]
        ws = syncmem.Workspace(device=dev)
        ws.feed_blob("x", numpy.ones(1 << 18, "float32"))
        ws.tensor("x").to_device()
        after = [syncmem.memory_stats(dev), syncmem.memory_stats()]
        print(json.dumps([before, after]))
        """,
        env={"SYNCMEM_ZERO_COPY": "off"},
    )
    assert r.returncode == 0, r.stderr
    before, after = json.loads(r.stdout)
    lbl = label(device)
    for b, a, which in zip(before, after, ("the device", "all")):
        assert set(b) == set(a), (
            f"{which}: missing before the first use {sorted(set(a) - set(b))}, "
            f"gone after it {sorted(set(b) - set(a))}"
        )
        assert b[f"allocated_bytes.{lbl}.current"] == 0, which
        assert b[f"num_device_alloc.{lbl}"] == 0, which
        assert a[f"allocated_bytes.{lbl}.current"] > 0, which
    assert before[1]["reserved_bytes.host.peak"] == 0
    assert after[1]["reserved_bytes.host.peak"] > 0


def test_memory_stats_count_what_is_fed(device):
    ws = syncmem.Workspace(device=device)
    before = syncmem.memory_stats()
    ws.feed_blob("big", numpy.ones(MiB // 4, "float32"))
    after = syncmem.memory_stats()
    grown = after["requested_bytes.host.current"] - before.get("requested_bytes.host.current", 0)
    assert grown >= MiB
    assert after["allocated_bytes.all.current"] >= after["allocated_bytes.host.current"]
    assert after["allocation.all.allocated"] > before.get("allocation.all.allocated", 0)
    # The tensor reaches the device on first device access: the device's pool grows.
    ws.tensor("big").to_device()
    lbl = label(device)
    mine = syncmem.memory_stats(device)
    assert mine[f"requested_bytes.{lbl}.current"] >= MiB
    assert "allocated_bytes.host.current" not in mine
    # With a device, `all` is its memory pool (not its pinned pool nor the host pool).
    for stat in ["allocated_bytes", "reserved_bytes", "allocation", "segment"]:
        for fig in ["current", "peak", "allocated", "freed"]:
            assert mine[f"{stat}.all.{fig}"] == mine[f"{stat}.{lbl}.{fig}"], (stat, fig)
    assert mine["num_device_alloc"] == mine[f"num_device_alloc.{lbl}"]
    # Without, `all` sums every pool.
    pools = [p["label"].replace(" ", "_") for p in syncmem.pool_snapshot()["pools"]]
    everything = syncmem.memory_stats()
    assert everything["allocated_bytes.all.current"] == sum(
        everything[f"allocated_bytes.{p}.current"] for p in pools
    )
    assert everything["num_ooms"] == sum(everything[f"num_ooms.{p}"] for p in pools)
    # Small and large blocks apart add up to all of them, figure by figure.
    for stat in ["allocated_bytes", "requested_bytes", "reserved_bytes", "inactive_split_bytes",
                 "allocation", "segment"]:
        for fig in ["current", "allocated", "freed"]:  # a peak of a sum is not a sum of peaks
            small, large = after[f"{stat}.small_pool.{fig}"], after[f"{stat}.large_pool.{fig}"]
            assert small + large == after[f"{stat}.all.{fig}"], (stat, fig)
    for stat in ["allocated_bytes", "allocation", "segment"]:
        assert (after[f"{stat}.all.allocated"] - after[f"{stat}.all.freed"]
                == after[f"{stat}.all.current"]), stat
    # Active blocks are the allocated ones (a freed block is cached at once).
    for fig in ["current", "peak", "allocated", "freed"]:
        assert mine[f"active_bytes.all.{fig}"] == mine[f"allocated_bytes.all.{fig}"]
        assert mine[f"active.all.{fig}"] == mine[f"allocation.all.{fig}"]
    # Blocks up to 1 MiB are small (as in PyTorch), bigger ones large.
    ws.feed_blob("huge", numpy.ones(MiB, "float32"))
    bigger = syncmem.memory_stats()
    grown_large = (bigger["allocated_bytes.large_pool.allocated"]
                   - after["allocated_bytes.large_pool.allocated"])
    assert grown_large >= 4 * MiB
    assert bigger["allocated_bytes.small_pool.allocated"] >= MiB


def test_torch_functions_and_peak_counts(device):
    ws = syncmem.Workspace(device=device)
    gc.collect()
    syncmem.reset_peak_memory_stats(device)
    lbl = label(device)
    start = syncmem.memory_stats(device)
    for i in range(3):
        ws.feed_blob(f"t{i}", numpy.ones(2 * MiB, "uint8"))
        ws.tensor(f"t{i}").to_device()
    held = syncmem.memory_stats(device)
    assert held["allocation.all.current"] == start["allocation.all.current"] + 3
    ws.clear()
    gc.collect()
    s = syncmem.memory_stats(device)
    assert s["allocation.all.current"] == start["allocation.all.current"]
    assert s["allocation.all.peak"] >= start["allocation.all.current"] + 3, "the peak stays"
    assert s["allocated_bytes.all.peak"] >= s["allocated_bytes.all.current"] + 6 * MiB
    assert syncmem.memory_allocated(device) == s["allocated_bytes.all.current"]
    assert syncmem.max_memory_allocated(device) == s["allocated_bytes.all.peak"]
    assert syncmem.memory_reserved(device) == s["reserved_bytes.all.current"]
    assert syncmem.max_memory_reserved(device) == s["reserved_bytes.all.peak"]
    everything = syncmem.memory_stats()
    assert syncmem.memory_allocated() == everything["allocated_bytes.all.current"]
    assert syncmem.max_memory_reserved(str(device)) == s["reserved_bytes.all.peak"]
    # A reset brings the device's peaks down to the current values, and keeps the totals.
    syncmem.reset_peak_memory_stats(device)
    after = syncmem.memory_stats(device)
    peaks = [k for k in after if k.endswith(".peak")]
    assert peaks and all(after[k] == after[k[: -len("peak")] + "current"] for k in peaks), [
        k for k in peaks if after[k] != after[k[: -len("peak")] + "current"]
    ]
    assert after["allocation.all.allocated"] == s["allocation.all.allocated"]
    assert syncmem.max_memory_allocated(device) == syncmem.memory_allocated(device)


def test_reset_without_a_device_resets_every_peak(device):
    ws = syncmem.Workspace(device=device)
    ws.feed_blob("x", numpy.ones(4 * MiB, "uint8"))
    ws.tensor("x").to_device()
    ws.clear()
    gc.collect()
    before = syncmem.memory_stats()
    assert before["in_use_bytes.host.peak"] > before["in_use_bytes.host.current"]
    syncmem.reset_peak_memory_stats()
    after = syncmem.memory_stats()
    stale = [k for k in after if k.endswith(".peak") and after[k] != after[k[:-4] + "current"]]
    assert stale == []


def test_out_of_memory_counts(device):
    r = run_python(
        f"""
        import numpy, syncmem
        ws = syncmem.Workspace(device={str(device)!r})
        ws.feed_blob("big", numpy.ones(4 << 20, "uint8"))
        try:
            ws.tensor("big").to_device()
        except MemoryError:
            pass
        s = syncmem.memory_stats({str(device)!r})
        print(s["num_ooms"], s["num_ooms.{label(device)}"], s["allocation.all.current"])
        """,
        # Two mirrors, as the rest of this module (a child process: the fixture is not there).
        env={"SYNCMEM_POOL_CONF": "memory_cap=1MiB", "SYNCMEM_ZERO_COPY": "off"},
    )
    assert r.returncode == 0, r.stderr
    ooms, mine, blocks = map(int, r.stdout.split())
    assert ooms == mine == 1 and blocks == 0, r.stdout


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
    assert set(after) == {"host_to_device", "device_to_host", "device_to_device", "mapped",
                          "spilled", "refilled"}


def human(b):
    """Bytes as the library's tables print them (`human_bytes`)."""
    v, unit = float(b), 0
    while v >= 1024 and unit < 4:
        v, unit = v / 1024, unit + 1
    return f"{b} B" if unit == 0 else f"{v:.1f} {['B', 'KiB', 'MiB', 'GiB', 'TiB'][unit]}"


def test_memory_summary_prints_the_pool_tables(device):
    ws = syncmem.Workspace(device=device)
    ws.feed_blob("summary_x", numpy.ones(64, "float32"))
    ws.tensor("summary_x").to_device()
    view = ws.tensor("summary_x").numpy()
    text = syncmem.memory_summary()
    assert text.startswith("syncmem memory summary")
    for part in ["host", str(device), "copies", "summary_x", "host views alive"]:
        assert part in text, part
    mine = syncmem.memory_summary(device)
    assert f"({device})" in mine.splitlines()[0]
    stats = syncmem.memory_stats(device)
    pools = syncmem.pool_snapshot(device)["pools"]
    assert pools
    for pool in pools:
        lbl = pool["label"].replace(" ", "_")
        head = f"| memory summary of pool {pool['label']} ({pool['kind']})"
        assert sum(line.startswith(head) for line in mine.splitlines()) == 1, head
        table = mine[mine.index(head):]
        table = table[: table.index("|====")]
        # The same figures as memory_stats, in the same rows as the library's table.
        for stat in ["allocated_bytes", "requested_bytes", "reserved_bytes"]:
            row = stat.replace("_", " ")
            line = next(x for x in table.splitlines() if x.startswith(f"| {row}"))
            cells = [c.strip() for c in re.split(r"\s{2,}", line.strip("| ")) if c.strip()][1:]
            want = [human(stats[f"{stat}.{lbl}.{fig}"]) for fig in FIGURES.strip("{}").split(",")]
            assert cells == want, (pool["label"], row, line)
        retries, ooms = stats[f"num_alloc_retries.{lbl}"], stats[f"num_ooms.{lbl}"]
        assert f"segments {stats[f'segment.{lbl}.current']} " in table, table
        assert (f"blocks handed out {stats[f'allocation.{lbl}.allocated']}, "
                f"given back {stats[f'allocation.{lbl}.freed']}") in table, table
        assert f"retries {retries}; out of memory {ooms}" in table
    assert mine.count("\nlegend:\n") == 1 and "small, large blocks" in mine
    assert "|   small blocks" in mine and "|   large blocks" in mine
    short = syncmem.memory_summary(device, abbreviated=True)
    assert "|   small blocks" not in short and "|   large blocks" not in short
    assert short.count("| allocated bytes") == len(pools)
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
    lbl = label(device)
    assert s[f"allocated_bytes.{lbl}.peak"] == s[f"allocated_bytes.{lbl}.current"]
