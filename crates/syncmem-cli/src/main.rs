//! The `syncmem` command: lists devices and replays Caffe's SyncedMemory sequence on one.

mod commands;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Devices(args) => commands::devices::run(&args),
        Command::Demo(args) => commands::demo::run(&args),
        Command::Inspect(args) => commands::inspect::run(&args),
        Command::Train(args) => commands::train::run(&args),
        Command::Bench(args) => commands::bench::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("syncmem: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
