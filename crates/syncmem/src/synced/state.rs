//! The coherence state of a [`super::SyncedMemory`].
//!
//! The state is a set of valid replicas (host, device, and replicas on other devices) plus an
//! optional transfer in flight. Caffe's four heads are the one-device view of it ([`Head`]).
//! Replicas on other devices are one bit ([`Place::Remote`]: at least one of them is current);
//! which ones are is kept with them (see [`super::replica`]).

use crate::device::Point;

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
    /// An asynchronous device-to-host copy: the host replica becomes valid when it ends.
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
