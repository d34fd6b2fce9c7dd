//! Gradient buckets summed over the ranks on a thread of their own, as DDP does: each bucket's
//! sum starts as soon as backward has written its gradients, while backward goes on; the
//! update waits only at its start, for every bucket.
//!
//! A bucket is a few gradients whose bytes together stay under the bucket size (a larger
//! gradient has a bucket of its own), in the order backward writes them. Its sum reads each
//! gradient through its host mirror (which waits for the device work writing it; on a device
//! whose memory is host memory it copies nothing, on a discrete GPU it copies device to host on
//! the buffer's stream, counted), packs them into one contiguous host buffer scaled by this
//! rank's share of the batch, sums that buffer over the ranks in place with one
//! [`Collective::all_reduce_sum_in_place`] (`MPI_IN_PLACE`: no receive buffer), and writes the
//! sum back through the host mirrors (the update's device read copies it back on a discrete
//! GPU, and nothing where memory is shared).
//!
//! A bucket of one gradient (a large one: it fills a bucket alone) is summed in place in the
//! gradient's host mirror, with no copy at all, when nothing needs scaling before the sum:
//! when this rank's share is 1 (several devices of a rank weighed their shards already), or
//! when every rank has the same share, which then scales the sum where it lies ([`Share`]).
//!
//! Every rank plans the same buckets from the same net and submits them in the same order, so
//! the collective calls match across ranks; a rank without rows in a batch submits its buckets
//! with a share of 0 (zeros, its gradients not read).

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use smallvec::SmallVec;
use syncmem::alloc::stats::{thread_copies, CopyStats};
use syncmem::net::Net;
use syncmem::synced::HostWrite;
use syncmem::{Blob, Error, Result, SyncedMemory, Tensor, Workspace};

use super::collective::Collective;
use super::meter::add;

/// The gradients of one bucket and where it becomes ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct BucketPlan {
    /// `(blob name, elements)`, in the order they are packed.
    pub(super) grads: Vec<(String, usize)>,
    /// Elements of all of them.
    pub(super) len: usize,
    /// The index in the net of the last operator writing one of them (`None`: the net writes
    /// none of them; the bucket is submitted after the net).
    pub(super) ready_after: Option<usize>,
}

/// Groups `grads` (`(name, elements)`) into buckets of at most `bucket_bytes` each (a larger
/// gradient alone), in the order `net` writes them last.
pub(super) fn plan_buckets(
    net: &Net,
    grads: &[(String, usize)],
    bucket_bytes: usize,
) -> Vec<BucketPlan> {
    let ops = &net.run_def().ops;
    let last_writer = |g: &str| {
        let g = net.blob_name(g);
        ops.iter().rposition(|o| o.outputs.iter().any(|n| n == g))
    };
    let mut order: Vec<(Option<usize>, &(String, usize))> =
        grads.iter().map(|g| (last_writer(&g.0), g)).collect();
    // Written ones in backward order, then any the net does not write; stable for equal keys.
    order.sort_by_key(|(w, _)| w.map_or(usize::MAX, |i| i));
    let mut buckets: Vec<BucketPlan> = Vec::new();
    for (writer, (name, n)) in order {
        let bytes = n * 4;
        let fits = buckets.last().is_some_and(|b| {
            (b.len * 4 + bytes <= bucket_bytes) && (b.ready_after.is_some() == writer.is_some())
        });
        if !fits {
            buckets.push(BucketPlan {
                grads: Vec::new(),
                len: 0,
                ready_after: writer,
            });
        }
        let b = buckets.last_mut().expect("a bucket was just pushed");
        b.grads.push((name.clone(), *n));
        b.len += n;
        b.ready_after = b.ready_after.max(writer);
    }
    buckets
}

/// Gradients of a bucket whose guards are held without a heap allocation (more spill to the
/// heap).
const GUARDS: usize = 16;

/// What summing over the ranks cost, summed over the steps (see [`super::Trainer::comm`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[non_exhaustive]
pub struct CommStats {
    /// Ranks of the job.
    pub ranks: usize,
    /// Steps whose gradients were summed.
    pub steps: u64,
    /// Buckets summed (one collective call each), and the calls summing loss and accuracy.
    pub calls: u64,
    /// Bytes this rank sent to the collective for gradients (4 per element).
    pub bytes: u64,
    /// Seconds inside the collective calls (the all-reduces themselves).
    pub reduce_seconds: f64,
    /// Seconds staging the buckets: waiting for the device work writing the gradients,
    /// reading them into the bucket and writing the sums back.
    pub staging_seconds: f64,
    /// Seconds the steps waited for the sums once their own work was queued: the part of
    /// the all-reduce time not hidden behind backward.
    pub exposed_seconds: f64,
    /// Copies between host and device that staging made (none where memory is shared).
    pub staging_copies: CopyStats,
}

impl CommStats {
    /// Seconds of all-reduce and staging hidden behind the steps' own work.
    pub fn overlapped_seconds(&self) -> f64 {
        (self.reduce_seconds + self.staging_seconds - self.exposed_seconds).max(0.0)
    }
}

/// This rank's weight of its gradients in the sums of a step's buckets: its rows over the
/// batch's (0: no rows, its gradients not read).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Share {
    weight: f32,
    /// Every rank of the job has this weight: the sum may be scaled once, after the
    /// all-reduce, instead of each rank's gradients before it.
    common: bool,
}

impl Share {
    /// `weight`, the same on every rank when `common`, else this rank's own.
    pub(super) fn new(weight: f32, common: bool) -> Self {
        Self { weight, common }
    }

    /// `weight`, this rank's own (other ranks' may differ).
    pub(super) fn own(weight: f32) -> Self {
        Self {
            weight,
            common: false,
        }
    }

    /// `weight`, the same on every rank of the job.
    pub(super) fn common(weight: f32) -> Self {
        Self {
            weight,
            common: true,
        }
    }

    /// Nothing to scale before the sum: a bucket of one gradient is summed straight from it.
    fn direct(self) -> bool {
        self.weight == 1.0 || (self.common && self.weight != 0.0)
    }
}

enum Job {
    /// Bucket `index`, scaled by this rank's share of the batch.
    Bucket { index: usize, share: Share },
    /// Two sums (loss and accuracy).
    Scalars([f64; 2]),
}

enum Done {
    Bucket {
        bytes: u64,
        reduce: f64,
        staging: f64,
        copies: CopyStats,
    },
    Scalars([f64; 2]),
}

/// The thread that sums buckets, and the bookkeeping of what was submitted.
pub(super) struct Reducer {
    /// The staging buffers and the collective, used by the thread or, when nothing is in
    /// flight, by the caller itself (no hand-over to wait for).
    worker: Arc<Mutex<Worker>>,
    /// Loss and accuracy sums computed by the caller (nothing was in flight).
    inline_scalars: Option<[f64; 2]>,
    /// This step's buckets were summed by the caller.
    inline_step: bool,
    jobs: Option<Sender<Job>>,
    done: Receiver<Result<Done>>,
    thread: Option<JoinHandle<()>>,
    pub(super) buckets: Vec<BucketPlan>,
    pub(super) collective: Arc<dyn Collective>,
    /// Jobs submitted and not yet collected.
    pending: usize,
    /// Buckets submitted in the current step.
    pub(super) submitted: usize,
    pub(super) stats: CommStats,
}

impl Reducer {
    /// Starts the thread summing `buckets` of the gradients in `ws` over `collective`.
    pub(super) fn start(
        ws: Arc<Workspace>,
        buckets: Vec<BucketPlan>,
        collective: Arc<dyn Collective>,
    ) -> Result<Self> {
        let (jobs, rx) = channel::<Job>();
        let (tx, done) = channel::<Result<Done>>();
        let worker = Worker {
            ws,
            blobs: vec![Vec::new(); buckets.len()],
            buckets: buckets.clone(),
            packed: vec![0.0; buckets.iter().map(|b| b.len).max().unwrap_or(0)],
            collective: collective.clone(),
        };
        let worker = Arc::new(Mutex::new(worker));
        let shared = worker.clone();
        let thread = std::thread::Builder::new()
            .name(format!("syncmem-reduce-{}", collective.rank()))
            .spawn(move || Worker::run(&shared, &rx, &tx))
            .map_err(|e| Error::InvalidState {
                op: "Trainer::distributed",
                buffer: "gradient buckets".into(),
                reason: format!("could not start the thread summing them: {e}"),
            })?;
        let ranks = collective.size();
        Ok(Reducer {
            worker,
            inline_scalars: None,
            inline_step: false,
            jobs: Some(jobs),
            done,
            thread: Some(thread),
            buckets,
            collective,
            pending: 0,
            submitted: 0,
            stats: CommStats {
                ranks,
                ..CommStats::default()
            },
        })
    }

    fn send(&mut self, job: Job) -> Result<()> {
        let sent = self.jobs.as_ref().is_some_and(|j| j.send(job).is_ok());
        if !sent {
            return Err(stopped());
        }
        self.pending += 1;
        Ok(())
    }

    /// Submits bucket `index` with this rank's `share` of the batch.
    pub(super) fn submit(&mut self, index: usize, share: Share) -> Result<()> {
        self.send(Job::Bucket { index, share })?;
        self.submitted += 1;
        Ok(())
    }

    /// Sums every bucket not yet submitted this step: on the calling thread when nothing is
    /// in flight (no hand-over to wait for; the time counts as exposed), else after what is.
    pub(super) fn submit_rest(&mut self, share: Share) -> Result<()> {
        if self.pending == 0 {
            let start = Instant::now();
            let mut any = false;
            while self.submitted < self.buckets.len() {
                let done = lock(&self.worker).bucket(self.submitted, share)?;
                self.record(done);
                self.submitted += 1;
                any = true;
            }
            if any {
                self.stats.exposed_seconds += start.elapsed().as_secs_f64();
                self.stats.steps += 1;
                self.inline_step = true;
            }
            return Ok(());
        }
        while self.submitted < self.buckets.len() {
            self.submit(self.submitted, share)?;
        }
        Ok(())
    }

    /// Adds a summed bucket's figures.
    fn record(&mut self, done: Done) {
        if let Done::Bucket {
            bytes,
            reduce,
            staging,
            copies,
        } = done
        {
            self.stats.bytes += bytes;
            self.stats.reduce_seconds += reduce;
            self.stats.staging_seconds += staging;
            self.stats.staging_copies = add(self.stats.staging_copies, copies);
        }
        self.stats.calls += 1;
    }

    /// Submits two values (loss and accuracy sums) to be summed over the ranks after every
    /// bucket submitted before.
    pub(super) fn submit_scalars(&mut self, values: [f64; 2]) -> Result<()> {
        if self.pending == 0 {
            let start = Instant::now();
            self.inline_scalars = Some(lock(&self.worker).scalars(values)?);
            self.stats.calls += 1;
            if self.inline_step {
                // After buckets summed inline: part of the step's wait.
                self.stats.exposed_seconds += start.elapsed().as_secs_f64();
            }
            return Ok(());
        }
        self.send(Job::Scalars(values))
    }

    /// Waits for everything submitted; returns the last scalars' sums (zeros without any).
    /// When buckets were among them, the time waited counts as exposed and a step as done.
    pub(super) fn wait_all(&mut self) -> Result<[f64; 2]> {
        let start = Instant::now();
        let (mut first_error, mut buckets) = (None, 0);
        let mut scalars = self.inline_scalars.take().unwrap_or([0.0; 2]);
        while self.pending > 0 {
            match self.receive() {
                Ok(Done::Scalars(v)) => {
                    scalars = v;
                    self.stats.calls += 1;
                }
                Ok(done) => {
                    buckets += 1;
                    self.record(done);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        self.submitted = 0;
        self.inline_step = false;
        if let Some(e) = first_error {
            return Err(e);
        }
        if buckets > 0 {
            self.stats.exposed_seconds += start.elapsed().as_secs_f64();
            self.stats.steps += 1;
        }
        Ok(scalars)
    }

    fn receive(&mut self) -> Result<Done> {
        let r = self.done.recv().map_err(|_| stopped())?;
        self.pending -= 1;
        r
    }
}

impl Drop for Reducer {
    fn drop(&mut self) {
        // Closing the channel ends the thread once it is idle. A thread still inside a
        // collective call (a step failed on this rank while others summed) is left to the
        // process's end: joining it could wait for peers forever.
        self.jobs = None;
        if self.pending == 0 {
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }
}

fn stopped() -> Error {
    Error::InvalidState {
        op: "Trainer::step",
        buffer: "gradient buckets".into(),
        reason: "the thread summing them stopped (a panic inside the collective)".into(),
    }
}

/// The thread's side: the staging buffers, reused every step.
struct Worker {
    ws: Arc<Workspace>,
    /// Each bucket's gradient blobs, looked up by name once (at the bucket's first sum).
    blobs: Vec<Vec<syncmem::workspace::BlobRef>>,
    buckets: Vec<BucketPlan>,
    /// Where buckets of several gradients are packed and summed in place.
    packed: Vec<f32>,
    collective: Arc<dyn Collective>,
}

fn lock(worker: &Mutex<Worker>) -> std::sync::MutexGuard<'_, Worker> {
    // A panic inside a collective call leaves the staging buffers as plain numbers.
    worker
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Worker {
    fn run(worker: &Mutex<Worker>, jobs: &Receiver<Job>, done: &Sender<Result<Done>>) {
        while let Ok(job) = jobs.recv() {
            let r = match job {
                Job::Bucket { index, share } => lock(worker).bucket(index, share),
                Job::Scalars(v) => lock(worker).scalars(v).map(Done::Scalars),
            };
            if done.send(r).is_err() {
                return;
            }
        }
    }

    fn scalars(&self, values: [f64; 2]) -> Result<[f64; 2]> {
        let mut out = [0.0; 2];
        self.collective.all_reduce_sum_f64(&values, &mut out)?;
        Ok(out)
    }

    fn bucket(&mut self, index: usize, share: Share) -> Result<Done> {
        let start = Instant::now();
        let copies = thread_copies();
        let plan = &self.buckets[index];
        if self.blobs[index].is_empty() {
            self.blobs[index] = plan
                .grads
                .iter()
                .map(|(name, _)| self.ws.get_blob(name))
                .collect::<Result<_>>()?;
        }
        if plan.grads.len() == 1 && share.direct() {
            return self.direct(index, share.weight, (start, copies));
        }
        let share = share.weight;
        // Each gradient's blob read-locked, and its host mirror held for writing from the pack
        // to the unpack: one guard per gradient. Nothing else touches them meanwhile (the
        // update, which reads them next, waits for every bucket).
        let locked: SmallVec<[_; GUARDS]> = self.blobs[index].iter().map(|b| b.read()).collect();
        let mut hosts = SmallVec::<[HostWrite<'_>; GUARDS]>::new();
        for (blob, (name, n)) in locked.iter().zip(&plan.grads) {
            let m = grad_memory(blob, name, *n)?;
            // A share of 0 sends zeros: the gradient is not read, only overwritten by the sum.
            hosts.push(if share == 0.0 {
                m.host_overwrite()?
            } else {
                m.host_mut()?
            });
        }
        let packed = &mut self.packed[..plan.len];
        let mut at = 0;
        for (host, (name, n)) in hosts.iter().zip(&plan.grads) {
            let dst = &mut packed[at..at + n];
            if share == 0.0 {
                dst.fill(0.0);
            } else if share == 1.0 {
                dst.copy_from_slice(floats(host, *n, name)?);
            } else {
                for (d, s) in dst.iter_mut().zip(floats(host, *n, name)?) {
                    *d = s * share;
                }
            }
            at += n;
        }
        let packing = start.elapsed().as_secs_f64();
        let call = Instant::now();
        self.collective.all_reduce_sum_in_place(packed)?;
        let reduce = call.elapsed().as_secs_f64();
        let unpack = Instant::now();
        let mut at = 0;
        for (host, (name, n)) in hosts.iter_mut().zip(&plan.grads) {
            floats_mut(host, *n, name)?.copy_from_slice(&packed[at..at + n]);
            at += n;
        }
        drop(hosts);
        Ok(Done::Bucket {
            bytes: plan.len as u64 * 4,
            reduce,
            staging: packing + unpack.elapsed().as_secs_f64(),
            copies: thread_copies().since(&copies),
        })
    }
}

impl Worker {
    /// Bucket `index`, of one gradient, summed in place in the gradient's host mirror (no
    /// copy), and scaled there by `weight` (see [`Share::direct`]). The gradient's write guard
    /// is held during the call: nothing reads or writes it before the update, which waits for
    /// every bucket.
    fn direct(
        &mut self,
        index: usize,
        weight: f32,
        (start, copies): (Instant, CopyStats),
    ) -> Result<Done> {
        let plan = &self.buckets[index];
        let ((name, n), blob) = (&plan.grads[0], &self.blobs[index][0]);
        let collective = &self.collective;
        let mut reduce = 0.0;
        with_grad(blob, name, *n, |g| {
            let mut host = g.host_mut()?;
            let values = floats_mut(&mut host, *n, name)?;
            let call = Instant::now();
            collective.all_reduce_sum_in_place(values)?;
            reduce = call.elapsed().as_secs_f64();
            if weight != 1.0 {
                values.iter_mut().for_each(|v| *v *= weight);
            }
            Ok(())
        })?;
        Ok(Done::Bucket {
            bytes: plan.len as u64 * 4,
            reduce,
            staging: start.elapsed().as_secs_f64() - reduce,
            copies: thread_copies().since(&copies),
        })
    }
}

/// Calls `f` with the storage of gradient `name` (of `n` elements), held by `blob`.
fn with_grad(
    blob: &syncmem::workspace::BlobRef,
    name: &str,
    n: usize,
    f: impl FnOnce(&syncmem::SyncedMemory) -> Result<()>,
) -> Result<()> {
    f(grad_memory(&blob.read(), name, n)?)
}

/// The storage of gradient `name` (of `n` elements), the tensor of `blob`.
fn grad_memory<'a>(blob: &'a Blob, name: &str, n: usize) -> Result<&'a SyncedMemory> {
    let t = blob.get::<Tensor>()?;
    match t.synced() {
        Some(m) if t.numel().unwrap_or(0) == n => Ok(m),
        _ => Err(Error::InvalidShape {
            what: format!("gradient {name:?}"),
            shape: format!("{:?}", t.dims()),
            reason: format!("expected {n} elements in a bucket of the all-reduce"),
        }),
    }
}

fn floats<'a>(bytes: &'a [u8], n: usize, name: &str) -> Result<&'a [f32]> {
    bytes
        .get(..n * 4)
        .and_then(|b| bytemuck::try_cast_slice(b).ok())
        .ok_or_else(|| cast_error(name))
}

fn floats_mut<'a>(bytes: &'a mut [u8], n: usize, name: &str) -> Result<&'a mut [f32]> {
    bytes
        .get_mut(..n * 4)
        .and_then(|b| bytemuck::try_cast_slice_mut(b).ok())
        .ok_or_else(|| cast_error(name))
}

fn cast_error(name: &str) -> Error {
    Error::InvalidState {
        op: "Trainer::step",
        buffer: format!("gradient {name:?}"),
        reason: "its host mirror is not aligned or too short for its f32 elements".into(),
    }
}

#[cfg(test)]
#[path = "reduce_tests.rs"]
mod tests;
