//! The memory page of a trace (`syncmem trace view`, `syncmem train --memory-html`): one
//! self-contained HTML file, inline SVG and a little inline script, nothing fetched.
//!
//! Per pool (each device, its pinned host pool, the host pool): allocated and reserved bytes
//! over time with the peak marked and the steps drawn, copies and the other transfer-like
//! events as marks on the time axis with their bytes, out-of-memory failures in red, and the
//! blocks alive at the peak, largest first, with their owners and lifetimes. The series are
//! downsampled to at most [`TimelineOptions::buckets`] spans per pool, each keeping its
//! highest and lowest value, so a trace of millions of events gives a page of the same size
//! and no peak is lost.
//!
//! The script records every error it meets into the page (`<body data-errors>`, `#errors`)
//! and sets `<body data-ready="1">` once it has run, so that a headless browser's dump of
//! the page tells whether it ran cleanly.

mod chart;
mod scale;

use std::fmt::Write as _;

use syncmem::report::timeline::{BlockLife, PoolTimeline, Timeline, TimelineOptions};
use syncmem::report::Trace;

use scale::{bytes, esc, x_label};

/// The width of the charts' coordinate space (they scale to the window).
const WIDTH: f64 = 1200.0;

/// Spans of time per pool.
const BUCKETS: usize = 1500;
/// Blocks listed as alive at a peak.
const TOP_BLOCKS: usize = 20;

/// How each kind of mark is drawn: the kind (as in [`syncmem::report::timeline::Mark`]),
/// its name, its short name (the lane's label), its colour; the order is the legend's. A
/// kind missing here (one added to traces later) is drawn in grey under its own name: a new
/// kind only needs a row here to get a name and a colour of its own.
const KINDS: &[(&str, &str, &str, &str)] = &[
    (
        "host_to_device",
        "copy host → device",
        "host→device",
        "#2e8b3e",
    ),
    (
        "device_to_host",
        "copy device → host",
        "device→host",
        "#8e44ad",
    ),
    (
        "device_to_device",
        "copy device → device",
        "device→device",
        "#138d90",
    ),
    (
        "mapped",
        "zero-copy sync (no byte copied)",
        "zero-copy",
        "#b8860b",
    ),
    ("spill", "spill device → host", "spill", "#c0392b"),
    ("refill", "refill host → device", "refill", "#e67e22"),
    (
        "evict",
        "eviction (clean copy dropped)",
        "evictions",
        "#a0522d",
    ),
    ("oom", "out of memory", "out of memory", "#d62728"),
];

/// (order, name, short name, colour) of mark kind `kind`.
fn kind_style(kind: &str) -> (usize, &str, &str, &'static str) {
    match KINDS.iter().position(|(k, ..)| *k == kind) {
        Some(i) => (i, KINDS[i].1, KINDS[i].2, KINDS[i].3),
        None => (KINDS.len(), kind, kind, "#7f7f7f"),
    }
}

const CSS: &str = include_str!("page.css");
const SCRIPT: &str = include_str!("page.js");

/// What kind of memory a pool holds.
fn pool_kind(p: &PoolTimeline) -> &'static str {
    if p.label == "host" {
        "host memory (the host copies of tensors)"
    } else if p.host {
        "pinned host memory (staging for copies)"
    } else {
        "device memory"
    }
}

/// The page of `trace`, titled `title`.
pub fn render(trace: &Trace, title: &str) -> String {
    let opts = TimelineOptions {
        buckets: BUCKETS,
        top_blocks: TOP_BLOCKS,
    };
    let t = Timeline::build(trace, &opts);
    let mut h = String::with_capacity(64 << 10);
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{}</title><style>{CSS}</style></head>\n<body data-ready=\"0\" data-errors=\"0\">\n",
        esc(title)
    );
    let _ = write!(h, "<header><h1>{}</h1><p class=\"sub\">", esc(title));
    let span = if t.timed {
        format!(
            "{} recorded over {}",
            plural(t.events, "event"),
            scale::time(t.end)
        )
    } else {
        format!(
            "{} (the trace has no times: the axis counts events)",
            plural(t.events, "event")
        )
    };
    let _ = write!(h, "{span}");
    if let (Some(a), Some(b)) = (t.steps.first(), t.steps.last()) {
        let _ = write!(h, ", steps {} to {}", a.step, b.step);
    }
    h.push_str(
        ". Each panel is one memory pool: <b>allocated</b> bytes are blocks handed to \
         tensors, <b>reserved</b> bytes are what the pool holds from the system (allocated + \
         cached). Hover over the charts, the marks and the blocks for details.</p></header>\n",
    );
    legend(&mut h, &t);
    summary(&mut h, &t);
    if t.pools.is_empty() {
        h.push_str("<p class=\"empty\">The trace holds no events.</p>\n");
    }
    for (i, p) in t.pools.iter().enumerate() {
        pool(&mut h, &t, p, i);
    }
    h.push_str("<div id=\"tip\" role=\"tooltip\"></div><pre id=\"errors\"></pre>\n");
    let _ = writeln!(
        h,
        "<script type=\"application/json\" id=\"geometry\">{}</script>",
        chart::geometry(&t)
    );
    for (i, p) in t.pools.iter().enumerate() {
        let _ = writeln!(
            h,
            "<script type=\"application/json\" id=\"series-{i}\">{}</script>",
            chart::series_json(p)
        );
    }
    let _ = write!(h, "<script>{SCRIPT}</script>\n</body></html>\n");
    h
}

fn plural(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// The legend of the series and of every kind of mark the trace has.
fn legend(h: &mut String, t: &Timeline) {
    h.push_str("<div class=\"legend\">");
    h.push_str("<span><i class=\"sw allocated\"></i>allocated</span>");
    if t.pools
        .iter()
        .any(|p| p.samples.iter().any(|s| s.alloc_lo != s.alloc_hi))
    {
        h.push_str(
            "<span><i class=\"sw held\"></i>allocated throughout a span (the lighter area is \
             the highest within it)</span>",
        );
    }
    if t.pools.iter().any(|p| p.segments_recorded) {
        h.push_str("<span><i class=\"sw reserved\"></i>reserved</span>");
    }
    h.push_str("<span><i class=\"sw peak\"></i>peak of allocated bytes</span>");
    if !t.steps.is_empty() {
        h.push_str("<span><i class=\"sw step\"></i>start of a step (numbered)</span>");
    }
    let mut kinds: Vec<&str> = Vec::new();
    for p in &t.pools {
        for m in &p.marks {
            if !kinds.contains(&m.kind.as_str()) {
                kinds.push(&m.kind);
            }
        }
    }
    kinds.sort_by_key(|k| kind_style(k).0);
    for k in kinds {
        let (_, name, _, colour) = kind_style(k);
        let _ = write!(
            h,
            "<span><i class=\"sw mark\" style=\"background:{colour}\"></i>{} (taller: more bytes)</span>",
            esc(name)
        );
    }
    h.push_str("</div>\n");
}

/// One row per pool: its peaks and counts.
fn summary(h: &mut String, t: &Timeline) {
    h.push_str(
        "<table class=\"summary\"><thead><tr><th>pool</th><th>memory</th>\
         <th>peak allocated</th><th>when</th><th>peak reserved</th><th>allocations</th>\
         <th>marks</th></tr></thead><tbody>",
    );
    for p in &t.pools {
        let reserved = if p.segments_recorded {
            bytes(p.peak_reserved.bytes)
        } else {
            "not recorded".to_string()
        };
        let marks: Vec<String> = {
            let mut kinds: Vec<(&str, u64)> = Vec::new();
            for m in &p.marks {
                match kinds.iter_mut().find(|(k, _)| *k == m.kind) {
                    Some((_, n)) => *n += m.count,
                    None => kinds.push((&m.kind, m.count)),
                }
            }
            kinds
                .into_iter()
                .map(|(k, n)| format!("{n} × {}", kind_style(k).2))
                .collect()
        };
        let _ = write!(
            h,
            "<tr><td><a href=\"#pool-{}\">{}</a></td><td>{}</td><td class=\"num\">{}</td>\
             <td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td></tr>",
            esc(&p.label),
            esc(&p.label),
            pool_kind(p),
            bytes(p.peak_allocated.bytes),
            esc(&when(t, p)),
            reserved,
            p.allocs,
            esc(&if marks.is_empty() {
                "none".to_string()
            } else {
                marks.join(", ")
            })
        );
    }
    h.push_str("</tbody></table>\n");
}

/// When pool `p` reached its allocated peak.
fn when(t: &Timeline, p: &PoolTimeline) -> String {
    let pk = &p.peak_allocated;
    let step = pk.step.map(|s| format!(" (step {s})")).unwrap_or_default();
    format!("{}{step}", x_label(pk.x, t.timed))
}

/// The section of one pool: facts, chart, blocks alive at the peak.
fn pool(h: &mut String, t: &Timeline, p: &PoolTimeline, i: usize) {
    let _ = writeln!(
        h,
        "<section class=\"pool\" id=\"pool-{}\" data-pool=\"{}\"><h2>{} <span>{}</span></h2>",
        esc(&p.label),
        esc(&p.label),
        esc(&p.label),
        pool_kind(p)
    );
    h.push_str(&chart::chart(t, p, i));
    h.push('\n');
    if p.at_peak.is_empty() {
        h.push_str("<p class=\"none\">No block was allocated in this pool.</p></section>\n");
        return;
    }
    let listed: u64 = p.at_peak.iter().map(|b| b.size).sum();
    let more = p.at_peak_count - p.at_peak.len() as u64;
    let rest = p.peak_allocated.bytes.saturating_sub(listed);
    let _ = write!(
        h,
        "<h3>Blocks alive at the peak ({} at {}), largest first</h3>",
        bytes(p.peak_allocated.bytes),
        esc(&when(t, p))
    );
    h.push_str(
        "<table class=\"blocks\"><thead><tr><th>owner</th><th>size</th><th>share of the peak</th>\
         <th>asked for</th><th>stream</th><th>allocated at</th><th>freed at</th>\
         <th>lifetime (bar: over the whole trace)</th></tr></thead><tbody>",
    );
    let peak = p.peak_allocated.bytes.max(1) as f64;
    for b in &p.at_peak {
        block_row(h, t, b, i, peak);
    }
    if more > 0 {
        let _ = write!(
            h,
            "<tr class=\"more\"><td colspan=\"8\">and {} more, {} in all</td></tr>",
            plural(more as usize, "block"),
            bytes(rest)
        );
    }
    h.push_str("</tbody></table></section>\n");
}

/// The row of block `b` alive at the peak of chart `i` (`peak`: the peak's bytes).
fn block_row(h: &mut String, t: &Timeline, b: &BlockLife, i: usize, peak: f64) {
    let owner = b.owner.as_deref().unwrap_or("(no owner)");
    let freed = b.free_x.map_or_else(
        || "still alive at the end".to_string(),
        |x| x_label(x, t.timed),
    );
    let end = b.free_x.unwrap_or(t.end);
    let life = if t.timed {
        scale::time(end - b.alloc_x)
    } else {
        plural((end - b.alloc_x) as usize, "event")
    };
    let share = b.size as f64 / peak * 100.0;
    let tip = format!(
        "{owner}: {} ({} asked for), stream {}, allocated at {}{}, freed at {freed}, alive {life}",
        bytes(b.size),
        bytes(b.requested),
        b.stream,
        x_label(b.alloc_x, t.timed),
        b.step.map(|s| format!(" (step {s})")).unwrap_or_default()
    );
    let total = t.end.max(1) as f64;
    let _ = write!(
        h,
        "<tr class=\"block\" data-chart=\"{i}\" data-alloc=\"{}\" data-free=\"{end}\" data-tip=\"{}\">\
         <td class=\"owner\">{}</td><td class=\"num\">{}</td>\
         <td><span class=\"share\" style=\"width:{:.1}%\"></span> {share:.1}%</td>\
         <td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td><td>{}</td>\
         <td><svg class=\"lifebar\" viewBox=\"0 0 100 8\" preserveAspectRatio=\"none\">\
         <rect x=\"{:.2}\" y=\"0\" width=\"{:.2}\" height=\"8\"/></svg> {}</td></tr>",
        b.alloc_x,
        esc(&tip),
        esc(owner),
        bytes(b.size),
        share.min(100.0),
        bytes(b.requested),
        b.stream,
        esc(&x_label(b.alloc_x, t.timed)),
        esc(&freed),
        b.alloc_x as f64 / total * 100.0,
        ((end - b.alloc_x) as f64 / total * 100.0).max(0.3),
        esc(&life)
    );
}
