//! Collectives: what ranks of a distributed job do together (sum gradients, compare checksums,
//! end the job), behind one small trait so that the trainer does not name the engine.
//!
//! [`Collective`] is the trait; [`Local`] runs ranks as threads of one process (tests, and a
//! model of a job without MPI); with the `mpi` feature, [`mpi::Mpi`] runs ranks as MPI
//! processes (`mpirun`, `srun`). An NCCL implementation for CUDA ranks would be another
//! implementation of the same trait: the trainer ([`Trainer::distributed`]) does not change.
//!
//! Every rank must make the same calls in the same order with the same lengths (as with MPI's
//! collectives); the trainer guarantees that for its own calls.
//!
//! ```
//! use syncmem_nn::train::collective::{Collective, Local};
//!
//! # fn main() -> syncmem::Result<()> {
//! let ranks = Local::group(3);
//! std::thread::scope(|s| {
//!     for c in &ranks {
//!         s.spawn(move || {
//!             let mine = [c.rank() as f32 + 1.0; 4];
//!             let mut sum = [0.0f32; 4];
//!             c.all_reduce_sum(&mine, &mut sum).unwrap();
//!             assert_eq!(sum, [6.0; 4]); // 1 + 2 + 3 on every rank
//!         });
//!     }
//! });
//! # Ok(())
//! # }
//! ```
//!
//! [`Trainer::distributed`]: super::Trainer::distributed

use std::fmt;

use syncmem::Result;

mod local;
#[cfg(feature = "mpi")]
pub mod mpi;

pub use local::Local;

/// What the ranks of a job do together. Implementations are `Send + Sync`: the trainer calls
/// them from one thread of its own (the one that sums gradients while backward runs), one call
/// at a time.
pub trait Collective: Send + Sync + fmt::Debug {
    /// This process's rank, from 0.
    fn rank(&self) -> usize;

    /// Ranks in the job.
    fn size(&self) -> usize;

    /// What the engine is and how many ranks it has, for reports (`"MPI: Open MPI v4.1.4, 2
    /// ranks"`).
    fn describe(&self) -> String;

    /// Sums `send` element by element over the ranks into `recv` (of the same length), and
    /// returns once this rank's `recv` holds the sum. Every rank sums its values in the same
    /// order, so the result is the same on every rank.
    ///
    /// # Errors
    /// [`syncmem::Error::InvalidShape`] when `send` and `recv` differ in length; an error of the
    /// engine.
    fn all_reduce_sum(&self, send: &[f32], recv: &mut [f32]) -> Result<()>;

    /// Sums `values` element by element over the ranks, in place: on return this rank's
    /// `values` hold the sum, as [`Collective::all_reduce_sum`] would have written it into a
    /// receive buffer. The trainer's buckets use it: no receive buffer, and no copy into one.
    ///
    /// The provided method copies `values` into a new vector and calls
    /// [`Collective::all_reduce_sum`] into `values`; [`mpi::Mpi`] sums in place with no copy
    /// (`MPI_IN_PLACE`), and [`Local`] writes its sum back into `values`.
    ///
    /// # Errors
    /// As [`Collective::all_reduce_sum`].
    fn all_reduce_sum_in_place(&self, values: &mut [f32]) -> Result<()> {
        let send = values.to_vec();
        self.all_reduce_sum(&send, values)
    }

    /// As [`Collective::all_reduce_sum`] for `f64` values (loss and accuracy sums).
    ///
    /// # Errors
    /// As [`Collective::all_reduce_sum`].
    fn all_reduce_sum_f64(&self, send: &[f64], recv: &mut [f64]) -> Result<()>;

    /// Every rank's `values` (all of the same length), in rank order: rank 0's first.
    ///
    /// # Errors
    /// An error of the engine.
    fn all_gather_u64(&self, values: &[u64]) -> Result<Vec<u64>>;

    /// Ends every rank of the job, this one included, with exit status `code`: called when this
    /// rank failed, so that the others, which may be waiting in a collective for it, do not wait
    /// forever. Does not return for engines that end processes ([`mpi::Mpi`]); [`Local`] marks
    /// the group failed, so that every rank's next or pending call returns an error, and returns.
    fn abort(&self, code: i32, reason: &str);
}

/// The error every collective returns for send and receive buffers of different lengths.
pub(crate) fn check_lengths(op: &'static str, send: usize, recv: usize) -> Result<()> {
    if send == recv {
        return Ok(());
    }
    Err(syncmem::Error::InvalidShape {
        what: format!("{op} buffers"),
        shape: format!("send {send}, receive {recv}"),
        reason: "the send and receive buffers must have the same length".into(),
    })
}
