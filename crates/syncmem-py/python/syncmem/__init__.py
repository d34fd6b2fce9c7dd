"""syncmem: tensor memory mirrored on the host and on compute devices, driven from Python.

Caffe2's workspace API with Python names, over syncmem's synced buffers (a host mirror and a
device mirror per tensor, allocated and copied lazily)::

    import numpy, syncmem

    ws = syncmem.Workspace(device="opencl:0")       # or "cpu", the default
    ws.feed_blob("x", numpy.ones((2, 3), "float32"))  # one copy into the host mirror
    ws.create_net({"name": "fwd", "ops": [{"type": "Relu", "inputs": ["x"], "outputs": ["y"]}]})
    ws.run_net("fwd")                                 # uploads x once, runs on the device
    print(ws.fetch_blob("y"))                         # a copy, straight from device memory
    print(syncmem.memory_summary())

There is also a module-level current workspace, as in Caffe2: ``feed_blob``, ``fetch_blob``,
``run_net`` ... act on it; ``switch_workspace(name)`` changes it, ``reset_workspace()`` empties
it.

Without copies:

- ``ws.tensor(name).numpy()`` is a live NumPy view of the host memory that keeps the buffer
  alive and in place (read-only; ``writable=True`` for a writable one, during which device
  access to that buffer raises ``BusyError``; ``copy=True`` for a snapshot: under zero copy a
  view is the device memory, which kernels write in place);
- ``ws.feed_blob(name, array, copy=False)`` takes the array's memory over as the host
  mirror: the array becomes a read-only view of it that NumPy will not make writable again;
- ``numpy.from_dlpack(tensor)`` and ``syncmem.from_dlpack(obj)`` exchange host memory through
  DLPack.
- mpi4py's collectives work in the tensor's host memory through a writable view:
  ``comm.Allreduce(MPI.IN_PLACE, ws.tensor(name).numpy(writable=True))`` (no copy on ``cpu`` and
  PoCL; on a discrete GPU one counted copy down and one up). A ``cpu`` tensor can be passed
  itself (through DLPack); an OpenCL or CUDA tensor must not be (mpi4py would hand MPI its
  ``cl_mem`` handle or device pointer). The README's mpi4py section has the details.

Memory statistics as ``torch.cuda`` names them: ``memory_stats(device=None)`` (the README lists
every key), ``memory_allocated``, ``max_memory_allocated``, ``memory_reserved``,
``max_memory_reserved``, ``reset_peak_memory_stats``, ``empty_cache`` and
``memory_summary(device=None, abbreviated=False)``; ``memory_snapshot()`` and
``pool_snapshot()`` list every buffer and every pool block. ``record_memory_history(N)`` keeps
the newest N events of every device (``memory_history()`` returns them as trace JSON lines);
``on_out_of_memory(callable)`` calls ``callable(report)`` at each out-of-memory failure, before
the ``OutOfMemoryError`` is raised, until its ``remove()``.

Every error is a subclass of ``SyncmemError`` carrying the library's message, and of the
matching builtin exception: ``NotFoundError`` is a ``KeyError``, ``FileError`` an ``OSError``,
``OutOfMemoryError`` a ``MemoryError``, ``TypeMismatchError`` a ``TypeError``, ``DeviceError``
and ``BusyError`` are ``RuntimeError``s, the others (bad shapes, values, files, configurations)
``ValueError``s.
"""

from __future__ import annotations

import os
import pickle
import threading
from typing import Any, Dict, List, Optional, Sequence, Union

from . import _native
from ._native import (
    AlreadyExistsError,
    BusyError,
    ConfigError,
    Device,
    DeviceError,
    FileError,
    FormatError,
    HostView,
    InvalidStateError,
    NotFoundError,
    OutOfMemoryError,
    ShapeError,
    SyncmemError,
    Tensor,
    TypeMismatchError,
    Workspace,
    backends,
    copy_stats,
    devices,
    empty_cache,
    from_dlpack,
    max_memory_allocated,
    max_memory_reserved,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_summary,
    operator_types,
    pool_snapshot,
    reset_peak_memory_stats,
    torch_snapshot_pickle,
)

__all__ = [
    "AlreadyExistsError",
    "BusyError",
    "ConfigError",
    "Device",
    "DeviceError",
    "FileError",
    "FormatError",
    "HostView",
    "InvalidStateError",
    "NotFoundError",
    "OutOfMemoryError",
    "ShapeError",
    "SyncmemError",
    "Tensor",
    "TypeMismatchError",
    "Workspace",
    "backends",
    "blobs",
    "copy_stats",
    "create_net",
    "current_workspace",
    "devices",
    "empty_cache",
    "feed_blob",
    "fetch_blob",
    "from_dlpack",
    "get_workspace",
    "has_blob",
    "load",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_allocated",
    "memory_reserved",
    "memory_snapshot",
    "memory_stats",
    "memory_summary",
    "nets",
    "operator_types",
    "pool_snapshot",
    "remove_blob",
    "rename_blob",
    "reset_peak_memory_stats",
    "reset_workspace",
    "run_net",
    "run_net_once",
    "save",
    "switch_workspace",
    "torch_snapshot_pickle",
    "workspaces",
]

# Kernels and operators of your own.
from ._native import RawKernel, register_operator  # noqa: E402
from ._native import MemPool, MemPoolContext, use_mem_pool  # noqa: E402

__all__ += ["RawKernel", "register_operator"]
__all__ += ["MemPool", "MemPoolContext", "use_mem_pool"]

# The always-on history and out-of-memory observers.
from ._native import (  # noqa: E402
    OomObserver,
    memory_history,
    on_out_of_memory,
    record_memory_history,
)

__all__ += ["OomObserver", "memory_history", "on_out_of_memory", "record_memory_history"]

__version__ = "0.1.0"

DeviceLike = Union[Device, str, None]
NetLike = Union[str, Dict[str, Any]]
PathLike = Union[str, "os.PathLike[str]"]

_lock = threading.RLock()
_workspaces: Dict[str, Workspace] = {}
_current = "default"


def _ws() -> Workspace:
    with _lock:
        ws = _workspaces.get(_current)
        if ws is None:
            ws = Workspace(name=_current)
            _workspaces[_current] = ws
        return ws


def current_workspace() -> str:
    """The name of the current workspace (``"default"`` at start), as Caffe2's
    ``CurrentWorkspace``."""
    return _current


def get_workspace(name: Optional[str] = None) -> Workspace:
    """The ``Workspace`` object of the current workspace, or of the workspace ``name``
    (``NotFoundError`` when there is none)."""
    with _lock:
        if name is None:
            return _ws()
        try:
            return _workspaces[name]
        except KeyError:
            raise NotFoundError(
                f"workspace {name!r} not found (workspaces: {workspaces()})"
            ) from None


def workspaces() -> List[str]:
    """Names of the module-level workspaces, sorted (Caffe2's ``Workspaces``)."""
    with _lock:
        _ws()
        return sorted(_workspaces)


def switch_workspace(name: str, create_if_missing: bool = True) -> None:
    """Makes ``name`` the current workspace (Caffe2's ``SwitchWorkspace``). A workspace that
    does not exist is created on ``cpu`` unless ``create_if_missing`` is false, in which case
    ``NotFoundError`` is raised and the current workspace stays."""
    global _current
    with _lock:
        if name not in _workspaces:
            if not create_if_missing:
                raise NotFoundError(
                    f"workspace {name!r} not found (workspaces: {workspaces()}); "
                    "pass create_if_missing=True to create it"
                )
            _workspaces[name] = Workspace(name=name)
        _current = name


def reset_workspace() -> None:
    """Empties the current workspace: every blob and net is gone (Caffe2's
    ``ResetWorkspace``). Views and tensor handles taken before keep their buffers alive."""
    with _lock:
        old = _workspaces.get(_current)
        device = old.device if old is not None else None
        _workspaces[_current] = Workspace(name=_current, device=device)


def feed_blob(name: str, value: Any, device: DeviceLike = None, copy: bool = True) -> None:
    """``Workspace.feed_blob`` on the current workspace (Caffe2's ``FeedBlob``)."""
    _ws().feed_blob(name, value, device=device, copy=copy)


def fetch_blob(name: str, copy: bool = True) -> Any:
    """``Workspace.fetch_blob`` on the current workspace (Caffe2's ``FetchBlob``)."""
    return _ws().fetch_blob(name, copy=copy)


def blobs() -> List[str]:
    """The blob names of the current workspace (Caffe2's ``Blobs``)."""
    return _ws().blobs()


def has_blob(name: str) -> bool:
    """``Workspace.has_blob`` on the current workspace (Caffe2's ``HasBlob``)."""
    return _ws().has_blob(name)


def remove_blob(name: str) -> bool:
    """``Workspace.remove_blob`` on the current workspace."""
    return _ws().remove_blob(name)


def rename_blob(old: str, new: str) -> None:
    """``Workspace.rename_blob`` on the current workspace."""
    _ws().rename_blob(old, new)


def create_net(
    net: NetLike,
    device: DeviceLike = None,
    overwrite: bool = False,
    plan_memory: bool = False,
    seed: Optional[int] = None,
) -> str:
    """``Workspace.create_net`` on the current workspace (Caffe2's ``CreateNet``)."""
    return _ws().create_net(
        net, device=device, overwrite=overwrite, plan_memory=plan_memory, seed=seed
    )


def run_net(name: str, num_iter: int = 1) -> None:
    """``Workspace.run_net`` on the current workspace (Caffe2's ``RunNet``)."""
    _ws().run_net(name, num_iter=num_iter)


def run_net_once(net: NetLike, device: DeviceLike = None) -> None:
    """``Workspace.run_net_once`` on the current workspace (Caffe2's ``RunNetOnce``)."""
    _ws().run_net_once(net, device=device)


def nets() -> List[str]:
    """The net names of the current workspace (Caffe2's ``Nets``)."""
    return _ws().nets()


def save(path: PathLike, names: Optional[Sequence[str]] = None) -> List[str]:
    """``Workspace.save`` on the current workspace (safetensors)."""
    return _ws().save(path, None if names is None else list(names))


def load(
    path: PathLike, names: Optional[Sequence[str]] = None, device: DeviceLike = None
) -> List[str]:
    """``Workspace.load`` on the current workspace (safetensors)."""
    return _ws().load(path, None if names is None else list(names), device=device)


def memory_snapshot(format: Optional[str] = None) -> Any:
    """Every live buffer with its size, device, head and owners (a list of dicts). It waits
    for no blob: one locked for writing by a running operator is listed with ``"busy": True``.

    ``format="torch"``: instead, every segment and block of every pool now as the dict that
    ``torch.cuda.memory._snapshot()`` returns (``segments`` with their ``blocks`` and the owner
    of each in its ``frames``; ``device_traces``, empty; ``device_labels``, the pool of each
    device number). PyTorch's memory viewer opens it once pickled with a protocol it reads::

        with open("snapshot.pickle", "wb") as f:
            pickle.dump(syncmem.memory_snapshot(format="torch"), f, protocol=4)
    """
    if format is None:
        return _native.memory_snapshot()
    if format == "torch":
        return pickle.loads(_native.torch_snapshot_pickle())
    raise ValueError(f"memory_snapshot: unknown format {format!r} (known: None, 'torch')")
