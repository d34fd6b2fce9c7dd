//! The memory page of a trace (`syncmem trace view`, `syncmem train --memory-html`): one
//! self-contained HTML file, nothing fetched, made by [`render`] for both commands.
//!
//! The page names the phases of the run (planning measurement, set-up, training, after
//! training: [`phases`]) and opens on training. Per pool (each device, its pinned host pool,
//! the host pool) it draws the live blocks stacked by owner over time (PyTorch's "active
//! memory timeline"), the reserved bytes, the steps, and copies, syncs, spills, refills,
//! evictions and out-of-memory failures as marks; it zooms (wheel, buttons) and pans (drag);
//! hovering names the owner, size, stream and any other field the block's event carries (an
//! operator, frames); a click on a moment lists the blocks alive then and draws the
//! allocator's state (segments with their blocks and free gaps). The peak shown is the peak
//! of training. Planner slots (`__shared_N`) are named by the blobs the net's plan puts in
//! them when the caller knows the plan ([`Slots`]).
//!
//! The data is the trace's blocks and segments ([`model`]), at most [`model::MAX_BLOCKS`]
//! blocks (those alive at a peak first, then the largest: the page says how many were left
//! out); marks are counted in [`model::MARK_BUCKETS`] spans of the run.
//!
//! The script records every error it meets into the page (`<body data-errors>`, `#errors`)
//! and sets `<body data-ready="1">` once it has run, so that a headless browser's dump of
//! the page tells whether it ran cleanly.

mod data;
mod model;
mod phases;
mod scale;

use std::fmt::Write as _;

use syncmem::report::timeline::{Timeline, TimelineOptions};
use syncmem::report::Trace;

pub use model::{slots_of, Slots};
use model::{Model, PoolModel};
use scale::{bytes, esc, x_label};

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
/// Blocks named under each pool's peak in the page's text.
const NAMED_AT_PEAK: usize = 8;

/// What kind of memory a pool holds.
fn pool_kind(label: &str) -> &'static str {
    if label == "host" {
        "host memory (the host copies of tensors)"
    } else if label.ends_with(" pinned") {
        "pinned host memory (staging for copies)"
    } else {
        "device memory"
    }
}

/// The page of `trace`, titled `title`; `slots`: the blobs in each planner slot, when known.
pub fn render(trace: &Trace, title: &str, slots: &Slots) -> String {
    let m = Model::build(trace);
    let elided = m.pools.iter().any(|p| p.elided > 0);
    let t = elided.then(|| {
        Timeline::build(
            trace,
            &TimelineOptions {
                buckets: 4000,
                top_blocks: 0,
            },
        )
    });
    let mut h = String::with_capacity(64 << 10);
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{}</title><style>{CSS}</style></head>\n<body data-ready=\"0\" data-errors=\"0\">\n",
        esc(title)
    );
    header(&mut h, &m, title);
    toolbar(&mut h, &m);
    legend(&mut h, &m);
    summary(&mut h, &m, slots);
    slot_note(&mut h, &m, slots);
    if m.pools.is_empty() {
        h.push_str("<p class=\"empty\">The trace holds no events.</p>\n");
    }
    for (i, p) in m.pools.iter().enumerate() {
        let _ = writeln!(
            h,
            "<section class=\"pool\" id=\"pool-{i}\" data-pool=\"{}\"><h2>{} <span>{}</span></h2>\
             <canvas class=\"chart\" data-pool=\"{i}\" aria-label=\"memory of {} over time\"></canvas>\
             <div class=\"owners\" data-pool=\"{i}\"></div>\
             <div class=\"state\" data-pool=\"{i}\"></div></section>",
            esc(&p.label),
            esc(&p.label),
            pool_kind(&p.label),
            esc(&p.label)
        );
    }
    h.push_str("<div id=\"tip\" role=\"tooltip\"></div><pre id=\"errors\"></pre>\n");
    let _ = writeln!(
        h,
        "<script type=\"application/json\" id=\"data\">{}</script>",
        data::data_json(&m, slots, t.as_ref())
    );
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

/// The duration of a phase, or its events when the trace has no times.
fn span(m: &Model, from: u64, to: u64, events: usize) -> String {
    if m.timed {
        scale::time(to - from)
    } else {
        plural(events, "event")
    }
}

fn header(h: &mut String, m: &Model, title: &str) {
    let _ = write!(h, "<header><h1>{}</h1><p class=\"sub\">", esc(title));
    let n = m.xs.len();
    match (m.xs.first(), m.xs.last()) {
        (Some(&a), Some(&b)) if m.timed => {
            let _ = write!(h, "{} over {}", plural(n, "event"), scale::time(b - a));
        }
        _ => {
            let _ = write!(
                h,
                "{} (the trace has no times: the axis counts events)",
                plural(n, "event")
            );
        }
    }
    h.push_str(
        ". Each panel is one memory pool: the live blocks stacked by owner (the tensor or \
         blob each was handed to), the <b>reserved</b> bytes (what the pool holds from the \
         system) as a line. Wheel or <b>+</b>/<b>−</b> to zoom, drag to pan, hover for a \
         block's owner, size, stream and origin, click for the blocks alive at that moment \
         and the allocator's segments.</p></header>\n",
    );
}

/// The phases as buttons (the main one pressed), the zoom buttons and the range shown.
fn toolbar(h: &mut String, m: &Model) {
    h.push_str("<nav class=\"toolbar\"><span class=\"phases\">");
    for (k, p) in m.phases.iter().enumerate() {
        let steps = if p.main && m.steps.iter().any(Option::is_some) {
            let first = m.steps[p.first].unwrap_or(0);
            let last = m.steps[p.last].unwrap_or(0);
            format!(", steps {first} to {last}")
        } else {
            String::new()
        };
        let _ = write!(
            h,
            "<button class=\"phase{}\" data-phase=\"{k}\" title=\"{}\">{} <small>{}{steps}</small></button>",
            if p.main { " on" } else { "" },
            esc(p.note),
            esc(p.name),
            esc(&span(m, p.from, p.to, p.last - p.first + 1))
        );
    }
    if m.phases.len() > 1 {
        h.push_str(
            "<button class=\"phase\" data-phase=\"all\" title=\"every event of the trace\">\
             whole run</button>",
        );
    }
    h.push_str(
        "</span><span class=\"zoom\">\
         <button id=\"zoom-in\" title=\"zoom in (or the wheel)\">+</button>\
         <button id=\"zoom-out\" title=\"zoom out\">−</button>\
         <button id=\"to-peak\" title=\"show the blocks alive at the peak of the main phase\">peak</button>\
         </span><span id=\"range\"></span></nav>\n",
    );
}

/// The legend of the series and of every kind of mark the trace has.
fn legend(h: &mut String, m: &Model) {
    h.push_str("<div class=\"legend\">");
    h.push_str("<span><i class=\"sw reserved\"></i>reserved</span>");
    h.push_str("<span><i class=\"sw peak\"></i>peak of the main phase</span>");
    if m.steps.iter().any(Option::is_some) {
        h.push_str("<span><i class=\"sw step\"></i>start of a step</span>");
    }
    let mut kinds: Vec<&str> = Vec::new();
    for p in &m.pools {
        for (k, ..) in &p.marks {
            if !kinds.contains(&k.as_str()) {
                kinds.push(k);
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
    notes(h, m);
}

/// What the page leaves out of a long trace.
fn notes(h: &mut String, m: &Model) {
    let mut notes: Vec<String> = Vec::new();
    let elided: u64 = m.pools.iter().map(|p| p.elided).sum();
    if elided > 0 {
        let largest = m.pools.iter().map(|p| p.elided_max).max().unwrap_or(0);
        notes.push(format!(
            "{elided} of the smaller blocks (none larger than {}) are not drawn one by one \
             (the page keeps {} blocks: those alive at a peak, then the largest); the dark \
             line is every block's total, downsampled to 4000 spans keeping the highest value",
            bytes(largest),
            model::MAX_BLOCKS
        ));
    }
    if m.pools.iter().any(|p| p.marks.iter().any(|mk| mk.2 > 1)) {
        notes.push(format!(
            "marks count the events of each of {} equal spans of the run",
            model::MARK_BUCKETS
        ));
    }
    if !notes.is_empty() {
        let _ = writeln!(
            h,
            "<p class=\"notes\">Downsampled: {}.</p>",
            esc(&notes.join("; "))
        );
    }
}

/// True for the name of a planner slot (`__shared_3`, `___shared_0`).
fn is_slot(owner: &str) -> bool {
    let rest = owner.trim_start_matches('_');
    owner.len() > rest.len()
        && rest
            .strip_prefix("shared_")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()))
}

/// Says what a planner slot is when the page cannot name the blobs in it.
fn slot_note(h: &mut String, m: &Model, slots: &Slots) {
    if !m
        .owners
        .iter()
        .any(|o| is_slot(o) && !slots.contains_key(o))
    {
        return;
    }
    h.push_str(
        "<p class=\"notes\">Planner slots (<code>__shared_N</code>) are buffers that memory \
         planning shares between blobs whose lifetimes do not overlap: one slot holds one blob \
         after another within each step. This trace does not record which blob a slot holds \
         (it holds no <code>plan</code> line: written before plans were recorded, or read \
         from the history, which keeps none).</p>\n",
    );
}

/// `owner` with the blobs of its planner slot, when known.
fn owner_text(owner: &str, slots: &Slots) -> String {
    match slots.get(owner) {
        Some(blobs) if !blobs.is_empty() => format!("{owner} ({})", blobs.join(", then ")),
        _ => owner.to_string(),
    }
}

/// One row per pool: its peaks and counts, and the blocks behind the main phase's peak.
fn summary(h: &mut String, m: &Model, slots: &Slots) {
    let main = m.main_phase().map_or("run", |p| p.name);
    let _ = write!(
        h,
        "<table class=\"summary\"><thead><tr><th>pool</th><th>memory</th>\
         <th>peak of {main}</th><th>when</th><th>largest blocks at that peak</th>\
         <th>peak of the whole run</th><th>peak reserved</th><th>allocations</th></tr></thead><tbody>"
    );
    for (i, p) in m.pools.iter().enumerate() {
        let when = p.peak.at.map_or("-".to_string(), |k| at(m, k));
        let all = match p.peak_all.at {
            Some(k) if p.peak_all.bytes > p.peak.bytes => format!(
                "{} (in {})",
                bytes(p.peak_all.bytes),
                m.phase_of(k).map_or("?", |ph| ph.name)
            ),
            _ => format!("{} (the same)", bytes(p.peak_all.bytes)),
        };
        let reserved = if p.segments_recorded {
            bytes(p.peak_reserved)
        } else {
            "not recorded".to_string()
        };
        let _ = write!(
            h,
            "<tr data-pool=\"{i}\"><td><a href=\"#pool-{i}\">{}</a></td><td>{}</td>\
             <td class=\"num\">{}</td><td>{}</td><td class=\"behind\">{}</td><td>{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            esc(&p.label),
            pool_kind(&p.label),
            bytes(p.peak.bytes),
            esc(&when),
            behind(m, p, slots),
            esc(&all),
            reserved,
            p.allocs
        );
    }
    h.push_str("</tbody></table>\n");
}

/// When event `k` happened, with its step.
fn at(m: &Model, k: usize) -> String {
    let step = m.steps[k]
        .map(|s| format!(" (step {s})"))
        .unwrap_or_default();
    let start = m.xs.first().copied().unwrap_or(0);
    format!("{}{step}", x_label(m.xs[k] - start, m.timed))
}

/// The largest blocks alive at the main phase's peak of `p`, named.
fn behind(m: &Model, p: &PoolModel, slots: &Slots) -> String {
    let Some(k) = p.peak.at else {
        return String::new();
    };
    let alive = m.alive_after(p, k);
    let mut parts: Vec<String> = alive
        .iter()
        .take(NAMED_AT_PEAK)
        .map(|b| {
            format!(
                "<span class=\"named\">{}</span> {}",
                esc(&owner_text(m.owner_name(b), slots)),
                bytes(b.size)
            )
        })
        .collect();
    if alive.len() > NAMED_AT_PEAK {
        parts.push(format!("and {} more", alive.len() - NAMED_AT_PEAK));
    }
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planner_slots_are_recognised() {
        assert!(is_slot("__shared_3") && is_slot("___shared_10"));
        assert!(!is_slot("shared_3") && !is_slot("__shared_") && !is_slot("fc1_w"));
        let mut slots = Slots::new();
        slots.insert("__shared_0".into(), vec!["relu1".into(), "fc2_grad".into()]);
        assert_eq!(
            owner_text("__shared_0", &slots),
            "__shared_0 (relu1, then fc2_grad)"
        );
        assert_eq!(owner_text("fc1_w", &slots), "fc1_w");
    }
}
