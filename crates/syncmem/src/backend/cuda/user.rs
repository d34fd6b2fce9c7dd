//! The user's kernels on CUDA: CUDA C source compiled by NVRTC once per process (with the
//! compile code of [`super::program`]; the compile log is in the error), the module loaded
//! once per device and kernel, launched with the one helper of [`super::launch`] on the
//! stream. A kernel must be declared `extern "C"` (its PTX entry is its name).
//!
//! The parameters are read from the PTX's `.entry` (NVRTC writes one `.param` per parameter):
//! `.f32`, `.f64` are `float`, `double`; a 32-bit integer is `.u32` or `.s32` whatever its
//! signedness; a pointer is a 64-bit word, as is a 64-bit integer.
//!
//! The CUDA C is compiled by NVRTC in CI; the launch path has run on a GPU by hand (the user
//! kernel tests on `cuda:0`, see the backend's status).

use std::sync::{Arc, LazyLock};

use cudarc::driver::{sys, CudaContext, CudaFunction, LaunchConfig};
use cudarc::nvrtc::Ptx;

use super::error::driver_error;
use super::launch::Arg;
use super::program::{compile, load_module};
use super::{CuDevice, CuStream};
use crate::backend::cache::BuildMap;
use crate::backend::user::{Grid, GridLimits, KernelParam, ScalarType};
use crate::error::{Error, Result};

/// The PTX of each CUDA C source of the user, compiled once per process.
static USER_PTX: LazyLock<BuildMap<Arc<str>, Ptx>> = LazyLock::new(BuildMap::default);

/// The PTX of `source`, compiled once per process; `name` is the kernel that needs it (for
/// the error).
///
/// # Errors
/// [`Error::KernelBuild`] with NVRTC's log when the source does not compile;
/// [`Error::RuntimeUnavailable`] without `libnvrtc`.
pub(crate) fn user_ptx(name: &str, source: &Arc<str>) -> Result<Ptx> {
    let once = USER_PTX.slot(source.clone());
    compile(source, &once).map_err(|e| match e {
        Error::Backend { op, message, .. } => Error::KernelBuild {
            kernel: name.to_string(),
            device: "cuda (NVRTC)".to_string(),
            reason: op.to_string(),
            log: message,
        },
        other => other,
    })
}

/// The parameters of entry `name` in PTX text, `None` when the PTX has no such entry.
pub(crate) fn ptx_params(ptx: &str, name: &str) -> Option<Vec<KernelParam>> {
    let head = format!(".entry {name}(");
    let start = ptx.find(&head)? + head.len();
    let end = start + ptx[start..].find(')')?;
    let params = ptx[start..end]
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            let words: Vec<&str> = p.split_whitespace().collect();
            // `.param [.align N] .type [.ptr ...] name[count]`.
            let ty = words
                .iter()
                .skip(1)
                .copied()
                .find(|w| w.starts_with('.') && !matches!(*w, ".align" | ".ptr"))
                .unwrap_or("");
            let count = words.last().and_then(|w| {
                let open = w.find('[')?;
                w[open + 1..].strip_suffix(']')?.parse::<usize>().ok()
            });
            let bytes = |size: usize| KernelParam::Bytes {
                type_name: format!("PTX {ty}[{}]", count.unwrap_or(1)),
                size: size * count.unwrap_or(1),
            };
            match (ty, count) {
                (".f32", None) => KernelParam::Scalar(ScalarType::F32),
                (".f64", None) => KernelParam::Scalar(ScalarType::F64),
                (".u32" | ".s32" | ".b32", None) => KernelParam::Int32,
                (".u64" | ".s64" | ".b64", None) => KernelParam::Word64,
                (".u8" | ".s8" | ".b8", _) => bytes(1),
                (".u16" | ".s16" | ".b16" | ".f16", _) => bytes(2),
                (".u32" | ".s32" | ".b32" | ".f32", Some(_)) => bytes(4),
                (".u64" | ".s64" | ".b64" | ".f64", Some(_)) => bytes(8),
                _ => KernelParam::Other(format!("PTX parameter `{p}`")),
            }
        })
        .collect();
    Some(params)
}

/// What the device of `ctx` launches at most, from its attributes.
fn grid_limits(label: &str, ctx: &CudaContext) -> Result<GridLimits> {
    use sys::CUdevice_attribute as A;
    let get = |a: A| {
        ctx.attribute(a)
            .map(|v| u64::try_from(v).unwrap_or(0))
            .map_err(|e| driver_error(label, "cuDeviceGetAttribute", e))
    };
    Ok(GridLimits {
        address_bits: 64,
        threads: [
            get(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X)?,
            get(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y)?,
            get(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z)?,
        ],
        blocks: [
            get(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X)?,
            get(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y)?,
            get(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z)?,
        ],
        per_block: get(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
    })
}

/// One kernel of the user, loaded on one device.
pub(crate) struct CuUserKernel {
    name: String,
    func: CudaFunction,
    params: Vec<KernelParam>,
    max_threads: u64,
    limits: GridLimits,
}

impl CuUserKernel {
    /// The kernel's parameters, from its PTX.
    pub(crate) fn params(&self) -> &[KernelParam] {
        &self.params
    }

    /// What the kernel's device launches at most.
    pub(crate) fn limits(&self) -> GridLimits {
        self.limits
    }

    /// The most threads per block the loaded kernel runs.
    pub(crate) fn max_threads(&self) -> u64 {
        self.max_threads
    }
}

/// The loaded kernels of the user on one device, by source and name.
#[derive(Default)]
pub(crate) struct UserModules {
    kernels: BuildMap<(Arc<str>, String), CuUserKernel>,
}

impl UserModules {
    /// Kernel `name` of `source` on `dev`: compiled (once per process) and loaded on first
    /// use.
    ///
    /// # Errors
    /// As [`user_ptx`]; [`Error::KernelBuild`] when the PTX has no entry `name`; a driver
    /// error loading the module.
    pub(crate) fn kernel(
        &self,
        dev: &CuDevice,
        name: &str,
        source: &Arc<str>,
    ) -> Result<Arc<CuUserKernel>> {
        let once = self.kernels.slot((source.clone(), name.to_string()));
        once.get_or_build(|| {
            let ptx = user_ptx(name, source)?;
            let params = ptx_params(&ptx.to_src(), name).ok_or_else(|| Error::KernelBuild {
                kernel: name.to_string(),
                device: dev.label().to_string(),
                reason: "the PTX has no entry of that name (declare the kernel extern \"C\")"
                    .to_string(),
                log: String::new(),
            })?;
            let label = dev.label();
            let limits = grid_limits(label, dev.context())?;
            let what = format!("CUDA kernel {name}");
            load_module(label, &what, dev.context(), ptx, |module| {
                let func = module
                    .load_function(name)
                    .map_err(|e| driver_error(label, "cuModuleGetFunction", e))?;
                let max = func
                    .max_threads_per_block()
                    .map_err(|e| driver_error(label, "cuFuncGetAttribute", e))?;
                Ok(CuUserKernel {
                    name: name.to_string(),
                    func,
                    params,
                    max_threads: u64::try_from(max).unwrap_or(0),
                    limits,
                })
            })
        })
    }
}

impl CuDevice {
    /// Kernel `name` of the user's `source` (see [`UserModules::kernel`]).
    ///
    /// # Errors
    /// As [`UserModules::kernel`].
    pub(crate) fn user_kernel(&self, name: &str, source: &Arc<str>) -> Result<Arc<CuUserKernel>> {
        self.kernel_cache().user.kernel(self, name, source)
    }

    /// Queues kernel `k` with `args` (in the order and of the kinds of its parameters, checked
    /// by the caller against [`CuUserKernel::params`]) over `grid` (no zero extent, at most
    /// [`CuUserKernel::max_threads`] threads per block) on `s`, and returns at once.
    pub(crate) fn launch_user(
        &self,
        s: &CuStream,
        k: &CuUserKernel,
        grid: &Grid,
        args: &[Arg],
    ) -> Result<()> {
        let [bx, by, bz] = grid.blocks;
        let [tx, ty, tz] = grid.threads;
        let cfg = LaunchConfig {
            grid_dim: (bx, by, bz),
            block_dim: (tx, ty, tz),
            shared_mem_bytes: 0,
        };
        self.run(s, &k.name, &k.func, args, cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CUDA C of the `custom_operator` example (its `LeakyRelu` and gradient kernels).
    const EXAMPLE: &str =
        include_str!("../../../../syncmem-nn/examples/custom_operator/leaky_relu.cu");

    #[test]
    fn ptx_parameters_are_read_from_the_entry() {
        let ptx = ".visible .entry k(\n\t.param .u64 k_param_0,\n\t.param .u64 .ptr .align 4 \
                   k_param_1,\n\t.param .f32 k_param_2,\n\t.param .u32 k_param_3,\n\t.param .f64 \
                   k_param_4\n)\n{\n}";
        assert_eq!(
            ptx_params(ptx, "k").unwrap(),
            [
                KernelParam::Word64,
                KernelParam::Word64,
                KernelParam::Scalar(ScalarType::F32),
                KernelParam::Int32,
                KernelParam::Scalar(ScalarType::F64),
            ]
        );
        assert!(ptx_params(ptx, "other").is_none());
        // A char, a float4 and a struct of 12 bytes, by value.
        let ptx = ".entry o(\n\t.param .u8 o_param_0,\n\t.param .align 16 .b8 o_param_1[16],\n\t\
                   .param .align 4 .b8 o_param_2[12]\n)";
        let sizes: Vec<usize> = ptx_params(ptx, "o")
            .unwrap()
            .iter()
            .map(|p| match p {
                KernelParam::Bytes { size, .. } => *size,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(sizes, [1, 16, 12]);
        assert_eq!(ptx_params(".entry e(\n)\n{", "e").unwrap(), []);
    }

    #[test]
    fn user_kernel_source_compiles_with_nvrtc() {
        if !crate::testing::nvrtc_or_skip("backend::cuda::user_kernel_source_compiles_with_nvrtc") {
            return;
        }
        let source: Arc<str> = EXAMPLE.into();
        let ptx = user_ptx("leaky_relu", &source)
            .unwrap_or_else(|e| panic!("{e}"))
            .to_src();
        let (x, y, n, alpha) = (
            KernelParam::Word64,
            KernelParam::Word64,
            KernelParam::Int32,
            KernelParam::Scalar(ScalarType::F32),
        );
        assert_eq!(
            ptx_params(&ptx, "leaky_relu").unwrap(),
            [x.clone(), y.clone(), n.clone(), alpha.clone()]
        );
        assert_eq!(
            ptx_params(&ptx, "leaky_relu_grad").unwrap(),
            [x.clone(), y.clone(), KernelParam::Word64, n, alpha]
        );
        // A compile error is a build error with NVRTC's log, and is not kept.
        let broken: Arc<str> = "extern \"C\" __global__ void b(float* x) { x[0] = nope; }".into();
        for _ in 0..2 {
            match user_ptx("b", &broken) {
                Err(Error::KernelBuild { kernel, log, .. }) => {
                    assert_eq!(kernel, "b");
                    assert!(log.contains("nope"), "{log}");
                }
                other => panic!("expected KernelBuild, got {:?}", other.map(|p| p.to_src())),
            }
        }
    }
}
