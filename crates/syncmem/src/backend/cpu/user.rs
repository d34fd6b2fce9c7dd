//! Kernels of the user on the `cpu` device: a Rust closure called with [`HostArgs`], the
//! launch's buffers as host slices (the `cpu` device's memory is host memory) and its scalars.
//! The call has finished when the launch returns.

use std::cell::Cell;

use bytemuck::Pod;
use smallvec::SmallVec;

use super::CpuMem;
use crate::backend::user::{Grid, ScalarArg, ScalarType};
use crate::error::{Error, Result};

/// The closure of a kernel on the `cpu` device.
pub type HostKernelFn = dyn Fn(&HostArgs<'_>) -> Result<()> + Send + Sync;

/// One argument of a host launch.
enum HostArg<'a> {
    /// `len` bytes at `ptr` (dangling when `len == 0`); `write`: the launch may write it.
    Buffer {
        ptr: *mut u8,
        len: usize,
        write: bool,
        /// The writable slice was handed out (once only).
        taken: Cell<bool>,
    },
    Scalar(ScalarArg),
    Bytes(&'a [u8]),
}

/// The arguments of a launch on the `cpu` device, as the kernel's closure sees them: buffers
/// as slices of elements (`input` for every buffer the launch reads only, `output` once for
/// each buffer it writes), scalars by type, and the launch's [`Grid`]. Every accessor checks
/// the argument's kind and returns [`Error::KernelArgument`] naming the kernel and the
/// argument.
pub struct HostArgs<'a> {
    kernel: &'a str,
    grid: Grid,
    args: SmallVec<[HostArg<'a>; 8]>,
    /// The buffers' borrows.
    _mem: std::marker::PhantomData<&'a CpuMem>,
}

/// An argument of [`launch`]: a buffer's memory (`None` when empty) and length in bytes, or a
/// scalar.
pub(crate) enum In<'a> {
    Buffer {
        mem: Option<&'a CpuMem>,
        len: usize,
        write: bool,
    },
    Scalar(ScalarArg),
    Bytes(&'a [u8]),
}

/// Runs `f` with the arguments `args`.
///
/// The caller (the device layer) guarantees that every buffer written appears once in `args`
/// and that it holds the buffers through guards for the call, so that the slices handed out
/// alias nothing else; `len` is at most the memory's length.
pub(crate) fn launch(f: &HostKernelFn, kernel: &str, grid: Grid, args: &[In<'_>]) -> Result<()> {
    let mut out = SmallVec::new();
    for a in args {
        out.push(match *a {
            In::Buffer { mem, len, write } => {
                let (ptr, len) = match mem {
                    Some(m) if len > 0 => (m.as_ptr(), len.min(m.len_bytes())),
                    _ => (std::ptr::NonNull::<u64>::dangling().as_ptr().cast(), 0),
                };
                HostArg::Buffer {
                    ptr,
                    len,
                    write,
                    taken: Cell::new(false),
                }
            }
            In::Scalar(s) => HostArg::Scalar(s),
            In::Bytes(b) => HostArg::Bytes(b),
        });
    }
    let host = HostArgs {
        kernel,
        grid,
        args: out,
        _mem: std::marker::PhantomData,
    };
    f(&host)
}

impl<'a> HostArgs<'a> {
    fn error(&self, index: Option<usize>, reason: String) -> Error {
        Error::KernelArgument {
            kernel: self.kernel.to_string(),
            index,
            reason,
        }
    }

    fn arg(&self, i: usize) -> Result<&HostArg<'a>> {
        self.args.get(i).ok_or_else(|| {
            self.error(
                Some(i),
                format!("the launch passes {} arguments", self.args.len()),
            )
        })
    }

    /// The kernel's name.
    pub fn kernel(&self) -> &str {
        self.kernel
    }

    /// The launch's grid.
    pub fn grid(&self) -> Grid {
        self.grid
    }

    /// Number of arguments.
    pub fn len(&self) -> usize {
        self.args.len()
    }

    /// True without arguments.
    pub fn is_empty(&self) -> bool {
        self.args.is_empty()
    }

    /// Buffer `i`, read only, as elements of `T` (its bytes must be a whole number of `T`).
    ///
    /// # Errors
    /// [`Error::KernelArgument`] when argument `i` is missing, a scalar, a buffer the launch
    /// writes (take it with [`HostArgs::output`]) or not a whole number of `T`.
    pub fn input<T: Pod>(&self, i: usize) -> Result<&[T]> {
        match self.arg(i)? {
            HostArg::Buffer {
                ptr,
                len,
                write: false,
                ..
            } => {
                // SAFETY: `ptr` is valid for `len` initialised bytes of a `cpu`-device buffer
                // that the launch holds for reading (a read guard, or `&` of the buffer) for
                // the life of `self`; no writable slice covers it (a buffer written appears
                // once in the launch, and this one is not written).
                let bytes = unsafe { std::slice::from_raw_parts(*ptr, *len) };
                self.cast(i, bytes)
            }
            HostArg::Buffer { write: true, .. } => Err(self.error(
                Some(i),
                "the launch writes this buffer: read it through `output`".into(),
            )),
            other => Err(self.not_a_buffer(i, other)),
        }
    }

    fn not_a_buffer(&self, i: usize, arg: &HostArg<'_>) -> Error {
        let what = match arg {
            HostArg::Scalar(s) => format!("a {} scalar", s.scalar_type()),
            HostArg::Bytes(b) => format!("{} raw bytes", b.len()),
            HostArg::Buffer { .. } => "a buffer".to_string(),
        };
        self.error(Some(i), format!("{what}, not a buffer"))
    }

    /// The raw bytes of argument `i` (passed with [`crate::device::KernelArg::bytes`]).
    ///
    /// # Errors
    /// [`Error::KernelArgument`] when argument `i` is missing, a buffer or a scalar.
    pub fn bytes(&self, i: usize) -> Result<&'a [u8]> {
        match self.arg(i)? {
            HostArg::Bytes(b) => Ok(b),
            HostArg::Buffer { .. } => Err(self.error(Some(i), "a buffer, not raw bytes".into())),
            HostArg::Scalar(s) => Err(self.error(
                Some(i),
                format!("a {} scalar, not raw bytes", s.scalar_type()),
            )),
        }
    }

    /// Buffer `i`, which the launch writes (and may read), as elements of `T`; once per
    /// argument.
    ///
    /// # Errors
    /// [`Error::KernelArgument`] when argument `i` is missing, a scalar, a buffer the launch
    /// only reads, already taken, or not a whole number of `T`.
    #[allow(clippy::mut_from_ref)]
    pub fn output<T: Pod>(&self, i: usize) -> Result<&mut [T]> {
        match self.arg(i)? {
            HostArg::Buffer {
                ptr,
                len,
                write: true,
                taken,
            } => {
                if taken.replace(true) {
                    return Err(self.error(Some(i), "the output was taken already".into()));
                }
                // SAFETY: `ptr` is valid for `len` initialised bytes of a `cpu`-device buffer
                // that the launch holds exclusively (a write guard, or `&mut` of the buffer)
                // for the life of `self`. The buffer appears once in the launch, and `taken`
                // hands this slice out once: nothing else views these bytes while it lives.
                let bytes = unsafe { std::slice::from_raw_parts_mut(*ptr, *len) };
                let len = bytes.len();
                bytemuck::try_cast_slice_mut(bytes).map_err(|e| self.cast_error::<T>(i, len, e))
            }
            HostArg::Buffer { write: false, .. } => Err(self.error(
                Some(i),
                "the launch only reads this buffer: take it with `input`".into(),
            )),
            other => Err(self.not_a_buffer(i, other)),
        }
    }

    fn cast<'s, T: Pod>(&self, i: usize, bytes: &'s [u8]) -> Result<&'s [T]> {
        bytemuck::try_cast_slice(bytes).map_err(|e| self.cast_error::<T>(i, bytes.len(), e))
    }

    fn cast_error<T>(&self, i: usize, len: usize, e: bytemuck::PodCastError) -> Error {
        self.error(
            Some(i),
            format!(
                "{len} bytes cannot be viewed as {} ({e:?})",
                std::any::type_name::<T>()
            ),
        )
    }

    /// Scalar `i`.
    ///
    /// # Errors
    /// [`Error::KernelArgument`] when argument `i` is missing or a buffer.
    pub fn scalar(&self, i: usize) -> Result<ScalarArg> {
        match self.arg(i)? {
            HostArg::Scalar(s) => Ok(*s),
            HostArg::Buffer { .. } => Err(self.error(Some(i), "a buffer, not a scalar".into())),
            HostArg::Bytes(b) => {
                Err(self.error(Some(i), format!("{} raw bytes, not a scalar", b.len())))
            }
        }
    }

    fn mismatch(&self, i: usize, want: ScalarType, got: ScalarArg) -> Error {
        self.error(
            Some(i),
            format!(
                "the kernel reads a {want} scalar, the launch passes a {}",
                got.scalar_type()
            ),
        )
    }
}

macro_rules! scalar_getter {
    ($name:ident, $t:ty, $variant:ident) => {
        impl HostArgs<'_> {
            #[doc = concat!("Scalar `i`, which must be a `", stringify!($t), "`.")]
            ///
            /// # Errors
            /// [`Error::KernelArgument`] when argument `i` is missing, a buffer, or a scalar of
            /// another type.
            pub fn $name(&self, i: usize) -> Result<$t> {
                match self.scalar(i)? {
                    ScalarArg::$variant(v) => Ok(v),
                    other => Err(self.mismatch(i, ScalarType::$variant, other)),
                }
            }
        }
    };
}

scalar_getter!(i32, i32, I32);
scalar_getter!(u32, u32, U32);
scalar_getter!(i64, i64, I64);
scalar_getter!(u64, u64, U64);
scalar_getter!(f32, f32, F32);
scalar_getter!(f64, f64, F64);
