//! Shared helpers for the integration tests.
#![allow(dead_code)]

/// Instantiates each `fn name(dev: &Device)` once per backend: `cpu::name` always,
/// `opencl::name` (skips with a message unless `SYNCMEM_REQUIRE_OPENCL=1`), `cuda::name`
/// (skips with a message where no CUDA driver is present).
#[macro_export]
macro_rules! per_device {
    ($($name:ident),* $(,)?) => {
        mod cpu {
            $( #[test] fn $name() { super::$name(&syncmem::Device::cpu()); } )*
        }
        #[cfg(feature = "opencl")]
        mod opencl {
            $( #[test] fn $name() {
                if let Some(d) = syncmem::testing::opencl_or_skip(concat!("opencl::", stringify!($name))) {
                    super::$name(&d);
                }
            } )*
        }
        #[cfg(feature = "cuda")]
        mod cuda {
            $( #[test] fn $name() {
                if let Some(d) = syncmem::testing::cuda_or_skip(concat!("cuda::", stringify!($name))) {
                    super::$name(&d);
                }
            } )*
        }
    };
}
