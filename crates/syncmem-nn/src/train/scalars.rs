//! The loss and the accuracy of a net just queued: one read of the pair a fused loss writes,
//! or the two scalars read one after the other.

use crate::mlp::{ACCURACY, LOSS, LOSS_AND_ACCURACY};
use syncmem::net::Net;
use syncmem::Tensor;
use syncmem::Workspace;
use syncmem::{Error, Result};

/// Queues the copy of scalar `name` of `ws` to the host (the next read of it waits for
/// nothing else).
fn prefetch_scalar(ws: &Workspace, name: &str) -> Result<()> {
    let blob = ws.get_blob(name)?;
    let guard = blob.read();
    let t = guard.get::<Tensor>()?;
    if let Some(m) = t.synced() {
        if m.head() == syncmem::synced::Head::AtDevice {
            m.prefetch_to_host(None)?;
        }
    }
    Ok(())
}

/// The first `N` values (`f32`) of blob `name` of `ws`, read on the host.
fn read_values<const N: usize>(ws: &Workspace, name: &str) -> Result<[f32; N]> {
    let blob = ws.get_blob(name)?;
    let guard = blob.read();
    let t = guard.get::<Tensor>()?;
    let v = t.host::<f32>()?;
    v.get(..N)
        .and_then(|v| <[f32; N]>::try_from(v).ok())
        .ok_or_else(|| Error::InvalidShape {
            what: format!("blob {name:?}"),
            shape: format!("{:?}", t.dims()),
            reason: format!("expected at least {N} value(s)"),
        })
}

/// The loss and the accuracy of `net`, just queued in `ws`: where its fused loss writes them
/// side by side (see [`crate::fuse::loss`]), one read of the pair; otherwise the loss's
/// copy is queued first, then the accuracy is read (the one wait), and the loss's copy is done
/// by then.
pub(super) fn read_scalars(ws: &Workspace, net: &Net) -> Result<(f32, f32)> {
    let pair = LOSS_AND_ACCURACY;
    if net
        .run_def()
        .ops
        .iter()
        .any(|o| o.outputs.iter().any(|n| n == pair))
    {
        let [loss, acc] = read_values(ws, pair)?;
        return Ok((loss, acc));
    }
    prefetch_scalar(ws, LOSS)?;
    let [acc] = read_values(ws, ACCURACY)?;
    let [loss] = read_values(ws, LOSS)?;
    Ok((loss, acc))
}
