//! syncmem: tensor memory that lives on the host and on compute devices at the same time.
//!
//! ```
//! use syncmem::{Device, Head, SyncedMemory};
//!
//! # fn main() -> syncmem::Result<()> {
//! // "opencl:0" or "cuda:0" when present; "cpu" runs the same code paths everywhere.
//! let dev = Device::open("cpu")?;
//! let buf = SyncedMemory::new(1024, &dev);          // nothing is allocated yet
//! assert_eq!(buf.head(), Head::Uninitialized);
//!
//! buf.host_mut()?.fill(7);                          // host mirror allocated, head = host
//! let on_device = buf.device()?;                    // made current on the device, head = synced
//! drop(on_device);
//! assert_eq!(buf.head(), Head::Synced);
//! assert_eq!(buf.host()?[0], 7);                    // nothing to do: both sides are current
//! // One transfer: a host-to-device copy, or, where host and device share memory (the `cpu`
//! // device, PoCL, integrated GPUs), a zero-copy sync that moves no byte.
//! let s = buf.copy_stats();
//! assert_eq!(s.host_to_device.count + s.mapped.count, 1);
//! println!("{}", syncmem::stats());
//! # Ok(())
//! # }
//! ```
//!
//! # Examples
//!
//! The repository's `crates/syncmem/examples` hold runnable programs (`cargo run -p syncmem
//! --example NAME [-- DEVICE]`): `quick_start` (Caffe's nine-step sequence with its copies),
//! `prefetch` (copies on a second stream) and `pools` (choosing and configuring a pool, its
//! statistics). The `syncmem-nn` crate's examples build on this crate's public API:
//! `workspace_net` (a workspace with nets, saved and loaded as safetensors) and
//! `custom_operator` (an operator of your own with its kernels, registered and trained).
//!
//! # Kernels and operators
//!
//! [`kernels`] is the one door for device work: the library's kernels ([`kernels::gemm`] with
//! its fused epilogues, [`kernels::relu`], [`kernels::softmax_loss`], ...), checked and safe,
//! taking guards of device mirrors as operands; and kernels of your own: [`device::UserKernel`]
//! compiles one from OpenCL C or CUDA C source once per device (or takes a Rust closure over
//! host slices for `cpu`), and [`kernels::launch`] runs it on tensors and [`SyncedMemory`]
//! buffers through their guards, checked, queued and ordered like the library's.
//! [`ops::register_operator`] adds an operator type to the registry that nets read; the
//! built-in operators (`FC`, `Relu`, `SoftmaxWithLoss`, ...) are the `syncmem-nn` crate's,
//! written on this crate's public API alone and registered the same way.
//!
//! # Several devices
//!
//! [`SyncedMemory::device_on`] and [`SyncedMemory::device_mut_on`] keep replicas of one buffer
//! on other devices (one coherence state for all of them: a read copies only where no current
//! copy is, from the cheapest one; a write makes the others stale), with the copies between
//! devices counted per pair in [`alloc::pairs`]. `syncmem-nn`'s data-parallel trainer trains
//! on several devices on top of them. For collective libraries, a guard's
//! `DeviceBuffer::as_opencl` / `as_cuda` (features `opencl`, `cuda`) give the native memory and
//! its stream the order.
//!
//! # Tensors by name
//!
//! A [`Workspace`] holds named blobs; for tensors, one call each:
//! [`Workspace::feed`] puts a [`Tensor`] in a blob, [`Workspace::fetch`] copies its elements
//! into a `Vec` from whichever side is newest (Caffe2's `FeedBlob` and `FetchBlob`), and
//! [`Workspace::with_tensor`] lends the tensor to a closure for everything else.
//!
//! ```
//! use syncmem::{Device, Tensor, Workspace};
//!
//! # fn main() -> syncmem::Result<()> {
//! let ws = Workspace::new();
//! ws.feed("x", Tensor::from_slice(&[3], &[1.0_f32, 2.0, 3.0], Some(&Device::cpu()))?)?;
//! assert_eq!(ws.fetch::<f32>("x")?, [1.0, 2.0, 3.0]);
//! assert_eq!(ws.with_tensor("x", |t| Ok(t.dims().to_vec()))?, [3]);
//! # Ok(())
//! # }
//! ```
//!
//! # Layers
//!
//! Bottom up; a layer imports only from the layers below it (the test `tests/layers.rs`
//! checks every source file), and calls up only through hooks a higher layer registers.
//!
//! | layer | role |
//! |---|---|
//! | `error`, [`dtype`], [`file`](mod@file) | [`Error`] and [`Result`]; element types ([`DType`], [`Element`], the math scalars); atomic file writes and bounded reads |
//! | `backend` (crate-private) | one folder per backend (`cpu`, `opencl`, `cuda`): discovery, raw memory, streams, events, kernel sources, programs, launches; all FFI; one `match` per method in `backend::dispatch` |
//! | [`alloc`] | host blocks, caching pools over any [`alloc::pool::RawStorage`], statistics; the events pools and streams publish (one leaf hook that higher layers attach sinks to) |
//! | [`device`] | [`Device`], [`DeviceBuffer`], [`Stream`], [`Event`], [`PinnedBuffer`]: pools and caps per device, the out-of-memory path, checked kernel calls |
//! | [`synced`], [`report`] | [`SyncedMemory`]: one buffer mirrored on host and device, lazily; the registry of evictable mirrors. Reports of memory traffic: traces recorded through the pools' hook, saved as JSON lines, replayed against any pool, drawn as a timeline, exported to PyTorch's memory tools |
//! | [`tensor`], [`param`], [`context`], [`kernels`] | Caffe2-style [`Tensor`]s, Caffe's data+diff [`ParamBlob`], contexts (device, stream, seeded generator), the math of parameter blobs |
//! | [`blob`], [`workspace`] | the type-erased [`Blob`] and the [`Workspace`] of named blobs, safetensors save/load |
//! | [`ops`], [`net`] | the operator trait and registry, operators' access to workspace blobs, nets of operators, rewrites, memory planning (the operators themselves, fusion and training: the `syncmem-nn` crate) |
//!
//! # Backends
//!
//! `cpu` is always present. `opencl` (feature `opencl`, via `opencl3`) and `cuda`
//! (feature `cuda`, via `cudarc`) load their runtime at run time, so the crate builds and runs
//! everywhere; a missing runtime is an [`Error::RuntimeUnavailable`], never a panic.
//!
//! The library's kernels ([`kernels`]) have CUDA kernels, compiled with NVRTC (`libnvrtc`,
//! loaded at run time) at first use. CI, which has no GPU, compiles them; the CUDA tests ran
//! on an NVIDIA GPU by hand (see the README).

#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod alloc;
mod backend;
pub mod blob;
pub mod context;

pub mod device;
pub mod dtype;
mod error;
pub mod file;
pub mod kernels;
pub mod net;
pub mod ops;
pub mod param;
pub mod report;
pub mod synced;
pub mod tensor;

#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;
pub mod workspace;

pub use alloc::pool::{
    HostPool, MemoryCap, MemorySnapshot, MemorySummary, PoolConfig, PoolKind, PoolStats,
    Preallocation,
};
pub use alloc::stats::{CopyStats, Direction, MemStats};
pub use alloc::Snapshot;

pub use blob::Blob;
pub use context::Context;
pub use device::{
    Device, DeviceBuffer, DeviceInfo, DeviceSpec, Event, LiveBuffer, MemPool, MemPoolScope,
    PinnedBuffer, Stream, ZeroCopy, ZeroCopyProtocol,
};
pub use dtype::{DType, Element, PodElement};
pub use error::{BackendKind, Error, OomReport, OomRetry, Result};
pub use param::ParamBlob;
pub use synced::{Head, SyncedMemory};
pub use tensor::{ShrinkPolicy, Tensor};
pub use workspace::Workspace;

/// Reads every memory and copy counter in the process: host memory, each device opened so far
/// (device memory and pinned host memory), and copies by direction.
pub fn stats() -> Snapshot {
    let mut devices = Vec::new();
    let mut pools: Vec<PoolStats> = alloc::pool::HostPool::global_if_initialised()
        .map(|p| p.stats())
        .into_iter()
        .collect();
    for d in device::registry_discovered() {
        if d.backend() != BackendKind::Cpu {
            devices.push(d.memory_stats());
            devices.push(d.pinned_stats());
        } else {
            devices.push(d.memory_stats());
        }
        pools.extend(d.pool_stats());
        pools.extend(d.pinned_pool_stats());
    }
    Snapshot {
        host: alloc::stats::HOST.snapshot("host"),
        devices,
        copies: alloc::stats::COPIES.snapshot(),
        host_waits: alloc::stats::host_waits(),
        pools,
    }
}

/// Resets every peak [`stats`] reads to the current value: host memory, the host pool, and each
/// device opened so far (device memory, pinned host memory, their pools; see
/// [`Device::reset_peak_stats`]). Cumulative counts (allocations, frees, copies) are kept.
pub fn reset_peak_stats() {
    alloc::stats::HOST.reset_peak();
    if let Some(p) = alloc::pool::HostPool::global_if_initialised() {
        p.reset_peak();
    }
    for d in device::registry_discovered() {
        d.reset_peak_stats();
    }
}

/// Every segment of every pool of the process, and every block in it, as
/// `torch.cuda.memory_snapshot()` reports them: the host pool, then each opened device's device
/// pool and pinned host pool (pools not used yet are left out; detached devices have
/// [`Device::pool_snapshots`]). Each block has its size, offset, state (allocated, free, or
/// cached with work pending), stream, and the name of the tensor or blob that holds it when
/// known (see [`alloc::pool::snapshot`]); each pool its statistics of the same instant.
/// Serializes to JSON ([`MemorySnapshot::to_json`]).
///
/// It walks every block under each pool's lock: a tool for reports, not for every step.
pub fn memory_snapshot() -> MemorySnapshot {
    let mut pools: Vec<_> = alloc::pool::HostPool::global_if_initialised()
        .map(HostPool::snapshot)
        .into_iter()
        .collect();
    for d in device::registry_discovered() {
        pools.extend(d.pool_snapshots());
    }
    MemorySnapshot { pools }
}
