//! [`TrainConfig`] and its `with_*` builder (a `#[non_exhaustive]` struct: code outside the
//! crate makes one from [`TrainConfig::default`]).

use super::Optimizer;
#[cfg(doc)]
use super::{offload, Trainer};

/// Settings of a training run: [`TrainConfig::default`] and the `with_*` methods make one.
///
/// ```
/// use syncmem_nn::train::TrainConfig;
///
/// let cfg = TrainConfig::default().with_hidden(vec![32, 32]).with_epochs(3);
/// assert_eq!((cfg.hidden.as_slice(), cfg.epochs, cfg.batch), (&[32, 32][..], 3, 64));
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct TrainConfig {
    /// Hidden layer widths.
    pub hidden: Vec<usize>,
    /// Passes over the data.
    pub epochs: usize,
    /// Samples per step (the last batch may be smaller).
    pub batch: usize,
    /// Learning rate of the update ([`TrainConfig::with_optimizer`] sets the optimizer's
    /// default).
    pub lr: f32,
    /// How the parameters are updated: SGD, momentum or Adam (see [`crate::optimizer`]).
    pub optimizer: Optimizer,
    /// Seed of the data order and the initial weights.
    pub seed: u64,
    /// Plan memory (intermediate blobs share buffers).
    pub plan: bool,
    /// Fuse each FC + Relu into one FC that applies the ReLU (see [`crate::fuse`]).
    pub fuse: bool,
    /// Distributed training ([`Trainer::distributed`]): the most bytes of gradients summed
    /// over the ranks in one collective call (a larger gradient has a call of its own).
    pub bucket_bytes: usize,
    /// Distributed training: sum each bucket as soon as backward has written it, while
    /// backward goes on (else after backward).
    pub overlap: bool,
    /// Keep the optimizer's state on the host and update the parameters there (see
    /// [`offload`]); single-device training only.
    pub offload_optimizer: bool,
    /// Keep the parameters on the host between steps: each step brings them to the device
    /// ahead of the forward pass (queued on a copy stream) and writes them back after the
    /// update, freeing their device memory (see [`Trainer::step`]); single-device training
    /// only.
    pub offload_parameters: bool,
    /// Move the activations that backward reads long after forward wrote them to the host in
    /// between, as vDNN does: each is copied out after its last forward use (on a copy stream),
    /// its device memory freed one operator later, and brought back one operator ahead of its
    /// backward reader (see [`super::activations`]); the training net then drops dead values
    /// at once and is not memory-planned, whatever [`TrainConfig::plan`] says (the evaluation
    /// net is): fixed shared buffers would keep the room the offloaded values leave. Single-device
    /// training only.
    pub offload_activations: bool,
}

impl Default for TrainConfig {
    /// Two hidden layers of 64, 30 epochs of batches of 64, SGD at learning rate 0.5, seed 0,
    /// planning and fusion on; for distributed training, buckets of 1 MiB, overlapped.
    fn default() -> Self {
        Self {
            hidden: vec![64, 64],
            epochs: 30,
            batch: 64,
            lr: Optimizer::Sgd.default_lr(),
            optimizer: Optimizer::Sgd,
            seed: 0,
            plan: true,
            fuse: true,
            bucket_bytes: 1 << 20,
            overlap: true,
            offload_optimizer: false,
            offload_parameters: false,
            offload_activations: false,
        }
    }
}

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

    /// The same settings with the parameters kept on the host between steps or not (see
    /// [`TrainConfig::offload_parameters`]).
    #[must_use]
    pub fn with_offload_parameters(mut self, offload: bool) -> Self {
        self.offload_parameters = offload;
        self
    }

    /// The same settings with the activations moved to the host between forward and backward
    /// or not (see [`TrainConfig::offload_activations`]).
    #[must_use]
    pub fn with_offload_activations(mut self, offload: bool) -> Self {
        self.offload_activations = offload;
        self
    }
}
