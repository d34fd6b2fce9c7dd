//! [`Mpi`]: the ranks of a job as MPI processes (feature `mpi`).
//!
//! Built on the `mpi` crate (any MPI library with the MPI-3 interface: Open MPI, MPICH, Intel
//! MPI). The sums run on host memory: what the trainer hands over is staged through the host
//! mirrors of the gradients (no copy on devices whose memory is host memory; one copy each way,
//! on the buffer's stream and counted, on a discrete GPU). A CUDA-aware MPI could take device
//! pointers instead; this implementation does not assume one.

use std::ffi::{c_int, c_void};
use std::fmt;
use std::sync::Mutex;

use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::raw::AsRaw;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::*;
use mpi::Threading;

use syncmem::{Error, Result};

use super::{check_lengths, Collective};

#[allow(unsafe_code)]
extern "C" {
    /// The MPI library's `MPI_IN_PLACE`, from its header (in_place.c, built by build.rs).
    static syncmem_mpi_in_place: *const c_void;
}

/// The ranks of `MPI_COMM_WORLD`: this process is one of them.
///
/// [`Mpi::init`] initialises MPI (with `MPI_THREAD_MULTIPLE` asked for; at least
/// `MPI_THREAD_SERIALIZED` needed, since the trainer calls it from a thread of its own); dropping
/// the value that initialised MPI finalises it, which should happen on the thread that created
/// it, after every trainer using it is dropped. MPI's errors end the job (MPI's default error
/// handler), so the calls here return errors only for bad arguments.
pub struct Mpi {
    /// `Some` when this value initialised MPI (and finalises it when dropped).
    universe: Option<Universe>,
    rank: usize,
    size: usize,
    local_rank: usize,
    local_size: usize,
    library: String,
    threading: Threading,
    /// Serialises the calls (the thread level may be `MPI_THREAD_SERIALIZED`).
    calls: Mutex<()>,
}

impl fmt::Debug for Mpi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Mpi(rank {} of {})", self.rank, self.size)
    }
}

impl Mpi {
    /// Initialises MPI, or joins it when the process already did (as `mpi4py` does on import).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when the MPI library cannot take calls from more than one thread
    /// (`MPI_THREAD_SERIALIZED` or better).
    pub fn init() -> Result<Self> {
        let (universe, threading) = match mpi::initialize_with_threading(Threading::Multiple) {
            Some((u, t)) => (Some(u), t),
            None => (None, mpi::environment::threading_support()),
        };
        if !matches!(threading, Threading::Serialized | Threading::Multiple) {
            return Err(Error::InvalidConfig {
                what: "MPI thread level".into(),
                reason: format!(
                    "the MPI library provides {threading:?}; the trainer sums gradients on a \
                     thread of its own, which needs MPI_THREAD_SERIALIZED or \
                     MPI_THREAD_MULTIPLE (use an MPI library built with thread support)"
                ),
            });
        }
        let world = SimpleCommunicator::world();
        let (rank, size) = (world.rank(), world.size());
        // The ranks on this node (`MPI_COMM_TYPE_SHARED`), numbered by world rank.
        let node = world.split_shared(rank);
        let library = mpi::environment::library_version()
            .ok()
            .and_then(|v| {
                // "Open MPI v4.1.4, package: ..., ident: ...": its first part.
                let first = v.split([',', '\n', '\0']).next()?.trim().to_string();
                (!first.is_empty()).then_some(first)
            })
            .unwrap_or_else(|| "MPI".into());
        Ok(Mpi {
            universe,
            rank: usize::try_from(rank).unwrap_or(0),
            size: usize::try_from(size).unwrap_or(1),
            local_rank: usize::try_from(node.rank()).unwrap_or(0),
            local_size: usize::try_from(node.size()).unwrap_or(1),
            library,
            threading,
            calls: Mutex::new(()),
        })
    }

    /// This process's rank among the ranks on its node (`MPI_COMM_TYPE_SHARED`).
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// Ranks on this process's node.
    pub fn local_size(&self) -> usize {
        self.local_size
    }

    /// Whether this value initialised MPI (and finalises it when dropped).
    pub fn owns_mpi(&self) -> bool {
        self.universe.is_some()
    }

    /// The thread level MPI provides.
    pub fn threading(&self) -> Threading {
        self.threading
    }

    fn serial(&self) -> std::sync::MutexGuard<'_, ()> {
        self.calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Collective for Mpi {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn describe(&self) -> String {
        format!("MPI: {}, {} ranks", self.library, self.size)
    }

    fn all_reduce_sum(&self, send: &[f32], recv: &mut [f32]) -> Result<()> {
        check_lengths("all_reduce_sum", send.len(), recv.len())?;
        let _one = self.serial();
        SimpleCommunicator::world().all_reduce_into(send, recv, SystemOperation::sum());
        Ok(())
    }

    // The one call the `mpi` crate does not wrap: MPI_Allreduce with MPI_IN_PLACE.
    #[allow(unsafe_code)]
    fn all_reduce_sum_in_place(&self, values: &mut [f32]) -> Result<()> {
        let count = c_int::try_from(values.len()).map_err(|_| Error::InvalidShape {
            what: "all_reduce_sum_in_place buffer".into(),
            shape: format!("{} elements", values.len()),
            reason: "MPI counts are C ints: at most 2^31 - 1 elements per call".into(),
        })?;
        let world = SimpleCommunicator::world();
        let _one = self.serial();
        // SAFETY: `syncmem_mpi_in_place` is a constant initialised from the library's own
        // `MPI_IN_PLACE` (in_place.c), never written. With it as the send buffer, MPI reads and
        // writes `count` floats at `values`, which is a live, exclusively borrowed slice of
        // exactly `count` f32 for the whole (blocking) call; the datatype, operation and
        // communicator are valid handles of the initialised library.
        let code = unsafe {
            mpi::ffi::MPI_Allreduce(
                syncmem_mpi_in_place,
                values.as_mut_ptr().cast(),
                count,
                mpi::ffi::RSMPI_FLOAT,
                SystemOperation::sum().as_raw(),
                world.as_raw(),
            )
        };
        // MPI's default error handler ends the job on failure; a code returned anyway is
        // reported.
        if code != mpi::ffi::MPI_SUCCESS as c_int {
            return Err(Error::InvalidState {
                op: "MPI_Allreduce",
                buffer: format!("{} gradient values", values.len()),
                reason: format!("the MPI library returned error code {code}"),
            });
        }
        Ok(())
    }

    fn all_reduce_sum_f64(&self, send: &[f64], recv: &mut [f64]) -> Result<()> {
        check_lengths("all_reduce_sum_f64", send.len(), recv.len())?;
        let _one = self.serial();
        SimpleCommunicator::world().all_reduce_into(send, recv, SystemOperation::sum());
        Ok(())
    }

    fn all_gather_u64(&self, values: &[u64]) -> Result<Vec<u64>> {
        let mut all = vec![0u64; values.len() * self.size];
        let _one = self.serial();
        SimpleCommunicator::world().all_gather_into(values, &mut all[..]);
        Ok(all)
    }

    fn abort(&self, code: i32, reason: &str) {
        // One write, so that the launcher's own abort banner cannot land inside the line.
        let line = format!(
            "rank {} of {}: ending the job: {reason}\n",
            self.rank, self.size
        );
        let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
        // No lock: the trainer's thread may be inside a call, waiting for this rank's peers.
        SimpleCommunicator::world().abort(code)
    }
}
