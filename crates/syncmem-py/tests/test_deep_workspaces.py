"""Chains of nested workspaces: Python frees a chain of parents recursively, so a chain is
bounded (at 1000 ancestors), and everything up to the bound works and is freed."""

import numpy as np
import pytest

import syncmem

MAX_DEPTH = 1000


def test_a_chain_of_parents_is_bounded_and_works_to_the_bound():
    root = syncmem.Workspace()
    root.feed_blob("x", np.array([-1.0, 0.5, 2.0], dtype=np.float32))
    leaf = root
    for _ in range(MAX_DEPTH):
        leaf = syncmem.Workspace(leaf)
    assert leaf.blobs() == ["x"]
    np.testing.assert_array_equal(leaf.fetch_blob("x"), [-1.0, 0.5, 2.0])
    leaf.create_net({"name": "relu", "ops": [{"type": "Relu", "inputs": ["x"], "outputs": ["y"]}]})
    leaf.run_net("relu")
    np.testing.assert_array_equal(leaf.fetch_blob("y"), [0.0, 0.5, 2.0])
    with pytest.raises(ValueError, match="at most 1000 ancestors; this one would have 1001"):
        syncmem.Workspace(leaf)
    # A chain 50 times longer stops at the bound; what was made is freed without a crash.
    with pytest.raises(ValueError):
        ws = root
        for _ in range(50 * MAX_DEPTH):
            ws = syncmem.Workspace(ws)
    del leaf, ws, root
