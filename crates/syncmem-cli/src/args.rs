//! Value parsers shared by every subcommand, so that one kind of argument is read and checked
//! the same way everywhere.
//!
//! Each error is a phrase that follows the argument's name: `main` prints
//! `syncmem: error: --lr must be a positive number, got "-1"` on one line and exits with 2, the
//! status of every usage error.
//! Numeric arguments also take `allow_negative_numbers`, so `--lr -1` reaches the parser (and
//! its real reason) instead of being read as an unknown flag.

use syncmem::alloc::pool::config::parse_size;
use syncmem::{DeviceSpec, PoolKind};

/// A device string: `cpu`, `opencl:N` or `cuda:N`. Whether the device exists is checked when it
/// is opened.
pub fn device(s: &str) -> Result<DeviceSpec, String> {
    s.parse::<DeviceSpec>().map_err(|e| match e {
        syncmem::Error::InvalidDeviceSpec { reason, .. } if !reason.starts_with("expected") => {
            format!("must be cpu, opencl:N or cuda:N, got {s:?}: {reason}")
        }
        _ => format!("must be cpu, opencl:N or cuda:N, got {s:?}"),
    })
}

/// Devices named on the command line, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceList(pub Vec<DeviceSpec>);

/// One device or several, separated by commas (`opencl:0,opencl:1`); each as [`device`], none
/// twice.
pub fn device_list(s: &str) -> Result<DeviceList, String> {
    let mut out: Vec<DeviceSpec> = Vec::new();
    for part in s.split(',') {
        let d = device(part.trim())?;
        if out.contains(&d) {
            return Err(format!("{d} is listed twice in {s:?}"));
        }
        out.push(d);
    }
    Ok(DeviceList(out))
}

/// A size in bytes with an optional binary unit (`4096`, `64k`, `1MiB`, `1.5G`), read by the
/// library's [`parse_size`] (as the `SYNCMEM_*` pool variables are).
pub fn size(s: &str) -> Result<u64, String> {
    parse_size(s)
        .map_err(|e| format!("must be a size (bytes, or with a unit: 64KiB, 1MiB, 2G): {e}"))
}

/// A [`size`] of at least one byte that fits in memory.
pub fn buffer_size(s: &str) -> Result<usize, String> {
    let n = size(s)?;
    if n == 0 {
        return Err(format!("must be at least 1 byte, got {s:?}"));
    }
    usize::try_from(n).map_err(|_| format!("must fit in memory, got {s:?}"))
}

/// A memory cap: a [`size`] of at least one byte (as `memory_cap` in `SYNCMEM_POOL_CONF`).
pub fn memory_cap(s: &str) -> Result<u64, String> {
    match size(s)? {
        0 => Err(format!(
            "must be at least 1 byte (no cap: leave it out), got {s:?}"
        )),
        n => Ok(n),
    }
}

/// Pool kinds to compare, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolKinds(pub Vec<PoolKind>);

/// `caching`, `binned`, `none`, or `all` (the three), in any case.
pub fn pool_kinds(s: &str) -> Result<PoolKinds, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "all" => Ok(PoolKinds(vec![
            PoolKind::Caching,
            PoolKind::Binned,
            PoolKind::None,
        ])),
        one => one
            .parse::<PoolKind>()
            .map(|k| PoolKinds(vec![k]))
            .map_err(|_| format!("must be caching, binned, none or all, got {s:?}")),
    }
}

/// An integer of at least 1.
pub fn positive_int(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("must be a positive integer, got {s:?}")),
    }
}

/// Most epochs a training command runs: far more than any run of the built-in model needs,
/// and small enough that the per-epoch report stays in memory.
pub const MAX_EPOCHS: usize = 1_000_000;

/// A number of epochs: an integer from 1 to [`MAX_EPOCHS`].
pub fn epochs(s: &str) -> Result<usize, String> {
    match s.trim().parse::<u128>() {
        Ok(n) if (1..=MAX_EPOCHS as u128).contains(&n) => Ok(n as usize),
        _ => Err(format!(
            "must be a positive integer of at most {MAX_EPOCHS}, got {s:?}"
        )),
    }
}

/// An integer of at least 0 (a seed).
pub fn non_negative_int(s: &str) -> Result<u64, String> {
    s.trim()
        .parse::<u64>()
        .map_err(|_| format!("must be a non-negative integer, got {s:?}"))
}

/// A finite number above 0.
pub fn positive_number(s: &str) -> Result<f32, String> {
    match s.trim().parse::<f32>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
        _ => Err(format!("must be a positive number, got {s:?}")),
    }
}

/// A number strictly between 0 and 1.
pub fn open_fraction(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if x > 0.0 && x < 1.0 => Ok(x),
        _ => Err(format!(
            "must be a number between 0 and 1 (both excluded), got {s:?}"
        )),
    }
}

/// The one-line message for an argument a value parser rejected (`None` for other errors,
/// which clap reports itself): the argument's name followed by the parser's phrase.
pub fn value_error_line(e: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() != ErrorKind::ValueValidation {
        return None;
    }
    let arg = match e.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(a)) => a.split(' ').next().unwrap_or(a).to_string(),
        _ => return None,
    };
    let reason = std::error::Error::source(e)?.to_string();
    Some(format!("{arg} {reason}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsers() {
        assert_eq!(device("opencl:2").unwrap().to_string(), "opencl:2");
        assert!(device("bogus").unwrap_err().contains("bogus"));
        assert_eq!(size("1MiB"), Ok(1 << 20));
        assert_eq!(buffer_size("4k"), Ok(4096));
        assert!(buffer_size("0").is_err());
        assert!(size("-1").is_err());
        assert_eq!(positive_int("3"), Ok(3));
        assert!(positive_int("0").is_err() && positive_int("-3").is_err());
        assert_eq!(non_negative_int("0"), Ok(0));
        assert!(non_negative_int("-1").is_err());
        assert_eq!(open_fraction("0.25"), Ok(0.25));
        for bad in ["0", "1", "-0.5", "1.5", "NaN", "x"] {
            assert!(open_fraction(bad).is_err(), "{bad}");
        }
        assert_eq!(memory_cap("64KiB"), Ok(64 << 10));
        for bad in ["0", "0B", "0%", "lots"] {
            assert!(memory_cap(bad).is_err(), "{bad}");
        }
        assert_eq!(pool_kinds(" Binned ").unwrap().0, [PoolKind::Binned]);
        assert_eq!(pool_kinds("all").unwrap().0.len(), 3);
        assert!(pool_kinds("lru").unwrap_err().contains("\"lru\""));
        assert_eq!(positive_number("0.5"), Ok(0.5));
        for bad in ["0", "-1", "NaN", "inf", "x"] {
            assert!(positive_number(bad).is_err(), "{bad}");
        }
    }
}
