//! Data-parallel training on several devices (see the parent module's docs).

use std::sync::Arc;

use super::{Batch, Trainer};
use crate::mlp::{Dataset, Mlp, MlpNets, ACCURACY, DATA, LABEL, LOSS};
use syncmem::kernels;
use syncmem::net::{Net, NetDef, NetOptions};
use syncmem::Device;
use syncmem::Tensor;
use syncmem::Workspace;
use syncmem::{Error, Result};

/// One device's part of data-parallel training.
pub(super) struct Shard {
    pub(super) device: Device,
    pub(super) ws: Arc<Workspace>,
    pub(super) train: Arc<Net>,
    eval: Arc<Net>,
    /// This shard's rows of each batch (`None`: the batch has none for it).
    pub(super) batches: Vec<Option<Batch>>,
}

/// The shards and the update, when training on several devices.
pub(super) struct Parallel {
    pub(super) shards: Vec<Shard>,
    pub(super) update: Arc<Net>,
    /// `(parameter, gradient)` names, from the update operators (`SGD`, `MomentumSGD`,
    /// `Adam`).
    pub(super) pairs: Vec<(String, String)>,
    /// The rank's part of a distributed job ([`Trainer::distributed`]).
    pub(super) dist: Option<super::distributed::Dist>,
}

impl Parallel {
    /// Weighs the shards' gradients by their `shares` of the batch into the first device's
    /// (a shard without rows, `None`, adds nothing).
    pub(super) fn sum_local_gradients(&self, shares: &[Option<f32>]) -> Result<()> {
        let first = &self.shards[0];
        for (_, g) in &self.pairs {
            let blob = first.ws.get_blob(g)?;
            let mut guard = blob.write();
            let g0 = guard.get_mut::<Tensor>()?;
            let n = g0.numel().unwrap_or(0);
            let Some(m0) = g0.synced() else { continue };
            match shares[0] {
                Some(w0) if w0 != 1.0 => kernels::scale(n, w0, &mut m0.device_mut()?)?,
                Some(_) => {}
                // No rows on the first device: its gradient holds an older step's values.
                None => kernels::scale(n, 0.0, &mut m0.device_mut()?)?,
            }
            for (s, w) in self.shards.iter().zip(shares).skip(1) {
                let Some(w) = *w else { continue };
                let other = s.ws.get_blob(g)?;
                let other = other.read();
                let Some(mr) = other.get::<Tensor>()?.synced() else {
                    continue;
                };
                let x = mr.device_on(&first.device)?;
                kernels::axpy(n, w, &x, &mut m0.device_mut()?)?;
            }
        }
        Ok(())
    }

    /// Runs the first shard's net on its rows of the first batch and measures its memory.
    pub(super) fn measure_first(&self) -> Result<syncmem::net::memory::RunMemory> {
        let s = &self.shards[0];
        if let Some(b) = s.batches.first().and_then(Option::as_ref) {
            super::feed_batch(&s.ws, &s.device, b)?;
        }
        syncmem::net::memory::measure_run(&s.train, &s.ws)
    }
}

/// Row counts of `len` rows split over `parts` shards: the first ones get one more.
pub(super) fn split(len: usize, parts: usize) -> Vec<usize> {
    let (base, extra) = (len / parts, len % parts);
    (0..parts).map(|r| base + usize::from(r < extra)).collect()
}

pub(super) fn upload(
    rows: &[usize],
    data: &Dataset,
    device: &Device,
    label: &str,
) -> Result<Batch> {
    let mut xs = Vec::with_capacity(rows.len() * data.features);
    for &s in rows {
        xs.extend_from_slice(&data.x[s * data.features..(s + 1) * data.features]);
    }
    let ys: Vec<i32> = rows.iter().map(|&s| data.y[s]).collect();
    let x = labelled(
        &[rows.len(), data.features],
        &xs,
        device,
        format!("{label}/{DATA}"),
    )?;
    let y = labelled(&[rows.len()], &ys, device, format!("{label}/{LABEL}"))?;
    drop(x.device::<f32>()?); // upload once, now
    drop(y.device::<i32>()?);
    Ok(Batch { x, y })
}

/// A tensor of `dims` holding `values` on `device`, labelled before its storage is made (so
/// that its memory carries the label in statistics, traces and snapshots).
fn labelled<T: syncmem::Element>(
    dims: &[usize],
    values: &[T],
    device: &Device,
    label: String,
) -> Result<Tensor> {
    let mut t = Tensor::new(device).with_label(label);
    t.resize(dims)?;
    t.host_overwrite::<T>()?.clone_from_slice(values);
    Ok(t)
}

impl Trainer {
    /// Sets up data-parallel training of an MLP on `devices` (at least one; one device is
    /// [`Trainer::new`]): see the [module docs](crate::train#several-devices). The first device holds the
    /// parameters and runs the update.
    ///
    /// # Errors
    /// [`Error::InvalidState`] for an empty list or a device listed twice; as
    /// [`Trainer::new`].
    pub fn data_parallel(
        devices: &[Device],
        data: &Dataset,
        cfg: &super::TrainConfig,
    ) -> Result<Self> {
        let (mlp, nets) = super::default_mlp(data, cfg)?;
        Self::data_parallel_with_nets(devices, data, cfg, mlp, nets)
    }

    /// [`Trainer::data_parallel`] with nets of its own (see [`Trainer::with_nets`]); their
    /// update operators (`SGD`, `MomentumSGD`, `Adam`) are the update, run once per step on
    /// the first device, where the parameters and the optimizer's state live.
    ///
    /// # Errors
    /// As [`Trainer::data_parallel`] and [`Trainer::with_nets`].
    pub fn data_parallel_with_nets(
        devices: &[Device],
        data: &Dataset,
        cfg: &super::TrainConfig,
        mlp: Mlp,
        nets: MlpNets,
    ) -> Result<Self> {
        Self::build_parallel(devices, data, cfg, mlp, nets, None)
    }

    /// Data-parallel training on `devices`; with `ranks` (`(rank, ranks)` of a distributed
    /// job), on this rank's rows of every batch, with shards even on one device.
    pub(super) fn build_parallel(
        devices: &[Device],
        data: &Dataset,
        cfg: &super::TrainConfig,
        mlp: Mlp,
        nets: MlpNets,
        ranks: Option<(usize, usize)>,
    ) -> Result<Self> {
        crate::register_operators()?;
        let first = check_devices(devices)?;
        if devices.len() == 1 && ranks.is_none() {
            return Self::with_nets(first, data, cfg, mlp, nets);
        }
        super::check_widths(&mlp, data)?;
        super::offload::refuse(cfg, "training on several devices or ranks")?;
        let mut setup = super::Setup::new(first, data, cfg, &nets)?;
        // The job's batch sizes: a rank trains on its rows of each.
        let global: Vec<usize> = setup.rows.iter().map(Vec::len).collect();
        if let Some((rank, size)) = ranks {
            setup.rows = super::distributed::rank_rows(&setup.rows, rank, size);
        }
        let (train, update, pairs) = split_update(&nets.train);
        check_shard_net(&train, &pairs, &setup.ws)?;
        let mut keep: Vec<String> = pairs.iter().map(|(_, g)| g.clone()).collect();
        keep.extend([LOSS.to_string(), ACCURACY.to_string()]);
        let opts = setup.options(cfg, &mlp, keep);
        let nets_of_shard = (&train, &nets.eval, &opts);
        let shards = (0..devices.len())
            .map(|r| Shard::build(r, devices, data, &setup, &pairs, nets_of_shard))
            .collect::<Result<Vec<_>>>()?;
        if ranks.is_some() {
            // A rank without rows in a batch still receives the sums into its gradients.
            super::distributed::shape_gradients(&shards[0].ws, &setup.ws, &pairs, first)?;
        }
        let update = shards[0].ws.create_net(
            &update,
            first,
            &NetOptions::new()
                .seed(cfg.seed)
                .rewrite(crate::fuse::Fuse::when(cfg.fuse)),
        )?;
        let (train0, eval0) = (shards[0].train.clone(), shards[0].eval.clone());
        let mut t = setup.trainer(first, data, mlp, nets, train0, eval0);
        t.sizes = global;
        t.parallel = Some(Parallel {
            shards,
            update,
            pairs,
            dist: None,
        });
        t.transfers.setup = t.copy_totals();
        Ok(t)
    }

    /// The devices trained on: the first holds the parameters.
    pub fn devices(&self) -> Vec<Device> {
        match &self.parallel {
            Some(p) => p.shards.iter().map(|s| s.device.clone()).collect(),
            None => vec![self.device.clone()],
        }
    }

    /// One data-parallel step on batch `i` (see the [module docs](crate::train#several-devices)).
    pub(super) fn parallel_step(&mut self, i: usize) -> Result<(f32, f32)> {
        let Some(p) = &self.parallel else {
            return Err(parallel_error("not a data-parallel trainer".into()));
        };
        if p.dist.is_some() {
            return self.dist_step(i);
        }
        let total = self.sizes[i].max(1) as f32;
        // Each shard's share of the batch (`None`: no rows for it this step).
        let mut shares: smallvec::SmallVec<[Option<f32>; 8]> = smallvec::SmallVec::new();
        for s in &p.shards {
            let Some(b) = &s.batches[i] else {
                shares.push(None);
                continue;
            };
            super::feed_batch(&s.ws, &s.device, b)?;
            s.train.run(&s.ws)?;
            shares.push(Some(b.y.numel().unwrap_or(0) as f32 / total));
        }
        p.sum_local_gradients(&shares)?;
        p.update.run(&p.shards[0].ws)?;
        let (mut loss, mut acc) = (0.0f32, 0.0f32);
        for (s, w) in p.shards.iter().zip(&shares) {
            let Some(w) = *w else { continue };
            let (l, a) = super::scalars::read_scalars(&s.ws, &s.train)?;
            loss += w * l;
            acc += w * a;
        }
        Ok((loss, acc))
    }

    /// Loss and accuracy of batch `i` by the shards' eval nets, weighted by their rows.
    pub(super) fn parallel_eval(&self, i: usize) -> Result<(f32, f32)> {
        let Some(p) = &self.parallel else {
            return Err(parallel_error("not a data-parallel trainer".into()));
        };
        let total = self.sizes[i].max(1) as f32;
        let (mut loss, mut acc) = (0.0f32, 0.0f32);
        for s in &p.shards {
            let Some(b) = &s.batches[i] else { continue };
            super::feed_batch(&s.ws, &s.device, b)?;
            s.eval.run(&s.ws)?;
            let w = b.y.numel().unwrap_or(0) as f32 / total;
            let (l, a) = super::scalars::read_scalars(&s.ws, &s.eval)?;
            loss += w * l;
            acc += w * a;
        }
        Ok((loss, acc))
    }
}

/// The first device of `devices`; an error for none, or for a device listed twice.
fn check_devices(devices: &[Device]) -> Result<&Device> {
    let Some(first) = devices.first() else {
        return Err(parallel_error("no device to train on".into()));
    };
    for (i, d) in devices.iter().enumerate() {
        if devices[..i].iter().any(|e| e.same(d)) {
            return Err(parallel_error(format!("{} is listed twice", d.label())));
        }
    }
    Ok(first)
}

/// Each shard runs the train net without the update (`pairs` are its update operators'): an
/// operator of it that writes a blob of the parent `ws` (a parameter, an optimizer's state)
/// would write it once per device.
fn check_shard_net(train: &NetDef, pairs: &[(String, String)], ws: &Workspace) -> Result<()> {
    if pairs.is_empty() {
        return Err(parallel_error(
            "the train net has no update operator (SGD, MomentumSGD, Adam) to run once per \
             step"
                .into(),
        ));
    }
    let grads: Vec<&str> = pairs.iter().map(|(_, g)| g.as_str()).collect();
    for op in &train.ops {
        if let Some(out) = op.outputs.iter().find(|o| {
            !grads.contains(&o.as_str())
                && ![DATA, LABEL].contains(&o.as_str())
                && ws.try_get_blob(o).is_some()
        }) {
            return Err(parallel_error(format!(
                "operator {} ({}) writes {out:?}, a blob of the trainer's workspace (a \
                 parameter): only update operators (SGD, MomentumSGD, Adam), run once per \
                 step on the first device, may update those",
                op.name.as_deref().unwrap_or("unnamed"),
                op.op_type
            )));
        }
    }
    Ok(())
}

impl Shard {
    /// Shard `r` of `devices`: a child workspace of the trainer's, its rows of every batch
    /// uploaded, local data, label and gradient blobs, its train and eval nets.
    fn build(
        r: usize,
        devices: &[Device],
        data: &Dataset,
        setup: &super::Setup,
        pairs: &[(String, String)],
        (train, eval, opts): (&NetDef, &NetDef, &NetOptions),
    ) -> Result<Self> {
        let device = &devices[r];
        let parts = devices.len();
        let ws = Arc::new(Workspace::with_parent(setup.ws.clone()));
        let mut batches = Vec::with_capacity(setup.rows.len());
        for (i, rows) in setup.rows.iter().enumerate() {
            let counts = split(rows.len(), parts);
            let start: usize = counts[..r].iter().sum();
            let mine = &rows[start..start + counts[r]];
            let label = format!("batch{i}@{}", device.label());
            batches.push(match mine.is_empty() {
                true => None,
                false => Some(upload(mine, data, device, &label)?),
            });
        }
        for name in [DATA, LABEL] {
            // Local blobs: each shard feeds its own rows (whatever the parent holds).
            ws.create_local_blob(name)?
                .write()
                .reset(Tensor::new(device).with_label(name));
        }
        for (_, g) in pairs {
            // Each shard's gradients are its own, even where the parent has such a blob.
            ws.create_local_blob(g)?;
        }
        let train = ws.create_net(train, device, opts)?;
        let eval = ws.create_net(eval, device, opts)?;
        Ok(Shard {
            device: device.clone(),
            ws,
            train,
            eval,
            batches,
        })
    }
}

/// The train net without its update operators (`SGD`, `MomentumSGD`, `Adam`), a net of just
/// those, and the `(parameter, gradient)` names of every group of their inputs (`[param, grad,
/// state...]`). The update net reads the gradients and the state and writes the parameters and
/// the state, which live in the parent workspace beside the parameters.
pub(super) fn split_update(train: &NetDef) -> (NetDef, NetDef, Vec<(String, String)>) {
    let (updates, rest): (Vec<_>, Vec<_>) = train
        .ops
        .iter()
        .cloned()
        .partition(|o| crate::ops::update_group(&o.op_type).is_some());
    let (mut pairs, mut state) = (Vec::new(), Vec::new());
    for op in &updates {
        let size = crate::ops::update_group(&op.op_type).unwrap_or(2);
        for group in op.inputs.chunks_exact(size) {
            pairs.push((group[0].clone(), group[1].clone()));
            state.extend(group[2..].iter().cloned());
        }
    }
    let mut shard = NetDef::new(format!("{}_shard", train.name));
    shard.ops = rest;
    shard.external_inputs = train.external_inputs.clone();
    let mut outputs = train.external_outputs.clone().unwrap_or_default();
    outputs.extend(pairs.iter().map(|(_, g)| g.clone()));
    shard.external_outputs = Some(outputs);
    let mut update = NetDef::new(format!("{}_update", train.name));
    update.ops = updates;
    let mut inputs: Vec<String> = pairs.iter().map(|(p, _)| p.clone()).collect();
    inputs.extend(pairs.iter().map(|(_, g)| g.clone()));
    inputs.extend(state.iter().cloned());
    update.external_inputs = Some(inputs);
    let mut written: Vec<String> = pairs.iter().map(|(p, _)| p.clone()).collect();
    written.extend(state);
    update.external_outputs = Some(written);
    (shard, update, pairs)
}

fn parallel_error(reason: String) -> Error {
    Error::InvalidState {
        op: "Trainer::data_parallel",
        buffer: "training devices".into(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn rows_split_with_the_first_shards_taking_the_rest() {
        assert_eq!(split(64, 2), [32, 32]);
        assert_eq!(split(7, 3), [3, 2, 2]);
        assert_eq!(split(1, 2), [1, 0]);
        assert_eq!(split(0, 2), [0, 0]);
    }
}
