//! One module per subcommand, and writing to stdout.
//!
//! Every write to stdout goes through `out!`, `outln!` or [`print_json`]: a closed stdout
//! (`syncmem ... | head` once `head` has exited) becomes [`StdoutClosed`], which ends the
//! command early and makes `main` exit with success, as a closed pipe is a normal end for a
//! command-line tool.

/// Writes to stdout like `print!`; returns early from the enclosing function (which returns
/// `anyhow::Result`) when the write fails.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::commands::stdout_result(::std::io::Write::write_fmt(
            &mut ::std::io::stdout().lock(),
            format_args!($($arg)*),
        ))?
    };
}

/// Writes to stdout like `println!`; returns early from the enclosing function (which returns
/// `anyhow::Result`) when the write fails.
macro_rules! outln {
    () => {
        out!("\n")
    };
    ($($arg:tt)*) => {
        out!("{}\n", format_args!($($arg)*))
    };
}

pub mod bench;
#[cfg(feature = "mpi")]
pub mod bench_mpi;
pub mod completions;
pub mod demo;
pub mod devices;
pub mod inspect;
pub mod trace;
pub mod trace_files;
pub mod train;

use std::io::{ErrorKind, Write};

use anyhow::Context as _;

/// The error of a write to a closed stdout: not a failure (`main` exits with success).
#[derive(Debug)]
pub struct StdoutClosed;

impl std::fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stdout was closed")
    }
}

impl std::error::Error for StdoutClosed {}

/// The result of a write to stdout: a broken pipe becomes [`StdoutClosed`].
pub fn stdout_result(r: std::io::Result<()>) -> anyhow::Result<()> {
    match r {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::BrokenPipe => Err(StdoutClosed.into()),
        Err(e) => Err(e).context("writing to stdout"),
    }
}

/// True when `e` comes from a write to a closed stdout.
pub fn is_stdout_closed(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<StdoutClosed>())
}

/// Writes `value` to stdout as pretty-printed JSON followed by a newline.
pub fn print_json<T: serde::Serialize + ?Sized>(value: &T) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match serde_json::to_writer_pretty(&mut out, value) {
        Err(e) if e.io_error_kind() == Some(ErrorKind::BrokenPipe) => {
            return Err(StdoutClosed.into())
        }
        r => r.context("writing JSON to stdout")?,
    }
    stdout_result(writeln!(out))
}
