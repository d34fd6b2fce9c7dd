//! Where an allocation came from: the operator running on the thread (always, cheap) and, when
//! asked, the call stack ([`TRACE_STACKS_ENV`], [`set_trace_stacks`]).
//!
//! The net runtime marks the operator it runs ([`op_scope`]; a program may mark its own
//! phases the same way), and every allocation a trace records carries it
//! ([`super::TraceEvent::Alloc`]'s `op`). With stacks on, each recorded allocation also
//! captures a backtrace ([`std::backtrace::Backtrace`]) as [`Frame`]s: costly (tens of
//! microseconds), for finding where memory goes, not for production runs.

use std::backtrace::Backtrace;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::alloc::ring;

/// The environment variable that turns stack capture on for every recorded allocation
/// (`SYNCMEM_TRACE_STACKS=1`).
pub const TRACE_STACKS_ENV: &str = ring::TRACE_STACKS_ENV;

/// The most frames kept of one stack.
const MAX_FRAMES: usize = 48;

/// One frame of a call stack, as PyTorch's snapshots write them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frame {
    /// The function.
    pub name: String,
    /// Its source file (empty when unknown).
    #[serde(default)]
    pub filename: String,
    /// The line in it (0 when unknown).
    #[serde(default)]
    pub line: u64,
}

/// Marks `op` as the operator running on this thread until the guard is dropped (which
/// restores the one marked before).
pub fn op_scope(op: Arc<str>) -> OpScope {
    OpScope {
        previous: ring::replace_op(Some(op)),
    }
}

/// The operator marked on this thread ([`op_scope`]), if any.
pub fn current_op() -> Option<Arc<str>> {
    ring::current_op()
}

/// Restores the operator marked before it when dropped (see [`op_scope`]).
#[must_use = "the operator is unmarked when the guard is dropped"]
#[derive(Debug)]
pub struct OpScope {
    previous: Option<Arc<str>>,
}

impl Drop for OpScope {
    fn drop(&mut self) {
        ring::replace_op(self.previous.take());
    }
}

/// Turns stack capture on or off for the allocations traces record from now on (overrides
/// [`TRACE_STACKS_ENV`]).
pub fn set_trace_stacks(on: bool) {
    ring::set_trace_stacks(on);
}

/// Whether recorded allocations capture their stack: [`set_trace_stacks`], else
/// [`TRACE_STACKS_ENV`] set to `1`, `true`, `on` or `yes`.
pub fn trace_stacks() -> bool {
    ring::trace_stacks()
}

/// The stack of the caller, innermost first, without the frames of the capture and of the
/// recording (the standard library's backtrace, syncmem's pools and reports).
pub(crate) fn capture() -> Vec<Frame> {
    frames_of(&Backtrace::force_capture())
}

/// The frames of `bt`, innermost first, without those of the capture and of the recording.
pub(crate) fn frames_of(bt: &Backtrace) -> Vec<Frame> {
    let frames = parse(&bt.to_string());
    let first = frames
        .iter()
        .position(|f| !is_recording(&f.name))
        .unwrap_or(frames.len());
    frames.into_iter().skip(first).take(MAX_FRAMES).collect()
}

/// True for a frame of the capture or of the recording machinery.
fn is_recording(name: &str) -> bool {
    let name = name.trim_start_matches('<');
    [
        "std::backtrace",
        "std::thread::local",
        "syncmem::report::",
        "syncmem::alloc::",
    ]
    .iter()
    .any(|p| name.starts_with(p))
        || name.starts_with("core::ops::function")
}

/// The frames of a backtrace as [`Backtrace`]'s `Display` writes them:
/// `  N: name` lines, each followed by `at file:line:column` when known.
fn parse(text: &str) -> Vec<Frame> {
    let mut out: Vec<Frame> = Vec::new();
    for line in text.lines() {
        let l = line.trim();
        if let Some(at) = l.strip_prefix("at ") {
            let mut parts = at.rsplitn(3, ':');
            let (_col, line, file) = (parts.next(), parts.next(), parts.next());
            if let (Some(f), Some(line), Some(last)) = (file, line, out.last_mut()) {
                last.filename = f.to_string();
                last.line = line.parse().unwrap_or(0);
            }
        } else if let Some((n, name)) = l.split_once(": ") {
            if n.chars().all(|c| c.is_ascii_digit()) && !n.is_empty() {
                out.push(Frame {
                    name: name.to_string(),
                    filename: String::new(),
                    line: 0,
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backtrace_parses_into_frames_with_files_and_lines() {
        let text = "   0: std::backtrace::Backtrace::create\n             at /rustc/x/library/std/src/backtrace.rs:331:13\n   1: my::code\n             at ./src/main.rs:12:5\n   2: main\n";
        let f = parse(text);
        assert_eq!(f.len(), 3);
        assert_eq!(f[1].name, "my::code");
        assert_eq!((f[1].filename.as_str(), f[1].line), ("./src/main.rs", 12));
        assert_eq!((f[2].filename.as_str(), f[2].line), ("", 0));
    }

    #[test]
    fn a_capture_starts_at_the_caller() {
        let f = capture();
        assert!(!f.is_empty());
        assert!(!is_recording(&f[0].name), "{:?}", f[0]);
        assert!(f.len() <= MAX_FRAMES);
    }

    #[test]
    fn op_scopes_nest_and_restore() {
        assert_eq!(current_op(), None);
        let outer = op_scope("net[0] FC".into());
        {
            let _inner = op_scope("net[1] Relu".into());
            assert_eq!(current_op().as_deref(), Some("net[1] Relu"));
        }
        assert_eq!(current_op().as_deref(), Some("net[0] FC"));
        drop(outer);
        assert_eq!(current_op(), None);
    }
}
