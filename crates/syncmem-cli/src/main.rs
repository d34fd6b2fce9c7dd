//! The `syncmem` command: lists devices and replays Caffe's SyncedMemory sequence on one.
//!
//! Exit status: 0 on success (and on `--help`, `--version`, or a closed stdout), 2 on a usage
//! error (an unknown flag, a missing argument, a value its parser rejects: clap's convention),
//! 1 on any failure while running (a device that cannot be opened, a bad file, a bad
//! `SYNCMEM_*` variable, out of memory).

mod args;
#[macro_use]
mod commands;
mod heap;
mod page;

use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use syncmem::report::{history_from_env, EnvTrace, HISTORY_ENV, TRACE_ENV};

/// Tensor memory mirrored on the host and on compute devices (Caffe's SyncedMemory, in Rust).
#[derive(Parser)]
#[command(name = "syncmem", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List every backend (cpu, opencl, cuda) and its devices, or why it has none.
    Devices(commands::devices::Args),
    /// Replay Caffe's nine-step SyncedMemory sequence on a device and show each copy.
    Demo(commands::demo::Args),
    /// List the tensors of a safetensors file: name, element type, shape, bytes, and a total.
    Inspect(commands::inspect::Args),
    /// Time the memory layer against plain equivalents and print the ratios.
    Bench(commands::bench::Args),
    /// Train a small MLP with nets of operators on a device; report memory and transfers.
    Train(commands::train::Args),
    /// Record memory traffic (allocations, frees, copies, evictions) and replay it against
    /// pool configurations.
    Trace(commands::trace::Args),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to stdout.
    Completions(commands::completions::Args),
    /// One rank of `syncmem bench`'s distributed rows (run by `mpirun`, not by hand).
    #[cfg(feature = "mpi")]
    #[command(hide = true)]
    BenchMpi(commands::bench_mpi::RankArgs),
}

/// Exit status of a usage error: an unknown flag, a missing argument, a rejected value.
const USAGE_ERROR: u8 = 2;

/// The system allocator with a counter (see [`heap`]).
#[global_allocator]
static GLOBAL: heap::Counting = heap::Counting;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => match args::value_error_line(&e) {
            // A value a parser rejected: one line, and the status of every usage error.
            Some(line) => {
                commands::error_line(line);
                return ExitCode::from(USAGE_ERROR);
            }
            // Other usage errors (status 2), --help and --version (status 0), as clap reports
            // them.
            None => e.exit(),
        },
    };
    let result = match cli.command {
        // A completion script depends on nothing but the arguments: no setting can spoil it.
        Command::Completions(args) => commands::completions::run::<Cli>(&args),
        command => {
            // A bad pool or zero-copy variable fails every command at once, naming the
            // variable, even when what it configures is never used.
            if let Err(e) = syncmem::alloc::pool::config::check_env()
                .and_then(|()| syncmem::device::zero_copy::check_env())
            {
                commands::error_line(e);
                return ExitCode::FAILURE;
            }
            with_env_trace(|| run(command))
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // A closed stdout (`syncmem ... | head`) is a normal end.
        Err(e) if commands::is_stdout_closed(&e) => ExitCode::SUCCESS,
        Err(e) => {
            commands::error_line(format_args!("{e:#}"));
            ExitCode::FAILURE
        }
    }
}

/// Runs one subcommand.
fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Devices(args) => commands::devices::run(&args),
        Command::Demo(args) => commands::demo::run(&args),
        Command::Inspect(args) => commands::inspect::run(&args),
        Command::Train(args) => commands::train::run(&args),
        Command::Bench(args) => commands::bench::run(&args),
        Command::Trace(args) => commands::trace::run(&args),
        Command::Completions(args) => commands::completions::run::<Cli>(&args),
        #[cfg(feature = "mpi")]
        Command::BenchMpi(args) => commands::bench_mpi::rank(args.quick),
    }
}

/// Runs `command`, recording the whole process into the file named by `SYNCMEM_TRACE` when it
/// is set (the trace is saved even when the command fails), with the history on when
/// `SYNCMEM_HISTORY` asks for it.
fn with_env_trace(command: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<()> {
    // SYNCMEM_HISTORY=N: the newest N events of each device, kept for the observers.
    history_from_env().context(HISTORY_ENV)?;
    let recording = EnvTrace::from_env().context(TRACE_ENV)?;
    let result = command();
    let Some(rec) = recording else {
        return result;
    };
    let path = rec.path().display().to_string();
    match rec.finish() {
        Ok(events) => {
            eprintln!("syncmem: {TRACE_ENV}: {events} events written to {path}");
            result
        }
        Err(e) if result.is_err() => {
            eprintln!("syncmem: {TRACE_ENV}: the trace was not saved: {e}");
            result
        }
        Err(e) => Err(e).context(format!("{TRACE_ENV}: saving the trace")),
    }
}
