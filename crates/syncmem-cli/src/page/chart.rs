//! The chart of one pool: allocated and reserved bytes over time, the peak, the steps, and a
//! lane of marks per kind of event (copies, evictions, out-of-memory failures, ...).

use std::fmt::Write as _;

use syncmem::report::timeline::{Mark, PoolTimeline, Sample, Timeline};

use super::scale::{byte_ticks, bytes, esc, x_label, x_ticks};
use super::{kind_style, WIDTH};

/// Left margin (byte labels).
pub(super) const LEFT: f64 = 104.0;
/// Right margin.
const RIGHT: f64 = 16.0;
/// Above the plot: step labels and the peak's label.
const TOP: f64 = 26.0;
/// The plot's height.
const PLOT: f64 = 210.0;
/// Below the plot: the time axis.
const AXIS: f64 = 40.0;
/// One lane of marks.
const LANE: f64 = 18.0;
/// The least room between two step lines drawn, beyond the previous label's width (steps
/// closer than this are skipped).
const STEP_GAP: f64 = 12.0;
/// The width of one character of a step label (10 px text), a little generous.
const STEP_CHAR: f64 = 6.5;

/// Maps trace `x` values and bytes to the chart's coordinates.
pub(super) struct Frame {
    end: f64,
    top_bytes: f64,
}

impl Frame {
    pub(super) fn new(t: &Timeline, p: &PoolTimeline) -> Self {
        let top = p.peak_reserved.bytes.max(p.peak_allocated.bytes).max(1);
        Frame {
            end: t.end.max(1) as f64,
            top_bytes: top as f64 * 1.1,
        }
    }

    /// The horizontal position of `x`.
    pub(super) fn px(&self, x: u64) -> f64 {
        LEFT + (x as f64 / self.end) * (WIDTH - LEFT - RIGHT)
    }

    fn py(&self, b: u64) -> f64 {
        TOP + PLOT - (b as f64 / self.top_bytes) * PLOT
    }
}

/// A step-shaped polygon under `value` of each sample (from the axis up).
fn area(f: &Frame, samples: &[Sample], end: u64, value: fn(&Sample) -> u64) -> String {
    let base = f.py(0);
    let mut pts = String::new();
    let Some(first) = samples.first() else {
        return pts;
    };
    let _ = write!(pts, "{:.1},{base:.1}", f.px(first.x));
    let mut prev = base;
    for s in samples {
        let x = f.px(s.x);
        let y = f.py(value(s));
        let _ = write!(pts, " {x:.1},{prev:.1} {x:.1},{y:.1}");
        prev = y;
    }
    let x = f.px(end);
    let _ = write!(pts, " {x:.1},{prev:.1} {x:.1},{base:.1}");
    pts
}

/// A step-shaped line through `value` of each sample.
fn line(f: &Frame, samples: &[Sample], end: u64, value: fn(&Sample) -> u64) -> String {
    let mut pts = String::new();
    let mut prev = f.py(0);
    for (i, s) in samples.iter().enumerate() {
        let x = f.px(s.x);
        let y = f.py(value(s));
        if i > 0 {
            let _ = write!(pts, " {x:.1},{prev:.1}");
        }
        let _ = write!(pts, " {x:.1},{y:.1}");
        prev = y;
    }
    if !samples.is_empty() {
        let _ = write!(pts, " {:.1},{prev:.1}", f.px(end));
    }
    pts
}

/// The kinds of marks of `p`, in the order of the style table (unknown kinds last).
fn lanes(p: &PoolTimeline) -> Vec<&str> {
    let mut kinds: Vec<&str> = Vec::new();
    for m in &p.marks {
        if !kinds.contains(&m.kind.as_str()) {
            kinds.push(&m.kind);
        }
    }
    kinds.sort_by_key(|k| kind_style(k).0);
    kinds
}

/// The tooltip of a mark.
fn mark_tip(m: &Mark, t: &Timeline) -> String {
    let (_, label, _, _) = kind_style(&m.kind);
    let what = if m.count == 1 {
        format!("{label}: {}", bytes(m.bytes))
    } else {
        format!("{} × {label}: {} in all", m.count, bytes(m.bytes))
    };
    format!("{what}, at {}", x_label(m.x, t.timed))
}

/// The chart of pool `p` (index `idx` on the page) as an SVG element.
pub(super) fn chart(t: &Timeline, p: &PoolTimeline, idx: usize) -> String {
    let f = Frame::new(t, p);
    let kinds = lanes(p);
    let height = TOP + PLOT + AXIS + LANE * kinds.len() as f64 + 4.0;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg class="chart" id="chart-{idx}" data-pool="{}" viewBox="0 0 {WIDTH} {height}" role="img" aria-label="memory of {} over time">"#,
        esc(&p.label),
        esc(&p.label)
    );
    byte_grid(&mut s, &f);
    step_lines(&mut s, &f, t);
    // Hover target for the read-out of the series, under everything drawn on the plot (which
    // lets the pointer through) but the out-of-memory lines (which have tooltips of their own).
    let _ = write!(
        s,
        r#"<rect class="hover" data-chart="{idx}" x="{LEFT}" y="{TOP:.1}" width="{:.1}" height="{PLOT:.1}"/>"#,
        WIDTH - LEFT - RIGHT
    );
    series(&mut s, &f, t, p);
    oom_lines(&mut s, &f, t, p);
    // The lifetime of a hovered block (set by the page's script).
    let _ = write!(
        s,
        r#"<rect class="life" x="0" y="{TOP:.1}" width="0" height="{PLOT:.1}"/>"#
    );
    peak(&mut s, &f, t, p);
    time_axis(&mut s, &f, t);
    for (i, kind) in kinds.iter().enumerate() {
        lane(&mut s, &f, t, p, kind, i);
    }
    s.push_str("</svg>");
    s
}

/// The byte grid and its labels.
fn byte_grid(s: &mut String, f: &Frame) {
    s.push_str(r#"<g class="axis-y">"#);
    for b in byte_ticks((f.top_bytes / 1.1) as u64) {
        let y = f.py(b);
        let _ = write!(
            s,
            r#"<line x1="{LEFT}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            WIDTH - RIGHT,
            LEFT - 6.0,
            y + 4.0,
            bytes(b)
        );
    }
    s.push_str("</g>");
}

/// A line and a label per training step, skipping steps too close to the last label drawn.
fn step_lines(s: &mut String, f: &Frame, t: &Timeline) {
    s.push_str(r#"<g class="steps">"#);
    // Where the room after the last label drawn ends.
    let mut free_from = f64::NEG_INFINITY;
    for (k, st) in t.steps.iter().enumerate() {
        let x = f.px(st.x);
        if x < free_from {
            continue;
        }
        // The first label says what the numbers are.
        let label = if k == 0 {
            format!("step {}", st.step)
        } else {
            st.step.to_string()
        };
        free_from = x + STEP_CHAR * label.len() as f64 + STEP_GAP;
        let _ = write!(
            s,
            r#"<line x1="{x:.1}" x2="{x:.1}" y1="{:.1}" y2="{:.1}"/><text x="{:.1}" y="{:.1}">{label}</text>"#,
            TOP - 4.0,
            TOP + PLOT,
            x + 2.0,
            TOP - 6.0,
        );
    }
    s.push_str("</g>");
}

/// The series: allocated (highest and lowest of each span), reserved.
fn series(s: &mut String, f: &Frame, t: &Timeline, p: &PoolTimeline) {
    let downsampled = p.samples.iter().any(|x| x.alloc_lo != x.alloc_hi);
    let _ = write!(
        s,
        r#"<polygon class="series series-allocated" points="{}"/>"#,
        area(f, &p.samples, t.end, |x| x.alloc_hi)
    );
    if downsampled {
        let _ = write!(
            s,
            r#"<polygon class="series series-allocated-held" points="{}"/>"#,
            area(f, &p.samples, t.end, |x| x.alloc_lo)
        );
    }
    if p.segments_recorded {
        let _ = write!(
            s,
            r#"<polyline class="series series-reserved" points="{}"/>"#,
            line(f, &p.samples, t.end, |x| x.reserved_hi)
        );
    }
}

/// Out-of-memory failures, as lines across the plot.
fn oom_lines(s: &mut String, f: &Frame, t: &Timeline, p: &PoolTimeline) {
    for m in p.marks.iter().filter(|m| m.kind == "oom") {
        let x = f.px(m.x);
        let _ = write!(
            s,
            r#"<line class="oom-line" x1="{x:.1}" x2="{x:.1}" y1="{TOP:.1}" y2="{:.1}" data-tip="{}"/>"#,
            TOP + PLOT,
            esc(&mark_tip(m, t))
        );
    }
}

/// The peak of allocated bytes: a dot and its label.
fn peak(s: &mut String, f: &Frame, t: &Timeline, p: &PoolTimeline) {
    let pk = &p.peak_allocated;
    if pk.bytes == 0 {
        return;
    }
    let (x, y) = (f.px(pk.x), f.py(pk.bytes));
    let step = pk.step.map(|s| format!(", step {s}")).unwrap_or_default();
    let label = format!(
        "peak {} at {}{step}",
        bytes(pk.bytes),
        x_label(pk.x, t.timed)
    );
    let anchor = if x > WIDTH * 0.7 { "end" } else { "start" };
    let dx = if anchor == "end" { -8.0 } else { 8.0 };
    let _ = write!(
        s,
        r#"<g class="peak"><circle cx="{x:.1}" cy="{y:.1}" r="4.5"/><text x="{:.1}" y="{:.1}" text-anchor="{anchor}">{}</text></g>"#,
        x + dx,
        (y - 6.0).max(12.0),
        esc(&label)
    );
}

/// The time axis: ticks, their labels and the axis title.
fn time_axis(s: &mut String, f: &Frame, t: &Timeline) {
    let base = TOP + PLOT;
    let _ = write!(
        s,
        r#"<g class="axis-x"><line x1="{LEFT}" x2="{:.1}" y1="{base:.1}" y2="{base:.1}"/>"#,
        WIDTH - RIGHT
    );
    for x in x_ticks(t.end) {
        let px = f.px(x);
        let _ = write!(
            s,
            r#"<line x1="{px:.1}" x2="{px:.1}" y1="{base:.1}" y2="{:.1}"/><text x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            base + 5.0,
            base + 18.0,
            esc(&x_label(x, t.timed).replace("event ", ""))
        );
    }
    let title = if t.timed {
        "time since the trace began"
    } else {
        "event number (this trace has no times)"
    };
    let _ = write!(
        s,
        r#"<text class="axis-title" x="{:.1}" y="{:.1}" text-anchor="middle">{title}</text></g>"#,
        (LEFT + WIDTH - RIGHT) / 2.0,
        base + 34.0
    );
}

/// Lane `i`: the marks of one kind, each as tall as its bytes (on a log scale).
fn lane(s: &mut String, f: &Frame, t: &Timeline, p: &PoolTimeline, kind: &str, i: usize) {
    let (_, _, label, colour) = kind_style(kind);
    let y0 = TOP + PLOT + AXIS + i as f64 * LANE;
    let most = p
        .marks
        .iter()
        .filter(|m| m.kind == kind)
        .map(|m| m.bytes)
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let _ = write!(
        s,
        r#"<g class="lane" data-kind="{}"><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
        esc(kind),
        LEFT - 6.0,
        y0 + 12.0,
        esc(label)
    );
    for m in p.marks.iter().filter(|m| m.kind == kind) {
        // Taller for more bytes (logarithmic), never less than a third of the lane.
        let h = 5.0 + 9.0 * ((m.bytes.max(1) as f64).ln() / most.ln().max(1.0)).min(1.0);
        let _ = write!(
            s,
            r#"<rect class="mark" x="{:.1}" y="{:.1}" width="2.5" height="{h:.1}" fill="{colour}" data-tip="{}"/>"#,
            f.px(m.x) - 1.0,
            y0 + 14.0 - h,
            esc(&mark_tip(m, t))
        );
    }
    s.push_str("</g>");
}

/// The series of `p` for the page's script: `[[x, alloc_lo, alloc_hi, reserved_hi], ...]`.
pub(super) fn series_json(p: &PoolTimeline) -> String {
    let mut s = String::from("[");
    for (i, x) in p.samples.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(
            s,
            "[{},{},{},{}]",
            x.x, x.alloc_lo, x.alloc_hi, x.reserved_hi
        );
    }
    s.push(']');
    s
}

/// The chart's geometry for the script: left edge, plot width, the last `x`.
pub(super) fn geometry(t: &Timeline) -> String {
    format!(
        r#"{{"left":{LEFT},"width":{},"total":{WIDTH},"end":{},"timed":{}}}"#,
        WIDTH - LEFT - RIGHT,
        t.end.max(1),
        t.timed
    )
}
