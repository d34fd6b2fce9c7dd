//! syncmem-nn: operators, their fusion and a training loop, built on [`syncmem`]'s public API
//! alone (the compiler proves that a user can write what this crate does).
//!
//! ```
//! use syncmem::Device;
//! use syncmem_nn::mlp::Dataset;
//! use syncmem_nn::train::{TrainConfig, Trainer};
//!
//! # fn main() -> syncmem::Result<()> {
//! // "opencl:0" or "cuda:0" when present; "cpu" runs the same code paths everywhere.
//! let dev = Device::first_accelerator().unwrap_or_else(Device::cpu);
//! let data = Dataset::spirals(300, 3, 0.2, 0);
//! let cfg = TrainConfig::default().with_epochs(2);
//! let mut trainer = Trainer::new(&dev, &data, &cfg)?; // registers the operators
//! for step in 0..trainer.batch_count() {
//!     let (loss, _accuracy) = trainer.step(step)?;
//!     assert!(loss.is_finite());
//! }
//! # Ok(())
//! # }
//! ```
//!
//! | module | role |
//! |---|---|
//! | [`ops`] | the built-in operators (`FC`, `Relu`, `SoftmaxWithLoss`, `Accuracy`, the updates `SGD`, `MomentumSGD` and `Adam`, the fills, the gradients), registered in syncmem's registry by [`register_operators`] |
//! | [`fuse`] | operator fusion, a [`NetRewrite`](syncmem::net::NetRewrite) of nets at build time: `FC` + `Relu`, `FCGradient` + `ReluGradient`, consecutive updates, the accuracy and gradient inside `SoftmaxWithLoss`, bias gradients inside the `dW` GEMM |
//! | [`mlp`] | a multilayer perceptron as nets of operators, and datasets |
//! | [`optimizer`] | the update of an MLP's parameters: SGD, momentum or Adam, and the state they keep |
//! | [`train`] | the training loop on one device or data-parallel on several |
//!
//! The operators launch the library's kernels through [`syncmem::kernels`] (`gemm` with its
//! fused epilogues, `relu`, `softmax_loss`, ...), the same door a user's operator takes
//! (see syncmem's `custom_operator` example).

#![warn(missing_docs)]
// Two calls are unsafe: the launch of the update operators' own kernels (`ops/optim/`), which
// syncmem cannot check, and, with the `mpi` feature, the in-place all-reduce the `mpi` crate
// does not wrap (`train/collective/mpi.rs`); everything else is safe code.
#![deny(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod fuse;
pub mod mlp;
pub mod ops;
pub mod optimizer;
pub mod train;

pub use ops::register_operators;
