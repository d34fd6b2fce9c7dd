"""Type stubs of the native module ``syncmem._native`` (re-exported by ``syncmem``)."""

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy

DeviceLike = Union["Device", str, None]
NetLike = Union[str, Dict[str, Any]]
PathLike = Union[str, "os.PathLike[str]"]

class SyncmemError(Exception):
    """Base class of every error syncmem raises; the message is the library's own."""

class OutOfMemoryError(SyncmemError):
    """An allocation failed for lack of memory (after freeing caches and clean mirrors)."""

class DeviceError(SyncmemError):
    """A bad device string, a missing backend or runtime, no such device, a failed backend
    call, a device mismatch, or an operation the device does not support."""

class ShapeError(SyncmemError):
    """Wrong dims, sizes that differ or overflow, an out-of-bounds range, or an array layout
    (not C-contiguous) that cannot be used without a copy."""

class TypeMismatchError(SyncmemError):
    """An element type that differs from the one stored or asked for, or has no equivalent."""

class NotFoundError(SyncmemError):
    """A blob, net, workspace, tensor in a file, or operator type that does not exist."""

class AlreadyExistsError(SyncmemError):
    """A blob or net that already exists where a new one was to be made."""

class BusyError(SyncmemError):
    """Device access to a buffer while a writable host view of it is alive."""

class InvalidStateError(SyncmemError):
    """An operation not valid in the object's state (uninitialised tensor, no data yet, a net
    definition that does not parse, a read-only array given with ``copy=False``)."""

class ConfigError(SyncmemError):
    """An invalid memory pool configuration."""

class FileError(SyncmemError):
    """Reading or writing a file failed."""

class FormatError(SyncmemError):
    """A file that is not valid safetensors."""

class Device:
    """A compute device: ``cpu``, ``opencl:N`` or ``cuda:N``. Opening a malformed string, a
    backend whose runtime is missing, or an index too large raises ``DeviceError``."""

    def __init__(self, spec: str) -> None: ...
    @property
    def kind(self) -> str:
        """``"cpu"``, ``"opencl"`` or ``"cuda"``."""
    @property
    def index(self) -> int:
        """Index among the backend's devices (0 for ``cpu``)."""
    @property
    def name(self) -> str:
        """Device name as the runtime reports it."""
    @property
    def vendor(self) -> str:
        """Vendor or platform name."""
    @property
    def total_memory(self) -> int:
        """Total device memory in bytes."""
    @property
    def max_alloc(self) -> int:
        """Largest single allocation in bytes."""
    @property
    def host_unified(self) -> bool:
        """True when device memory is host memory."""
    @property
    def memory_cap(self) -> Optional[int]:
        """The memory cap of the device's pool in bytes, or ``None``."""
    def synchronize(self) -> None:
        """Waits for the work queued on the default stream (GIL released)."""
    def empty_cache(self) -> int:
        """Gives cached free blocks back; returns the bytes released."""
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

class Tensor:
    """A handle to the tensor in a blob (``Workspace.tensor``) or of its own
    (``from_dlpack``). Views (``numpy``, ``__array__``, ``__dlpack__``) share the host mirror
    without copying and keep the buffer alive."""

    @property
    def name(self) -> str:
        """Blob name or label."""
    @property
    def shape(self) -> Tuple[int, ...]:
        """The dims."""
    @property
    def ndim(self) -> int:
        """Number of dims."""
    @property
    def size(self) -> int:
        """Number of elements."""
    @property
    def nbytes(self) -> int:
        """Bytes of the elements."""
    @property
    def dtype(self) -> Optional[str]:
        """Element type name (NumPy's names, ``bfloat16``, ``str``)."""
    @property
    def device(self) -> Optional[Device]:
        """The device mirrored on, ``None`` for host-only tensors."""
    @property
    def head(self) -> Optional[str]:
        """``"uninitialized"``, ``"host"``, ``"device"`` or ``"synced"``; ``None`` without
        storage."""
    def copy_stats(self) -> Dict[str, Dict[str, int]]:
        """Copies made by this tensor's buffer, by direction."""
    def numpy(self, writable: bool = False) -> numpy.ndarray:
        """A NumPy view of the host mirror, without copying. Read-only by default (a snapshot
        of the host made current once); ``writable=True`` makes the host the head, and device
        access to the buffer raises ``BusyError`` while the view lives."""
    def __array__(self, dtype: Any = None, copy: Optional[bool] = None) -> numpy.ndarray:
        """``numpy.asarray(t)``: a read-only view; ``copy=True`` or another dtype copy."""
    def to_device(self) -> None:
        """Makes the device mirror current; ``BusyError`` while a writable view lives."""
    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any:
        """A DLPack capsule of the host mirror (writable, no copy) for host-only and ``cpu``
        tensors; ``DeviceError`` naming the device kind for ``opencl``/``cuda`` tensors."""
    def __dlpack_device__(self) -> Tuple[int, int]:
        """``(1, 0)`` for host memory, ``(4, N)`` OpenCL, ``(2, N)`` CUDA."""
    def __len__(self) -> int: ...

class HostView:
    """The ``base`` of a NumPy view: keeps the buffer alive while any array uses it."""

    @property
    def writable(self) -> bool:
        """True for a writable view."""
    @property
    def nbytes(self) -> int:
        """Bytes of the elements."""
    @property
    def label(self) -> str:
        """The buffer's label."""

class Workspace:
    """Named blobs, nets over them, and an optional parent (Caffe2's ``Workspace``).

    ``device`` (default ``cpu``, or the parent's) is where fed and loaded tensors live and nets
    run unless a call names another. ``blob_mapping={"local": "parent_name"}`` with a parent
    makes only those parent blobs visible, under local names."""

    def __init__(
        self,
        parent: Optional["Workspace"] = None,
        *,
        device: DeviceLike = None,
        blob_mapping: Optional[Dict[str, str]] = None,
        name: Optional[str] = None,
    ) -> None: ...
    @property
    def name(self) -> str:
        """The workspace's name."""
    @property
    def device(self) -> Device:
        """Default device of feeds, loads and nets."""
    @property
    def parent(self) -> Optional["Workspace"]:
        """The parent workspace, or ``None``."""
    def feed_blob(
        self, name: str, value: Any, device: DeviceLike = None, copy: bool = True
    ) -> None:
        """Puts ``value`` (array-like or ``Tensor``) in blob ``name``: one copy, or none with
        ``copy=False`` (the array's memory becomes the host mirror and is marked read-only)."""
    def fetch_blob(self, name: str, copy: bool = True) -> numpy.ndarray:
        """A copy of the blob's elements from the newest side; ``copy=False``: a read-only
        view."""
    def tensor(self, name: str) -> Tensor:
        """A handle to the tensor in blob ``name``."""
    def blobs(self) -> List[str]:
        """Every visible blob name, sorted."""
    def local_blobs(self) -> List[str]:
        """This workspace's own blob names, sorted."""
    def has_blob(self, name: str) -> bool:
        """True when a blob is visible as ``name``."""
    def __contains__(self, name: str) -> bool: ...
    def create_blob(self, name: str) -> None:
        """Creates an empty local blob unless one is visible."""
    def remove_blob(self, name: str) -> bool:
        """Removes a local blob; returns whether there was one."""
    def rename_blob(self, old: str, new: str) -> None:
        """Renames a local blob."""
    def create_net(
        self,
        net: NetLike,
        device: DeviceLike = None,
        overwrite: bool = False,
        plan_memory: bool = False,
        seed: Optional[int] = None,
    ) -> str:
        """Builds and registers a net (JSON string or dict); returns its name."""
    def run_net(self, name: str, num_iter: int = 1) -> None:
        """Runs a net ``num_iter`` times (GIL released); ``BusyError`` while a writable view
        of one of the workspace's tensors is alive."""
    def run_net_once(self, net: NetLike, device: DeviceLike = None) -> None:
        """Builds, runs once and discards a net."""
    def nets(self) -> List[str]:
        """Registered net names, sorted."""
    def has_net(self, name: str) -> bool:
        """True when a net ``name`` is registered."""
    def delete_net(self, name: str) -> bool:
        """Unregisters a net; returns whether there was one."""
    def save(self, path: PathLike, names: Optional[Sequence[str]] = None) -> List[str]:
        """Writes tensors to a safetensors file (GIL released); returns the names."""
    def load(
        self,
        path: PathLike,
        names: Optional[Sequence[str]] = None,
        device: DeviceLike = None,
    ) -> List[str]:
        """Reads tensors of a safetensors file (GIL released); returns the names."""
    def clear(self) -> None:
        """Removes every local blob and net."""

def devices() -> List[Device]:
    """Every device that can be opened: ``cpu``, then OpenCL and CUDA devices."""

def backends() -> List[Dict[str, Any]]:
    """Each backend: ``backend``, ``compiled``, ``devices``, ``error``."""

def from_dlpack(obj: Any, device: DeviceLike = None) -> Tensor:
    """A tensor on ``device`` (default ``cpu``) whose host mirror is the producer's memory."""

def memory_stats(device: DeviceLike = None) -> Dict[str, int]:
    """Flat statistics dict in ``torch.cuda.memory_stats`` shape."""

def memory_summary(device: DeviceLike = None) -> str:
    """A readable report of memory, copies, pools, device mirrors and host views."""

def memory_snapshot() -> List[Dict[str, Any]]:
    """Every live buffer with its size, device, head and owners."""

def pool_snapshot(device: DeviceLike = None) -> Dict[str, Any]:
    """Every segment and block of every pool: size, offset, state, stream, owner; pool stats."""

def copy_stats() -> Dict[str, Dict[str, int]]:
    """Every host/device copy of the process, by direction."""

def empty_cache() -> int:
    """Gives cached free blocks of every pool back; returns the bytes released."""

def reset_peak_memory_stats() -> None:
    """Resets the peak counters of every pool opened."""

def operator_types() -> List[str]:
    """The operator types nets can use."""
