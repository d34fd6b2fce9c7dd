//! [`At`]: the instant of a trace a snapshot shows (`syncmem trace export-torch --at`).

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use super::TorchSnapshot;
use crate::error::{Error, Result};
use crate::report::event::{invalid, Stamp, TraceEvent};
use crate::report::trace::Trace;

/// An instant of a trace: the segments and blocks of a snapshot are those alive then, and its
/// history ends there ([`TorchSnapshot::from_trace_at`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum At {
    /// The first event at which the bytes of blocks handed out, over every pool together,
    /// are highest (`peak`): what memory_viz users look at first.
    #[default]
    Peak,
    /// The first out-of-memory failure (`oom`).
    Oom,
    /// The end of step `N` (`step N`, `step:N`): its last event.
    Step(u64),
    /// The end of the trace (`end`).
    End,
}

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            At::Peak => f.write_str("peak"),
            At::Oom => f.write_str("oom"),
            At::Step(n) => write!(f, "step {n}"),
            At::End => f.write_str("end"),
        }
    }
}

impl FromStr for At {
    type Err = Error;

    /// `peak`, `oom`, `end`, or `step N` (also `step:N`, `step=N`, `stepN`).
    fn from_str(s: &str) -> Result<At> {
        let s = s.trim();
        match s {
            "peak" => return Ok(At::Peak),
            "oom" => return Ok(At::Oom),
            "end" => return Ok(At::End),
            _ => {}
        }
        let n = s
            .strip_prefix("step")
            .map(|r| r.trim_start_matches([' ', ':', '=']))
            .and_then(|r| r.parse().ok());
        n.map(At::Step).ok_or_else(|| Error::InvalidConfig {
            what: "instant".to_string(),
            reason: format!("{s:?}: expected peak, oom, end or step N"),
        })
    }
}

impl At {
    /// The index of the last event shown of `events` (stamped by `stamps`), `None` for no
    /// events.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when the trace has no out-of-memory failure (`oom`) or no event
    /// of the step asked for.
    pub fn index(self, events: &[TraceEvent], stamps: &[Stamp]) -> Result<Option<usize>> {
        if events.is_empty() {
            return Ok(None);
        }
        let found = match self {
            At::End => Some(events.len() - 1),
            At::Peak => Some(peak(events)),
            At::Oom => events
                .iter()
                .position(|e| matches!(e, TraceEvent::Oom { .. })),
            At::Step(n) => stamps.iter().rposition(|s| s.step == Some(n)),
        };
        match found {
            Some(i) => Ok(Some(i)),
            None => Err(invalid(match self {
                At::Oom => "the trace records no out-of-memory failure".to_string(),
                _ => format!("the trace records no event of {self}"),
            })),
        }
    }
}

/// The first index at which the bytes of live blocks, over every pool, are highest.
fn peak(events: &[TraceEvent]) -> usize {
    let mut live: HashMap<u64, u64> = HashMap::new();
    let (mut now, mut best, mut at) = (0u64, 0u64, 0usize);
    for (i, e) in events.iter().enumerate() {
        match e {
            TraceEvent::Alloc {
                id, size, place, ..
            } => {
                let b = place.map_or(*size as u64, |p| p.size);
                now += b;
                if let Some(old) = live.insert(*id, b) {
                    now -= old;
                }
            }
            TraceEvent::Free { id, .. } => now -= live.remove(id).unwrap_or(0),
            _ => {}
        }
        if now > best {
            (best, at) = (now, i);
        }
    }
    at
}

impl TorchSnapshot {
    /// The state of `trace` at instant `at` and its history up to then: the trace replayed up
    /// to that event ([`TorchSnapshot::from_trace`] of the events until then). Returns the
    /// snapshot and the index of the last event shown.
    ///
    /// # Errors
    /// As [`At::index`] and [`TorchSnapshot::from_trace`].
    pub fn from_trace_at(trace: &Trace, at: At) -> Result<(TorchSnapshot, usize)> {
        trace.with_stamped(|events, stamps| {
            let end = at.index(events, stamps)?.map_or(0, |i| i + 1);
            let snap = super::convert::from_events(&events[..end], &stamps[..end])?;
            Ok((snap, end.saturating_sub(1)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(id: u64, size: usize) -> TraceEvent {
        TraceEvent::Alloc {
            id,
            size,
            stream: 1,
            device: "d".into(),
            owner: None,
            place: None,
            operator: None,
            frames: Vec::new(),
        }
    }

    fn free(id: u64) -> TraceEvent {
        TraceEvent::Free {
            id,
            device: "d".into(),
        }
    }

    #[test]
    fn instants_parse_and_print() {
        for (s, at) in [
            ("peak", At::Peak),
            ("oom", At::Oom),
            ("end", At::End),
            ("step 3", At::Step(3)),
            ("step:3", At::Step(3)),
            ("step=3", At::Step(3)),
        ] {
            assert_eq!(s.parse::<At>().unwrap(), at);
        }
        assert_eq!(At::Step(3).to_string().parse::<At>().unwrap(), At::Step(3));
        assert!("step".parse::<At>().is_err());
        assert!("top".parse::<At>().is_err());
    }

    #[test]
    fn each_instant_finds_its_event() {
        let events = vec![
            alloc(0, 100),
            alloc(1, 300),
            free(1),
            alloc(2, 50),
            TraceEvent::Oom {
                size: 9,
                device: "d".into(),
            },
            free(0),
        ];
        let step = |s| Stamp {
            t_us: 0,
            step: Some(s),
        };
        let stamps = vec![step(1), step(1), step(2), step(2), step(3), step(3)];
        let index = |at: At| at.index(&events, &stamps).unwrap();
        assert_eq!(index(At::Peak), Some(1));
        assert_eq!(index(At::Oom), Some(4));
        assert_eq!(index(At::Step(2)), Some(3));
        assert_eq!(index(At::End), Some(5));
        assert!(At::Step(7).index(&events, &stamps).is_err());
        assert!(At::Oom.index(&events[..4], &stamps[..4]).is_err());
        assert_eq!(At::Peak.index(&[], &[]).unwrap(), None);
        // At the peak, blocks 0 and 1 are alive.
        let trace = Trace::from_stamped(events, stamps);
        let (snap, i) = TorchSnapshot::from_trace_at(&trace, At::Peak).unwrap();
        assert_eq!(i, 1);
        let live: u64 = snap
            .segments
            .iter()
            .flat_map(|s| &s.blocks)
            .map(|b| b.requested_size)
            .sum();
        assert_eq!(live, 400);
        let (end, _) = TorchSnapshot::from_trace_at(&trace, At::End).unwrap();
        let live_at_end: u64 = end
            .segments
            .iter()
            .flat_map(|s| &s.blocks)
            .map(|b| b.requested_size)
            .sum();
        assert_eq!(live_at_end, 50);
    }
}
