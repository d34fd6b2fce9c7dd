//! One module per subcommand.

pub mod bench;
pub mod demo;
pub mod devices;
pub mod inspect;
pub mod trace;
pub mod train;

use std::io::Write;

use anyhow::Context as _;

/// Writes `value` to stdout as pretty-printed JSON followed by a newline.
pub fn print_json<T: serde::Serialize + ?Sized>(value: &T) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, value).context("writing JSON to stdout")?;
    writeln!(out).context("writing to stdout")?;
    Ok(())
}
