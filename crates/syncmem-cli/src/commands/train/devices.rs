//! The devices `syncmem train` trains on: those named by `--device` (this rank's part of them
//! in a distributed job), or the default one; and their memory cap.

use anyhow::{ensure, Context as _};
use syncmem::{BackendKind, Device};

use super::distributed;

/// The devices to train on, with a note on the default device; in a distributed job
/// (`world`), this rank's part of them.
pub(super) fn for_run(
    specs: Option<crate::args::DeviceList>,
    world: Option<&distributed::World>,
) -> anyhow::Result<(Vec<Device>, Option<String>)> {
    let (devices, note) = pick_devices(specs)?;
    match world {
        Some(w) => Ok((distributed::local_devices(devices, w.local)?, note)),
        None => Ok((devices, note)),
    }
}

/// Caps the device memory of every device trained on at `cap` bytes (`--memory-cap`), with the
/// pool the environment asks for.
pub(super) fn cap_devices(devices: &[Device], cap: u64) -> anyhow::Result<()> {
    // The pools' rule (`memory_cap=0` in SYNCMEM_POOL_CONF is refused as well).
    ensure!(
        cap > 0,
        "--memory-cap: 0 bytes: must be at least 1 (no cap: leave it out)"
    );
    let config = syncmem::alloc::pool::config::device_pool_from_env()
        .context("--memory-cap: the device pool settings")?;
    for d in devices {
        d.set_pool(
            config
                .clone()
                .with_memory_cap(syncmem::MemoryCap::Bytes(cap)),
        )
        .with_context(|| format!("--memory-cap on {}", d.label()))?;
    }
    Ok(())
}

/// The devices asked for, each opened (an absent one is an error naming it), or the default
/// device with a note when it is not the first OpenCL device.
fn pick_devices(
    specs: Option<crate::args::DeviceList>,
) -> anyhow::Result<(Vec<Device>, Option<String>)> {
    let Some(crate::args::DeviceList(specs)) = specs else {
        let (d, note) = pick_device()?;
        return Ok((vec![d], note));
    };
    let several = specs.len() > 1;
    let devices = specs
        .into_iter()
        .map(|s| {
            Device::open_spec(s).with_context(|| {
                if several && s.backend == BackendKind::OpenCl {
                    format!(
                        "opening device {s} (with PoCL, POCL_DEVICES=\"pthread pthread\" gives \
                         two OpenCL devices; `syncmem devices` lists those present)"
                    )
                } else {
                    format!("opening device {s}")
                }
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok((devices, None))
}

fn pick_device() -> anyhow::Result<(Device, Option<String>)> {
    match Device::all(BackendKind::OpenCl) {
        Ok(list) if !list.is_empty() => Ok((list[0].clone(), None)),
        Ok(_) => Ok((
            Device::cpu(),
            Some("no OpenCL device found; training on cpu".into()),
        )),
        // A bad setting is the user's to fix, not a reason to train somewhere else.
        Err(e @ syncmem::Error::InvalidConfig { .. }) => Err(e.into()),
        Err(e) => Ok((
            Device::cpu(),
            Some(format!("OpenCL unavailable ({e}); training on cpu")),
        )),
    }
}
