//! Writes the interop table (`tests/fixtures/interop.rs`, mirrored by
//! `scripts/interop_table.py`) to a safetensors file with [`Workspace::save`], for
//! `scripts/check_rust_file.py` to check with Python's `safetensors` and numpy.
//!
//! ```sh
//! cargo run -p syncmem --example write_fixture -- OUT.safetensors [DEVICE]
//! python3 scripts/check_rust_file.py OUT.safetensors
//! ```
//!
//! `DEVICE` is a device string (`cpu`, the default, or `opencl:0`, ...). Every other tensor is
//! written on the device, so the save also reads tensors whose newest data is on the device.

use std::process::ExitCode;

use syncmem::workspace::Workspace;
use syncmem::Device;

#[path = "../tests/fixtures/interop.rs"]
mod interop;

fn run(out: &str, device: &str) -> syncmem::Result<()> {
    let dev = Device::open(device)?;
    let ws = Workspace::new();
    for (k, spec) in interop::TABLE.iter().enumerate() {
        let t = spec.make(Some(&dev), k % 2 == 0)?;
        ws.create_blob(spec.name)?.write().reset(t);
    }
    // Not a tensor: skipped when saving every tensor blob.
    ws.create_blob("note")?
        .write()
        .reset(String::from("not saved"));
    let saved = ws.save(out, None)?;
    let from_device: u64 = interop::TABLE
        .iter()
        .filter_map(|s| ws.tensor(s.name).ok())
        .map(|t| t.read().map_or(0, |t| t.copy_stats().device_to_host.count))
        .sum();
    println!(
        "wrote {} tensors from {} to {out} ({from_device} copied device to host to save them)",
        saved.len(),
        dev.label()
    );
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (out, device) = match args.as_slice() {
        [out] => (out.as_str(), "cpu"),
        [out, device] => (out.as_str(), device.as_str()),
        _ => {
            eprintln!("usage: write_fixture OUT.safetensors [DEVICE]");
            return ExitCode::from(2);
        }
    };
    match run(out, device) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("write_fixture: error: {e}");
            ExitCode::FAILURE
        }
    }
}
