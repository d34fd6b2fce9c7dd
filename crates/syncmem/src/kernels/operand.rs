//! What the library's kernels take: [`Src`] for a buffer read, [`Dst`] for a buffer written,
//! [`Empty`] for an operand without elements, and [`BadLabel`] for a label a kernel found out of
//! range.
//!
//! Only guards of a [`SyncedMemory`](crate::SyncedMemory)'s device mirror (and [`Empty`]) are
//! operands: a guard proves that its holder has the mirror current on the device (or taken for
//! writing) and that no one else reads or writes its memory meanwhile, so a launch through them
//! is safe. Outputs are taken `&mut`: one guard cannot be an input and an output of one call;
//! kernels that work in place say so with `None` for the input.

use crate::device::{Device, DeviceBuffer};
use crate::synced::{DeviceRead, DeviceWrite};

mod sealed {
    use crate::device::DeviceBuffer;

    /// The memory of an operand read. Not implementable outside the crate.
    pub trait Read {
        fn read_buffer(&self) -> &DeviceBuffer;
    }

    /// The memory of an operand written, borrowed exclusively.
    pub trait Write {
        fn write_buffer(&mut self) -> &DeviceBuffer;
    }
}

/// A buffer a library kernel reads: a [`DeviceRead`] or [`DeviceWrite`] guard, or [`Empty`].
pub trait Src: sealed::Read {}

/// A buffer a library kernel writes: a [`DeviceWrite`] guard, or [`Empty`].
pub trait Dst: sealed::Write {}

impl sealed::Read for DeviceRead<'_> {
    fn read_buffer(&self) -> &DeviceBuffer {
        self.buffer()
    }
}
impl Src for DeviceRead<'_> {}

impl sealed::Read for DeviceWrite<'_> {
    fn read_buffer(&self) -> &DeviceBuffer {
        self.buffer()
    }
}
impl Src for DeviceWrite<'_> {}

impl sealed::Write for DeviceWrite<'_> {
    fn write_buffer(&mut self) -> &DeviceBuffer {
        self.buffer()
    }
}
impl Dst for DeviceWrite<'_> {}

/// An operand without elements on a device: what a tensor with no elements passes (it has no
/// memory, hence no guard). A kernel given one reads and writes nothing there; one that needs
/// at least one element returns an error naming the operand.
pub struct Empty {
    buffer: DeviceBuffer,
}

impl Empty {
    /// An empty operand on `device`.
    pub fn new(device: &Device) -> Self {
        Self {
            buffer: DeviceBuffer::empty(device),
        }
    }
}

impl std::fmt::Debug for Empty {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Empty({})", self.buffer.device().label())
    }
}

impl sealed::Read for Empty {
    fn read_buffer(&self) -> &DeviceBuffer {
        &self.buffer
    }
}
impl Src for Empty {}

impl sealed::Write for Empty {
    fn write_buffer(&mut self) -> &DeviceBuffer {
        &self.buffer
    }
}
impl Dst for Empty {}

/// A label out of range, found by a kernel that reads labels (the `cpu` device checks every
/// row; other devices clamp and cannot tell): the first such row and its label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BadLabel {
    /// The row.
    pub row: usize,
    /// Its label.
    pub label: i32,
}

impl BadLabel {
    pub(crate) fn from_pair((row, label): (usize, i32)) -> Self {
        Self { row, label }
    }
}
