//! Copies between two devices, counted per pair of devices and per route: with one device
//! command (`direct`) or through the host (a read into host memory and a write from it).
//! Each leg of a copy through the host is also counted by direction (device to host on the
//! source, host to device on the destination) in [`super::stats::CopyStats`]; a direct copy
//! is counted there as [`super::stats::Direction::DeviceToDevice`].

use parking_lot::Mutex;
use serde::Serialize;

/// The copies from one device to another by one route, as counted by [`pair_copies`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct PairCopies {
    /// Label of the device copied from.
    pub from: String,
    /// Label of the device copied to.
    pub to: String,
    /// `true`: one device command (the devices share an OpenCL context); `false`: through the
    /// host.
    pub direct: bool,
    /// Number of copies.
    pub count: u64,
    /// Bytes copied.
    pub bytes: u64,
}

static PAIRS: Mutex<Vec<PairCopies>> = Mutex::new(Vec::new());

/// Counts a copy of `bytes` from device `from` to device `to`.
pub(crate) fn record(from: &str, to: &str, direct: bool, bytes: usize) {
    let mut pairs = PAIRS.lock();
    let bytes = bytes as u64;
    match pairs
        .iter_mut()
        .find(|p| p.from == from && p.to == to && p.direct == direct)
    {
        Some(p) => {
            p.count += 1;
            p.bytes = p.bytes.saturating_add(bytes);
        }
        None => pairs.push(PairCopies {
            from: from.to_string(),
            to: to.to_string(),
            direct,
            count: 1,
            bytes,
        }),
    }
}

/// Copies between devices so far in the process, one entry per (source, destination, route)
/// in the order they first happened.
pub fn pair_copies() -> Vec<PairCopies> {
    PAIRS.lock().clone()
}

/// The count and bytes of every (source, destination, route) so far, in the order of
/// [`pair_copies`] (entries are only ever added at the end), written into `out` without
/// allocating once `out` has room for them.
pub fn counts_into(out: &mut Vec<(u64, u64)>) {
    let pairs = PAIRS.lock();
    out.clear();
    out.extend(pairs.iter().map(|p| (p.count, p.bytes)));
}

/// The copies made since `earlier` (a former [`pair_copies`]), without the pairs that made
/// none.
pub fn pair_copies_since(earlier: &[PairCopies]) -> Vec<PairCopies> {
    pair_copies()
        .into_iter()
        .filter_map(|mut p| {
            if let Some(e) = earlier
                .iter()
                .find(|e| e.from == p.from && e.to == p.to && e.direct == p.direct)
            {
                p.count -= e.count.min(p.count);
                p.bytes -= e.bytes.min(p.bytes);
            }
            (p.count > 0).then_some(p)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_are_counted_apart_by_route() {
        let before = pair_copies();
        record("test:a", "test:b", true, 10);
        record("test:a", "test:b", true, 6);
        record("test:a", "test:b", false, 4);
        record("test:b", "test:a", false, 1);
        let d = pair_copies_since(&before);
        let find = |from: &str, to: &str, direct: bool| {
            d.iter()
                .find(|p| p.from == from && p.to == to && p.direct == direct)
                .map(|p| (p.count, p.bytes))
        };
        assert_eq!(find("test:a", "test:b", true), Some((2, 16)));
        assert_eq!(find("test:a", "test:b", false), Some((1, 4)));
        assert_eq!(find("test:b", "test:a", false), Some((1, 1)));
        assert_eq!(find("test:b", "test:a", true), None);
    }
}
