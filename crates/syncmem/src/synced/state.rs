//! The coherence state of a [`super::SyncedMemory`].
//!
//! The state is a set of valid replicas (host, device) plus an optional transfer in flight.
//! Caffe's four heads are the one-device view of it ([`Head`]). Replicas are bits in a mask, so
//! more device replicas can join later without a new representation.

use crate::device::Point;

pub use crate::device::Head;

/// A replica: the host mirror or a device mirror.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    Host,
    Device,
}

impl Place {
    fn bit(self) -> u8 {
        match self {
            Place::Host => 1,
            Place::Device => 2,
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
    /// Caffe's head for one host and one device.
    pub(crate) fn head(self) -> Head {
        match (self.has(Place::Host), self.has(Place::Device)) {
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
