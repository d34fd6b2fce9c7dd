//! Compiling and loading the CUDA kernels: each CUDA C source is compiled to PTX by NVRTC
//! **once per process** (`cudarc::nvrtc::compile_ptx`, no options: NVRTC's default virtual
//! architecture, which the driver JIT-compiles for the actual device), and each PTX is loaded
//! **once per device** (`CudaContext::load_module`, then `load_function` per kernel). A failure
//! (no NVRTC, a compile error, a module the driver rejects) is not kept: the next call tries
//! again.
//!
//! - The PTX carries the ISA version of the NVRTC that made it (NVRTC 12.9 writes
//!   `.version 8.8`, target `sm_52`). A driver older than that NVRTC cannot JIT it and rejects
//!   the module with `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`: an [`Error::Backend`] naming
//!   `cuModuleLoadData`, not a panic. Use an NVRTC no newer than the driver.
//! - `libnvrtc` is probed first (`cudarc::nvrtc::sys::is_culib_present`): cudarc's dynamic
//!   loader panics when the library is absent, so absence becomes [`Error::RuntimeUnavailable`]
//!   before any NVRTC call. Compilation and module loading also run under `catch_unwind` as a
//!   second line of defence (cudarc `unwrap`s inside its compile-error path, and panics on a
//!   missing symbol of an old library).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, LazyLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::{self, Ptx};

use super::error::{driver_error, panic_text};
use super::source::{BLOCK, GEMM_THREADS, MATH, OPS};
use super::CuDevice;
use crate::backend::cache::{BuildMap, BuildOnce};
use crate::dtype::ScalarKind;
use crate::error::{BackendKind, Error, Result};

/// The reason given when `libnvrtc` cannot be loaded.
const NO_NVRTC: &str = "CUDA kernels need the NVRTC library (libnvrtc), which was not found";

/// The PTX of [`OPS`], compiled once per process (device-independent).
static OPS_PTX: BuildOnce<Ptx> = BuildOnce::new();
/// The PTX of [`MATH`], compiled once per process.
static MATH_PTX: BuildOnce<Ptx> = BuildOnce::new();

/// The operator kernels, in the order of the fields of [`OpKernels`].
pub(super) const OP_KERNELS: [&str; 8] = [
    "sm_gemm",
    "sm_col_sum",
    "sm_relu",
    "sm_relu_grad",
    "sm_fill",
    "sm_softmax_loss",
    "sm_softmax_loss_grad",
    "sm_accuracy",
];

/// The math kernels of one element type, without their `_f32` / `_f64` suffix.
#[cfg(test)]
pub(super) const MATH_KERNELS: [&str; 5] = [
    "sm_axpy",
    "sm_axpy_multi",
    "sm_scale",
    "sm_asum",
    "sm_sumsq",
];

/// The operator kernels of one device (the functions keep their module alive).
pub(super) struct OpKernels {
    pub(super) gemm: CudaFunction,
    pub(super) col_sum: CudaFunction,
    pub(super) relu: CudaFunction,
    pub(super) relu_grad: CudaFunction,
    pub(super) fill: CudaFunction,
    pub(super) softmax_loss: CudaFunction,
    pub(super) softmax_loss_grad: CudaFunction,
    pub(super) accuracy: CudaFunction,
}

/// The math kernels of one element type.
pub(super) struct TypedKernels {
    pub(super) axpy: CudaFunction,
    pub(super) axpy_multi: CudaFunction,
    pub(super) scale: CudaFunction,
    pub(super) asum: CudaFunction,
    pub(super) sumsq: CudaFunction,
}

/// The math kernels of one device.
pub(super) struct MathKernels {
    f32: TypedKernels,
    f64: TypedKernels,
}

impl MathKernels {
    pub(super) fn typed(&self, kind: ScalarKind) -> &TypedKernels {
        match kind {
            ScalarKind::F64 => &self.f64,
            _ => &self.f32,
        }
    }
}

/// The loaded kernels of one CUDA device, built on first use (shared by the handles of one
/// device).
#[derive(Default)]
pub(crate) struct KernelCache {
    ops: BuildOnce<OpKernels>,
    math: BuildOnce<MathKernels>,
    /// The user's kernels (see [`super::user`]).
    pub(super) user: super::user::UserModules,
    /// The GEMMs with a user's epilogue, by prelude ([`crate::backend::epilogue`]).
    epilogues: BuildMap<String, CudaFunction>,
}

impl KernelCache {
    /// The operator kernels of `dev`.
    pub(super) fn ops(&self, dev: &CuDevice) -> Result<Arc<OpKernels>> {
        self.ops.get_or_build(|| build_ops(dev))
    }

    /// The GEMM of `dev` with a user's epilogue: the operator source after `prelude`,
    /// compiled once per process and loaded once per device.
    pub(super) fn gemm_with_epilogue(
        &self,
        dev: &CuDevice,
        prelude: &str,
    ) -> Result<Arc<CudaFunction>> {
        self.epilogues.slot_of(prelude).get_or_build(|| {
            let label = dev.label();
            let ptx = epilogue_ptx(prelude)?;
            load_module(
                label,
                "CUDA GEMM with an epilogue",
                dev.context(),
                ptx,
                |module| {
                    let func = module
                        .load_function("sm_gemm")
                        .map_err(|e| driver_error(label, "cuModuleGetFunction", e))?;
                    let max = func
                        .max_threads_per_block()
                        .map_err(|e| driver_error(label, "cuFuncGetAttribute", e))?;
                    check_threads(label, "sm_gemm", max, threads_of("sm_gemm"))?;
                    Ok(func)
                },
            )
        })
    }

    /// The math kernels of `dev`.
    pub(super) fn math(&self, dev: &CuDevice) -> Result<Arc<MathKernels>> {
        self.math.get_or_build(|| build_math(dev))
    }
}

/// Compiles `source` to PTX once per process (kept in `cache`).
pub(super) fn compile(source: &str, cache: &BuildOnce<Ptx>) -> Result<Ptx> {
    let ptx = cache.get_or_build(|| {
        // SAFETY: `is_culib_present` only tries to open the shared library with `libloading`
        // (and closes it again); it calls no NVRTC function and has no preconditions.
        if !unsafe { nvrtc::sys::is_culib_present() } {
            return Err(Error::RuntimeUnavailable {
                backend: BackendKind::Cuda,
                reason: NO_NVRTC.to_string(),
            });
        }
        let compiled = catch_unwind(|| nvrtc::compile_ptx(source)).map_err(|payload| {
            Error::RuntimeUnavailable {
                backend: BackendKind::Cuda,
                reason: format!(
                    "NVRTC could not be used (cudarc panicked: {})",
                    panic_text(payload.as_ref())
                ),
            }
        })?;
        compiled.map_err(|e| Error::Backend {
            backend: BackendKind::Cuda,
            device: "cuda".to_string(),
            op: "nvrtcCompileProgram",
            code: 0,
            message: match e {
                nvrtc::CompileError::CompileError { nvrtc, log, .. } => {
                    format!("{nvrtc:?}; compile log: {}", log.to_string_lossy().trim())
                }
                other => format!("{other:?}"),
            },
        })
    })?;
    Ok((*ptx).clone())
}

/// The PTX of the operator kernels.
pub(super) fn ops_ptx() -> Result<Ptx> {
    compile(OPS, &OPS_PTX)
}

/// The PTX of the operator kernels after a user's epilogue `prelude`, once per prelude.
pub(super) fn epilogue_ptx(prelude: &str) -> Result<Ptx> {
    static PTX: LazyLock<BuildMap<String, Ptx>> = LazyLock::new(BuildMap::default);
    compile(&format!("{prelude}{OPS}"), &PTX.slot_of(prelude))
}

/// The PTX of the math kernels.
pub(super) fn math_ptx() -> Result<Ptx> {
    compile(MATH, &MATH_PTX)
}

/// Loads `ptx` into `ctx` and takes what `get` needs from the module, turning a panic inside
/// cudarc into an error.
pub(super) fn load_module<T>(
    label: &str,
    what: &str,
    ctx: &Arc<CudaContext>,
    ptx: Ptx,
    get: impl FnOnce(&Arc<CudaModule>) -> Result<T>,
) -> Result<T> {
    let load = || -> Result<T> {
        let module = ctx
            .load_module(ptx)
            .map_err(|e| driver_error(label, "cuModuleLoadData", e))?;
        get(&module)
    };
    catch_unwind(AssertUnwindSafe(load)).unwrap_or_else(|payload| {
        Err(Error::RuntimeUnavailable {
            backend: BackendKind::Cuda,
            reason: format!(
                "loading the {what} on {label} failed (cudarc panicked: {})",
                panic_text(payload.as_ref())
            ),
        })
    })
}

/// The threads per block every launch of operator kernel `name` uses.
pub(super) fn threads_of(name: &str) -> u32 {
    match name {
        "sm_gemm" => GEMM_THREADS.0 * GEMM_THREADS.1,
        _ => BLOCK,
    }
}

/// Fails when the compiled kernel `name` cannot run the `needed` threads per block its launches
/// use (`max` is the driver's `CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK`).
pub(super) fn check_threads(label: &str, name: &str, max: i32, needed: u32) -> Result<()> {
    if i64::from(max) >= i64::from(needed) {
        return Ok(());
    }
    Err(Error::Unsupported {
        device: label.to_string(),
        what: format!(
            "CUDA kernel {name} runs at most {max} threads per block on this device; its \
             launches use {needed}"
        ),
    })
}

fn build_ops(dev: &CuDevice) -> Result<OpKernels> {
    let label = dev.label();
    let ptx = ops_ptx()?;
    load_module(
        label,
        "CUDA operator kernels",
        dev.context(),
        ptx,
        |module| {
            let f = |name: &'static str| -> Result<CudaFunction> {
                let func = module
                    .load_function(name)
                    .map_err(|e| driver_error(label, "cuModuleGetFunction", e))?;
                let max = func
                    .max_threads_per_block()
                    .map_err(|e| driver_error(label, "cuFuncGetAttribute", e))?;
                check_threads(label, name, max, threads_of(name))?;
                Ok(func)
            };
            let [gemm, col_sum, relu, relu_grad, fill, softmax_loss, softmax_loss_grad, accuracy] =
                OP_KERNELS.map(f);
            Ok(OpKernels {
                gemm: gemm?,
                col_sum: col_sum?,
                relu: relu?,
                relu_grad: relu_grad?,
                fill: fill?,
                softmax_loss: softmax_loss?,
                softmax_loss_grad: softmax_loss_grad?,
                accuracy: accuracy?,
            })
        },
    )
}

fn build_math(dev: &CuDevice) -> Result<MathKernels> {
    let label = dev.label();
    let ptx = math_ptx()?;
    load_module(label, "CUDA math kernels", dev.context(), ptx, |module| {
        let f = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| driver_error(label, "cuModuleGetFunction", e))
        };
        let typed = |suf: &str| -> Result<TypedKernels> {
            Ok(TypedKernels {
                axpy: f(&format!("sm_axpy_{suf}"))?,
                axpy_multi: f(&format!("sm_axpy_multi_{suf}"))?,
                scale: f(&format!("sm_scale_{suf}"))?,
                asum: f(&format!("sm_asum_{suf}"))?,
                sumsq: f(&format!("sm_sumsq_{suf}"))?,
            })
        };
        Ok(MathKernels {
            f32: typed("f32")?,
            f64: typed("f64")?,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_nvrtc_is_an_error_not_a_panic() {
        // SAFETY: only tries to open the shared library; see `compile`.
        if unsafe { nvrtc::sys::is_culib_present() } {
            eprintln!(
                "SKIPPED backend::cuda::program::missing_nvrtc_is_an_error_not_a_panic: \
                 libnvrtc is present"
            );
            return;
        }
        for _ in 0..2 {
            for ptx in [ops_ptx(), math_ptx()] {
                match ptx {
                    Err(Error::RuntimeUnavailable {
                        backend: BackendKind::Cuda,
                        reason,
                    }) => assert_eq!(reason, NO_NVRTC),
                    other => panic!("expected RuntimeUnavailable, got {other:?}"),
                }
            }
        }
    }
}
