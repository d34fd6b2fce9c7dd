//! The page's data, as the JSON its script reads (`<script type="application/json"
//! id="data">`). Blocks are written as columns of numbers, times and event indices as
//! differences from the previous block's, so that a long trace's page stays small.
//!
//! ```text
//! {"timed", "start", "end", "events", "phases": [{"name", "note", "from", "to", "first",
//!  "last", "main"}], "steps": [[step, x, event]], "stepsThinned", "owners": [name],
//!  "extras": [{field: value}], "slots": {slot: [blob]}, "kinds": [[kind, name, short, colour]],
//!  "pools": [{"label", "host", "peak": {"bytes", "at", "x", "step"}, "peakAll": {...},
//!   "peakReserved", "segmentsRecorded", "allocs", "elided", "elidedMax",
//!   "blocks": {"id", "ai", "fi", "ax", "fx", "s", "q", "o", "t", "g", "f", "e"},
//!   "segs": [[id, size, ai, fi, ax, fx, stream]], "marks": [[kind, x, count, bytes]],
//!   "total": [[x, highest allocated]]}]}
//! ```
//!
//! `ai`, `ax`: differences from the previous block's event index and time; `fi`, `fx`: from
//! its own allocation (-1: alive at the end). `q`: bytes asked for (0: as `s`). `o`, `e`:
//! indices into `owners`, `extras` (-1: none). `g`, `f`: segment and offset (-1: no place).

use std::fmt::Write as _;

use syncmem::report::timeline::Timeline;

use super::model::{Model, Peak, PoolModel, Slots, MAX_STEPS};
use super::KINDS;

fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_string())
}

/// Writes `[a,b,c]` of the values.
fn column(out: &mut String, name: &str, values: impl Iterator<Item = i64>) {
    let _ = write!(out, "\"{name}\":[");
    for (k, v) in values.enumerate() {
        if k > 0 {
            out.push(',');
        }
        let _ = write!(out, "{v}");
    }
    out.push(']');
}

fn diff(prev: &mut i64, v: i64) -> i64 {
    let d = v - *prev;
    *prev = v;
    d
}

fn peak_json(m: &Model, p: &Peak) -> String {
    match p.at {
        Some(k) => format!(
            r#"{{"bytes":{},"at":{k},"x":{},"step":{}}}"#,
            p.bytes,
            m.xs[k],
            m.steps[k].map_or("null".to_string(), |s| s.to_string())
        ),
        None => r#"{"bytes":0,"at":-1,"x":0,"step":null}"#.to_string(),
    }
}

fn blocks_json(out: &mut String, m: &Model, p: &PoolModel) {
    let b = &p.blocks;
    let x = |k: usize| m.xs[k] as i64;
    out.push_str("\"blocks\":{");
    column(out, "id", b.iter().map(|b| b.id as i64));
    out.push(',');
    let mut prev = 0;
    column(out, "ai", b.iter().map(|b| diff(&mut prev, b.ai as i64)));
    out.push(',');
    column(
        out,
        "fi",
        b.iter().map(|b| b.fi.map_or(-1, |f| (f - b.ai) as i64)),
    );
    out.push(',');
    let mut prev = 0;
    column(out, "ax", b.iter().map(|b| diff(&mut prev, x(b.ai))));
    out.push(',');
    column(
        out,
        "fx",
        b.iter().map(|b| b.fi.map_or(-1, |f| x(f) - x(b.ai))),
    );
    out.push(',');
    column(out, "s", b.iter().map(|b| b.size as i64));
    out.push(',');
    column(
        out,
        "q",
        b.iter().map(|b| {
            if b.requested == b.size {
                0
            } else {
                b.requested as i64
            }
        }),
    );
    out.push(',');
    column(out, "o", b.iter().map(|b| b.owner.map_or(-1, i64::from)));
    out.push(',');
    column(out, "t", b.iter().map(|b| b.stream as i64));
    out.push(',');
    column(
        out,
        "g",
        b.iter().map(|b| b.place.map_or(-1, |p| p.0 as i64)),
    );
    out.push(',');
    column(
        out,
        "f",
        b.iter().map(|b| b.place.map_or(-1, |p| p.1 as i64)),
    );
    out.push(',');
    column(out, "e", b.iter().map(|b| b.extra.map_or(-1, i64::from)));
    out.push('}');
}

fn pool_json(out: &mut String, m: &Model, p: &PoolModel, t: Option<&Timeline>) {
    let host = p.label == "host" || p.label.ends_with(" pinned");
    let _ = write!(
        out,
        r#"{{"label":{},"host":{host},"peak":{},"peakAll":{},"peakReserved":{},"segmentsRecorded":{},"allocs":{},"elided":{},"elidedMax":{},"#,
        json_str(&p.label),
        peak_json(m, &p.peak),
        peak_json(m, &p.peak_all),
        p.peak_reserved,
        p.segments_recorded,
        p.allocs,
        p.elided,
        p.elided_max
    );
    blocks_json(out, m, p);
    out.push_str(",\"segs\":[");
    for (k, s) in p.segments.iter().enumerate() {
        let (ax, fx) = (m.xs[s.ai], s.fi.map_or(-1, |f| m.xs[f] as i64));
        let fi = s.fi.map_or(-1, |f| f as i64);
        let sep = if k > 0 { "," } else { "" };
        let _ = write!(
            out,
            "{sep}[{},{},{},{fi},{ax},{fx},{}]",
            s.id, s.size, s.ai, s.stream
        );
    }
    out.push_str("],\"marks\":[");
    for (k, (kind, x, count, bytes)) in p.marks.iter().enumerate() {
        let sep = if k > 0 { "," } else { "" };
        let _ = write!(out, "{sep}[{},{x},{count},{bytes}]", json_str(kind));
    }
    out.push_str("],\"total\":[");
    if let Some(pt) = t.and_then(|t| t.pool(&p.label)).filter(|_| p.elided > 0) {
        for (k, s) in pt.samples.iter().enumerate() {
            let sep = if k > 0 { "," } else { "" };
            let _ = write!(out, "{sep}[{},{}]", s.x, s.alloc_hi);
        }
    }
    out.push_str("]}");
}

fn steps_json(out: &mut String, m: &Model) {
    let mut starts: Vec<(u64, usize)> = Vec::new();
    for (i, s) in m.steps.iter().enumerate() {
        if let Some(s) = s {
            if starts.last().map(|l| l.0) != Some(*s) {
                starts.push((*s, i));
            }
        }
    }
    let every = starts.len().div_ceil(MAX_STEPS).max(1);
    out.push_str("\"steps\":[");
    for (k, (s, i)) in starts.iter().step_by(every).enumerate() {
        let sep = if k > 0 { "," } else { "" };
        let _ = write!(out, "{sep}[{s},{},{i}]", m.xs[*i]);
    }
    let _ = write!(out, "],\"stepsThinned\":{every}");
}

/// The page's data (see the module docs); `t`: the downsampled series, for pools with
/// blocks left out.
pub fn data_json(m: &Model, slots: &Slots, t: Option<&Timeline>) -> String {
    let mut out = String::with_capacity(1 << 16);
    let _ = write!(
        out,
        r#"{{"timed":{},"start":{},"end":{},"events":{},"phases":["#,
        m.timed,
        m.xs.first().copied().unwrap_or(0),
        m.xs.last().copied().unwrap_or(0),
        m.xs.len()
    );
    for (k, p) in m.phases.iter().enumerate() {
        let sep = if k > 0 { "," } else { "" };
        let _ = write!(
            out,
            r#"{sep}{{"name":{},"note":{},"from":{},"to":{},"first":{},"last":{},"main":{}}}"#,
            json_str(p.name),
            json_str(p.note),
            p.from,
            p.to,
            p.first,
            p.last,
            p.main
        );
    }
    out.push_str("],");
    steps_json(&mut out, m);
    let owners = serde_json::to_string(&m.owners).unwrap_or_else(|_| "[]".into());
    let _ = write!(out, ",\"owners\":{owners},\"extras\":[");
    for (k, e) in m.extras.iter().enumerate() {
        let sep = if k > 0 { "," } else { "" };
        let _ = write!(out, "{sep}{e}");
    }
    let slots = serde_json::to_string(slots).unwrap_or_else(|_| "{}".into());
    let _ = write!(out, "],\"slots\":{slots},\"kinds\":[");
    for (k, (kind, name, short, colour)) in KINDS.iter().enumerate() {
        let sep = if k > 0 { "," } else { "" };
        let _ = write!(
            out,
            "{sep}[{},{},{},{}]",
            json_str(kind),
            json_str(name),
            json_str(short),
            json_str(colour)
        );
    }
    out.push_str("],\"pools\":[");
    for (k, p) in m.pools.iter().enumerate() {
        if k > 0 {
            out.push(',');
        }
        pool_json(&mut out, m, p, t);
    }
    out.push_str("]}");
    // Inside a <script> element no "</" or "<!--" may appear: every "<" (only ever inside a
    // JSON string) is written as its escape.
    out.replace('<', "\\u003c")
}
