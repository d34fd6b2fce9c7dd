"""memory_snapshot(format="torch"): the pools in the dict of torch.cuda.memory._snapshot()."""

import os
import pickle
import subprocess
import sys

import numpy
import pytest

import syncmem

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")


def test_torch_format_names_each_block_and_tiles_segments(device, tmp_path):
    ws = syncmem.Workspace(device=device)
    ws.feed_blob("weights", numpy.ones((256, 256), "float32"))
    ws.run_net_once({"name": "n", "ops": [{"type": "Relu", "inputs": ["weights"], "outputs": ["out"]}]})
    snap = syncmem.memory_snapshot(format="torch")
    assert set(snap) >= {"segments", "device_traces", "device_labels"}
    labels = snap["device_labels"]
    assert len(snap["device_traces"]) == len(labels)
    assert all(t == [] for t in snap["device_traces"])
    owners = {}
    for seg in snap["segments"]:
        assert 0 <= seg["device"] < len(labels)
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
        for b in seg["blocks"]:
            assert b["state"] in ("active_allocated", "active_pending_free", "inactive")
            for f in b["frames"]:
                owners.setdefault(f["name"], []).append((labels[seg["device"]], b))
    # The fed blob's host mirror and, on a device, its device mirror are named.
    held = [(pool, b) for pool, b in owners.get("weights", []) if b["state"] == "active_allocated"]
    assert held, sorted(owners)
    assert all(b["requested_size"] == 256 * 256 * 4 for _, b in held)
    # Pickled with a protocol PyTorch's viewer reads, it passes the checks of the repository's
    # script (Python's pickle, tiling, backward replay).
    path = tmp_path / "snapshot.pickle"
    with open(path, "wb") as f:
        pickle.dump(snap, f, protocol=4)
    script = os.path.join(ROOT, "scripts", "check_torch_snapshot.py")
    out = subprocess.run([sys.executable, script, str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_default_format_is_unchanged_and_unknown_formats_fail():
    assert isinstance(syncmem.memory_snapshot(), list)
    with pytest.raises(ValueError, match="unknown format"):
        syncmem.memory_snapshot(format="json")


def test_torch_memory_viz_reads_it(tmp_path):
    pytest.importorskip("torch")
    ws = syncmem.Workspace()
    ws.feed_blob("x", numpy.ones(1000, "float32"))
    path = tmp_path / "snapshot.pickle"
    with open(path, "wb") as f:
        pickle.dump(syncmem.memory_snapshot(format="torch"), f, protocol=4)
    out = subprocess.run(
        [sys.executable, "-m", "torch.cuda._memory_viz", "stats", str(path)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert "segment" in out.stdout


def test_torch_snapshot_pickle_is_exported_at_module_level():
    from syncmem import torch_snapshot_pickle

    assert "torch_snapshot_pickle" in syncmem.__all__
    snapshot = pickle.loads(torch_snapshot_pickle())
    assert "segments" in snapshot and "device_traces" in snapshot
