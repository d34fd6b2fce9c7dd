#!/usr/bin/env python3
"""Epoch times of the `syncmem train` MLP against the peers a user would pick instead.

The same model and data in each: an MLP 2 -> H -> H -> 3 (ReLU, He init), softmax cross-entropy,
plain SGD (lr 0.5), batches of 64 over 3 spiral arms of 1000 points, hidden H = 64, 256, 1024.
Peers: NumPy, and JAX (jit, CPU). They run from a virtualenv (target/peers-venv by default,
created and filled from PyPI on first use); syncmem runs as `syncmem train --json` on `cpu` and
on `opencl:0` (built with `cargo build --release -p syncmem-cli` when missing).

Prints the median epoch time of each (first epoch of every run left out: compilation, warm-up)
and the ratio of each to syncmem on `cpu` (above 1: slower than syncmem cpu). The sides run in
turn, `--rounds` times at each width, and the median is over all their rounds' epochs, so that
a change of the machine's load between runs weighs on every side alike. Not part of the test
command.

    python3 scripts/peers.py [--hidden 64,256,1024] [--epochs 4] [--rounds 3] [--venv DIR]
                             [--syncmem BIN]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ["numpy", "jax[cpu]"]
BATCH, LR, POINTS, CLASSES, NOISE = 64, 0.5, 1000, 3, 0.2
# JAX's epoch time over syncmem's on `cpu`, at every width: the goal of the comparison.
JAX_GOAL = 1.2


def ensure_venv(venv):
    """Re-runs this script inside `venv` (created and filled on first use)."""
    python = os.path.join(venv, "bin", "python")
    if os.path.realpath(sys.prefix) == os.path.realpath(venv):
        return
    if not os.path.exists(python):
        print(f"creating {venv} ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    probe = subprocess.run([python, "-c", "import numpy, jax"], capture_output=True)
    if probe.returncode != 0:
        print(f"installing {' '.join(PACKAGES)} into {venv} ...", file=sys.stderr)
        subprocess.run([python, "-m", "pip", "install", "--quiet", *PACKAGES], check=True)
    os.execv(python, [python, os.path.abspath(__file__), *sys.argv[1:]])


def spirals(np, seed=0):
    """3 interleaved spiral arms (CS231n): radius 0 to 1, 4 radians per arm, angle noise."""
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for c in range(CLASSES):
        r = np.linspace(0.0, 1.0, POINTS)
        t = 4.0 * c + 4.0 * r + NOISE * rng.standard_normal(POINTS)
        xs.append(np.stack([r * np.sin(t), r * np.cos(t)], axis=1))
        ys.append(np.full(POINTS, c))
    return np.concatenate(xs).astype(np.float32), np.concatenate(ys).astype(np.int32)


def init(np, hidden, seed=0):
    rng = np.random.default_rng(seed)
    widths = [2, hidden, hidden, CLASSES]
    params = []
    for fan_in, out in zip(widths, widths[1:]):
        w = (rng.standard_normal((fan_in, out)) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        params += [w, np.zeros(out, np.float32)]
    return params


def batches(np, n, seed):
    order = np.random.default_rng(seed).permutation(n)
    return [order[i:i + BATCH] for i in range(0, n, BATCH)]


def numpy_epochs(hidden, epochs):
    import numpy as np

    x, y = spirals(np)
    w1, b1, w2, b2, w3, b3 = init(np, hidden)
    times = []
    for e in range(epochs):
        start = time.perf_counter()
        for idx in batches(np, len(y), e):
            xb, yb = x[idx], y[idx]
            n = len(yb)
            h1 = np.maximum(xb @ w1 + b1, 0)
            h2 = np.maximum(h1 @ w2 + b2, 0)
            z = h2 @ w3 + b3
            z = z - z.max(axis=1, keepdims=True)
            p = np.exp(z)
            p /= p.sum(axis=1, keepdims=True)
            dz = p
            dz[np.arange(n), yb] -= 1
            dz /= n
            dw3, db3 = h2.T @ dz, dz.sum(0)
            dh2 = (dz @ w3.T) * (h2 > 0)
            dw2, db2 = h1.T @ dh2, dh2.sum(0)
            dh1 = (dh2 @ w2.T) * (h1 > 0)
            dw1, db1 = xb.T @ dh1, dh1.sum(0)
            for prm, g in ((w1, dw1), (b1, db1), (w2, dw2), (b2, db2), (w3, dw3), (b3, db3)):
                prm -= LR * g
        times.append(time.perf_counter() - start)
    return times


def jax_epochs(hidden, epochs):
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp
    import numpy as np

    x, y = spirals(np)
    params = [jnp.asarray(p) for p in init(np, hidden)]

    def loss(params, xb, yb):
        w1, b1, w2, b2, w3, b3 = params
        h = jax.nn.relu(xb @ w1 + b1)
        h = jax.nn.relu(h @ w2 + b2)
        logp = jax.nn.log_softmax(h @ w3 + b3)
        return -jnp.mean(jnp.take_along_axis(logp, yb[:, None], axis=1))

    @jax.jit
    def step(params, xb, yb):
        grads = jax.grad(loss)(params, xb, yb)
        return [p - LR * g for p, g in zip(params, grads)]

    times = []
    for e in range(epochs):
        start = time.perf_counter()
        for idx in batches(np, len(y), e):
            params = step(params, x[idx], y[idx])
        jax.block_until_ready(params)
        times.append(time.perf_counter() - start)
    return times


def syncmem_epochs(binary, device, hidden, epochs):
    out = subprocess.run(
        [binary, "train", "--device", device, "--hidden", str(hidden), "--epochs", str(epochs),
         "--json"],
        check=True, capture_output=True, text=True,
    ).stdout
    return [e["seconds"] for e in json.loads(out)["epochs"]]


def peer_epochs(peer, hidden, epochs):
    """Runs a peer in its own process, so that no runtime's threads (XLA's pools) linger
    beside the other runs."""
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--worker", peer, "--hidden", str(hidden),
         "--epochs", str(epochs)],
        check=True, capture_output=True, text=True,
    ).stdout
    return json.loads(out)


def kept(times):
    """A run's epoch times without its first (compilation, warm-up)."""
    return times[1:] if len(times) > 1 else times


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", default="64,256,1024")
    ap.add_argument("--epochs", type=int, default=4, help="epochs per run (the first is left out)")
    ap.add_argument("--rounds", type=int, default=3, help="runs of every side, in turn")
    ap.add_argument("--venv", default=os.path.join(ROOT, "target", "peers-venv"))
    ap.add_argument("--syncmem", default=os.path.join(ROOT, "target", "release", "syncmem"))
    ap.add_argument("--worker", choices=["numpy", "jax"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        run = numpy_epochs if args.worker == "numpy" else jax_epochs
        print(json.dumps(run(int(args.hidden), args.epochs)))
        return
    ensure_venv(os.path.abspath(args.venv))
    if not os.path.exists(args.syncmem):
        subprocess.run(["cargo", "build", "--release", "-p", "syncmem-cli"], cwd=ROOT, check=True)

    versions = subprocess.run(
        [sys.executable, "-c", "import numpy, jax; print(numpy.__version__, jax.__version__)"],
        check=True, capture_output=True, text=True,
    ).stdout.split()
    rounds = max(1, args.rounds)
    print(f"numpy {versions[0]}, jax {versions[1]} (cpu); median epoch of {rounds} runs in turn "
          f"of {args.epochs - 1} epochs after a warm-up epoch, in ms; "
          "ratio = time / syncmem cpu time")
    cols = ["syncmem cpu", "syncmem opencl:0", "numpy", "jax (jit, cpu)"]
    print(f"{'hidden':>6}  " + "  ".join(f"{c:>22}" for c in cols))
    for h in [int(v) for v in args.hidden.split(",")]:
        runs = {
            "syncmem cpu": lambda: syncmem_epochs(args.syncmem, "cpu", h, args.epochs),
            "syncmem opencl:0": lambda: syncmem_epochs(args.syncmem, "opencl:0", h, args.epochs),
            "numpy": lambda: peer_epochs("numpy", h, args.epochs),
            "jax (jit, cpu)": lambda: peer_epochs("jax", h, args.epochs),
        }
        times = {name: [] for name in runs}
        failed = set()
        for _ in range(rounds):
            for name, run in runs.items():
                if name in failed:
                    continue
                try:
                    times[name] += kept(run())
                except (subprocess.CalledProcessError, OSError) as e:
                    print(f"note: {name} at hidden {h} failed: {e}", file=sys.stderr)
                    failed.add(name)
        ms = {
            name: None if name in failed or not t else statistics.median(t) * 1e3
            for name, t in times.items()
        }
        base = ms["syncmem cpu"]
        cells = []
        for name in cols:
            t = ms[name]
            if t is None:
                cells.append(f"{'-':>22}")
            elif base:
                cells.append(f"{t:>12.1f} ({t / base:>5.2f}x)")
            else:
                cells.append(f"{t:>22.1f}")
        jax, goal = ms["jax (jit, cpu)"], ""
        if jax and base:
            met = "met" if jax / base >= JAX_GOAL else "NOT met"
            goal = f"  goal jax / syncmem cpu >= {JAX_GOAL}: {met}"
        print(f"{h:>6}  " + "  ".join(cells) + goal, flush=True)


if __name__ == "__main__":
    main()
