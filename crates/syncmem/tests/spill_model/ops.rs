//! The operations of the programs: what each does, how the property test draws them, and
//! short constructors for the programs written out by hand.

use proptest::prelude::*;

use super::{SIZES, SLOTS};

#[derive(Debug, Clone, Copy)]
pub enum Op {
    /// A new buffer in `slot` (the old one dropped).
    Alloc {
        slot: usize,
        size: usize,
        stream: usize,
        seed: u8,
    },
    Drop {
        slot: usize,
    },
    HostRead {
        slot: usize,
    },
    HostWrite {
        slot: usize,
        at: usize,
        value: i8,
    },
    HostOverwrite {
        slot: usize,
        seed: u8,
    },
    /// `x *= a` on the device, on the buffer's stream.
    Scale {
        slot: usize,
        a: f32,
    },
    /// `y += a * x` on `y`'s stream.
    Axpy {
        x: usize,
        y: usize,
        a: f32,
    },
    /// Overwrites every element on the device (a fill).
    DeviceOverwrite {
        slot: usize,
        value: u8,
    },
    DeviceRead {
        slot: usize,
    },
    Prefetch {
        slot: usize,
        stream: usize,
        to_device: bool,
    },
    /// Keeps a host (or device) read guard of the slot until `Release`.
    Guard {
        slot: usize,
        device: bool,
    },
    Release,
}

impl Op {
    /// [`Op::Alloc`] of `slot`: `SIZES[size]` elements on stream `stream`, filled from `seed`.
    pub fn alloc(slot: usize, size: usize, stream: usize, seed: u8) -> Op {
        Op::Alloc {
            slot,
            size,
            stream,
            seed,
        }
    }

    /// [`Op::HostWrite`] of `value` at element `at` (modulo the length) of `slot`.
    pub fn host_write(slot: usize, at: usize, value: i8) -> Op {
        Op::HostWrite { slot, at, value }
    }

    /// [`Op::Guard`]: a device guard of `slot` with `device`, else a host one.
    pub fn guard(slot: usize, device: bool) -> Op {
        Op::Guard { slot, device }
    }

    /// [`Op::Prefetch`] of `slot` on stream `stream`, to the device or to the host.
    pub fn prefetch(slot: usize, stream: usize, to_device: bool) -> Op {
        Op::Prefetch {
            slot,
            stream,
            to_device,
        }
    }

    /// [`Op::Axpy`]: `y += a * x`.
    pub fn axpy(x: usize, y: usize, a: f32) -> Op {
        Op::Axpy { x, y, a }
    }
}

pub fn op() -> impl Strategy<Value = Op> {
    let slot = || 0..SLOTS;
    prop_oneof![
        3 => (slot(), 0..SIZES.len(), 0..2usize, any::<u8>())
            .prop_map(|(slot, size, stream, seed)| Op::Alloc { slot, size, stream, seed }),
        1 => slot().prop_map(|slot| Op::Drop { slot }),
        2 => slot().prop_map(|slot| Op::HostRead { slot }),
        2 => (slot(), any::<usize>(), any::<i8>())
            .prop_map(|(slot, at, value)| Op::HostWrite { slot, at, value }),
        1 => (slot(), any::<u8>()).prop_map(|(slot, seed)| Op::HostOverwrite { slot, seed }),
        3 => (slot(), prop::sample::select(vec![2.0f32, 0.5, -1.0]))
            .prop_map(|(slot, a)| Op::Scale { slot, a }),
        3 => (slot(), slot(), prop::sample::select(vec![1.0f32, -1.0]))
            .prop_map(|(x, y, a)| Op::Axpy { x, y, a }),
        1 => (slot(), 0u8..8).prop_map(|(slot, value)| Op::DeviceOverwrite { slot, value }),
        2 => slot().prop_map(|slot| Op::DeviceRead { slot }),
        2 => (slot(), 0..2usize, any::<bool>())
            .prop_map(|(slot, stream, to_device)| Op::Prefetch { slot, stream, to_device }),
        1 => (slot(), any::<bool>()).prop_map(|(slot, device)| Op::Guard { slot, device }),
        1 => Just(Op::Release),
    ]
}
