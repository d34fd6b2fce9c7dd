//! The machine's load around a run: the load averages of `/proc/loadavg` at the start and at
//! the end, and the CPUs this process may use. Figures taken while other work loads the
//! machine flatter the slower side of a comparison; the load says how quiet the run was.

use std::fmt;
use std::path::Path;

use serde::Serialize;

/// Where Linux publishes the load averages.
pub const LOADAVG: &str = "/proc/loadavg";

/// The three load averages: runnable (and uninterruptible) tasks over 1, 5 and 15 minutes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LoadAverage {
    /// Over the last minute.
    pub one: f64,
    /// Over the last 5 minutes.
    pub five: f64,
    /// Over the last 15 minutes.
    pub fifteen: f64,
}

impl LoadAverage {
    /// The load averages in `path` (the format of `/proc/loadavg`), or why there are none.
    ///
    /// # Errors
    /// A text naming the file and what is wrong: missing, unreadable, or not three numbers.
    pub fn read_from(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Self::parse(&text).ok_or_else(|| format!("{}: not three load averages", path.display()))
    }

    /// The load averages of this machine (`/proc/loadavg`), or why there are none.
    ///
    /// # Errors
    /// As [`LoadAverage::read_from`]: off Linux, the file does not exist.
    pub fn read() -> Result<Self, String> {
        Self::read_from(Path::new(LOADAVG))
    }

    /// The first three fields of a `/proc/loadavg` line.
    pub fn parse(text: &str) -> Option<Self> {
        let mut f = text.split_whitespace().map(str::parse::<f64>);
        let mut next = || f.next()?.ok().filter(|x| x.is_finite() && *x >= 0.0);
        Some(LoadAverage {
            one: next()?,
            five: next()?,
            fifteen: next()?,
        })
    }
}

impl fmt::Display for LoadAverage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.2} {:.2} {:.2}", self.one, self.five, self.fifteen)
    }
}

/// The machine around a run.
#[derive(Debug, Clone, Default)]
pub(crate) struct Machine {
    pub cpus: usize,
    pub start: Option<LoadAverage>,
    /// Why the load is unknown, when it is.
    pub unknown: Option<String>,
}

impl Machine {
    /// The CPUs this process may run on and the load now.
    pub fn now() -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let (start, unknown) = match LoadAverage::read() {
            Ok(l) => (Some(l), None),
            Err(e) => (None, Some(e)),
        };
        Machine {
            cpus,
            start,
            unknown,
        }
    }
}

/// `load average (1, 5, 15 min) at WHEN: a b c on N CPUs`, or why it is unknown.
pub(crate) fn load_line(when: &str, load: Option<LoadAverage>, cpus: usize) -> String {
    match load {
        Some(l) => format!("load average (1, 5, 15 min) at {when}: {l} on {cpus} CPUs"),
        None => format!(
            "load average at {when}: unknown ({LOADAVG} is not readable here) on {cpus} CPUs"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loadavg_line_gives_its_three_averages() {
        let l = LoadAverage::parse("0.52 1.25 2.00 3/456 7890\n").unwrap();
        assert_eq!((l.one, l.five, l.fifteen), (0.52, 1.25, 2.0));
        assert_eq!(l.to_string(), "0.52 1.25 2.00");
        assert_eq!(LoadAverage::parse("0.5 1.0"), None);
        assert_eq!(LoadAverage::parse("a b c"), None);
    }

    #[test]
    fn a_missing_file_is_said_not_fatal() {
        let e = LoadAverage::read_from(Path::new("/nonexistent/loadavg")).unwrap_err();
        assert!(e.starts_with("/nonexistent/loadavg: "), "{e}");
        let line = load_line("start", None, 4);
        assert!(
            line.contains("unknown") && line.ends_with("on 4 CPUs"),
            "{line}"
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_machine_has_a_load() {
        let m = Machine::now();
        assert!(m.cpus >= 1);
        assert!(m.start.is_some(), "{:?}", m.unknown);
    }
}
