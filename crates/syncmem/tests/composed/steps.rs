//! The steps of a program: each operation applied to the buffers and their models, and what
//! it read checked. An operation that fails with out-of-memory leaves its buffers as they were.

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use syncmem::kernels::{self, Arg, Grid};
use syncmem::{MemPool, PoolConfig, SyncedMemory};

use super::model::{pattern, same, values};
use super::ops::*;
use super::{Held, Kept, Live, World};

/// Applies `op` to the buffers, the guards and the pins, and checks what it read.
pub fn step_one<'s>(
    w: &World<'_>,
    slots: &mut [Option<Live>],
    held: &mut Vec<Held<'s>>,
    pins: &mut Vec<Kept>,
    op: Op,
    at: &str,
) -> Result<(), TestCaseError> {
    match op {
        Op::Alloc { .. }
        | Op::Drop { .. }
        | Op::HostRead { .. }
        | Op::HostWrite { .. }
        | Op::HostOverwrite { .. } => host_step(w, slots, op, at),
        Op::Scale { .. }
        | Op::Axpy { .. }
        | Op::DeviceOverwrite { .. }
        | Op::DeviceRead { .. }
        | Op::Prefetch { .. } => device_step(w, slots, op, at),
        Op::UserTwice { .. } | Op::ReplicaRead { .. } | Op::ReplicaScale { .. } => {
            elsewhere_step(w, slots, op, at)
        }
        Op::Guard { .. }
        | Op::Release
        | Op::Pin { .. }
        | Op::Unpin
        | Op::ViewRead { .. }
        | Op::FailNext { .. } => keep_step(w, slots, held, pins, op, at),
        Op::DropContents { .. }
        | Op::Offload { .. }
        | Op::MoveOut { .. }
        | Op::Scratch { .. }
        | Op::ScratchFree { .. }
        | Op::HostRelease { .. }
        | Op::DevScratch { .. }
        | Op::DevScratchFree { .. }
        | Op::HistoryPause { .. } => unreachable!("run applies {op:?}"),
        Op::OpenScope | Op::CloseScope { .. } => {
            scope_step(w, op);
            Ok(())
        }
        Op::Hold { stream, micros } => {
            super::hold::hold(&w.streams[stream], micros);
            Ok(())
        }
        Op::PinnedHost { slot, pinned } => {
            if let Some(l) = &slots[slot] {
                l.mem.set_pinned_host(pinned);
                prop_assert_eq!(l.mem.pinned_host(), pinned, "{}", at);
            }
            Ok(())
        }
    }
}

/// Opens or closes a MemPool scope on the device.
fn scope_step(w: &World<'_>, op: Op) {
    match op {
        Op::OpenScope => {
            let mut scopes = w.scopes.borrow_mut();
            if scopes.len() < 2 {
                let pool = MemPool::new(w.dev, PoolConfig::default()).unwrap();
                scopes.push((pool.scope(), pool));
            }
        }
        Op::CloseScope { keep } => {
            let Some((scope, pool)) = w.scopes.borrow_mut().pop() else {
                return;
            };
            drop(scope);
            w.scoped.set(w.scoped.get() + pool.stats().allocations);
            if keep {
                *w.closed.borrow_mut() = Some(pool);
            }
        }
        _ => unreachable!("{op:?} is another step's"),
    }
}

/// Applies a host access, an allocation or a drop.
fn host_step(
    w: &World<'_>,
    slots: &mut [Option<Live>],
    op: Op,
    at: &str,
) -> Result<(), TestCaseError> {
    match op {
        Op::Alloc {
            slot,
            size,
            stream,
            seed,
        } => {
            slots[slot] = None;
            let n = SIZES[size];
            let model = pattern(n, seed);
            let mem = SyncedMemory::new(n * 4, w.dev)
                .with_stream(&w.streams[stream])
                .unwrap()
                .with_label(format!("slot {slot} ({at})"));
            let written = mem.host_overwrite().map(|mut h| {
                h.as_mut_slice_of::<f32>().unwrap().copy_from_slice(&model);
            });
            if w.ok(at, written)?.is_some() {
                slots[slot] = Some(Live {
                    mem,
                    model,
                    stream,
                    dropped: false,
                });
            }
        }
        Op::Drop { slot } => slots[slot] = None,
        Op::HostRead { slot } => {
            if let Some(l) = &slots[slot] {
                match w.ok(at, l.mem.host())? {
                    Some(h) => same(at, h.as_slice_of::<f32>().unwrap(), &l.model)?,
                    None => w.as_it_was(at, l)?,
                }
            }
        }
        Op::HostWrite { slot, at: i, value } => {
            if let Some(l) = &mut slots[slot] {
                let i = i % l.model.len();
                match w.ok(at, l.mem.host_mut())? {
                    Some(mut h) => {
                        h.as_mut_slice_of::<f32>().unwrap()[i] = f32::from(value);
                        l.model[i] = f32::from(value);
                    }
                    None => w.as_it_was(at, l)?,
                }
            }
        }
        Op::HostOverwrite { slot, seed } => {
            if let Some(l) = &mut slots[slot] {
                match w.ok(at, l.mem.host_overwrite())? {
                    Some(mut h) => {
                        l.dropped = false;
                        l.model = pattern(l.model.len(), seed);
                        h.as_mut_slice_of::<f32>()
                            .unwrap()
                            .copy_from_slice(&l.model);
                    }
                    None => w.as_it_was(at, l)?,
                }
            }
        }
        _ => unreachable!("{op:?} is another step's"),
    }
    Ok(())
}

/// Applies a device access of the buffer's own device, or a prefetch.
fn device_step(
    w: &World<'_>,
    slots: &mut [Option<Live>],
    op: Op,
    at: &str,
) -> Result<(), TestCaseError> {
    match op {
        Op::Scale { slot, a } => {
            if let Some(l) = &mut slots[slot] {
                let n = l.model.len();
                match w.ok(at, l.mem.device_mut())? {
                    Some(mut g) => {
                        kernels::scale(n, a, &mut g).unwrap();
                        l.model.iter_mut().for_each(|v| *v *= a);
                    }
                    None => w.as_it_was(at, l)?,
                }
            }
        }
        Op::Axpy { x, y, a } => return axpy(w, slots, (x, y, a), at),
        Op::DeviceOverwrite { slot, value } => {
            if let Some(l) = &mut slots[slot] {
                match w.ok(at, l.mem.device_overwrite())? {
                    Some(mut g) => {
                        l.dropped = false;
                        g.fill(value).unwrap();
                        let b = f32::from_ne_bytes([value; 4]);
                        l.model.iter_mut().for_each(|v| *v = b);
                    }
                    None => w.as_it_was(at, l)?,
                }
            }
        }
        Op::DeviceRead { slot } => {
            if let Some(l) = &slots[slot] {
                match w.ok(at, l.mem.device())? {
                    Some(g) => {
                        let mut bytes = vec![0u8; l.mem.len()];
                        w.streams[2].read(g.buffer(), 0, &mut bytes).unwrap();
                        same(at, &values(&bytes), &l.model)?;
                    }
                    None => w.as_it_was(at, l)?,
                }
            }
        }
        Op::Prefetch {
            slot,
            stream,
            to_device,
        } => {
            if let Some(l) = &slots[slot] {
                let s = Some(&w.streams[stream]);
                let r = if to_device {
                    l.mem.prefetch_to_device(s)
                } else {
                    l.mem.prefetch_to_host(s)
                };
                if w.ok(at, r)?.is_none() {
                    w.as_it_was(at, l)?;
                }
            }
        }
        _ => unreachable!("{op:?} is another step's"),
    }
    Ok(())
}

/// Applies a user kernel, or an access of a replica on the other device.
fn elsewhere_step(
    w: &World<'_>,
    slots: &mut [Option<Live>],
    op: Op,
    at: &str,
) -> Result<(), TestCaseError> {
    match op {
        Op::UserTwice { slot } => {
            if let Some(l) = &mut slots[slot] {
                let n = l.model.len();
                let stream = &w.streams[l.stream];
                let args = [Arg::write(&l.mem), (n as u32).into()];
                // SAFETY: `twice` touches elements 0..n of the buffer, which holds n floats.
                let r =
                    unsafe { kernels::launch(&w.twice, stream, Grid::for_elements(n, 64), &args) };
                match w.ok(at, r)? {
                    Some(()) => l.model.iter_mut().for_each(|v| *v *= 2.0),
                    None => w.as_it_was(at, l)?,
                }
            }
        }
        Op::ReplicaRead { slot } => {
            if let Some(l) = &slots[slot] {
                match w.ok(at, l.mem.device_on(w.other))? {
                    Some(g) => {
                        let mut bytes = vec![0u8; l.mem.len()];
                        let s = w.other.default_stream().unwrap();
                        s.read(g.buffer(), 0, &mut bytes).unwrap();
                        same(at, &values(&bytes), &l.model)?;
                    }
                    None => w.as_it_was(at, l)?,
                }
            }
        }
        Op::ReplicaScale { slot, a } => {
            if let Some(l) = &mut slots[slot] {
                let n = l.model.len();
                match w.ok(at, l.mem.device_mut_on(w.other))? {
                    Some(mut g) => {
                        kernels::scale(n, a, &mut g).unwrap();
                        l.model.iter_mut().for_each(|v| *v *= a);
                    }
                    None => w.as_it_was(at, l)?,
                }
            }
        }
        _ => unreachable!("{op:?} is another step's"),
    }
    Ok(())
}

/// Takes or drops a guard or a pin kept across operations, reads a pinned view, or arms a failure.
fn keep_step<'s>(
    w: &World<'_>,
    slots: &mut [Option<Live>],
    held: &mut Vec<Held<'s>>,
    pins: &mut Vec<Kept>,
    op: Op,
    at: &str,
) -> Result<(), TestCaseError> {
    match op {
        Op::Guard { slot, device } => {
            if held.len() >= 2 {
                return Ok(());
            }
            let Some(l) = slots[slot].as_ref() else {
                return Ok(());
            };
            // SAFETY: the borrow outlives this call: `slots` outlives `held` (declared first in
            // `run`, dropped after it), and a slot a guard holds is never replaced or dropped
            // while the guard lives (those operations skip it), so the buffer stays where it
            // is for as long as the guard.
            let l: &'s Live = unsafe { &*std::ptr::from_ref(l) };
            let g = if device {
                w.ok(at, l.mem.device())?.map(|g| Held::Device(slot, g))
            } else {
                w.ok(at, l.mem.host())?.map(|g| Held::Host(slot, g))
            };
            match g {
                Some(g) => held.push(g),
                None => w.as_it_was(at, l)?,
            }
        }
        Op::Release => {
            held.pop();
        }
        Op::Pin { slot } => {
            if pins.len() >= 2 {
                return Ok(());
            }
            if let Some(l) = &slots[slot] {
                let pin = l.mem.pin_placement();
                match w.ok(at, l.mem.host())? {
                    // The address a view would keep: read after the pin is taken.
                    Some(h) => {
                        let at = h.as_ptr() as usize;
                        pins.push(Kept {
                            slot,
                            _pin: pin,
                            at,
                        })
                    }
                    None => w.as_it_was(at, l)?,
                }
            }
        }
        Op::Unpin => {
            pins.pop();
        }
        Op::ViewRead { slot } => {
            let Some(p) = pins.iter().find(|p| p.slot == slot) else {
                return Ok(());
            };
            let l = slots[slot].as_ref().unwrap();
            if let Some(h) = w.ok(at, l.mem.host())? {
                prop_assert_eq!(h.as_ptr() as usize, p.at, "{}: the pinned view moved", at);
                same(at, h.as_slice_of::<f32>().unwrap(), &l.model)?;
            } else {
                w.as_it_was(at, l)?;
            }
        }
        Op::FailNext { n } => {
            w.dev.fail_allocation(n);
            w.other.fail_allocation(n);
        }
        _ => unreachable!("{op:?} is another step's"),
    }
    Ok(())
}

/// `y += a * x` on `y`'s stream.
fn axpy(
    w: &World<'_>,
    slots: &mut [Option<Live>],
    (x, y, a): (usize, usize, f32),
    at: &str,
) -> Result<(), TestCaseError> {
    let (Some(lx), Some(ly)) = (&slots[x], &slots[y]) else {
        return Ok(());
    };
    let n = lx.model.len().min(ly.model.len());
    let done = {
        match w.ok(at, lx.mem.device())? {
            None => false,
            Some(xd) => match w.ok(at, ly.mem.device_mut())? {
                None => false,
                Some(mut yd) => {
                    kernels::axpy(n, a, &xd, &mut yd).unwrap();
                    true
                }
            },
        }
    };
    if !done {
        w.as_it_was(at, lx)?;
        w.as_it_was(at, ly)?;
        return Ok(());
    }
    let xs = lx.model[..n].to_vec();
    let ly = slots[y].as_mut().unwrap();
    for (v, xv) in ly.model.iter_mut().zip(xs) {
        *v += a * xv;
    }
    Ok(())
}
