//! [`LentStream`]: a [`Stream`] lent for as long as its originals are borrowed, with no
//! reference count taken or given back.
//!
//! A buffer's device access uses its stream (the device's default one, most often) for a few
//! calls and hands it to its guard, which lives no longer than the buffer. An owned copy took
//! two reference counts and gave them back (the device's handle, the queue); a step of a small
//! net did that about fifty times, a few percent of its time.

use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ops::Deref;

use super::{Stream, UnboundStream};
use crate::device::handle::StreamHandle;
use crate::device::Device;

/// A [`Stream`] lent for `'a` (or, made by [`LentStream::owned`], held): it derefs to
/// `&Stream`, and [`LentStream::to_stream`] makes an owned one where the stream must outlive
/// the loan.
pub(crate) struct LentStream<'a> {
    /// Lent: bitwise copies of the originals' handles, never dropped and never moved out
    /// (only `&Stream` is handed out), so that no count is given back for them. Owned: the
    /// handles, dropped with this.
    stream: ManuallyDrop<Stream>,
    owned: bool,
    _originals: PhantomData<&'a Device>,
}

impl Drop for LentStream<'_> {
    #[inline]
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: an owned stream's handles are this value's own, dropped once, here.
            unsafe { ManuallyDrop::drop(&mut self.stream) }
        }
    }
}

impl Deref for LentStream<'_> {
    type Target = Stream;

    #[inline]
    fn deref(&self) -> &Stream {
        &self.stream
    }
}

impl LentStream<'_> {
    /// `stream` held by value (a stream of another device than the one borrowed, say).
    pub(crate) fn owned(stream: Stream) -> Self {
        LentStream {
            stream: ManuallyDrop::new(stream),
            owned: true,
            _originals: PhantomData,
        }
    }

    /// An owned handle of the stream (two reference counts).
    pub(crate) fn to_stream(&self) -> Stream {
        Stream::clone(&self.stream)
    }
}

impl Stream {
    /// The stream lent for as long as `self` is borrowed.
    #[inline]
    pub(crate) fn lend(&self) -> LentStream<'_> {
        LentStream {
            // SAFETY: a bitwise copy of `self`, whose handles stay alive (and counted) while
            // the borrow lasts, which the loan does not outlive. The copy is never dropped and
            // never handed out by value, so that it gives back no count it did not take: it is
            // another way to reach the same handles, as `&self` is.
            stream: ManuallyDrop::new(unsafe { std::ptr::read(self) }),
            owned: false,
            _originals: PhantomData,
        }
    }
}

impl UnboundStream {
    /// The stream on `device` (the device it was made on, which keeps it), lent for as long
    /// as both are borrowed: the stream with its device handle, without their two reference
    /// counts.
    #[inline]
    pub(crate) fn lend<'a>(&'a self, device: &'a Device) -> LentStream<'a> {
        // SAFETY: bitwise copies of `device`'s handle and of the queue's, both alive (and
        // counted) while the borrows last, which the loan does not outlive. As in
        // `Stream::lend`, the copies are never dropped nor handed out by value.
        let (device, raw) = unsafe { (std::ptr::read(device), std::ptr::read(&self.raw)) };
        LentStream {
            stream: ManuallyDrop::new(Stream {
                device: StreamHandle::Device(device),
                raw,
                id: self.id,
            }),
            owned: false,
            _originals: PhantomData,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::Device;

    #[test]
    fn a_lent_stream_takes_and_gives_back_no_count() {
        // A device of its own: other tests take and give back counts of the shared one.
        let d = Device::cpu().isolated();
        let owned = d.default_stream().unwrap();
        let (device, raw) = (Arc::strong_count(&d.shared), Arc::strong_count(&owned.raw));
        for _ in 0..3 {
            let lent = d.default_stream_lent().unwrap();
            assert_eq!(lent.id(), owned.id());
            let again = owned.lend();
            assert_eq!(again.id(), owned.id());
            assert_eq!(Arc::strong_count(&d.shared), device);
            assert_eq!(Arc::strong_count(&owned.raw), raw);
            // An owned copy made from the loan counts, and gives its counts back.
            let copy = lent.to_stream();
            assert_eq!(Arc::strong_count(&owned.raw), raw + 1);
            drop(copy);
        }
        assert_eq!(Arc::strong_count(&d.shared), device);
        assert_eq!(Arc::strong_count(&owned.raw), raw);
        // A stream held by value gives its counts back once, when it goes.
        let held = super::LentStream::owned(owned.clone());
        assert_eq!(Arc::strong_count(&owned.raw), raw + 1);
        drop(held);
        assert_eq!(Arc::strong_count(&owned.raw), raw);
    }
}
