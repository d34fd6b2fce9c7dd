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

/// Writes `syncmem: error: {text}` and a newline to stderr in one write.
///
/// `eprintln!` writes each piece of its format separately to the unbuffered stderr, so a line
/// can be cut by another writer to the same terminal or pipe: under `mpirun`, the launcher's
/// own banner landed inside a rank's error. One write of a short line (under the pipe's
/// atomic size) reaches the reader whole.
pub fn error_line(text: impl std::fmt::Display) {
    // Nothing is left to report to when stderr itself fails.
    let _ = write_line(&mut std::io::stderr().lock(), "syncmem: error: ", text);
}

/// Formats `{prefix}{text}\n` first, then writes it to `w` with one `write_all`.
fn write_line(
    w: &mut impl Write,
    prefix: &str,
    text: impl std::fmt::Display,
) -> std::io::Result<()> {
    let line = format!("{prefix}{text}\n");
    w.write_all(line.as_bytes())
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    /// Records every `write` call it gets.
    #[derive(Default)]
    struct Calls(Vec<Vec<u8>>);

    impl Write for Calls {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.push(buf.to_vec());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn an_error_line_reaches_the_writer_in_one_write() {
        let (rank, size) = (1, 2);
        let mut w = Calls::default();
        let text = format_args!("rank {rank} of {size} failed: {}", "no such file");
        super::write_line(&mut w, "syncmem: error: ", text).unwrap();
        assert_eq!(
            w.0,
            vec![b"syncmem: error: rank 1 of 2 failed: no such file\n".to_vec()]
        );
        // What `eprintln!` does with the same line: a write per piece, which another writer
        // can come between.
        let mut pieces = Calls::default();
        writeln!(pieces, "syncmem: error: rank {rank} of {size} failed").unwrap();
        assert!(pieces.0.len() > 1);
    }
}
