//! The pending work of a device buffer: which commands read or write it, as points on the
//! streams' timelines ([`crate::backend::timeline`]).
//!
//! Every command the crate queues on a buffer (a copy, a fill, a kernel) records its point on
//! the buffer: the last writer, and the readers since (the newest one per stream). That is all
//! the ordering the crate needs, as PyTorch's `record_stream` and Caffe2's per-context events:
//! - a command on stream `S` that reads the buffer first makes `S` wait, on the device, for the
//!   last writer when it ran on another stream; one that writes waits for the writer and the
//!   readers of other streams (commands of `S` itself are in order already);
//! - the host waits for exactly the points of the buffer it reads, never for a whole queue;
//! - a pooled block freed with points still pending goes back to the pool with them: its own
//!   stream reuses it at once (in order), another stream once they are done.
//!
//! Recording is allocation-free: a point is a stream handle (a reference count) and a number.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::buffer::{single_hint, NOT_SINGLE};
use super::{DeviceBuffer, Stream};
use crate::alloc::pool::{Fence, Queue, QueuePoint};
use crate::alloc::stats::count_wait;
use crate::backend::dispatch::RawStream;
use crate::error::Result;

/// A command on a stream: everything queued there up to `seq`.
#[derive(Clone)]
pub(crate) struct Point {
    pub(crate) stream: Arc<RawStream>,
    /// The stream's id ([`super::Stream::id`]).
    pub(crate) id: u64,
    pub(crate) seq: u64,
}

/// A point not owned: the stream's queue borrowed, so that recording it where a point of
/// the same stream is recorded already takes no reference count (see [`Uses::note_write`]).
#[derive(Clone, Copy)]
pub(crate) struct At<'a> {
    pub(crate) stream: &'a Arc<RawStream>,
    /// The stream's id ([`super::Stream::id`]).
    pub(crate) id: u64,
    pub(crate) seq: u64,
}

impl At<'_> {
    /// The point, owned (a reference count on the queue).
    fn to_point(self) -> Point {
        Point {
            stream: self.stream.clone(),
            id: self.id,
            seq: self.seq,
        }
    }
}

impl Point {
    /// True once the command has completed (never blocks; an error counts as done: the
    /// command no longer runs, and the access that needs its result reports it).
    pub(crate) fn is_done(&self) -> bool {
        self.stream.is_done(self.seq).unwrap_or(true)
    }

    /// Blocks until the command has completed, counting a host wait when it had to wait.
    ///
    /// # Errors
    /// The error of the command (or of one before it on its stream).
    pub(crate) fn wait(&self) -> Result<()> {
        if self.stream.wait_done(self.seq)? {
            count_wait();
        }
        Ok(())
    }
}

impl Queue for RawStream {
    fn reached(&self, seq: u64) -> bool {
        self.is_done(seq).unwrap_or(true)
    }
    fn wait_reached(&self, seq: u64) {
        if self.wait_done(seq).unwrap_or(false) {
            count_wait();
        }
    }
}

impl Point {
    /// The point as a pool fence of its stream's: the stream shared, nothing allocated.
    pub(crate) fn queue(&self) -> Arc<dyn Queue> {
        self.stream.clone()
    }

    /// The point a pool fence of [`Point::queue`] stands for (`None` for any other fence).
    pub(crate) fn of_fence(id: u64, fence: &dyn Fence) -> Option<Point> {
        let any: &dyn std::any::Any = fence;
        let p = any.downcast_ref::<QueuePoint>()?;
        let queue: Arc<dyn std::any::Any + Send + Sync> = p.queue.clone();
        let stream = queue.downcast::<RawStream>().ok()?;
        Some(Point {
            stream,
            id,
            seq: p.seq,
        })
    }
}

impl Fence for Point {
    fn is_complete(&self) -> bool {
        Point::is_done(self)
    }
    fn wait(&self) {
        let _ = Point::wait(self);
    }
    fn poll(&self) -> bool {
        Point::is_done(self)
    }
}

/// The points of one buffer: its last writer and the readers since (at most one per stream).
#[derive(Default)]
pub(crate) struct Uses {
    write: Option<Point>,
    reads: [Option<Point>; 2],
    /// Readers of a third stream and more (rare; empty, so unallocated, otherwise).
    more: Vec<Point>,
}

impl Uses {
    /// Makes `stream` wait, on the device, for what a command of it that reads (or, with
    /// `write`, writes) the buffer must follow: commands of other streams not known complete.
    pub(crate) fn order_before(&self, stream: &RawStream, id: u64, write: bool) -> Result<()> {
        let wait = |p: &Point| -> Result<()> {
            if p.id != id && !p.is_done() {
                stream.wait_on(&p.stream, p.seq)?;
            }
            Ok(())
        };
        if let Some(w) = &self.write {
            wait(w)?;
        }
        if write {
            for r in self.reads.iter().flatten().chain(&self.more) {
                wait(r)?;
            }
        }
        Ok(())
    }

    /// Records a command at `at` that read the buffer (replacing an older read of the same
    /// stream: the newer one completes after it; its queue handle is kept, so no reference
    /// count is taken).
    pub(crate) fn note_read(&mut self, at: At<'_>) {
        let same = self
            .reads
            .iter_mut()
            .flatten()
            .chain(self.more.iter_mut())
            .find(|p| p.id == at.id);
        if let Some(p) = same {
            p.seq = at.seq;
            return;
        }
        match self.reads.iter_mut().find(|s| s.is_none()) {
            Some(slot) => *slot = Some(at.to_point()),
            None => self.more.push(at.to_point()),
        }
    }

    /// Records a command at `at` that wrote the buffer. It was ordered after every reader
    /// (see [`Uses::order_before`]), so its completion covers them: they are forgotten. A
    /// writer of the same stream as the last one takes its place without a reference count
    /// (the common case: a buffer written again and again on one stream).
    pub(crate) fn note_write(&mut self, at: At<'_>) {
        match &mut self.write {
            Some(w) if w.id == at.id => w.seq = at.seq,
            w => *w = Some(at.to_point()),
        }
        if self.reads.iter().any(Option::is_some) {
            self.reads = [None, None];
        }
        self.more.clear();
    }

    /// Records work of a previous owner of the memory (a pooled block handed out again) that
    /// may still run: every command of another stream on the memory, a read included, must
    /// follow it, as it follows a write. Of two such points of one stream the newer is kept.
    /// Returns the point it displaces when one of another stream is already recorded (the
    /// caller waits for it: a block comes back with work of one stream at most).
    pub(crate) fn inherit(&mut self, point: Point) -> Option<Point> {
        match &mut self.write {
            None => {
                self.write = Some(point);
                None
            }
            Some(w) if w.id == point.id => {
                if w.seq < point.seq {
                    *w = point;
                }
                None
            }
            Some(_) => Some(point),
        }
    }

    /// What [`Uses::single_stream`] returns when the points are of several streams, or one is
    /// of stream id 0.
    pub(crate) const MIXED: u64 = u64::MAX;

    /// The id of the one stream every recorded point is of: 0 when none is recorded,
    /// [`Uses::MIXED`] when they are of several. What a command of that stream need not wait
    /// for (see [`super::DeviceBuffer::order_before`]).
    pub(crate) fn single_stream(&self) -> u64 {
        let mut single = 0;
        for p in self.points() {
            if p.id == 0 || (single != 0 && p.id != single) {
                return Self::MIXED;
            }
            single = p.id;
        }
        single
    }

    /// The last writer, if recorded.
    pub(crate) fn writer(&self) -> Option<&Point> {
        self.write.as_ref()
    }

    /// Every point still recorded.
    pub(crate) fn points(&self) -> impl Iterator<Item = &Point> {
        self.write
            .iter()
            .chain(self.reads.iter().flatten())
            .chain(&self.more)
    }

    /// True when no command was recorded (or all were forgotten).
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.write.is_none() && self.reads.iter().all(Option::is_none) && self.more.is_empty()
    }

    /// True when dropping these uses would free nothing: no point, and no room kept for the
    /// readers of a third stream (`more` keeps its capacity once it had some).
    #[inline]
    pub(crate) fn owns_nothing(&self) -> bool {
        self.write.is_none() && self.reads.iter().all(Option::is_none) && self.more.capacity() == 0
    }

    /// Forgets the points known to be complete.
    pub(crate) fn prune(&mut self) {
        if self.write.as_ref().is_some_and(Point::is_done) {
            self.write = None;
        }
        for slot in &mut self.reads {
            if slot.as_ref().is_some_and(Point::is_done) {
                *slot = None;
            }
        }
        self.more.retain(|p| !p.is_done());
    }
}

/// The record of uses of a buffer, read and written by its commands and host accesses.
impl DeviceBuffer {
    /// Makes `stream` wait, on the device, for the commands of other streams that a command of
    /// it reading (or, with `write`, writing) this memory must follow. Inlined: on the `cpu`
    /// device, every copy and kernel call pays only the test of the stream.
    #[inline]
    pub(crate) fn order_before(&self, stream: &Stream, write: bool) -> Result<()> {
        if stream.raw.is_cpu() {
            return Ok(());
        }
        // Every point recorded is of this stream, or none is: nothing to wait for (the common
        // case: a buffer used on one stream). A point recorded concurrently by another thread
        // may be missed here, as it would be under the lock too (it is released before the
        // command is queued): commands that race on one buffer from two threads are not
        // ordered by the crate either way.
        let single = self.single.load(Ordering::Acquire);
        if single == 0 || (single != NOT_SINGLE && u64::from(single) == stream.id()) {
            return Ok(());
        }
        self.uses
            .lock()
            .order_before(&stream.raw, stream.id(), write)
    }

    /// Records a command at `at` (`None`: finished already) that read or wrote the memory.
    pub(crate) fn note(&self, at: Option<At<'_>>, write: bool) {
        let Some(at) = at else {
            return;
        };
        let mut uses = self.uses.lock();
        if write {
            uses.note_write(at);
        } else {
            uses.note_read(at);
        }
        self.single
            .store(single_hint(uses.single_stream()), Ordering::Release);
    }

    /// Blocks until every command recorded on the memory has completed (a host wait each
    /// that was not complete yet).
    ///
    /// # Errors
    /// The error of a command that failed.
    pub(crate) fn wait_uses(&self) -> Result<()> {
        // No point recorded (a `cpu` buffer's commands record none), or every one complete at
        // the last wait: nothing to wait for, and no lock taken (every host access of memory
        // the host shares with the device waits here). A point recorded concurrently by
        // another thread may be missed, as it would be under the lock.
        if self.single.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        // A writer and a reader per stream of two, inline: no heap allocation.
        let points: smallvec::SmallVec<[Point; 3]> = {
            let mut uses = self.uses.lock();
            uses.prune();
            if uses.is_empty() {
                // All complete: the next waits, and `order_before`, skip the lock.
                self.single.store(0, Ordering::Release);
                return Ok(());
            }
            uses.points().cloned().collect()
        };
        for p in &points {
            p.wait()?;
        }
        Ok(())
    }
}
