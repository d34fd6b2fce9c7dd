//! Kernels of the user ([`UserKernel`]) launched on [`SyncedMemory`] buffers and [`Tensor`]s
//! through their guards: the adapters of the device layer's launch API (documented on
//! [`launch`]).

use smallvec::SmallVec;

use crate::device::{Device, DeviceBuffer, Grid, KernelArg, ScalarArg, Stream, UserKernel};
use crate::error::{Error, Result};
use crate::synced::{DeviceRead, DeviceWrite, SyncedMemory};
use crate::tensor::Tensor;

/// How a launch uses a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// Read only: the device mirror is made current ([`SyncedMemory::device`]).
    Read,
    /// Read and written: made current, then the device is the only current mirror
    /// ([`SyncedMemory::device_mut`]).
    Write,
    /// Every byte written, none read: no copy, no fill ([`SyncedMemory::device_overwrite`]).
    Overwrite,
}

/// A buffer of a launch: a [`SyncedMemory`] or a [`Tensor`]'s storage.
#[derive(Clone, Copy)]
pub struct Buffer<'a> {
    /// `None`: a tensor without elements (an empty buffer is passed).
    mem: Option<&'a SyncedMemory>,
    /// How errors name it.
    label: &'a str,
    /// The tensor's device (`None`: host only), when it has no storage.
    device: Option<&'a Device>,
    /// A tensor with elements but no storage to hold them.
    missing: bool,
}

impl<'a> From<&'a SyncedMemory> for Buffer<'a> {
    fn from(m: &'a SyncedMemory) -> Self {
        Buffer {
            mem: Some(m),
            label: m.label(),
            device: m.target(),
            missing: false,
        }
    }
}

impl<'a> From<&'a Tensor> for Buffer<'a> {
    fn from(t: &'a Tensor) -> Self {
        let elements = t.numel().unwrap_or(0);
        let mem = t.synced().filter(|_| elements > 0);
        Buffer {
            mem,
            label: t.label(),
            device: t.target(),
            missing: elements > 0 && mem.is_none(),
        }
    }
}

impl<'a> From<&'a mut Tensor> for Buffer<'a> {
    fn from(t: &'a mut Tensor) -> Self {
        Buffer::from(&*t)
    }
}

/// A written buffer of a launch: a [`SyncedMemory`] (whose accessors take `&self`) or a
/// `&mut` [`Tensor`] (whose write accessors take `&mut self`).
pub struct BufferMut<'a>(Buffer<'a>);

impl<'a> From<&'a SyncedMemory> for BufferMut<'a> {
    fn from(m: &'a SyncedMemory) -> Self {
        BufferMut(Buffer::from(m))
    }
}

impl<'a> From<&'a mut Tensor> for BufferMut<'a> {
    fn from(t: &'a mut Tensor) -> Self {
        BufferMut(Buffer::from(&*t))
    }
}

#[derive(Clone, Copy)]
enum Kind<'a> {
    Buffer(Buffer<'a>, Access),
    Scalar(ScalarArg),
    Bytes(&'a [u8]),
}

/// One argument of [`launch`]: a buffer read, read and written, or overwritten, or a scalar
/// (`2.0f32.into()`, `n.into()` for a `u32` `n`).
#[derive(Clone, Copy)]
pub struct Arg<'a> {
    kind: Kind<'a>,
}

impl<'a> Arg<'a> {
    /// A buffer the kernel reads: its device mirror is made current first (one upload when the
    /// host holds newer data).
    pub fn read(buf: impl Into<Buffer<'a>>) -> Self {
        Self {
            kind: Kind::Buffer(buf.into(), Access::Read),
        }
    }

    /// A buffer the kernel reads and writes: made current first, then the device is its only
    /// current mirror.
    pub fn write(buf: impl Into<BufferMut<'a>>) -> Self {
        Self {
            kind: Kind::Buffer(buf.into().0, Access::Write),
        }
    }

    /// A buffer whose every byte the kernel writes without reading it: no copy and no fill
    /// (its previous contents are unspecified to the kernel); then the device is its only
    /// current mirror.
    pub fn overwrite(buf: impl Into<BufferMut<'a>>) -> Self {
        Self {
            kind: Kind::Buffer(buf.into().0, Access::Overwrite),
        }
    }

    /// A scalar.
    pub fn scalar(value: impl Into<ScalarArg>) -> Self {
        Self {
            kind: Kind::Scalar(value.into()),
        }
    }

    /// The raw bytes of a by-value parameter of a type the crate has no scalar for (see
    /// [`KernelArg::bytes`]).
    pub fn bytes(bytes: &'a [u8]) -> Self {
        Self {
            kind: Kind::Bytes(bytes),
        }
    }
}

macro_rules! arg_from {
    ($($t:ty),*) => {$(
        impl From<$t> for Arg<'_> {
            fn from(v: $t) -> Self {
                Arg::scalar(v)
            }
        }
    )*};
}

arg_from!(i32, u32, i64, u64, f32, f64, ScalarArg);

/// A guard held for the launch.
enum Guard<'a> {
    Read(DeviceRead<'a>),
    Write(DeviceWrite<'a>),
}

/// Queues `kernel` on `stream` over `grid` with `args`, [`SyncedMemory`] buffers and
/// [`Tensor`]s each taken through its guard, so that SyncedMemory's head state machine makes
/// exactly the copies the access needs: an input ([`Arg::read`], [`Arg::write`]) whose newest
/// data is on the host is uploaded once, an output taken with [`Arg::overwrite`] is neither
/// copied nor filled. Then the launch is checked, ordered and recorded as
/// [`UserKernel::launch`] describes, and the call returns at once (on `cpu`, once the host
/// closure returned). A buffer of another device is used through its replica on the launch's
/// device ([`SyncedMemory::device_on`]: a copy when the replica is stale; written, the replica
/// becomes the only current place). Guards are taken in the order of the buffers' locks, so
/// that launches on several threads cannot deadlock on each other, and released once the
/// kernel is queued: later accesses are ordered after it on the device, and a host access
/// waits for it.
///
/// ```
/// use syncmem::kernels::{self, Arg, Grid, UserKernel};
/// use syncmem::{Device, Tensor};
///
/// # fn main() -> syncmem::Result<()> {
/// let square = UserKernel::new("square").with_host(|a| {
///     let (x, y) = (a.input::<f32>(0)?, a.output::<f32>(1)?);
///     y.iter_mut().zip(x).for_each(|(y, x)| *y = x * x);
///     Ok(())
/// });
/// let dev = Device::cpu();
/// let x = Tensor::from_slice(&[3], &[1.0f32, 2.0, 3.0], Some(&dev))?;
/// let mut y = Tensor::with_shape(&[3], syncmem::DType::F32, Some(&dev))?;
/// let stream = dev.default_stream()?;
/// // SAFETY: a host closure is safe Rust.
/// unsafe { kernels::launch(&square, &stream, Grid::linear(1, 3), &[Arg::read(&x), Arg::overwrite(&mut y)])? };
/// assert_eq!(&*y.host::<f32>()?, [1.0, 4.0, 9.0]);
/// # Ok(())
/// # }
/// ```
///
/// # Safety
/// As [`UserKernel::launch`]: for these arguments and this grid the kernel reads and writes
/// each buffer only within its length and writes only the buffers passed as written.
///
/// # Errors
/// [`Error::KernelArgument`] naming the kernel and the argument: a buffer on the host only
/// (or a tensor with elements but no storage), the same buffer twice with a
/// write, and every check of [`UserKernel::launch`]; the errors of the guards
/// ([`Error::Busy`] for a buffer this thread holds, out of memory, an upload that failed).
pub unsafe fn launch(
    kernel: &UserKernel,
    stream: &Stream,
    grid: Grid,
    args: &[Arg<'_>],
) -> Result<()> {
    let dev = stream.device();
    let (slot_of, wanted) = plan_guards(kernel, dev, args)?;
    let guards = take_guards(&wanted, dev)?;
    let empty = DeviceBuffer::empty(dev);
    let mut kargs: SmallVec<[KernelArg<'_>; 16]> = SmallVec::new();
    for (a, slot) in args.iter().zip(&slot_of) {
        kargs.push(match (a.kind, slot) {
            (Kind::Scalar(s), _) => KernelArg::scalar(s),
            (Kind::Bytes(b), _) => KernelArg::bytes(b),
            (Kind::Buffer(_, access), None) => match access {
                Access::Read => KernelArg::read(&empty),
                _ => KernelArg::written(&empty),
            },
            (Kind::Buffer(..), Some(s)) => match &guards[*s] {
                Some(Guard::Read(g)) => KernelArg::read(g.buffer()),
                Some(Guard::Write(g)) => KernelArg::written(g.buffer()),
                None => unreachable_guard(kernel)?,
            },
        });
    }
    kernel.launch_checked(stream, grid, &kargs)
}

/// A buffer a launch takes a guard of: its lock key, its memory, its label, the access, and
/// whether it is another device's (used through its replica on the launch's device).
type Wanted<'a> = (usize, &'a SyncedMemory, &'a str, Access, bool);

/// Which guard each argument uses (`None`: a scalar or an empty buffer; the same buffer read
/// twice shares one), and the guards wanted. Checks each buffer's device, and that no buffer
/// written is passed twice.
#[allow(clippy::type_complexity)]
fn plan_guards<'a>(
    kernel: &UserKernel,
    dev: &Device,
    args: &'a [Arg<'a>],
) -> Result<(SmallVec<[Option<usize>; 16]>, SmallVec<[Wanted<'a>; 8]>)> {
    let error = |i: usize, reason: String| Error::KernelArgument {
        kernel: kernel.name().to_string(),
        index: Some(i),
        reason,
    };
    let mut slot_of: SmallVec<[Option<usize>; 16]> = SmallVec::new();
    let mut wanted: SmallVec<[Wanted<'a>; 8]> = SmallVec::new();
    for (i, a) in args.iter().enumerate() {
        let Kind::Buffer(b, access) = a.kind else {
            slot_of.push(None);
            continue;
        };
        if b.missing {
            return Err(error(
                i,
                format!(
                    "tensor {:?} has elements but no device memory (no storage, or str \
                     elements)",
                    b.label
                ),
            ));
        }
        let remote = match b.device {
            Some(d) => !d.same(dev),
            None => {
                return Err(error(
                    i,
                    format!(
                        "{:?} lives on the host only, the launch's stream on {}",
                        b.label,
                        dev.label()
                    ),
                ))
            }
        };
        let Some(mem) = b.mem else {
            slot_of.push(None);
            continue;
        };
        let key = mem.lock_key();
        match wanted.iter().position(|w| w.0 == key) {
            Some(s) if access == Access::Read && wanted[s].3 == Access::Read => {
                slot_of.push(Some(s));
            }
            Some(_) => {
                return Err(error(
                    i,
                    format!(
                        "{:?} is passed twice and written: pass a buffer that is read and \
                         written once, with Arg::write",
                        b.label
                    ),
                ))
            }
            None => {
                slot_of.push(Some(wanted.len()));
                wanted.push((key, mem, b.label, access, remote));
            }
        }
    }
    Ok((slot_of, wanted))
}

/// The guards of `wanted`, taken in the order of the buffers' locks (so that two launches
/// cannot deadlock), each at its index in `wanted`.
fn take_guards<'a>(
    wanted: &[Wanted<'a>],
    dev: &Device,
) -> Result<SmallVec<[Option<Guard<'a>>; 8]>> {
    let mut order: SmallVec<[usize; 8]> = (0..wanted.len()).collect();
    order.sort_unstable_by_key(|&s| wanted[s].0);
    let mut guards: SmallVec<[Option<Guard<'a>>; 8]> = (0..wanted.len()).map(|_| None).collect();
    for s in order {
        let (_, mem, label, access, remote) = wanted[s];
        guards[s] = Some(match (access, remote) {
            (Access::Read, false) => Guard::Read(mem.device_for(Some(label))?),
            (Access::Write, false) => Guard::Write(mem.device_write_for(Some(label), false)?),
            (Access::Overwrite, false) => Guard::Write(mem.device_write_for(Some(label), true)?),
            (Access::Read, true) => Guard::Read(mem.device_on(dev)?),
            (Access::Write, true) => Guard::Write(mem.device_mut_on(dev)?),
            (Access::Overwrite, true) => Guard::Write(mem.device_overwrite_on(dev)?),
        });
    }
    Ok(guards)
}

/// Every wanted guard was taken above; an error rather than a panic all the same.
fn unreachable_guard<T>(kernel: &UserKernel) -> Result<T> {
    Err(Error::InvalidState {
        op: "kernels::launch",
        buffer: format!("an argument of kernel {:?}", kernel.name()),
        reason: "its guard was not taken".into(),
    })
}
