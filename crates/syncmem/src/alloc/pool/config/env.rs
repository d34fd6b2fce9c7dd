//! Pool configurations from the environment: the six pool variables, read and checked once.

use std::sync::OnceLock;

use super::{invalid, PoolConfig, PoolKind};
use super::{DEVICE_POOL_CONF_ENV, DEVICE_POOL_ENV, HOST_POOL_CONF_ENV, HOST_POOL_ENV};
use super::{PINNED_POOL_CONF_ENV, PINNED_POOL_ENV};
use crate::error::{Error, Result};

impl PoolConfig {
    /// The configuration named by a kind variable and an option-list variable: the defaults of
    /// the kind (caching when unset), then the options. Pure: see [`PoolConfig::from_env`].
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a bad kind or option, or a `gc_threshold` without a
    /// `memory_cap` (such a pool has no other cap).
    pub fn from_vars(kind: Option<&str>, conf: Option<&str>) -> Result<Self> {
        let kind = match kind {
            Some(k) => k.parse()?,
            None => PoolKind::Caching,
        };
        let cfg = Self::new(kind).apply(conf.unwrap_or(""))?;
        cfg.check_gc_cap(cfg.memory_cap.map(|_| u64::MAX))?;
        Ok(cfg)
    }

    /// [`PoolConfig::from_vars`] with the values of the environment variables `kind_var` and
    /// `conf_var` (e.g. [`DEVICE_POOL_ENV`] and [`DEVICE_POOL_CONF_ENV`]).
    ///
    /// # Errors
    /// As [`PoolConfig::from_vars`] (or a value that is not UTF-8), and a `gc_threshold`
    /// without a `memory_cap`; the message names the variable at fault.
    pub fn from_env(kind_var: &str, conf_var: &str) -> Result<Self> {
        let kind = match env_value(kind_var)? {
            Some(k) => k.parse().map_err(|e| from_var(e, kind_var))?,
            None => PoolKind::Caching,
        };
        let conf = env_value(conf_var)?;
        let cfg = Self::new(kind)
            .apply(conf.as_deref().unwrap_or(""))
            .map_err(|e| from_var(e, conf_var))?;
        // A pool made from the environment has no cap but its own `memory_cap`.
        cfg.check_gc_cap(cfg.memory_cap.map(|_| u64::MAX))
            .map_err(|e| from_var(e, conf_var))?;
        Ok(cfg)
    }
}

/// The value of `var`, `None` when unset.
fn env_value(var: &str) -> Result<Option<String>> {
    match std::env::var(var) {
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(invalid(var, "not valid UTF-8".into())),
    }
}

/// Names the environment variable `var` in a configuration error.
fn from_var(e: Error, var: &str) -> Error {
    match e {
        Error::InvalidConfig { what, reason } => Error::InvalidConfig {
            what: format!("{var} ({what})"),
            reason,
        },
        e => e,
    }
}

/// The pool variables, as (kind, options) pairs: device, pinned host, host.
const ENV_PAIRS: [(&str, &str); 3] = [
    (DEVICE_POOL_ENV, DEVICE_POOL_CONF_ENV),
    (PINNED_POOL_ENV, PINNED_POOL_CONF_ENV),
    (HOST_POOL_ENV, HOST_POOL_CONF_ENV),
];

/// Checks every pool variable of the process (`SYNCMEM_DEVICE_POOL`, `SYNCMEM_POOL_CONF`,
/// `SYNCMEM_PINNED_POOL[_CONF]`, `SYNCMEM_HOST_POOL[_CONF]`), once per process. The library
/// calls it when the first device opens or builds a pool, so that a bad setting fails at once
/// instead of at the first use of the pool it configures (which may never come); a program
/// can call it at start to fail before doing anything (the `syncmem` command does).
///
/// # Errors
/// [`Error::InvalidConfig`] naming the first variable at fault (the same error every time).
pub fn check_env() -> Result<()> {
    static CHECKED: OnceLock<std::result::Result<(), (String, String)>> = OnceLock::new();
    let checked = CHECKED.get_or_init(|| {
        for (kind, conf) in ENV_PAIRS {
            PoolConfig::from_env(kind, conf).map_err(|e| match e {
                Error::InvalidConfig { what, reason } => (what, reason),
                e => (format!("{kind} / {conf}"), e.to_string()),
            })?;
        }
        Ok(())
    });
    checked
        .clone()
        .map_err(|(what, reason)| Error::InvalidConfig { what, reason })
}

/// The device pool configuration `SYNCMEM_DEVICE_POOL` and `SYNCMEM_POOL_CONF` ask for (the
/// defaults where they are unset).
///
/// # Errors
/// [`Error::InvalidConfig`] naming the variable at fault.
pub fn device_pool_from_env() -> Result<PoolConfig> {
    PoolConfig::from_env(DEVICE_POOL_ENV, DEVICE_POOL_CONF_ENV)
}
