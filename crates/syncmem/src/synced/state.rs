//! The coherence state of a [`super::SyncedMemory`], and every change of it.
//!
//! The state ([`Coherence`]) is a set of valid replicas (host, device, and replicas on other
//! devices) plus an optional transfer in flight. Caffe's four heads are the one-device view of
//! it ([`Head`]). Replicas on other devices are one bit ([`Place::Remote`]: at least one of
//! them is current); which ones are is kept with them (see [`super::replica`]).
//!
//! The head changes only through the transitions of [`Coherence`], each named for the event
//! that makes it:
//!
//! | event | transition | current after |
//! |---|---|---|
//! | a write at a place, or the zero fill of a fresh buffer | [`Coherence::wrote`] | that place alone |
//! | a host write through the two-mirror path | [`Coherence::host_written`] | the host alone |
//! | a copy, a zero-copy sync, or a transfer landing | [`Coherence::arrived`] | the place too |
//! | an upload or a refill | [`Coherence::uploaded`] | the device too |
//! | a transfer queued (a prefetch, work announced on another stream) | [`Coherence::queued`] | unchanged until it lands |
//! | a replica's data copied into a home mirror | [`Coherence::pulled`] | that mirror and the replicas |
//! | a dirty device mirror spilled | [`Coherence::spilled_to_host`] | the host alone |
//! | a clean device mirror evicted | [`Coherence::device_dropped`] | the host alone |
//! | an upload that failed, an adopted device mirror taken back | [`Coherence::device_lost`] | the host (if it was), the replicas |
//! | shared memory split into two mirrors | [`Coherence::unshared`] | the device (if a side was), the replicas |
//! | the contents dropped as dead (no write-back) | [`Coherence::contents_dropped`] | none: reads fail until an overwrite |

use crate::device::Point;
use crate::error::Result;

pub use crate::device::Head;

/// A replica: the host mirror or a device mirror.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    Host,
    Device,
    /// A replica on another device than the buffer's own.
    Remote,
}

impl Place {
    fn bit(self) -> u8 {
        match self {
            Place::Host => 1,
            Place::Device => 2,
            Place::Remote => 4,
        }
    }
}

/// Set of replicas that hold the newest data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Valid(u8);

impl Valid {
    pub(crate) const NONE: Valid = Valid(0);

    pub(crate) fn only(p: Place) -> Valid {
        Valid(p.bit())
    }
    pub(crate) fn has(self, p: Place) -> bool {
        self.0 & p.bit() != 0
    }
    pub(crate) fn with(self, p: Place) -> Valid {
        Valid(self.0 | p.bit())
    }
    pub(crate) fn is_empty(self) -> bool {
        self.0 == 0
    }
    /// Only replicas on other devices are current: the buffer's own mirrors are both stale.
    pub(crate) fn remote_only(self) -> bool {
        self.0 == Place::Remote.bit()
    }
    /// `self` with the [`Place::Remote`] bit of `other` (the replicas on other devices stay as
    /// they were while the buffer's own mirrors change without a write).
    pub(crate) fn keep_remote(self, other: Valid) -> Valid {
        Valid(self.0 | (other.0 & Place::Remote.bit()))
    }
    /// Caffe's head for one host and one device ([`Head::Elsewhere`] when only a replica on
    /// another device is current).
    pub(crate) fn head(self) -> Head {
        match (self.has(Place::Host), self.has(Place::Device)) {
            (false, false) if self.has(Place::Remote) => Head::Elsewhere,
            (false, false) => Head::Uninitialized,
            (true, false) => Head::AtHost,
            (false, true) => Head::AtDevice,
            (true, true) => Head::Synced,
        }
    }
}

/// Device work that has been queued but may not have finished: the command on its stream.
pub(crate) struct Pending {
    pub(crate) kind: PendingKind,
    pub(crate) point: Point,
}

/// What is in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PendingKind {
    /// An asynchronous host-to-device copy: the device replica becomes valid when it ends.
    ToDevice,
    /// An asynchronous device-to-host copy: the host replica becomes valid when it ends. Also
    /// the device write still running when memory shared in place was spilled in place
    /// ([`super::SyncedMemory::offload_ordered`]): the host counts as current, and its accesses
    /// wait for that write.
    ToHost,
    /// Work on the device mirror queued by the user on another stream (see
    /// [`super::DeviceWrite::queued_on`]).
    DeviceWork,
}

/// Kinds of access, for conflict checks against a pending transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    HostRead,
    HostWrite,
    DeviceRead,
    DeviceWrite,
}

impl PendingKind {
    /// Whether `access` must wait for this pending work.
    pub(crate) fn conflicts_with(self, access: Access) -> bool {
        use Access::*;
        match self {
            // Source host must not change; destination device is not ready.
            PendingKind::ToDevice => !matches!(access, HostRead),
            // Destination host is not ready; source device must not change.
            PendingKind::ToHost => !matches!(access, DeviceRead),
            // Unknown device work: anything may depend on it.
            PendingKind::DeviceWork => true,
        }
    }

    /// The replica that becomes valid when the work ends.
    pub(crate) fn lands_on(self) -> Option<Place> {
        match self {
            PendingKind::ToDevice => Some(Place::Device),
            PendingKind::ToHost => Some(Place::Host),
            PendingKind::DeviceWork => None,
        }
    }
}

/// Where the newest data of a buffer is and what is on its way there: the part of its state
/// that makes its head, changed only by the transitions below (see the [module docs](self)).
#[derive(Default)]
pub(super) struct Coherence {
    valid: Valid,
    /// Transfer or device work in flight.
    pending: Option<Pending>,
    /// The newest queued copy that reads the host mirror (the upload behind a device access):
    /// whatever writes, replaces or frees the host mirror waits for it first
    /// ([`Coherence::release_host`]). Host reads do not.
    host_busy: Option<Point>,
    /// The device mirror was written back to the host to make room (see [`super::spill`]): the
    /// next upload brings it back, and counts as a refill.
    spilled: bool,
    /// The contents were dropped as no longer needed ([`Coherence::contents_dropped`]): no
    /// replica holds data, and a read is an error (not zeros, as for a fresh buffer) until
    /// the next write.
    dropped: bool,
    /// The device mirror's data came, on the same stream, from the host mirror that the
    /// pending copy to the host is filling ([`Coherence::chained_upload`]): if that copy
    /// fails, the device's data is not the buffer's either.
    chained: bool,
}

impl Coherence {
    /// Caffe's head, counting a transfer in flight as done.
    pub(super) fn head(&self) -> Head {
        if self.dropped {
            return Head::Dropped;
        }
        let mut valid = self.valid;
        if let Some(place) = self.pending.as_ref().and_then(|p| p.kind.lands_on()) {
            valid = valid.with(place);
        }
        valid.head()
    }

    /// Whether `place` holds the newest data (a transfer in flight not counted).
    pub(super) fn has(&self, place: Place) -> bool {
        self.valid.has(place)
    }

    /// Nothing holds data yet: the buffer was never written (or its data went with an adopted
    /// mirror).
    pub(super) fn is_fresh(&self) -> bool {
        self.valid.is_empty() && !self.dropped
    }

    /// The contents were dropped ([`Coherence::contents_dropped`]) and not written since.
    pub(super) fn dropped(&self) -> bool {
        self.dropped
    }

    /// Only replicas on other devices hold the newest data.
    pub(super) fn remote_only(&self) -> bool {
        self.valid.remote_only()
    }

    /// The device mirror was spilled since the host data last changed.
    pub(super) fn spilled(&self) -> bool {
        self.spilled
    }

    /// The transfer or work in flight.
    pub(super) fn pending(&self) -> Option<&Pending> {
        self.pending.as_ref()
    }

    /// The valid set, to put back with [`Coherence::restore`] when a copy fails.
    pub(super) fn save(&self) -> Valid {
        self.valid
    }

    /// Puts back a valid set saved before a copy that failed.
    pub(super) fn restore(&mut self, valid: Valid) {
        self.valid = valid;
    }

    /// `place` was written, or filled for a fresh buffer: it alone is current.
    pub(super) fn wrote(&mut self, place: Place) {
        self.valid = Valid::only(place);
        self.dropped = false;
    }

    /// New host data from a host write: the host alone is current, and its next upload is an
    /// ordinary copy (not a spilled buffer's refill).
    pub(super) fn host_written(&mut self) {
        self.valid = Valid::only(Place::Host);
        self.spilled = false;
        self.dropped = false;
    }

    /// A copy, a zero-copy sync or a transfer that landed made `place` current too.
    pub(super) fn arrived(&mut self, place: Place) {
        self.valid = self.valid.with(place);
    }

    /// The host data was uploaded (or moved into shared memory): the device is current too,
    /// and a spilled buffer is back.
    pub(super) fn uploaded(&mut self) {
        self.spilled = false;
        self.valid = self.valid.with(Place::Device);
    }

    /// The spilled data will not come back (every byte is about to be overwritten): the next
    /// upload is an ordinary copy.
    pub(super) fn spill_forgotten(&mut self) {
        self.spilled = false;
    }

    /// The upload that reads the host mirror until `point` was queued.
    pub(super) fn upload_queued(&mut self, point: Option<Point>) {
        self.host_busy = point;
    }

    /// A replica's data was copied into the home mirror at `place`: that mirror and the
    /// replicas are current; the mirror holds new data (its next upload is an ordinary copy).
    pub(super) fn pulled(&mut self, place: Place) {
        self.valid = Valid::only(place).with(Place::Remote);
        self.spilled = false;
        self.dropped = false;
    }

    /// The dirty device mirror was written back to the host and freed to make room.
    pub(super) fn spilled_to_host(&mut self) {
        self.valid = Valid::only(Place::Host);
        self.spilled = true;
    }

    /// The contents are no longer needed (a dead value: the next use overwrites them whole)
    /// and the device mirror went without a write-back: no replica holds data, and reads fail
    /// until the next write. A spilled buffer's data is forgotten too.
    pub(super) fn contents_dropped(&mut self) {
        self.valid = Valid::NONE;
        self.spilled = false;
        self.dropped = true;
    }

    /// A clean device mirror was dropped (the host is current): the host alone is current.
    pub(super) fn device_dropped(&mut self) {
        self.valid = Valid::only(Place::Host);
    }

    /// The device side lost its data (an upload failed, an adopted mirror was taken back):
    /// the host stays current if it was, and so do the replicas on other devices.
    pub(super) fn device_lost(&mut self) {
        self.valid = if self.valid.has(Place::Host) {
            Valid::only(Place::Host)
        } else {
            Valid::NONE
        }
        .keep_remote(self.valid);
    }

    /// Shared memory became the device mirror alone: whichever side was current, the data is
    /// there (replicas on other devices keep theirs).
    pub(super) fn unshared(&mut self) {
        if self.valid.has(Place::Host) || self.valid.has(Place::Device) {
            self.valid = Valid::only(Place::Device).keep_remote(self.valid);
        }
    }

    /// Work of `kind` was queued, ending at `point`: the next access it conflicts with waits
    /// for it. `None`: the work was done when queued, and its destination is current now.
    pub(super) fn queued(&mut self, kind: PendingKind, point: Option<Point>) {
        match point {
            Some(point) => self.pending = Some(Pending { kind, point }),
            None => {
                self.pending = None;
                if let Some(place) = kind.lands_on() {
                    self.arrived(place);
                }
            }
        }
    }

    /// Waits for the work in flight and takes its result into the valid set.
    ///
    /// The work is settled either way: when the wait fails (the copy or the work before its
    /// event failed), its destination is *not* marked valid, so the next access that needs it
    /// copies again, and the error is returned (once).
    ///
    /// A copy to the host whose device mirror went before it ended
    /// ([`Coherence::device_left_under_copy`]) held the only data: when it fails, the contents
    /// are lost, and every read says so ([`Head::Dropped`]) instead of reading zeros. So are
    /// they when the device write still running when a block was parked in place fails (a
    /// copy to the host pending while the host is current: see `park_ordered`).
    pub(super) fn finish_pending(&mut self) -> Result<()> {
        let parked = self.parked_writer();
        if let Some(p) = self.pending.take() {
            let chained = std::mem::take(&mut self.chained);
            if let Err(e) = p.point.wait() {
                if chained {
                    self.device_lost();
                }
                if parked {
                    // A block parked while its writer ran (`park_ordered`): that write
                    // failed, so the bytes the host shares are not the buffer's.
                    self.contents_dropped();
                }
                if self.valid.is_empty() && !self.dropped {
                    self.contents_dropped();
                }
                return Err(e);
            }
            if let Some(place) = p.kind.lands_on() {
                self.arrived(place);
            }
        }
        Ok(())
    }

    /// An upload queued at `point` on the stream of the pending copy to the host, after it,
    /// from the host mirror that copy fills (a value freed under its copy out and brought
    /// back): the device mirror is current (every device command on it is ordered after the
    /// upload, its last writer), the upload reads the host mirror until `point`
    /// ([`Coherence::release_host`]), and the host still becomes current when the pending copy
    /// lands (host accesses wait for it).
    pub(super) fn chained_upload(&mut self, point: Point) {
        self.host_busy = Some(point);
        self.chained = true;
        self.arrived(Place::Device);
    }

    /// Forgets the pending copy to the host of a buffer whose device mirror came back behind
    /// it ([`Coherence::chained_upload`]), when the contents are dropped: nothing waits for
    /// the copy, and whatever writes or frees the host mirror still waits for the upload
    /// queued after it on the same stream ([`Coherence::release_host`]), so for the copy too.
    /// Returns whether it did.
    pub(super) fn forget_chained_copy(&mut self) -> bool {
        let copy_out = self
            .pending
            .as_ref()
            .is_some_and(|p| p.kind == PendingKind::ToHost);
        if !(self.chained && copy_out && self.host_busy.is_some()) {
            return false;
        }
        self.pending = None;
        self.chained = false;
        true
    }

    /// The device mirror went while a copy from it to the host is in flight (freed ordered
    /// after the copy): the host becomes current when the copy lands, and the device holds
    /// nothing. Replicas on other devices keep theirs.
    pub(super) fn device_left_under_copy(&mut self) {
        self.valid = Valid::NONE.keep_remote(self.valid);
        self.chained = false;
    }

    /// A copy to the device in flight, met by a device access: the device takes it as
    /// arrived, and the host does not wait. Every command on the device mirror, on any
    /// stream, is ordered after the copy on the device (it is the mirror's last writer, which
    /// the access's stream waits for, device-side), and the copy stays recorded as the reader
    /// of the host mirror ([`Coherence::release_host`]), as an upload queued by a device
    /// access is. Returns whether it did: not for another kind of work, nor while another
    /// copy that reads the host mirror is not known done (the record holds one).
    pub(super) fn arrive_on_device(&mut self, access: Access) -> bool {
        let device = matches!(access, Access::DeviceRead | Access::DeviceWrite);
        let upload = self
            .pending
            .as_ref()
            .is_some_and(|p| p.kind == PendingKind::ToDevice);
        if !device || !upload || self.host_busy.as_ref().is_some_and(|p| !p.is_done()) {
            return false;
        }
        let Some(p) = self.pending.take() else {
            return false;
        };
        self.host_busy = Some(p.point);
        self.arrived(Place::Device);
        true
    }

    /// A block parked in place with its writer still running (`park_ordered`), or brought back
    /// by a device read since: a copy to the host pending while the host already counts as
    /// current.
    pub(super) fn parked_writer(&self) -> bool {
        self.valid.has(Place::Host)
            && self
                .pending
                .as_ref()
                .is_some_and(|p| p.kind == PendingKind::ToHost)
    }

    /// Waits for the work in flight, forgetting its result (the buffer or its contents are
    /// going). The writer of a block parked in place with it running
    /// ([`Coherence::parked_writer`]) is forgotten without a wait: nothing reads what it
    /// writes, the block goes back to its pool ordered after the commands on it, and a host
    /// write of a block still parked waits for them.
    pub(super) fn abandon_pending(&mut self) {
        if self.parked_writer() {
            self.pending = None;
            return;
        }
        if let Some(p) = self.pending.take() {
            let _ = p.point.wait();
        }
    }

    /// Waits for the queued copy that reads the host mirror, if any (before the host mirror is
    /// written, replaced or freed).
    ///
    /// # Errors
    /// The copy's error (it failed: the device mirror it was filling is not current).
    pub(super) fn release_host(&mut self) -> Result<()> {
        let Some(p) = self.host_busy.take() else {
            return Ok(());
        };
        // The upload did not land: only the host holds the data (a device write since would
        // have made the host stale, and then nothing is valid any more).
        p.wait().inspect_err(|_| self.device_lost())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_from_valid_sets() {
        assert_eq!(Valid::NONE.head(), Head::Uninitialized);
        assert_eq!(Valid::only(Place::Host).head(), Head::AtHost);
        assert_eq!(Valid::only(Place::Device).head(), Head::AtDevice);
        assert_eq!(
            Valid::only(Place::Host).with(Place::Device).head(),
            Head::Synced
        );
        assert_eq!(Valid::only(Place::Remote).head(), Head::Elsewhere);
        assert!(Valid::only(Place::Remote).remote_only());
        assert!(!Valid::only(Place::Remote).with(Place::Host).remote_only());
        assert_eq!(
            Valid::only(Place::Host).with(Place::Remote).head(),
            Head::AtHost
        );
        let kept = Valid::only(Place::Device).keep_remote(Valid::only(Place::Remote));
        assert!(kept.has(Place::Remote) && kept.has(Place::Device));
        assert!(!Valid::only(Place::Device)
            .keep_remote(Valid::only(Place::Host))
            .has(Place::Remote));
    }

    #[test]
    fn conflicts() {
        use Access::*;
        assert!(!PendingKind::ToDevice.conflicts_with(HostRead));
        assert!(PendingKind::ToDevice.conflicts_with(HostWrite));
        assert!(PendingKind::ToDevice.conflicts_with(DeviceRead));
        assert!(!PendingKind::ToHost.conflicts_with(DeviceRead));
        assert!(PendingKind::ToHost.conflicts_with(HostRead));
        assert!(PendingKind::ToHost.conflicts_with(DeviceWrite));
        assert!(PendingKind::DeviceWork.conflicts_with(HostRead));
    }
}
