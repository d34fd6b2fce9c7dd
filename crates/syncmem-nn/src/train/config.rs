//! The `with_*` builder of [`TrainConfig`] (a `#[non_exhaustive]` struct: code outside the
//! crate makes one from [`TrainConfig::default`]).

use super::{Optimizer, TrainConfig};

impl TrainConfig {
    /// The same settings with these hidden layer widths.
    #[must_use]
    pub fn with_hidden(mut self, hidden: Vec<usize>) -> Self {
        self.hidden = hidden;
        self
    }

    /// The same settings with this many epochs.
    #[must_use]
    pub fn with_epochs(mut self, epochs: usize) -> Self {
        self.epochs = epochs;
        self
    }

    /// The same settings with this batch size.
    #[must_use]
    pub fn with_batch(mut self, batch: usize) -> Self {
        self.batch = batch;
        self
    }

    /// The same settings with this learning rate.
    #[must_use]
    pub fn with_lr(mut self, lr: f32) -> Self {
        self.lr = lr;
        self
    }

    /// The same settings with this optimizer, at its default learning rate
    /// ([`Optimizer::default_lr`]: 0.5 for SGD, 0.05 for momentum, 0.01 for Adam): the rates
    /// differ by an order of magnitude between optimizers, so a rate chosen for another one
    /// is not kept. Call [`TrainConfig::with_lr`] after this one for another rate.
    ///
    /// ```
    /// use syncmem_nn::train::{Optimizer, TrainConfig};
    ///
    /// let cfg = TrainConfig::default().with_optimizer(Optimizer::Adam);
    /// assert_eq!((cfg.optimizer, cfg.lr), (Optimizer::Adam, 0.01));
    /// let cfg = cfg.with_lr(0.003);
    /// assert_eq!(cfg.lr, 0.003);
    /// ```
    #[must_use]
    pub fn with_optimizer(mut self, optimizer: Optimizer) -> Self {
        self.optimizer = optimizer;
        self.lr = optimizer.default_lr();
        self
    }

    /// The same settings with this seed.
    #[must_use]
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// The same settings with memory planning on or off.
    #[must_use]
    pub fn with_plan(mut self, plan: bool) -> Self {
        self.plan = plan;
        self
    }

    /// The same settings with fusion on or off.
    #[must_use]
    pub fn with_fuse(mut self, fuse: bool) -> Self {
        self.fuse = fuse;
        self
    }

    /// The same settings with this bucket size in bytes (distributed training).
    #[must_use]
    pub fn with_bucket_bytes(mut self, bytes: usize) -> Self {
        self.bucket_bytes = bytes;
        self
    }

    /// The same settings with the overlap of sums and backward on or off (distributed
    /// training).
    #[must_use]
    pub fn with_overlap(mut self, overlap: bool) -> Self {
        self.overlap = overlap;
        self
    }

    /// The same settings with the optimizer on the host or not (see
    /// [`super::offload`]).
    #[must_use]
    pub fn with_offload_optimizer(mut self, offload: bool) -> Self {
        self.offload_optimizer = offload;
        self
    }
}
