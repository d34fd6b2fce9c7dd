//! Evaluation on a held-out dataset: its batches are uploaded once to the device that holds
//! the parameters, and the eval net (the forward part of the model, on that device) runs on
//! each, as on the training batches. Nothing is trained on them: the parameters, the batch
//! order and the seeded generator are left as they were, so that training gives the same
//! results with or without a held-out set.

use super::{add, feed_batch, parallel, Batch, Trainer};
use crate::mlp::Dataset;
use syncmem::{Error, Result};

/// A held-out dataset on the trainer's first device.
pub(super) struct HeldOut {
    pub(super) batches: Vec<Batch>,
    /// Rows of each batch.
    sizes: Vec<usize>,
    samples: usize,
}

impl Trainer {
    /// Sets the held-out dataset that [`Trainer::evaluate_held_out`] evaluates, replacing any
    /// earlier one: its samples are cut into batches of the training batch size, in order,
    /// and uploaded once to the device that holds the parameters (the first device of
    /// data-parallel training). The uploads count as setup copies ([`super::Transfers::setup`]).
    ///
    /// # Errors
    /// [`Error::InvalidShape`] when `data` has another number of features than the model's
    /// inputs, or a label the model has no class for; device errors from the upload.
    pub fn set_held_out(&mut self, data: &Dataset) -> Result<()> {
        let widths = &self.mlp.widths;
        let (features, classes) = (widths[0], widths[widths.len() - 1]);
        let bad = |reason: String| Error::InvalidShape {
            what: "held-out data".into(),
            shape: format!("[{}, {}]", data.len(), data.features),
            reason,
        };
        if data.features != features {
            return Err(bad(format!(
                "{} features per sample, the model takes {features}",
                data.features
            )));
        }
        if data.classes > classes {
            return Err(bad(format!(
                "labels up to {} ({} classes), the model has {classes} classes",
                data.classes - 1,
                data.classes
            )));
        }
        let batch = self.sizes.iter().copied().max().unwrap_or(1).max(1);
        let rows: Vec<usize> = (0..data.len()).collect();
        self.held_out = None;
        let before = self.copy_totals();
        let mut batches = Vec::new();
        for (i, chunk) in rows.chunks(batch).enumerate() {
            batches.push(parallel::upload(
                chunk,
                data,
                &self.device,
                &format!("held_out{i}"),
            )?);
        }
        self.held_out = Some(HeldOut {
            sizes: batches.iter().map(|b| b.y.numel().unwrap_or(0)).collect(),
            batches,
            samples: data.len(),
        });
        let d = self.copy_totals().since(&before);
        self.transfers.setup = add(self.transfers.setup, d);
        Ok(())
    }

    /// Samples of the held-out dataset (0 without one).
    pub fn held_out_len(&self) -> usize {
        self.held_out.as_ref().map_or(0, |h| h.samples)
    }

    /// Loss and accuracy of the current weights over the held-out dataset
    /// ([`Trainer::set_held_out`]; `None` without one): the eval net on each of its batches,
    /// on the device that holds the parameters. Its copies count as evaluation copies
    /// ([`super::Transfers::eval`]).
    ///
    /// # Errors
    /// The errors of [`syncmem::net::Net::run`].
    pub fn evaluate_held_out(&mut self) -> Result<Option<(f64, f64)>> {
        let Some(h) = &self.held_out else {
            return Ok(None);
        };
        // Not a training step.
        self.device.mark_trace_step(None);
        let before = self.copy_totals();
        // The eval net of the device holding the parameters, in its workspace (the first
        // shard's, when training on several devices).
        let ws = match &self.parallel {
            Some(p) => &*p.shards[0].ws,
            None => &*self.ws,
        };
        let (mut loss, mut acc) = (0.0f64, 0.0f64);
        for (b, &n) in h.batches.iter().zip(&h.sizes) {
            feed_batch(ws, &self.device, b)?;
            self.eval.run(ws)?;
            let (l, a) = super::read_scalars(ws, &self.eval)?;
            loss += f64::from(l) * n as f64;
            acc += f64::from(a) * n as f64;
        }
        let n = h.samples.max(1) as f64;
        let d = self.copy_totals().since(&before);
        self.transfers.eval = add(self.transfers.eval, d);
        Ok(Some((loss / n, acc / n)))
    }
}
