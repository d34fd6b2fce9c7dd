//! The user's kernels on OpenCL: programs built from the user's OpenCL C source once per
//! device (with the program build code of [`super::program`]; a failed build is not kept, and
//! its log is in the error), kernels created once per program and name, launched with the one
//! helper of [`super::launch`] on the stream's command queue.
//!
//! Programs are built with `-cl-kernel-arg-info`, so that each kernel's parameters (address
//! space, `const`, type name) can be checked against a launch's arguments.

use std::collections::HashMap;
use std::sync::Arc;

use opencl3::device::Device as ClDeviceHandle;
use opencl3::error_codes::ClError;
use opencl3::kernel::{
    Kernel, CL_KERNEL_ARG_ADDRESS_CONSTANT, CL_KERNEL_ARG_ADDRESS_GLOBAL,
    CL_KERNEL_ARG_ADDRESS_LOCAL, CL_KERNEL_ARG_TYPE_CONST,
};
use parking_lot::Mutex;

use super::error::backend_error;
use super::handle::OwnedProgram;
use super::launch::{Arg, Grid as ClGrid, Slot};
use super::program::compile_program;
use super::{ClDevice, ClStream};
use crate::backend::cache::BuildMap;
use crate::backend::user::{opencl_type_size, Grid, GridLimits, KernelParam, ScalarType};
use crate::error::{Error, Result};

/// The option every program of the user is built with, so that arguments can be checked.
const ARG_INFO: &str = "-cl-kernel-arg-info";

/// A program built from the user's source, and the kernels made from it so far.
struct UserProgram {
    kernels: Mutex<HashMap<String, Arc<ClUserKernel>>>,
    program: Arc<OwnedProgram>,
}

/// The programs of the user's kernels on one device, by source and build options (shared by
/// the handles of one device, as the built-in programs are).
#[derive(Default)]
pub(crate) struct UserPrograms {
    programs: BuildMap<(Arc<str>, Arc<str>), UserProgram>,
}

/// One kernel of the user on one device.
pub(crate) struct ClUserKernel {
    slot: Slot,
    params: Vec<KernelParam>,
    limits: GridLimits,
    // Declared last: dropped after the kernel made from it.
    _program: Arc<OwnedProgram>,
}

impl ClUserKernel {
    /// The kernel's parameters, from the program's argument information.
    pub(crate) fn params(&self) -> &[KernelParam] {
        &self.params
    }

    /// What the kernel's device launches at most.
    pub(crate) fn limits(&self) -> GridLimits {
        self.limits
    }

    /// The most threads per block (work-items per work-group) the compiled kernel runs.
    pub(crate) fn max_threads(&self) -> u64 {
        self.slot.max_work_group as u64
    }
}

impl UserPrograms {
    /// Kernel `name` of `source` built with `options` for `dev`: built on first use, then
    /// shared by every later call with the same source and options.
    ///
    /// # Errors
    /// [`Error::KernelBuild`] with the build log when the program does not build or has no
    /// kernel `name`; a backend error otherwise.
    pub(crate) fn kernel(
        &self,
        dev: &ClDevice,
        name: &str,
        source: &Arc<str>,
        options: &Arc<str>,
    ) -> Result<Arc<ClUserKernel>> {
        let once = self.programs.slot((source.clone(), options.clone()));
        let program = once.get_or_build(|| {
            let opts = format!("{options} {ARG_INFO}");
            let program = compile_program(dev, source, opts.trim()).map_err(|(e, log)| {
                Error::KernelBuild {
                    kernel: name.to_string(),
                    device: dev.label().to_string(),
                    reason: e.to_string(),
                    log,
                }
            })?;
            Ok(UserProgram {
                kernels: Mutex::default(),
                program: Arc::new(program),
            })
        })?;
        let mut kernels = program.kernels.lock();
        if let Some(k) = kernels.get(name) {
            return Ok(k.clone());
        }
        let slot = Slot::new(
            &program.program,
            dev.device_id(),
            name.to_string(),
            dev.label(),
        )
        .map_err(|e| Error::KernelBuild {
            kernel: name.to_string(),
            device: dev.label().to_string(),
            reason: format!("the program has no kernel of that name ({e})"),
            log: String::new(),
        })?;
        let limits = grid_limits(dev)?;
        let params = slot
            .with_kernel(|k| params_of(k, limits.address_bits))
            .map_err(|e| Error::KernelBuild {
                kernel: name.to_string(),
                device: dev.label().to_string(),
                reason: e,
                log: String::new(),
            })?;
        let k = Arc::new(ClUserKernel {
            slot,
            params,
            limits,
            _program: program.program.clone(),
        });
        kernels.insert(name.to_string(), k.clone());
        Ok(k)
    }
}

/// What `dev` launches at most, as it reports it.
fn grid_limits(dev: &ClDevice) -> Result<GridLimits> {
    let label = dev.label();
    let info = ClDeviceHandle::new(dev.device_id());
    let query = |what| move |ClError(c)| backend_error(label, what, c);
    let address_bits = info
        .address_bits()
        .map_err(query("clGetDeviceInfo(ADDRESS_BITS)"))?;
    let sizes = info
        .max_work_item_sizes()
        .map_err(query("clGetDeviceInfo(MAX_WORK_ITEM_SIZES)"))?;
    let per_block = info
        .max_work_group_size()
        .map_err(query("clGetDeviceInfo(MAX_WORK_GROUP_SIZE)"))?;
    // A device reports at least three sizes; one that reports fewer launches 1 along the rest.
    let mut threads = [1u64; 3];
    for (t, &s) in threads.iter_mut().zip(&sizes) {
        *t = s as u64;
    }
    Ok(GridLimits {
        address_bits,
        threads,
        blocks: [u64::MAX; 3],
        per_block: per_block as u64,
    })
}

/// The parameters of `k` from its argument information, on a device of `address_bits`-bit
/// addresses (the size of a `size_t` parameter).
fn params_of(k: &Kernel, address_bits: u32) -> std::result::Result<Vec<KernelParam>, String> {
    let n = k
        .num_args()
        .map_err(|e| format!("clGetKernelInfo(NUM_ARGS): {e}"))?;
    (0..n)
        .map(|i| {
            let info = |e| format!("clGetKernelArgInfo of argument {i}: {e}");
            let space = k.get_arg_address_qualifier(i).map_err(info)?;
            Ok(match space {
                CL_KERNEL_ARG_ADDRESS_GLOBAL | CL_KERNEL_ARG_ADDRESS_CONSTANT => {
                    let quals = k.get_arg_type_qualifier(i).map_err(info)?;
                    KernelParam::Buffer {
                        read_only: space == CL_KERNEL_ARG_ADDRESS_CONSTANT
                            || quals & u64::from(CL_KERNEL_ARG_TYPE_CONST) != 0,
                    }
                }
                CL_KERNEL_ARG_ADDRESS_LOCAL => KernelParam::Local,
                _ => {
                    let name = k.get_arg_type_name(i).map_err(info)?;
                    let name = name.trim_end_matches('\0').trim().to_string();
                    match ScalarType::from_c_name(&name) {
                        Some(t) => KernelParam::Scalar(t),
                        None => match opencl_type_size(&name, address_bits) {
                            Some(size) => KernelParam::Bytes {
                                type_name: name,
                                size,
                            },
                            None => KernelParam::Other(name),
                        },
                    }
                }
            })
        })
        .collect()
}

impl ClDevice {
    /// Kernel `name` of the user's `source`, built with `options` (see
    /// [`UserPrograms::kernel`]).
    ///
    /// # Errors
    /// As [`UserPrograms::kernel`].
    pub(crate) fn user_kernel(
        &self,
        name: &str,
        source: &Arc<str>,
        options: &Arc<str>,
    ) -> Result<Arc<ClUserKernel>> {
        self.kernel_cache().user.kernel(self, name, source, options)
    }

    /// Queues kernel `k` with `args` (in the order and of the kinds of its parameters, checked
    /// by the caller against [`ClUserKernel::params`]) over `grid` (no zero extent, at most
    /// [`ClUserKernel::max_threads`] threads per block) on `s`, and returns at once.
    pub(crate) fn launch_user(
        &self,
        s: &ClStream,
        k: &ClUserKernel,
        grid: &Grid,
        args: &[Arg],
    ) -> Result<()> {
        let dims = grid.dims();
        let mut global = [0usize; 3];
        let mut local = [0usize; 3];
        for d in 0..3 {
            global[d] = grid.blocks[d] as usize * grid.threads[d] as usize;
            local[d] = grid.threads[d] as usize;
        }
        let grid = ClGrid {
            global: &global[..dims],
            local: &local[..dims],
            scratch: None,
        };
        self.run(s, &k.slot, args, grid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::dispatch::RawDevice;
    use crate::testing::opencl_or_skip;

    const SOURCE: &str = "__kernel void twice(const __global float* x, __global float* y, \
                          uint n, float a, __local float* scratch) { \
                          size_t i = get_global_id(0); if (i < n) y[i] = a * x[i]; }";

    #[test]
    fn user_programs_are_built_once_and_report_their_parameters() {
        let Some(dev) = opencl_or_skip("backend::opencl::user::built_once") else {
            return;
        };
        let RawDevice::OpenCl(cl) = &dev.shared.raw else {
            panic!("not an OpenCL device");
        };
        let (src, opts): (Arc<str>, Arc<str>) = (SOURCE.into(), "".into());
        let cache = &cl.kernel_cache().user;
        let a = cache.kernel(cl, "twice", &src, &opts).unwrap();
        let b = cache.kernel(cl, "twice", &src, &opts).unwrap();
        assert!(Arc::ptr_eq(&a, &b), "built once");
        assert_eq!(
            a.params(),
            [
                KernelParam::Buffer { read_only: true },
                KernelParam::Buffer { read_only: false },
                KernelParam::Scalar(ScalarType::U32),
                KernelParam::Scalar(ScalarType::F32),
                KernelParam::Local,
            ]
        );
        assert!(a.max_threads() >= 1);
        let limits = a.limits();
        assert!(
            limits.address_bits == 32 || limits.address_bits == 64,
            "{limits:?}"
        );
        assert!(
            limits.per_block >= a.max_threads() && limits.threads[0] >= 1,
            "{limits:?}"
        );
        // Another name of the same program: the program is not built again.
        let e = cache.kernel(cl, "missing", &src, &opts).err().unwrap();
        assert!(
            matches!(&e, Error::KernelBuild { kernel, reason, .. }
                if kernel == "missing" && reason.contains("no kernel of that name")),
            "{e}"
        );
    }

    #[test]
    fn a_build_failure_carries_the_log_and_is_not_kept() {
        let Some(dev) = opencl_or_skip("backend::opencl::user::build_failure") else {
            return;
        };
        let RawDevice::OpenCl(cl) = &dev.shared.raw else {
            panic!("not an OpenCL device");
        };
        let src: Arc<str> = "__kernel void broken(__global float* x) { x[0] = undeclared; }".into();
        let opts: Arc<str> = "-D UNUSED=1".into();
        for _ in 0..2 {
            let e = cl
                .kernel_cache()
                .user
                .kernel(cl, "broken", &src, &opts)
                .err()
                .unwrap();
            match &e {
                Error::KernelBuild {
                    kernel,
                    device,
                    reason,
                    log,
                } => {
                    assert_eq!((kernel.as_str(), device.as_str()), ("broken", dev.label()));
                    assert!(reason.contains("clBuildProgram"), "{reason}");
                    assert!(log.contains("undeclared"), "{log}");
                }
                other => panic!("expected KernelBuild, got {other}"),
            }
        }
    }
}
