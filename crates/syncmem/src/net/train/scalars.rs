//! The loss and the accuracy of a net just queued: one read of the pair a fused loss writes,
//! or the two scalars read one after the other.

use super::super::mlp::{ACCURACY, LOSS, LOSS_AND_ACCURACY};
use crate::error::{Error, Result};
use crate::net::Net;
use crate::tensor::Tensor;
use crate::workspace::Workspace;

fn prefetch_scalar(ws: &Workspace, name: &str) -> Result<()> {
    let blob = ws.get_blob(name)?;
    let guard = blob.read();
    let t = guard.get::<Tensor>()?;
    if let Some(m) = t.synced() {
        if m.head() == crate::synced::Head::AtDevice {
            m.prefetch_to_host(None)?;
        }
    }
    Ok(())
}

fn read_scalar(ws: &Workspace, name: &str) -> Result<f32> {
    let blob = ws.get_blob(name)?;
    let guard = blob.read();
    let t = guard.get::<Tensor>()?;
    let v = t.host::<f32>()?;
    v.first().copied().ok_or_else(|| Error::InvalidShape {
        what: format!("blob {name:?}"),
        shape: format!("{:?}", t.dims()),
        reason: "expected a scalar".into(),
    })
}

/// The loss and the accuracy of `net`, just queued in `ws`: where its fused loss writes them
/// side by side (see [`crate::net::fuse_loss`]), one read of the pair; otherwise the loss's
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
        let blob = ws.get_blob(pair)?;
        let guard = blob.read();
        let t = guard.get::<Tensor>()?;
        let v = t.host::<f32>()?;
        return match *v {
            [loss, acc] => Ok((loss, acc)),
            _ => Err(Error::InvalidShape {
                what: format!("blob {pair:?}"),
                shape: format!("{:?}", t.dims()),
                reason: "expected the loss and the accuracy".into(),
            }),
        };
    }
    prefetch_scalar(ws, LOSS)?;
    let acc = read_scalar(ws, ACCURACY)?;
    let loss = read_scalar(ws, LOSS)?;
    Ok((loss, acc))
}
