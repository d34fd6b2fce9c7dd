//! The user's kernels, dispatched: [`RawDevice::build_user`] builds (or finds) a kernel for
//! the device's backend from the [`Sources`] given, [`RawDevice::launch_user`] launches it on
//! a stream of the same backend with its arguments, one `match` each.

use std::sync::Arc;

use smallvec::SmallVec;

use super::{mismatch, RawDevice, RawMem, RawStream};
use crate::backend::cpu::user::{self as host, HostKernelFn};
use crate::backend::user::{nul_problem, Grid, GridLimits, KernelParam, ScalarArg, Sources};
use crate::error::{Error, Result};

/// A user's kernel built for one device.
#[derive(Clone)]
pub(crate) enum RawUserKernel {
    /// The host closure (`cpu`).
    Cpu(Arc<HostKernelFn>),
    #[cfg(feature = "opencl")]
    OpenCl(Arc<crate::backend::opencl::ClUserKernel>),
    #[cfg(feature = "cuda")]
    Cuda(Arc<crate::backend::cuda::CuUserKernel>),
}

impl RawUserKernel {
    /// The compiled kernel's parameters (`None` for a host closure, which has no declared
    /// parameters).
    pub(crate) fn params(&self) -> Option<&[KernelParam]> {
        match self {
            RawUserKernel::Cpu(_) => None,
            #[cfg(feature = "opencl")]
            RawUserKernel::OpenCl(k) => Some(k.params()),
            #[cfg(feature = "cuda")]
            RawUserKernel::Cuda(k) => Some(k.params()),
        }
    }

    /// What the kernel's device launches at most.
    pub(crate) fn limits(&self) -> GridLimits {
        match self {
            RawUserKernel::Cpu(_) => GridLimits::HOST,
            #[cfg(feature = "opencl")]
            RawUserKernel::OpenCl(k) => k.limits(),
            #[cfg(feature = "cuda")]
            RawUserKernel::Cuda(k) => k.limits(),
        }
    }

    /// The most threads per block the compiled kernel runs (`None`: no limit, a host closure).
    pub(crate) fn max_threads(&self) -> Option<u64> {
        match self {
            RawUserKernel::Cpu(_) => None,
            #[cfg(feature = "opencl")]
            RawUserKernel::OpenCl(k) => Some(k.max_threads()),
            #[cfg(feature = "cuda")]
            RawUserKernel::Cuda(k) => Some(k.max_threads()),
        }
    }
}

/// One argument of a launch: device memory (`None` when empty) with its length in bytes and
/// whether the launch writes it, or a scalar.
pub(crate) enum RawArg<'a> {
    Mem {
        mem: Option<&'a RawMem>,
        len: usize,
        write: bool,
    },
    Scalar(ScalarArg),
    /// The raw bytes of a by-value parameter.
    Bytes(&'a [u8]),
}

fn missing(label: &str, name: &str, what: &str, call: &str) -> Error {
    Error::Unsupported {
        device: label.to_string(),
        what: format!("kernel {name:?} has no {what} (give one with UserKernel::{call})"),
    }
}

/// The backend's argument list, with `ptr` for the backend pointer of a memory argument,
/// into `out` (the caller's: a list returned by value would be copied whole, 16 slots, on
/// this per-launch path).
#[cfg(any(feature = "opencl", feature = "cuda"))]
fn device_args<'a, P: crate::backend::args::DevicePtr>(
    args: &[RawArg<'a>],
    label: &str,
    ptr: impl Fn(&'a RawMem) -> Option<P>,
    out: &mut SmallVec<[crate::backend::args::KArg<P>; 16]>,
) -> Result<()> {
    use crate::backend::args::{scalar, KArg};
    for a in args {
        out.push(match a {
            RawArg::Mem { mem: None, .. } => KArg::Ptr(P::NULL),
            RawArg::Mem { mem: Some(m), .. } => {
                KArg::Ptr(ptr(m).ok_or_else(|| mismatch("kernel launch", label))?)
            }
            RawArg::Scalar(s) => scalar(*s),
            RawArg::Bytes(b) => KArg::Bytes {
                ptr: b.as_ptr(),
                len: b.len(),
            },
        });
    }
    Ok(())
}

impl RawDevice {
    /// Builds (or finds) kernel `name` for this device from `src`: the host closure on `cpu`,
    /// the OpenCL C or CUDA C source elsewhere.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when `src` has nothing for this backend; [`Error::KernelBuild`]
    /// when the name, or the source or options of this backend, hold a NUL byte; the build
    /// errors of the backend ([`Error::KernelBuild`] with the compiler's log).
    pub(crate) fn build_user(&self, name: &str, src: &Sources) -> Result<RawUserKernel> {
        let label = self.info().label();
        let refuse = |texts: &[(&str, &str)]| match nul_problem(name, texts) {
            Some(reason) => Err(Error::KernelBuild {
                kernel: name.to_string(),
                device: label.clone(),
                reason,
                log: String::new(),
            }),
            None => Ok(()),
        };
        match self {
            RawDevice::Cpu(_) => refuse(&[])
                .and_then(|()| {
                    src.host
                        .clone()
                        .ok_or_else(|| missing(&label, name, "host closure", "with_host"))
                })
                .map(RawUserKernel::Cpu),
            #[cfg(feature = "opencl")]
            RawDevice::OpenCl(d) => {
                let source = src
                    .opencl
                    .as_ref()
                    .ok_or_else(|| missing(&label, name, "OpenCL C source", "with_opencl"))?;
                refuse(&[
                    ("OpenCL C source", source),
                    ("OpenCL build options", &src.opencl_options),
                ])?;
                d.user_kernel(name, source, &src.opencl_options)
                    .map(RawUserKernel::OpenCl)
            }
            #[cfg(feature = "cuda")]
            RawDevice::Cuda(d) => {
                let source = src
                    .cuda
                    .as_ref()
                    .ok_or_else(|| missing(&label, name, "CUDA C source", "with_cuda"))?;
                refuse(&[("CUDA C source", source)])?;
                d.user_kernel(name, source).map(RawUserKernel::Cuda)
            }
        }
    }

    /// Launches `k` (built for this device) on `s` over `grid` with `args`, which the caller
    /// checked against the kernel's parameters; returns once it is queued (`cpu`: once the
    /// closure returned).
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] for a stream, kernel or memory of another backend; the errors
    /// of the launch (a host closure's own errors on `cpu`).
    pub(crate) fn launch_user(
        &self,
        s: &RawStream,
        k: &RawUserKernel,
        name: &str,
        grid: &Grid,
        args: &[RawArg<'_>],
    ) -> Result<()> {
        match (self, s, k) {
            (RawDevice::Cpu(_), RawStream::Cpu(_), RawUserKernel::Cpu(f)) => {
                let mut host_args: SmallVec<[host::In<'_>; 16]> = SmallVec::new();
                for a in args {
                    host_args.push(match a {
                        RawArg::Mem { mem, len, write } => host::In::Buffer {
                            mem: match mem {
                                Some(m) => Some(m.as_cpu().ok_or_else(|| {
                                    mismatch("kernel launch", &self.info().label())
                                })?),
                                None => None,
                            },
                            len: *len,
                            write: *write,
                        },
                        RawArg::Scalar(v) => host::In::Scalar(*v),
                        RawArg::Bytes(b) => host::In::Bytes(b),
                    });
                }
                host::launch(f.as_ref(), name, *grid, &host_args)
            }
            #[cfg(feature = "opencl")]
            (RawDevice::OpenCl(d), RawStream::OpenCl(s), RawUserKernel::OpenCl(k)) => {
                let mut out = SmallVec::new();
                device_args(
                    args,
                    d.label(),
                    |m| m.as_opencl().map(opencl3::memory::ClMem::get),
                    &mut out,
                )?;
                d.launch_user(s, k, grid, &out)
            }
            #[cfg(feature = "cuda")]
            (RawDevice::Cuda(d), RawStream::Cuda(s), RawUserKernel::Cuda(k)) => {
                let mut out = SmallVec::new();
                device_args(
                    args,
                    d.label(),
                    |m| match m {
                        RawMem::Cuda(m) => Some(m.device_ptr()),
                        #[allow(unreachable_patterns)]
                        _ => None,
                    },
                    &mut out,
                )?;
                d.launch_user(s, k, grid, &out)
            }
            #[allow(unreachable_patterns)]
            _ => Err(mismatch("kernel launch", &self.info().label())),
        }
    }
}
