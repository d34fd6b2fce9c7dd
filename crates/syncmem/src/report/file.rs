//! The JSON-lines file format of traces: one event per line, its stamp's fields appended.

use std::io::{BufRead, Write};

use serde::Deserialize;

use super::event::{check_event_size, Stamp, TraceEvent, MAX_LINE_BYTES};

/// Writes `e` as one JSON object with `t_us` (and `step` when marked) and a newline.
pub(super) fn write_line(
    out: &mut (impl Write + ?Sized),
    e: &TraceEvent,
    s: &Stamp,
) -> std::io::Result<()> {
    let mut line = serde_json::to_string(e).map_err(std::io::Error::other)?;
    // The event is a JSON object: its closing brace makes way for the stamp's fields.
    line.pop();
    match s.step {
        Some(step) => writeln!(out, "{line},\"t_us\":{},\"step\":{step}}}", s.t_us),
        None => writeln!(out, "{line},\"t_us\":{}}}", s.t_us),
    }
}

/// The stamp's fields of a line (the event's fields are skipped).
#[derive(Deserialize)]
struct StampLine {
    #[serde(default)]
    t_us: u64,
    #[serde(default)]
    step: Option<u64>,
}

/// Why reading failed: the line (`None`: a read error) and the reason.
pub(super) type ReadError = (Option<usize>, String);

/// Events and stamps read from JSON lines of at most [`MAX_LINE_BYTES`] bytes, each event of
/// at most [`super::MAX_EVENT_BYTES`] (a line without `t_us` has time 0: files written before
/// times were recorded); an error names the line (`None`: a read error).
pub(super) fn read_events(
    mut input: impl BufRead,
) -> std::result::Result<(Vec<TraceEvent>, Vec<Stamp>), ReadError> {
    let mut events = Vec::new();
    let mut stamps = Vec::new();
    let mut buf = Vec::new();
    let mut n = 0usize;
    loop {
        n += 1;
        match crate::file::read_line_bounded(&mut input, &mut buf, MAX_LINE_BYTES) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                return Err((
                    Some(n),
                    format!("longer than {MAX_LINE_BYTES} bytes: not a trace event"),
                ))
            }
            Err(e) => return Err((None, e.to_string())),
        }
        let line =
            std::str::from_utf8(&buf).map_err(|e| (Some(n), format!("not UTF-8 text: {e}")))?;
        if line.trim().is_empty() {
            continue;
        }
        let e = serde_json::from_str(line).map_err(|e| (Some(n), e.to_string()))?;
        check_event_size(&e).map_err(|reason| (Some(n), reason))?;
        let s: StampLine = serde_json::from_str(line).map_err(|e| (Some(n), e.to_string()))?;
        events.push(e);
        stamps.push(Stamp {
            t_us: s.t_us,
            step: s.step,
        });
    }
    Ok((events, stamps))
}
