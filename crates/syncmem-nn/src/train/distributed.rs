//! Training as one rank of a distributed job (see [`Trainer::distributed`]).

use std::sync::Arc;

use super::collective::Collective;
use super::parallel::split;
use super::reduce::{plan_buckets, CommStats, Reducer, Share};
use super::{TrainConfig, Trainer};
use crate::mlp::{Dataset, Mlp, MlpNets};
use syncmem::{Device, Error, Result, Tensor, Workspace};

/// A rank's part of a distributed job: the collective and the thread summing buckets.
pub(super) struct Dist {
    pub(super) reducer: Reducer,
    /// Buckets are submitted as backward writes them (else after the net).
    overlap: bool,
}

impl Trainer {
    /// Sets up training as one rank of a distributed job: `collective` connects the ranks
    /// (an [`Mpi`](super::collective::mpi::Mpi) under `mpirun`, or a
    /// [`Local`](super::collective::Local) rank); `devices` are this rank's own (one, or
    /// several for data parallelism inside the rank as [`Trainer::data_parallel`]).
    ///
    /// Every rank draws the same batches from the same seed and reads only its share of each
    /// (the first ranks take one row more when a batch does not split evenly; a rank may have
    /// none of a small last batch). Backward writes this rank's gradients, each bucket of them
    /// ([`TrainConfig::bucket_bytes`]) is summed over the ranks as soon as it is written (on a
    /// thread of the trainer's, while backward goes on; after backward with
    /// [`TrainConfig::overlap`] off or several devices in the rank), each rank's gradient
    /// weighted by its share of the batch, and every rank runs the same update on the sums.
    /// Loss and accuracy are summed over the ranks, so [`Trainer::step`],
    /// [`Trainer::run_epoch`] and [`Trainer::evaluate`] return the job's figures on every
    /// rank. [`Trainer::comm`] tells what the sums cost.
    ///
    /// Setting up compares, over the ranks, a checksum of the initial parameters and one of
    /// the data and settings: a rank that differs is an error naming it. Every rank must call
    /// this, and then the same steps, epochs and evaluations in the same order (the trainer's
    /// collective calls must match); a rank that fails should call
    /// [`Collective::abort`] so that the others do not wait for it.
    ///
    /// # Errors
    /// [`Error::InvalidState`] for checksums that differ between ranks (naming the ranks and
    /// what differs); as [`Trainer::data_parallel`]; an error of the collective.
    pub fn distributed(
        devices: &[Device],
        data: &Dataset,
        cfg: &TrainConfig,
        collective: Arc<dyn Collective>,
    ) -> Result<Self> {
        let (mlp, nets) = super::default_mlp(data, cfg)?;
        Self::distributed_with_nets(devices, data, cfg, mlp, nets, collective)
    }

    /// [`Trainer::distributed`] with nets of its own (see [`Trainer::with_nets`]).
    ///
    /// # Errors
    /// As [`Trainer::distributed`].
    pub fn distributed_with_nets(
        devices: &[Device],
        data: &Dataset,
        cfg: &TrainConfig,
        mlp: Mlp,
        nets: MlpNets,
        collective: Arc<dyn Collective>,
    ) -> Result<Self> {
        let ranks = (collective.rank(), collective.size());
        let mut t = Self::build_parallel(devices, data, cfg, mlp, nets, Some(ranks))?;
        let Some(p) = t.parallel.as_mut() else {
            return Err(dist_error("no shards were built".into()));
        };
        let first = &p.shards[0];
        let grads: Vec<(String, usize)> = p
            .pairs
            .iter()
            .map(|(param, g)| Ok((g.clone(), numel(&t.ws, param)?)))
            .collect::<Result<_>>()?;
        check_agreement(&*collective, &t.ws, &p.pairs, data, cfg)?;
        let buckets = plan_buckets(&first.train, &grads, cfg.bucket_bytes.max(4));
        let reducer = Reducer::start(first.ws.clone(), buckets, collective)?;
        p.dist = Some(Dist {
            reducer,
            overlap: cfg.overlap,
        });
        Ok(t)
    }

    /// What summing over the ranks cost so far (`None` unless [`Trainer::distributed`]).
    pub fn comm(&self) -> Option<CommStats> {
        let d = self.parallel.as_ref()?.dist.as_ref()?;
        Some(d.reducer.stats)
    }

    /// The collective of a distributed trainer.
    pub fn collective(&self) -> Option<&Arc<dyn Collective>> {
        let d = self.parallel.as_ref()?.dist.as_ref()?;
        Some(&d.reducer.collective)
    }

    /// The buckets' sizes in elements, in the order they are summed (distributed training;
    /// empty otherwise).
    pub fn bucket_sizes(&self) -> Vec<usize> {
        let dist = self.parallel.as_ref().and_then(|p| p.dist.as_ref());
        dist.map_or_else(Vec::new, |d| {
            d.reducer.buckets.iter().map(|b| b.len).collect()
        })
    }

    /// One distributed step on batch `i`.
    pub(super) fn dist_step(&mut self, i: usize) -> Result<(f32, f32)> {
        let total = self.sizes[i].max(1) as f32;
        let Some(p) = self.parallel.as_mut() else {
            return Err(dist_error("not a distributed trainer".into()));
        };
        let Some(mut d) = p.dist.take() else {
            return Err(dist_error("not a distributed trainer".into()));
        };
        let r = dist_step_on(p, &mut d, i, total);
        p.dist = Some(d);
        r
    }
}

/// [`Trainer::dist_step`] on the shards of `p`, with `d` taken out of it.
fn dist_step_on(
    p: &mut super::parallel::Parallel,
    d: &mut Dist,
    i: usize,
    total: f32,
) -> Result<(f32, f32)> {
    let single = p.shards.len() == 1;
    // Every rank has the same share of a batch its rows split evenly over (`rank_rows`).
    let ranks = d.reducer.collective.size().max(1);
    let even = (total as usize).is_multiple_of(ranks);
    let mut shares: smallvec::SmallVec<[Option<f32>; 8]> = smallvec::SmallVec::new();
    // Each shard's rows.
    let mut rows: smallvec::SmallVec<[usize; 8]> = smallvec::SmallVec::new();
    for s in &p.shards {
        let Some(b) = &s.batches[i] else {
            shares.push(None);
            rows.push(0);
            continue;
        };
        super::feed_batch(&s.ws, &s.device, b)?;
        let n = b.y.numel().unwrap_or(0);
        rows.push(n);
        let share = n as f32 / total;
        if single && d.overlap {
            let r = &mut d.reducer;
            // A bucket ready only after the last operator has nothing to overlap with: the
            // caller sums it itself (no hand-over to the thread and back).
            let last = s.train.len().saturating_sub(1);
            s.train.run_observed(&s.ws, s.train.context(), |index, _| {
                while let Some(b) = r.buckets.get(r.submitted) {
                    if index >= last || b.ready_after.is_none_or(|w| w > index) {
                        break;
                    }
                    r.submit(r.submitted, Share::new(share, even))?;
                }
                Ok(())
            })?;
        } else {
            s.train.run(&s.ws)?;
        }
        shares.push(Some(share));
    }
    let bucket_share = rank_share(p, (&shares, &rows, total), even)?;
    d.reducer.submit_rest(bucket_share)?;
    let (mut loss, mut acc) = (0.0f64, 0.0f64);
    for (s, w) in p.shards.iter().zip(&shares) {
        let Some(w) = *w else { continue };
        let (l, a) = super::scalars::read_scalars(&s.ws, &s.train)?;
        loss += f64::from(w * l);
        acc += f64::from(w * a);
    }
    d.reducer.submit_scalars([loss, acc])?;
    let [loss, acc] = d.reducer.wait_all()?;
    p.update.run(&p.shards[0].ws)?;
    Ok((loss as f32, acc as f32))
}

/// What a rank of `p` submits its buckets with, once its shards ran: `shares` (each shard's
/// rows over the batch's `total`, `None` without rows) and `rows` (each shard's); `even`: the
/// batch splits evenly over the ranks, so every rank has the same share.
fn rank_share(
    p: &super::parallel::Parallel,
    (shares, rows, total): (&[Option<f32>], &[usize], f32),
    even: bool,
) -> Result<Share> {
    let mine: usize = rows.iter().sum();
    Ok(if p.shards.len() == 1 {
        Share::new(shares[0].unwrap_or(0.0), even)
    } else if even && mine > 0 {
        // The shards' gradients weighted into the first device's as the mean over the rank's
        // rows, which the common share then scales after the sum, as every rank does: the
        // same value on every rank (the rows over the batch's, rounded once, as a rank of one
        // device computes it).
        let local: smallvec::SmallVec<[Option<f32>; 8]> = shares
            .iter()
            .zip(rows)
            .map(|(w, &n)| w.map(|_| n as f32 / mine as f32))
            .collect();
        p.sum_local_gradients(&local)?;
        Share::common(mine as f32 / total)
    } else {
        // The shards' gradients weighted into the first device's, for the job's batch: summed
        // as they are.
        p.sum_local_gradients(shares)?;
        Share::own(1.0)
    })
}

impl Trainer {
    /// Sums this rank's current gradients over the ranks now, bucket by bucket, as a step
    /// does after backward (each rank's weighted by 1): what one step's all-reduce costs,
    /// without the step (the benchmark of `syncmem bench` times it). Does nothing unless
    /// distributed. Every rank must call it.
    ///
    /// # Errors
    /// As [`Trainer::step`].
    pub fn sum_gradients(&mut self) -> Result<()> {
        let Some(d) = self.parallel.as_mut().and_then(|p| p.dist.as_mut()) else {
            return Ok(());
        };
        d.reducer.submit_rest(Share::common(1.0))?;
        d.reducer.wait_all().map(|_| ())
    }

    /// Sums `values` over the ranks of a distributed trainer (the identity otherwise).
    pub(super) fn sum_over_ranks(&mut self, values: [f64; 2]) -> Result<[f64; 2]> {
        match self.parallel.as_mut().and_then(|p| p.dist.as_mut()) {
            Some(d) => {
                d.reducer.submit_scalars(values)?;
                d.reducer.wait_all()
            }
            None => Ok(values),
        }
    }
}

/// Elements of tensor `name` of `ws`.
fn numel(ws: &Workspace, name: &str) -> Result<usize> {
    let blob = ws.get_blob(name)?;
    let guard = blob.read();
    Ok(guard.get::<Tensor>()?.numel().unwrap_or(0))
}

/// FNV-1a over `bytes`, continuing from `h`.
fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

/// Compares over the ranks a checksum of the initial parameters and one of the data and the
/// settings; an error names the ranks that differ from rank 0.
fn check_agreement(
    c: &dyn Collective,
    ws: &Workspace,
    pairs: &[(String, String)],
    data: &Dataset,
    cfg: &TrainConfig,
) -> Result<()> {
    let mut params = FNV_START;
    for (p, _) in pairs {
        let blob = ws.get_blob(p)?;
        let guard = blob.read();
        let t = guard.get::<Tensor>()?;
        params = fnv(params, p.as_bytes());
        params = fnv(params, bytemuck::cast_slice(&t.host::<f32>()?));
    }
    let mut inputs = fnv(FNV_START, bytemuck::cast_slice(&data.x));
    inputs = fnv(inputs, bytemuck::cast_slice(&data.y));
    inputs = fnv(inputs, &(data.features as u64).to_le_bytes());
    let settings = format!(
        "{:?} {} {} {} {} {} {} {}",
        cfg.hidden,
        cfg.epochs,
        cfg.batch,
        cfg.lr.to_bits(),
        cfg.optimizer,
        cfg.seed,
        cfg.fuse,
        cfg.bucket_bytes
    );
    let mine = [params, inputs, fnv(FNV_START, settings.as_bytes())];
    let all = c.all_gather_u64(&mine)?;
    let what = [
        "initial parameters",
        "training data",
        "settings (widths, epochs, batch, learning rate, optimizer, seed, fusion, bucket size)",
    ];
    for (k, what) in what.iter().enumerate() {
        let differ: Vec<String> = (1..c.size())
            .filter(|&r| all.get(r * 3 + k) != all.get(k))
            .map(|r| r.to_string())
            .collect();
        if !differ.is_empty() {
            return Err(dist_error(format!(
                "the {what} of rank(s) {} differ from rank 0's (checksums over the ranks); \
                 every rank must start from the same seed, data and settings",
                differ.join(", ")
            )));
        }
    }
    Ok(())
}

fn dist_error(reason: String) -> Error {
    Error::InvalidState {
        op: "Trainer::distributed",
        buffer: "ranks of the job".into(),
        reason,
    }
}

/// The rows of rank `rank` of `size` in each batch of `rows`: its contiguous share.
pub(super) fn rank_rows(rows: &[Vec<usize>], rank: usize, size: usize) -> Vec<Vec<usize>> {
    rows.iter()
        .map(|batch| {
            let counts = split(batch.len(), size);
            let start: usize = counts[..rank].iter().sum();
            batch[start..start + counts[rank]].to_vec()
        })
        .collect()
}

/// Makes each gradient of `pairs` in `ws` a tensor shaped like its parameter in `parent`, on
/// `device`, so that a rank without rows in a batch still has gradients to receive sums into.
pub(super) fn shape_gradients(
    ws: &Workspace,
    parent: &Workspace,
    pairs: &[(String, String)],
    device: &Device,
) -> Result<()> {
    for (p, g) in pairs {
        let dims = {
            let blob = parent.get_blob(p)?;
            let guard = blob.read();
            guard.get::<Tensor>()?.dims().to_vec()
        };
        let blob = ws.create_local_blob(g)?;
        let mut guard = blob.write();
        let mut t = Tensor::new(device).with_label(g.clone());
        t.resize(&dims)?;
        drop(t.device_overwrite::<f32>()?);
        guard.reset(t);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{rank_rows, split};

    #[test]
    fn each_rank_takes_its_contiguous_share_of_every_batch() {
        let rows = vec![(0..5).collect::<Vec<_>>(), vec![5]];
        assert_eq!(rank_rows(&rows, 0, 2), vec![vec![0, 1, 2], vec![5]]);
        assert_eq!(rank_rows(&rows, 1, 2), vec![vec![3, 4], vec![]]);
        assert_eq!(split(7, 3), [3, 2, 2]);
    }
}
