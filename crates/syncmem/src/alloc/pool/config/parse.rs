//! Pool options as text: the `key=value` lists of [`PoolConfig::apply`] and the sizes and
//! caps in them ([`parse_size`]).

use super::{invalid, MemoryCap, PoolConfig, Preallocation, GIB, KIB, MIB, TIB};
use crate::error::Result;

#[cfg(doc)]
use crate::error::Error;

impl PoolConfig {
    /// Applies a `key=value` list (`,` or `;` between items, `=` or `:` between key and value;
    /// keys ending in `_mb` take a number of MiB, as in PyTorch). Sizes take binary units
    /// (`512`, `64k`, `64KiB`, `20MB`, `1G`). Keys: `kind`, `round`, `small_size`,
    /// `size_class_limit`, `min_segment`, `segment_growth_percent`, `max_idle_percent` (or
    /// `unlimited`), `small_segment`, `large_segment`,
    /// `large_segment_limit`, `segment_round`, `max_split_size` (or `unlimited`),
    /// `max_non_split_rounding`, `bin_growth`, `min_bin`, `max_bin`, `bin_divisions` (or
    /// `roundup_power2_divisions`), `max_cached_bytes` (or `unlimited`), `memory_cap` (bytes, a
    /// fraction such as `0.5`, a percentage such as `50%`, or `none`), `shards` (`0`: one per
    /// core), `thread_cache` (bytes each thread keeps of its own frees; `off`),
    /// `preallocate` (bytes reserved when the pool is made, or a percentage of the cap,
    /// else of the device's memory, such as `25%`; `none`), `gc_threshold` (a fraction in
    /// `(0, 1)` of the cap above which idle cached segments are given back; `none`). The
    /// result is validated.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an unknown key (the message lists the known ones) or a bad
    /// value.
    pub fn apply(mut self, list: &str) -> Result<Self> {
        for item in list
            .split([',', ';'])
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            let (key, value) = item
                .split_once(['=', ':'])
                .ok_or_else(|| invalid(item, "expected key=value".into()))?;
            self.set(key.trim(), value.trim())?;
        }
        self.validate()?;
        Ok(self)
    }

    fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let key = key.to_ascii_lowercase();
        let (name, mib) = match key.strip_suffix("_mb") {
            Some(n) => (n, true),
            None => (key.as_str(), false),
        };
        let size = || -> Result<usize> {
            let v = if mib {
                value
                    .parse::<u64>()
                    .ok()
                    .and_then(|v| v.checked_mul(MIB))
                    .ok_or_else(|| invalid(&key, format!("{value:?} is not a number of MiB")))?
            } else {
                parse_size(value).map_err(|r| invalid(&key, r))?
            };
            usize::try_from(v).map_err(|_| invalid(&key, "too large".into()))
        };
        let unlimited = matches!(
            value.to_ascii_lowercase().as_str(),
            "unlimited" | "none" | "off" | "max"
        );
        let small = |v: &str| -> Result<u32> {
            v.parse()
                .map_err(|_| invalid(&key, format!("{v:?} is not a small integer")))
        };
        match name {
            "kind" | "backend" | "pool" => self.kind = value.parse()?,
            "round" => self.round = size()?,
            "small_size" => self.small_size = size()?,
            "size_class_limit" => self.size_class_limit = size()?,
            "min_segment" => self.min_segment = size()?,
            "segment_growth_percent" => self.segment_growth_percent = small(value)?,
            "max_idle_percent" => {
                self.max_idle_percent = (!unlimited).then(|| small(value)).transpose()?
            }
            "small_segment" => self.small_segment = size()?,
            "large_segment" => self.large_segment = size()?,
            "large_segment_limit" => self.large_segment_limit = size()?,
            "segment_round" => self.segment_round = size()?,
            "max_split_size" => self.max_split_size = (!unlimited).then(size).transpose()?,
            "max_non_split_rounding" => self.max_non_split_rounding = size()?,
            "bin_growth" => self.bin_growth = small(value)?,
            "min_bin" => self.min_bin = small(value)?,
            "max_bin" => self.max_bin = small(value)?,
            "bin_divisions" | "roundup_power2_divisions" => self.bin_divisions = small(value)?,
            "shards" => self.shards = small(value)? as usize,
            "thread_cache" => {
                let off = matches!(value.to_ascii_lowercase().as_str(), "off" | "none");
                self.thread_cache = if off { 0 } else { size()? }
            }
            "max_cached_bytes" => {
                self.max_cached_bytes = (!unlimited).then(size).transpose()?.map(|v| v as u64)
            }
            "preallocate" | "gc_threshold" | "garbage_collection_threshold" => {
                self.set_reserve(name, &key, value, unlimited)?
            }
            "memory_cap" | "cap" => {
                self.memory_cap = if unlimited {
                    None
                } else if mib {
                    Some(MemoryCap::Bytes(size()? as u64))
                } else {
                    Some(parse_cap(value).map_err(|r| invalid(&key, r))?)
                }
            }
            _ => {
                return Err(invalid(
                    &key,
                    format!("unknown option; the options are {}", KEYS.join(", ")),
                ))
            }
        }
        Ok(())
    }
}

impl PoolConfig {
    /// Sets `preallocate` or `gc_threshold` (`name`; `key` as written, `_mb` kept).
    fn set_reserve(&mut self, name: &str, key: &str, value: &str, unlimited: bool) -> Result<()> {
        if name == "preallocate" {
            self.preallocate = if unlimited || value == "0" {
                None
            } else if key.ends_with("_mb") {
                let mib = value.parse::<u64>().ok().and_then(|v| v.checked_mul(MIB));
                let bytes =
                    mib.ok_or_else(|| invalid(key, format!("{value:?} is not a number of MiB")))?;
                Some(Preallocation::Bytes(bytes))
            } else {
                Some(parse_preallocation(value).map_err(|r| invalid(key, r))?)
            };
            return Ok(());
        }
        self.gc_threshold = if unlimited {
            None
        } else {
            Some(value.parse::<f64>().map_err(|_| {
                invalid(
                    key,
                    format!("{value:?} is not a fraction of the cap in (0, 1), such as 0.8"),
                )
            })?)
        };
        Ok(())
    }
}

/// The keys [`PoolConfig::apply`] takes (`_mb` forms aside), for the message of an unknown one.
const KEYS: &[&str] = &[
    "kind",
    "round",
    "small_size",
    "size_class_limit",
    "min_segment",
    "segment_growth_percent",
    "max_idle_percent",
    "small_segment",
    "large_segment",
    "large_segment_limit",
    "segment_round",
    "max_split_size",
    "max_non_split_rounding",
    "bin_growth",
    "min_bin",
    "max_bin",
    "bin_divisions",
    "max_cached_bytes",
    "memory_cap",
    "shards",
    "thread_cache (SIZE, or off)",
    "preallocate (SIZE or PERCENT of the cap, else of the device's memory)",
    "gc_threshold (a fraction of the cap in (0, 1))",
];

/// Parses `512`, `64k`, `64KiB`, `20MB`, `1.5G` (binary units) into bytes.
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => KIB,
        "m" | "mb" | "mib" => MIB,
        "g" | "gb" | "gib" => GIB,
        "t" | "tb" | "tib" => TIB,
        u => return Err(format!("{s:?}: unknown unit {u:?}")),
    };
    if let Ok(n) = num.parse::<u64>() {
        return n
            .checked_mul(mult)
            .ok_or_else(|| format!("{s:?} overflows"));
    }
    match num.parse::<f64>() {
        Ok(f) if f.is_finite() && f >= 0.0 && f * (mult as f64) < u64::MAX as f64 => {
            Ok((f * mult as f64) as u64)
        }
        _ => Err(format!("{s:?} is not a size")),
    }
}

fn parse_cap(s: &str) -> std::result::Result<MemoryCap, String> {
    let t = s.trim();
    if let Some(p) = t.strip_suffix('%') {
        let f: f64 = p
            .trim()
            .parse()
            .map_err(|_| format!("{s:?} is not a percentage"))?;
        return Ok(MemoryCap::Fraction(f / 100.0));
    }
    if t.contains('.') && t.parse::<f64>().is_ok_and(|f| f <= 1.0) {
        return Ok(MemoryCap::Fraction(t.parse().unwrap_or(1.0)));
    }
    parse_size(t).map(MemoryCap::Bytes)
}

/// A preallocation: a size, or a percentage (`25%`) or fraction (`0.25`) of the cap.
fn parse_preallocation(s: &str) -> std::result::Result<Preallocation, String> {
    parse_cap(s)
        .map(|c| match c {
            MemoryCap::Bytes(b) => Preallocation::Bytes(b),
            MemoryCap::Fraction(f) => Preallocation::Fraction(f),
        })
        .map_err(|e| format!("{e}: expected SIZE (512MiB) or PERCENT (25%)"))
}
