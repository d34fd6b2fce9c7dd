"""Type stubs of the native module ``syncmem._native`` (re-exported by ``syncmem``)."""

import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy

DeviceLike = Union["Device", str, None]
NetLike = Union[str, Dict[str, Any]]
PathLike = Union[str, "os.PathLike[str]"]

class SyncmemError(Exception):
    """Base class of every error syncmem raises; the message is the library's own. Each
    subclass also derives from the matching builtin exception."""

class OutOfMemoryError(SyncmemError, MemoryError):
    """An allocation failed for lack of memory (after freeing caches and clean mirrors)."""

class DeviceError(SyncmemError, RuntimeError):
    """A bad device string, a missing backend or runtime, no such device, a failed backend
    call, a device mismatch, or an operation the device does not support."""

class ShapeError(SyncmemError, ValueError):
    """Wrong dims, sizes that differ or overflow, an out-of-bounds range, or an array layout
    (not C-contiguous) that cannot be used without a copy."""

class TypeMismatchError(SyncmemError, TypeError):
    """An element type that differs from the one stored or asked for, or has no equivalent."""

class NotFoundError(SyncmemError, KeyError):
    """A blob, net, workspace, tensor in a file, or operator type that does not exist (its
    message is shown without the quotes of a plain ``KeyError``)."""

class AlreadyExistsError(SyncmemError, ValueError):
    """A blob or net that already exists where a new one was to be made."""

class BusyError(SyncmemError, RuntimeError):
    """Device access to a buffer while a writable host view of it is alive."""

class InvalidStateError(SyncmemError, ValueError):
    """An operation not valid in the object's state (uninitialised tensor, no data yet, a net
    definition that does not parse, an array that ``feed_blob(copy=False)`` cannot adopt)."""

class ConfigError(SyncmemError, ValueError):
    """An invalid memory pool configuration."""

class FileError(SyncmemError, OSError):
    """Reading or writing a file failed; ``errno`` is the operating system's error number when
    there is one."""

class FormatError(SyncmemError, ValueError):
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
    @property
    def zero_copy(self) -> str:
        """``"auto"``, ``"off"`` or ``"map"``; settable, for the memory allocated from then
        on, with exactly those values in any case (``ConfigError`` for any other, blanks,
        ``"on"``, ``"1"`` and ``""`` included), as ``SYNCMEM_ZERO_COPY``."""
    @zero_copy.setter
    def zero_copy(self, setting: str) -> None: ...
    @property
    def zero_copy_protocol(self) -> Optional[str]:
        """``"in-place"``, ``"map"``, or ``None`` when tensors keep two copies."""
    def synchronize(self) -> None:
        """Waits for the work queued on the default stream (GIL released)."""
    def empty_cache(self) -> int:
        """Gives cached free blocks back; returns the bytes released."""
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

class Tensor:
    """A handle to the tensor in a blob (``Workspace.tensor``) or of its own
    (``from_dlpack``). Views (``numpy``, ``__array__``, ``__dlpack__``) share the tensor's
    memory without copying, live (not snapshots), and keep the buffer alive and in place."""

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
    def numpy(self, writable: bool = False, copy: bool = False) -> numpy.ndarray:
        """A live NumPy view of the host memory, without copying; the buffer stays alive and
        in place (never spilled) while it lives. Not a snapshot: under zero copy (default on
        ``cpu`` and PoCL) it is the device memory, which kernels write in place; otherwise the
        host mirror, refreshed by host reads. Read-only by default (the host made current
        once); ``writable=True`` makes the host the head, and device access to the buffer
        raises ``BusyError`` while the view lives. ``copy=True``: a snapshot (a new array)."""
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
        """A DLPack capsule without copying: of the host mirror for host-only and ``cpu``
        tensors, of the device memory for ``opencl``/``cuda`` tensors (``cl_mem`` or device
        pointer). Writable; the buffer is pinned in place until the consumer releases it.
        ``copy=True``: a copy on the same device, or a host copy with ``dl_device=(1, 0)``;
        another ``dl_device`` raises ``BufferError``."""
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

class MemPool:
    """A private memory pool of one device: inside ``with use_mem_pool(pool):`` the device
    memory the calling thread allocates on ``pool.device`` comes from it, and nothing else
    does. ``conf`` is a ``key=value`` list as ``SYNCMEM_POOL_CONF`` takes (``memory_cap``,
    ``preallocate``, ``gc_threshold``, ...)."""

    def __init__(
        self, device: DeviceLike = None, conf: Optional[str] = None, kind: Optional[str] = None
    ) -> None: ...
    @property
    def label(self) -> str:
        """``"DEVICE mempool N"``."""
    @property
    def device(self) -> Device:
        """The device whose memory the pool holds."""
    def stats(self) -> Dict[str, Any]:
        """The pool's own statistics (the library's ``PoolStats``)."""
    def snapshot(self) -> Dict[str, Any]:
        """Every segment and block of the pool, as ``pool_snapshot()`` lists a pool."""
    def empty_cache(self) -> int:
        """Gives the pool's cached memory back to the device; returns the bytes."""
    def release(self) -> int:
        """Lets the pool go: its cached memory goes back now; later use raises
        ``InvalidStateError``."""

class MemPoolContext:
    """The context manager ``use_mem_pool`` returns (it stays on the thread that entered it)."""

    @property
    def pool(self) -> MemPool:
        """The pool the block routes to."""
    def __enter__(self) -> "MemPoolContext": ...
    def __exit__(self, *exc: Any) -> bool: ...

def use_mem_pool(pool: MemPool) -> MemPoolContext:
    """``with use_mem_pool(pool):`` routes the calling thread's allocations on the pool's
    device to it (blocks nest; the innermost wins)."""

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
        ``copy=False``.

        ``copy=False`` takes the array's memory over as the host mirror: syncmem owns it from
        then on. The array (and its base when it views all of it, e.g. ``a.reshape(...)``)
        becomes a read-only view whose ``base`` is a ``HostView``; NumPy refuses to make it
        writable again or to resize it (``ValueError``). Write through
        ``tensor(name).numpy(writable=True)``. It needs a C-contiguous, aligned, native-order
        array (``ShapeError``) that is writable and owns its memory or views all of an array
        that does (``InvalidStateError`` for a view of part of an array, for memory NumPy does
        not own such as ``frombuffer`` or ``memmap``, and for memory that already belongs to a
        tensor). Views taken from the array before the call keep their writable flag (NumPy
        does not track them): do not write through them."""
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
    """A flat dict of ints with ``torch.cuda.memory_stats``'s keys
    (``"allocated_bytes.all.current"``, ``"active_bytes.all.peak"``, ``"allocation.all.peak"``,
    ``"num_ooms"``, ...; the README lists every key). With ``device``, ``all``,
    ``small_pool``, ``large_pool`` and the counts without a scope cover its memory pool, the
    keys per pool and per memory space its pools and spaces; without, every pool and space."""

def memory_allocated(device: DeviceLike = None) -> int:
    """Bytes in blocks handed out now (``"allocated_bytes.all.current"``)."""

def max_memory_allocated(device: DeviceLike = None) -> int:
    """The most bytes handed out at once since the start or the last peak reset
    (``"allocated_bytes.all.peak"``)."""

def memory_reserved(device: DeviceLike = None) -> int:
    """Bytes in segments held from the backend now (``"reserved_bytes.all.current"``)."""

def max_memory_reserved(device: DeviceLike = None) -> int:
    """The most bytes held in segments at once since the start or the last peak reset
    (``"reserved_bytes.all.peak"``)."""

def memory_summary(device: DeviceLike = None, abbreviated: bool = False) -> str:
    """For each pool, the table ``torch.cuda.memory_summary`` prints (the library's
    ``MemorySummary``; ``abbreviated`` leaves out the small and large block rows), then memory
    per space, copies, device mirrors and host views alive."""

def memory_snapshot() -> List[Dict[str, Any]]:
    """Every live buffer with its size, device, head and owners. Waits for no blob: a blob
    locked for writing by a running operator is listed with ``"busy": True`` (and its name
    and owner only)."""

def record_memory_history(max_entries: Optional[int] = None) -> None:
    """Keeps the newest ``max_entries`` events of every device; ``None`` or 0 stops."""

def memory_history() -> Optional[str]:
    """The events the history keeps now as trace JSON lines, or ``None`` while it is off."""

class OomObserver:
    """A callable registered by ``on_out_of_memory``."""
    def remove(self) -> None: ...
    def __enter__(self) -> "OomObserver": ...
    def __exit__(self, *args: Any) -> bool: ...

def on_out_of_memory(callable: Callable[[Dict[str, Any]], Any]) -> OomObserver:
    """Calls ``callable(report)`` at each out-of-memory failure, before the error is raised."""

def torch_snapshot_pickle() -> bytes:
    """The pools now as a pickle of ``torch.cuda.memory._snapshot()``'s dict (protocol 3)."""

def pool_snapshot(device: DeviceLike = None) -> Dict[str, Any]:
    """Every segment and block of every pool: size, offset, state, stream, owner; pool stats."""

def copy_stats() -> Dict[str, Dict[str, int]]:
    """Every host/device copy of the process, by direction."""

def empty_cache() -> int:
    """Gives cached free blocks of every pool back; returns the bytes released."""

def reset_peak_memory_stats(device: DeviceLike = None) -> None:
    """Resets every peak to the current value: of ``device`` (its memory, pinned memory and
    pools), or of the whole process (host memory and pool too). Totals are kept."""

def operator_types() -> List[str]:
    """The operator types nets can use."""

class RawKernel:
    """A kernel from OpenCL C or CUDA C source, called as CuPy's: ``kernel(grid, block, args)``
    with tensors and NumPy scalars (or Python numbers, typed by the kernel's parameters; a
    value the parameter's type cannot hold, such as ``1e300`` for a ``float``, is an error).
    A parameter of a type without a scalar (``char``, ``float4``, a CUDA struct) takes
    ``bytes`` of exactly its size, or a NumPy scalar of that size. A tensor passed for a
    pointer whose element type the source declares must be of that dtype.

    The arguments' count, kinds, sizes and dtypes are checked, the kernel's indexing is not:
    a kernel that reads or writes past the end of a tensor corrupts memory."""

    def __init__(
        self, source: str, name: str, backend: Optional[str] = None, options: str = ""
    ) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def backend(self) -> str: ...
    def compile(self, device: DeviceLike) -> None: ...
    def __call__(self, grid: Any, block: Any, args: Sequence[Any]) -> None: ...

def register_operator(
    op_type: str,
    func: Callable[[List[Any], List[Any]], None],
    gradient: Optional[str] = None,
    shapes: Optional[Callable[[List[Tuple[int, ...]]], List[Sequence[int]]]] = None,
) -> None:
    """Registers an operator type run by ``func(inputs, outputs)`` on ``cpu``. The function
    may call the package; a call that would wait for the blobs the running operator holds
    (``feed_blob`` of its input or output, ``fetch_blob`` of an output, ``run_net`` of a net
    using them, ``save``, ``numpy(writable=True)``) raises ``BusyError`` naming the blob."""
