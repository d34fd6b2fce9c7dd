#!/usr/bin/env python3
"""Epoch times of the `syncmem train` MLP against the peers a user would pick instead.

The same model and data in each: an MLP 2 -> H -> H -> 3 (ReLU, He init), softmax cross-entropy,
plain SGD (lr 0.5), batches of 64 over 3 spiral arms of 1000 points, hidden H = 64, 256, 1024.
Peers: NumPy, JAX (jit, CPU) and PyTorch (CPU, eager and `torch.compile`). PyTorch runs on as
many threads as syncmem's `cpu` backend takes (the cores, at most 4), and eager also on one
thread (its OpenMP pool waits for every thread at each operation: on a busy machine that
costs more than the second thread gains); NumPy's BLAS and JAX take every core. They run
from a virtualenv (target/peers-venv by default, created and filled with NumPy and JAX from
PyPI on first use; PyTorch is not installed by the script: `DIR/bin/pip install torch` adds
it, the CPU wheel from PyTorch's own index is the smaller one). A peer whose package is
missing, or whose compiler fails (`torch.compile` needs a C compiler), is skipped with the
reason. syncmem runs as `syncmem train --json` on `cpu` and on `opencl:0` (built with `cargo
build --release -p syncmem-cli` when missing).

Prints, for each side, the median epoch time (first epoch of every run left out: compilation,
warm-up), its spread (the interquartile range of the kept epochs) and the ratio of the median
to syncmem on `cpu` (above 1: slower than syncmem cpu), with the machine's load
(/proc/loadavg) at the start and the end: figures taken on a busy machine are noisier. The
sides run in turn, `--rounds` times at each width, and the median is over all their rounds'
epochs, so that a change of the machine's load between runs weighs on every side alike. Not
part of the test command.

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
# The threads of syncmem's `cpu` backend: the caller and a worker per further core, at most 3.
THREADS = min(os.cpu_count() or 1, 4)
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
    probe = subprocess.run([python, "-c", "import numpy, jax"], check=False, capture_output=True)
    if probe.returncode != 0:
        print(f"installing {' '.join(PACKAGES)} into {venv} ...", file=sys.stderr)
        pip = subprocess.run([python, "-m", "pip", "install", "--quiet", *PACKAGES], check=False)
        if pip.returncode != 0:
            print("note: the install failed; the peers it lacks are skipped", file=sys.stderr)
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


def torch_epochs(hidden, epochs, compiled=False, threads=THREADS):
    """PyTorch on the CPU: autograd and `torch.optim.SGD`, eager or through `torch.compile`
    (the loss with its backward, and the optimizer's step), on `threads` threads."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    x, y = spirals(np)
    x, y = torch.from_numpy(x), torch.from_numpy(y).long()
    params = [torch.from_numpy(p).requires_grad_() for p in init(np, hidden)]
    opt = torch.optim.SGD(params, lr=LR)

    def loss(xb, yb):
        w1, b1, w2, b2, w3, b3 = params
        h = torch.relu(xb @ w1 + b1)
        h = torch.relu(h @ w2 + b2)
        return F.cross_entropy(h @ w3 + b3, yb)

    update = opt.step
    if compiled:
        loss, update = torch.compile(loss), torch.compile(opt.step)
    times = []
    for e in range(epochs):
        start = time.perf_counter()
        for idx in batches(np, len(y), e):
            idx = torch.from_numpy(idx)
            opt.zero_grad()
            loss(x[idx], y[idx]).backward()
            update()
        times.append(time.perf_counter() - start)
    return times


WORKERS = {
    "numpy": numpy_epochs,
    "jax": jax_epochs,
    "torch": torch_epochs,
    "torch-compile": lambda hidden, epochs: torch_epochs(hidden, epochs, compiled=True),
    # One thread: what PyTorch's OpenMP pool costs on a machine whose cores are busy.
    "torch-1": lambda hidden, epochs: torch_epochs(hidden, epochs, threads=1),
}


def worker(peer, hidden, epochs):
    """Prints a peer's epoch times as JSON, or why it could not run (missing package, failed
    compiler): `{"skip": reason}`."""
    try:
        out = {"times": WORKERS[peer](hidden, epochs)}
    except ImportError as e:
        out = {"skip": f"not installed ({e})"}
    except Exception as e:  # noqa: BLE001 - any failure of a peer's runtime is reported
        first = (str(e).strip().splitlines() or [""])[0][:160]
        out = {"skip": f"failed: {type(e).__name__}: {first}"}
    print(json.dumps(out))


def syncmem_epochs(binary, device, hidden, epochs):
    out = subprocess.run(
        [binary, "train", "--device", device, "--hidden", str(hidden), "--epochs", str(epochs),
         "--json"],
        check=True, capture_output=True, text=True,
    ).stdout
    return [e["seconds"] for e in json.loads(out)["epochs"]]


class Skipped(Exception):
    """A peer that cannot run here, with the reason."""


def peer_epochs(peer, hidden, epochs):
    """Runs a peer in its own process, so that no runtime's threads (XLA's pools, PyTorch's)
    linger beside the other runs."""
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--worker", peer, "--hidden", str(hidden),
         "--epochs", str(epochs)],
        check=True, capture_output=True, text=True,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    if "skip" in result:
        raise Skipped(result["skip"])
    return result["times"]


def kept(times):
    """A run's epoch times without its first (compilation, warm-up)."""
    return times[1:] if len(times) > 1 else times


def load():
    """The machine's load averages over 1, 5 and 15 minutes, as /proc/loadavg gives them."""
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "unknown"


def versions():
    """The peers' package versions, as far as they are installed."""
    found = []
    for name in ["numpy", "jax", "torch"]:
        out = subprocess.run(
            [sys.executable, "-c", f"import {name}; print({name}.__version__)"],
            check=False, capture_output=True, text=True,
        )
        found.append(f"{name} {out.stdout.strip()}" if out.returncode == 0 else f"no {name}")
    return ", ".join(found)


def spread(times):
    """Median and interquartile range of epoch times, in ms."""
    ms = sorted(t * 1e3 for t in times)
    if len(ms) < 4:
        return statistics.median(ms), ms[0], ms[-1]
    q1, _, q3 = statistics.quantiles(ms, n=4)
    return statistics.median(ms), q1, q3


SIDES = ["syncmem cpu", "syncmem opencl:0", "numpy", "jax (jit, cpu)", "torch (eager, cpu)",
         "torch.compile (cpu)", "torch (eager, 1 thr)"]
PEERS = {"numpy": "numpy", "jax (jit, cpu)": "jax", "torch (eager, cpu)": "torch",
         "torch.compile (cpu)": "torch-compile", "torch (eager, 1 thr)": "torch-1"}


def measure(args, hidden, rounds, skipped):
    """Every side's kept epoch times at one width, the sides in turn, `rounds` times. A side
    that cannot run here goes into `skipped` (not run again at any width); one that fails at
    this width is left out of it, and the reason returned too."""
    def run(name):
        if name.startswith("syncmem"):
            return syncmem_epochs(args.syncmem, name.split()[1], hidden, args.epochs)
        return peer_epochs(PEERS[name], hidden, args.epochs)

    times, failed = {name: [] for name in SIDES}, {}
    for _ in range(rounds):
        for name in SIDES:
            if name in skipped or name in failed:
                continue
            try:
                times[name] += kept(run(name))
            except Skipped as e:
                skipped[name] = str(e)
            except (subprocess.CalledProcessError, OSError, ValueError, KeyError) as e:
                failed[name] = f"failed: {e}"
                times[name] = []
    return times, {**skipped, **failed}


def report(hidden, times, notes):
    """Prints one width's rows: median, spread and ratio to syncmem cpu of every side."""
    base = spread(times["syncmem cpu"])[0] if times["syncmem cpu"] else None
    for name in SIDES:
        if not times[name]:
            why = notes.get(name, "no epochs")
            print(f"{hidden:>6}  {name:<20}  {'-':>9}  {'-':>15}  {'-':>6}   ({why})")
            continue
        median, q1, q3 = spread(times[name])
        ratio = f"{median / base:>5.2f}x" if base else f"{'-':>6}"
        goal = ""
        if name == "jax (jit, cpu)" and base:
            met = "met" if median / base >= JAX_GOAL else "NOT met"
            goal = f"   goal jax / syncmem cpu >= {JAX_GOAL}: {met}"
        print(f"{hidden:>6}  {name:<20}  {median:>9.1f}  {q1:>7.1f}-{q3:<7.1f}  {ratio}{goal}",
              flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", default="64,256,1024")
    ap.add_argument("--epochs", type=int, default=4, help="epochs per run (the first is left out)")
    ap.add_argument("--rounds", type=int, default=3, help="runs of every side, in turn")
    ap.add_argument("--venv", default=os.path.join(ROOT, "target", "peers-venv"))
    ap.add_argument("--syncmem", default=os.path.join(ROOT, "target", "release", "syncmem"))
    ap.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, int(args.hidden), args.epochs)
        return
    ensure_venv(os.path.abspath(args.venv))
    if not os.path.exists(args.syncmem):
        subprocess.run(["cargo", "build", "--release", "-p", "syncmem-cli"], cwd=ROOT, check=True)

    rounds = max(1, args.rounds)
    print(f"{versions()}; torch on {THREADS} threads (1 in the 1 thr row); {os.cpu_count()} "
          f"CPUs; load at start {load()}")
    print(f"median epoch of {rounds} runs in turn of {args.epochs - 1} epochs after a warm-up "
          "epoch, in ms; spread = interquartile range; ratio = median / syncmem cpu median")
    print(f"{'hidden':>6}  {'side':<20}  {'median':>9}  {'spread':>15}  {'ratio':>6}")
    skipped = {}
    for h in [int(v) for v in args.hidden.split(",")]:
        report(h, *measure(args, h, rounds, skipped))
    print(f"load at end {load()}")


if __name__ == "__main__":
    main()
