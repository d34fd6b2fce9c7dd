//! Zero-copy mirrors: where a device's memory is host memory, a [`crate::SyncedMemory`] keeps
//! one allocation for both sides instead of two mirrors and copies between them.
//!
//! The setting ([`ZeroCopy`]) comes from `SYNCMEM_ZERO_COPY` (`auto`, the default; `off`;
//! `map`; in any case, and nothing else: an empty or other value is an error) or [`crate::Device::set_zero_copy`], and applies to the mirrors a device allocates
//! from then on. What it means on a device is [`crate::Device::zero_copy_protocol`]:
//!
//! | device | `auto` | `map` | `off` |
//! |---|---|---|---|
//! | `cpu`, CPU OpenCL devices (PoCL), integrated CUDA devices | [`ZeroCopyProtocol::InPlace`] | `InPlace` (OpenCL: [`ZeroCopyProtocol::Map`]) | none |
//! | other host-unified OpenCL devices (integrated GPUs) | [`ZeroCopyProtocol::Map`] | `Map` | none |
//! | discrete devices | none | none | none |

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
use std::sync::OnceLock;

use crate::backend::DeviceInfo;
use crate::error::{BackendKind, Error, Result};

/// The environment variable of the zero-copy setting.
pub const ZERO_COPY_ENV: &str = "SYNCMEM_ZERO_COPY";

/// Whether buffers share one allocation between host and device where the device's memory is
/// host memory (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ZeroCopy {
    /// On every device whose memory is host memory, with the protocol the device needs.
    #[default]
    Auto,
    /// Never: two mirrors and copies between them everywhere.
    Off,
    /// As `Auto`, and OpenCL devices map and unmap buffers for every host access even where
    /// the host could use them in place (a CPU device): the protocol of integrated GPUs, on any
    /// host-unified device.
    Map,
}

impl ZeroCopy {
    /// `auto`, `off` or `map`.
    pub fn as_str(self) -> &'static str {
        match self {
            ZeroCopy::Auto => "auto",
            ZeroCopy::Off => "off",
            ZeroCopy::Map => "map",
        }
    }

    /// The setting of `SYNCMEM_ZERO_COPY` (`auto` when unset).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the variable for a value other than `auto`, `off` or
    /// `map` (in any case; see [`ZeroCopy::from_str`]).
    pub fn from_env() -> Result<ZeroCopy> {
        match std::env::var(ZERO_COPY_ENV) {
            Err(std::env::VarError::NotPresent) => Ok(ZeroCopy::Auto),
            Err(std::env::VarError::NotUnicode(v)) => Err(Error::InvalidConfig {
                what: ZERO_COPY_ENV.to_string(),
                reason: format!("{v:?} is not valid UTF-8; expected auto, off or map"),
            }),
            Ok(v) => v.parse().map_err(|e: Error| match e {
                Error::InvalidConfig { reason, .. } => Error::InvalidConfig {
                    what: ZERO_COPY_ENV.to_string(),
                    reason,
                },
                e => e,
            }),
        }
    }

    /// The protocol this setting gives a device with `info`, or `None` when its buffers keep
    /// two mirrors.
    pub fn protocol_for(self, info: &DeviceInfo) -> Option<ZeroCopyProtocol> {
        if !info.host_unified {
            return None;
        }
        match self {
            ZeroCopy::Off => None,
            ZeroCopy::Map if info.backend == BackendKind::OpenCl => Some(ZeroCopyProtocol::Map),
            _ if info.host_coherent => Some(ZeroCopyProtocol::InPlace),
            _ => Some(ZeroCopyProtocol::Map),
        }
    }

    fn code(self) -> u8 {
        match self {
            ZeroCopy::Auto => 1,
            ZeroCopy::Off => 2,
            ZeroCopy::Map => 3,
        }
    }

    fn from_code(c: u8) -> Option<ZeroCopy> {
        match c {
            1 => Some(ZeroCopy::Auto),
            2 => Some(ZeroCopy::Off),
            3 => Some(ZeroCopy::Map),
            _ => None,
        }
    }
}

impl FromStr for ZeroCopy {
    type Err = Error;

    /// Exactly `auto`, `off` or `map`, in any case, and no other spelling (no surrounding
    /// blanks, no `on`, `1`, `0` or empty value): the one rule of `SYNCMEM_ZERO_COPY` and of
    /// every setting parsed from text (the Python package's `Device.zero_copy`).
    fn from_str(s: &str) -> Result<ZeroCopy> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(ZeroCopy::Auto),
            "off" => Ok(ZeroCopy::Off),
            "map" => Ok(ZeroCopy::Map),
            _ => Err(Error::InvalidConfig {
                what: "zero-copy setting".to_string(),
                reason: format!("{s:?}: expected auto, off or map"),
            }),
        }
    }
}

impl fmt::Display for ZeroCopy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the host and the device take turns on a buffer they share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ZeroCopyProtocol {
    /// The host uses the memory in place once the device work on it is done: no call at all
    /// (the `cpu` device, CPU OpenCL devices, CUDA mapped pinned memory).
    InPlace,
    /// The host maps the buffer before it touches it and unmaps it before the device does
    /// (`clEnqueueMapBuffer` / `clEnqueueUnmapMemObject`), as the OpenCL specification asks of
    /// integrated GPUs.
    Map,
}

impl ZeroCopyProtocol {
    /// `in-place` or `map`.
    pub fn as_str(self) -> &'static str {
        match self {
            ZeroCopyProtocol::InPlace => "in-place",
            ZeroCopyProtocol::Map => "map",
        }
    }
}

impl fmt::Display for ZeroCopyProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The zero-copy setting of one device: set, or read from the environment on first use.
#[derive(Default)]
pub(crate) struct ZeroCopySetting(AtomicU8);

impl ZeroCopySetting {
    /// The setting (the environment's when none was set).
    pub(crate) fn get(&self) -> ZeroCopy {
        if let Some(z) = ZeroCopy::from_code(self.0.load(Relaxed)) {
            return z;
        }
        // An invalid variable is reported when the first device opens ([`check_env`]); here
        // it counts as the default.
        let z = env_setting().unwrap_or_default();
        let _ = self.0.compare_exchange(0, z.code(), Relaxed, Relaxed);
        ZeroCopy::from_code(self.0.load(Relaxed)).unwrap_or(z)
    }

    pub(crate) fn set(&self, z: ZeroCopy) {
        self.0.store(z.code(), Relaxed);
    }
}

/// `SYNCMEM_ZERO_COPY`, read once per process.
fn env_setting() -> std::result::Result<ZeroCopy, (String, String)> {
    static ENV: OnceLock<std::result::Result<ZeroCopy, (String, String)>> = OnceLock::new();
    ENV.get_or_init(|| {
        ZeroCopy::from_env().map_err(|e| match e {
            Error::InvalidConfig { what, reason } => (what, reason),
            e => (ZERO_COPY_ENV.to_string(), e.to_string()),
        })
    })
    .clone()
}

/// Checks `SYNCMEM_ZERO_COPY` (read once per process; every device open checks it too).
///
/// # Errors
/// [`Error::InvalidConfig`] naming the variable when its value is not valid.
pub fn check_env() -> Result<()> {
    env_setting()
        .map(drop)
        .map_err(|(what, reason)| Error::InvalidConfig { what, reason })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(backend: BackendKind, unified: bool, coherent: bool) -> DeviceInfo {
        DeviceInfo {
            backend,
            ordinal: 0,
            name: String::new(),
            vendor: String::new(),
            total_memory: 1 << 30,
            max_alloc: 1 << 28,
            host_unified: unified,
            host_coherent: coherent,
        }
    }

    #[test]
    fn the_protocol_follows_the_device() {
        let pocl = info(BackendKind::OpenCl, true, true);
        let igpu = info(BackendKind::OpenCl, true, false);
        let discrete = info(BackendKind::Cuda, false, false);
        let cpu = info(BackendKind::Cpu, true, true);
        use ZeroCopyProtocol::*;
        assert_eq!(ZeroCopy::Auto.protocol_for(&pocl), Some(InPlace));
        assert_eq!(ZeroCopy::Map.protocol_for(&pocl), Some(Map));
        assert_eq!(ZeroCopy::Auto.protocol_for(&igpu), Some(Map));
        assert_eq!(ZeroCopy::Auto.protocol_for(&cpu), Some(InPlace));
        assert_eq!(ZeroCopy::Map.protocol_for(&cpu), Some(InPlace));
        for z in [ZeroCopy::Auto, ZeroCopy::Map, ZeroCopy::Off] {
            assert_eq!(z.protocol_for(&discrete), None, "{z}");
        }
        assert_eq!(ZeroCopy::Off.protocol_for(&pocl), None);
    }

    #[test]
    fn values_parse_and_bad_ones_name_the_choices() {
        assert_eq!("AUTO".parse::<ZeroCopy>().unwrap(), ZeroCopy::Auto);
        assert_eq!("Off".parse::<ZeroCopy>().unwrap(), ZeroCopy::Off);
        assert_eq!("map".parse::<ZeroCopy>().unwrap(), ZeroCopy::Map);
        let e = "sometimes".parse::<ZeroCopy>().unwrap_err().to_string();
        assert!(e.contains("auto, off or map"), "{e}");
        // One rule, no aliases: blanks, empty values and on/1/0/none are refused.
        for bad in ["", " auto", "off ", "on", "1", "0", "none"] {
            assert!(bad.parse::<ZeroCopy>().is_err(), "{bad:?}");
        }
    }
}
