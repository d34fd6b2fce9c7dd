//! `syncmem train` as one rank of a distributed job: detecting the launcher, joining the MPI
//! world, choosing this rank's devices, and ending the whole job when this rank fails.

use std::sync::Arc;

use anyhow::bail;
use syncmem::Device;
use syncmem_nn::train::collective::Collective;

/// `--distributed`: how ranks are found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// MPI when a launcher (`mpirun`, `srun`) started this process as one of several ranks,
    /// else one process.
    Auto,
    /// MPI, always (one rank when started without a launcher).
    Mpi,
    /// One process, even under a launcher (each rank would train alone).
    None,
}

/// This process's place in the job.
pub(super) struct World {
    pub(super) collective: Arc<dyn Collective>,
    /// Rank and ranks on this node.
    pub(super) local: (usize, usize),
}

impl World {
    /// The header line of a distributed run.
    pub(super) fn print(&self, devices: &[Device]) -> anyhow::Result<()> {
        let labels: Vec<&str> = devices.iter().map(Device::label).collect();
        outln!(
            "distributed: {}; each rank trains on its share of every batch, on its own devices \
             (rank 0 on {}), and the gradients are summed over the ranks",
            self.collective.describe(),
            labels.join(", ")
        );
        Ok(())
    }

    /// Whether this rank prints the report and writes the files.
    pub(super) fn is_root(world: Option<&World>) -> bool {
        world.is_none_or(|w| w.collective.rank() == 0)
    }
}

/// The variable a launcher sets that shows this process is one of several ranks, and its
/// value.
pub(super) fn launcher() -> Option<(&'static str, String)> {
    // Ranks in the job: Open MPI, MPICH and Intel MPI (PMI), Slurm's srun.
    for var in ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"] {
        if let Ok(v) = std::env::var(var) {
            if v.trim().parse::<u64>().is_ok_and(|n| n > 1) {
                return Some((var, v));
            }
        }
    }
    None
}

/// Joins the job as `mode` says: `None` for one process.
pub(super) fn join(mode: Mode) -> anyhow::Result<Option<World>> {
    let detected = launcher();
    match (mode, &detected) {
        (Mode::None, _) | (Mode::Auto, None) => Ok(None),
        (Mode::Mpi, _) | (Mode::Auto, Some(_)) => join_mpi(detected),
    }
}

#[cfg(feature = "mpi")]
fn join_mpi(_detected: Option<(&'static str, String)>) -> anyhow::Result<Option<World>> {
    use anyhow::Context as _;
    let mpi = syncmem_nn::train::collective::mpi::Mpi::init().context("joining the MPI job")?;
    let local = (mpi.local_rank(), mpi.local_size());
    Ok(Some(World {
        collective: Arc::new(mpi),
        local,
    }))
}

#[cfg(not(feature = "mpi"))]
fn join_mpi(detected: Option<(&'static str, String)>) -> anyhow::Result<Option<World>> {
    let why = match detected {
        Some((var, n)) => format!("this process is one of {n} ranks ({var} is set)"),
        None => "--distributed mpi was given".into(),
    };
    bail!(
        "{why}, but this syncmem was built without MPI: build it with the `mpi` feature \
         (`cargo build --release -p syncmem-cli --features mpi`; it needs an MPI library and \
         libclang, which `scripts/setup.sh --with-mpi` installs), or pass --distributed none \
         to train one process per rank, each alone"
    )
}

/// This rank's devices out of `devices` (the `--device` list, or the default device): with
/// `L` ranks on the node, local rank `r` takes the `r`-th of `L` equal parts of a list of a
/// multiple of `L` devices; a list shorter than `L` is shared, rank `r` taking device `r mod
/// len`.
pub(super) fn local_devices(
    devices: Vec<Device>,
    (rank, ranks): (usize, usize),
) -> anyhow::Result<Vec<Device>> {
    let n = devices.len();
    if ranks <= 1 || n == 0 {
        return Ok(devices);
    }
    if n < ranks {
        return Ok(vec![devices[rank % n].clone()]);
    }
    if !n.is_multiple_of(ranks) {
        bail!(
            "--device lists {n} devices for the {ranks} ranks on this node: give a multiple of \
             {ranks} (each rank takes its part) or fewer than {ranks} (ranks share them)"
        );
    }
    let k = n / ranks;
    Ok(devices[rank * k..(rank + 1) * k].to_vec())
}

/// Ends the job after this rank failed with `e`: the message names the rank, and the
/// collective ends every other rank (MPI: `MPI_Abort`), which may be waiting for this one.
pub(super) fn fail(world: &World, e: &anyhow::Error) -> ! {
    let c = &world.collective;
    let reason = format!("{e:#}");
    // One write: `mpirun` prints its own abort banner to the same stream.
    crate::commands::error_line(format_args!(
        "rank {} of {} failed: {reason}",
        c.rank(),
        c.size()
    ));
    c.abort(1, &reason);
    // A collective that returns from abort: end this process the same way.
    std::process::exit(1)
}

#[cfg(test)]
mod tests {
    use super::local_devices;
    use syncmem::Device;

    #[test]
    fn ranks_on_a_node_split_or_share_the_devices() {
        let cpu = || Device::cpu();
        // One device for 3 ranks: shared.
        assert_eq!(local_devices(vec![cpu()], (2, 3)).unwrap().len(), 1);
        // 4 for 2: two each.
        assert_eq!(local_devices(vec![cpu(); 4], (1, 2)).unwrap().len(), 2);
        let e = local_devices(vec![cpu(); 3], (0, 2))
            .unwrap_err()
            .to_string();
        assert!(e.contains("lists 3 devices for the 2 ranks"), "{e}");
    }
}
