//! The operations of the composed model test and their random strategy.

use proptest::prelude::*;

/// Buffer slots.
pub const SLOTS: usize = 8;
/// Scratch slots: unnamed host blocks (see `scratch.rs`).
pub const SCRATCH: usize = 4;
/// Buffer sizes in `f32` elements (16 KiB and 64 KiB).
pub const SIZES: [usize; 2] = [1 << 12, 1 << 14];
/// The cap of each device: four of the largest buffers. Two guards kept across operations,
/// two pins and the two buffers of an axpy may want more: then the pool fails, which the
/// model allows (an operation that fails changes nothing).
pub const CAP: u64 = 4 * (1 << 14) * 4;

#[derive(Debug, Clone, Copy)]
pub enum Op {
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
    /// Pins the slot's placement and keeps the host address it has then, as a NumPy view or
    /// a host DLPack export does, until `Unpin`.
    Pin {
        slot: usize,
    },
    Unpin,
    /// Reads the slot through the address a pin kept: it must still be the buffer's host
    /// memory, with the model's data once the host is made current.
    ViewRead {
        slot: usize,
    },
    /// `x *= 2` by a user's kernel (`user_twice`), on the buffer's stream.
    UserTwice {
        slot: usize,
    },
    /// Reads the slot on the second device (a replica there).
    ReplicaRead {
        slot: usize,
    },
    /// `x *= a` on the second device: the replica becomes the only current copy.
    ReplicaScale {
        slot: usize,
        a: f32,
    },
    /// Drops the slot's contents (`SyncedMemory::drop_contents`): reads fail until an
    /// overwrite.
    DropContents {
        slot: usize,
    },
    /// Offloads the slot (`SyncedMemory::offload`, or with `ordered`
    /// `SyncedMemory::offload_ordered`, which frees the device mirror under a copy to the host
    /// in flight, or parks memory shared in place under its writer still running): its device
    /// mirror goes, its data stays.
    Offload {
        slot: usize,
        ordered: bool,
    },
    /// The `n`-th allocation for the devices from now fails.
    FailNext {
        n: u64,
    },
    /// Opens a scope of a new MemPool of the device (at most two open): the device
    /// allocations of the operations that follow (mirrors, refills after a spill) come from it.
    OpenScope,
    /// Closes the innermost scope. `keep`: its MemPool stays (the last one kept so, with no
    /// scope); else it is dropped, with the blocks of live buffers still in it.
    CloseScope {
        keep: bool,
    },
    /// An unnamed host block (a staging buffer: what a thread's cache serves), `len` bytes
    /// with `seed`'s pattern, in scratch slot `slot` (see `scratch.rs`): of the process's host
    /// pool, or (`private`) of a host pool of the test's own.
    Scratch {
        slot: usize,
        len: usize,
        seed: u8,
        private: bool,
    },
    /// Frees scratch slot `slot`, here or on another thread (`elsewhere`).
    ScratchFree {
        slot: usize,
        elsewhere: bool,
    },
    /// An unnamed pooled device buffer of `len` bytes filled with `seed` on stream `stream`,
    /// in device scratch slot `slot` (see `dev_scratch.rs`).
    DevScratch {
        slot: usize,
        len: usize,
        seed: u8,
        stream: usize,
    },
    /// Frees device scratch slot `slot`, here or on another thread (`elsewhere`).
    DevScratchFree {
        slot: usize,
        elsewhere: bool,
    },
    /// Stops (`paused`) or starts again the always-on history: while it is stopped nobody
    /// listens to the device pool, whose thread caches then serve.
    HistoryPause {
        paused: bool,
    },
    /// Gives the host pool's idle memory back (`trim`, or with `empty` `empty_cache`, which
    /// empties every thread's cache) and takes its snapshot.
    HostRelease {
        empty: bool,
    },
    /// Holds stream `stream` of the device for `micros` microseconds (OpenCL; see
    /// `hold.rs`): what is queued on it meanwhile stays in flight.
    Hold {
        stream: usize,
        micros: u64,
    },
    /// Takes the slot out of the device and maybe back, with the copies held in flight on
    /// `stream` for `micros` (see `hold.rs`).
    MoveOut {
        slot: usize,
        stream: usize,
        micros: u64,
        back: bool,
    },
    /// Sets where the slot's next host mirror comes from (`SyncedMemory::set_pinned_host`):
    /// the device's pinned pool, or the host pool. Its data stays as it is.
    PinnedHost {
        slot: usize,
        pinned: bool,
    },
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
        2 => (slot(), slot(), prop::sample::select(vec![1.0f32, -1.0]))
            .prop_map(|(x, y, a)| Op::Axpy { x, y, a }),
        1 => (slot(), 0u8..8).prop_map(|(slot, value)| Op::DeviceOverwrite { slot, value }),
        2 => slot().prop_map(|slot| Op::DeviceRead { slot }),
        1 => (slot(), 0..2usize, any::<bool>())
            .prop_map(|(slot, stream, to_device)| Op::Prefetch { slot, stream, to_device }),
        1 => (slot(), any::<bool>()).prop_map(|(slot, device)| Op::Guard { slot, device }),
        1 => Just(Op::Release),
        2 => slot().prop_map(|slot| Op::Pin { slot }),
        1 => Just(Op::Unpin),
        2 => slot().prop_map(|slot| Op::ViewRead { slot }),
        2 => slot().prop_map(|slot| Op::UserTwice { slot }),
        1 => slot().prop_map(|slot| Op::ReplicaRead { slot }),
        1 => (slot(), prop::sample::select(vec![2.0f32, -1.0]))
            .prop_map(|(slot, a)| Op::ReplicaScale { slot, a }),
        2 => (1u64..6).prop_map(|n| Op::FailNext { n }),
        1 => slot().prop_map(|slot| Op::DropContents { slot }),
        1 => (slot(), any::<bool>()).prop_map(|(slot, ordered)| Op::Offload { slot, ordered }),
        1 => Just(Op::OpenScope),
        1 => any::<bool>().prop_map(|keep| Op::CloseScope { keep }),
        2 => (
            0..SCRATCH,
            prop::sample::select(vec![100usize, 4096, 16 << 10, 64 << 10]),
            any::<u8>(),
            any::<bool>()
        )
            .prop_map(|(slot, len, seed, private)| Op::Scratch { slot, len, seed, private }),
        2 => (0..SCRATCH, any::<bool>())
            .prop_map(|(slot, elsewhere)| Op::ScratchFree { slot, elsewhere }),
        1 => any::<bool>().prop_map(|empty| Op::HostRelease { empty }),
        3 => (
            0..SCRATCH,
            prop::sample::select(vec![256usize, 4096, 16 << 10]),
            any::<u8>(),
            0..2usize
        )
            .prop_map(|(slot, len, seed, stream)| Op::DevScratch { slot, len, seed, stream }),
        2 => (0..SCRATCH, any::<bool>())
            .prop_map(|(slot, elsewhere)| Op::DevScratchFree { slot, elsewhere }),
        1 => prop::bool::weighted(0.75).prop_map(|paused| Op::HistoryPause { paused }),
        1 => (slot(), any::<bool>()).prop_map(|(slot, pinned)| Op::PinnedHost { slot, pinned }),
        2 => (0..2usize, 200..3000u64).prop_map(|(stream, micros)| Op::Hold { stream, micros }),
        2 => (slot(), 0..2usize, 200..3000u64, any::<bool>())
            .prop_map(|(slot, stream, micros, back)| Op::MoveOut { slot, stream, micros, back }),
    ]
}
