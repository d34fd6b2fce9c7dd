//! `syncmem devices`: every backend and its devices, or why it has none.

use serde::Serialize;
use syncmem::alloc::stats::human_bytes;
use syncmem::device::{probe, BackendReport};
use syncmem::{Device, DeviceInfo, Error};

/// Arguments of `syncmem devices`.
#[derive(clap::Args)]
#[command(after_long_help = JSON_SCHEMA)]
pub struct Args {
    /// Print a JSON array instead of a table (schema: see `syncmem devices --help`).
    #[arg(long)]
    pub json: bool,
}

const JSON_SCHEMA: &str = "\
JSON output (--json): one array. Each device is an object
  {\"backend\": \"cpu\" | \"opencl\" | \"cuda\",
   \"label\": string                 for --device: \"cpu\", \"opencl:0\", \"cuda:0\",
   \"name\": string, \"vendor\": string,
   \"total_memory\": integer | null  bytes (null: not known),
   \"max_alloc\": integer | null     largest single allocation, bytes (null: no limit of its
                                   own, as for cpu, whose limit is the address space),
   \"host_unified\": bool            device memory is host memory}
and each backend without devices is one object
  {\"backend\": string, \"compiled\": bool, \"error\": string}
where \"compiled\" is false when the backend's cargo feature is off and \"error\" says why there
is no device (e.g. \"unavailable: CUDA driver library (libcuda) not found\").
An object has an \"error\" key exactly when it describes no device.";

/// One element of the `--json` array.
#[derive(Serialize)]
#[serde(untagged)]
enum Entry {
    Device {
        backend: &'static str,
        label: String,
        name: String,
        vendor: String,
        total_memory: Option<u64>,
        max_alloc: Option<u64>,
        host_unified: bool,
    },
    Unavailable {
        backend: &'static str,
        compiled: bool,
        error: String,
    },
}

impl Entry {
    fn device(info: &DeviceInfo) -> Self {
        Entry::Device {
            backend: info.backend.as_str(),
            label: info.label(),
            name: info.name.clone(),
            vendor: info.vendor.clone(),
            total_memory: known_size(info.total_memory),
            max_alloc: known_size(info.max_alloc),
            host_unified: info.host_unified,
        }
    }
}

/// Why a backend lists no device, in one line (without the backend name).
fn why_none(report: &BackendReport) -> Option<String> {
    let backend = report.backend;
    if !report.compiled {
        return Some(format!(
            "not compiled in (build with the cargo feature `{backend}`)"
        ));
    }
    match &report.devices {
        Ok(list) if list.is_empty() => Some("no devices found".to_string()),
        Ok(_) => None,
        // The report keeps only the message; discovery is cached, so asking again is free and
        // gives the typed error, whose reason reads better without the "runtime unavailable"
        // prefix.
        Err(msg) => Some(match Device::all(backend) {
            Err(Error::RuntimeUnavailable { reason, .. }) => format!("unavailable: {reason}"),
            Err(e) => format!("error: {e}"),
            Ok(_) => format!("error: {msg}"),
        }),
    }
}

/// Longest name or vendor shown in the table (the JSON output has the full text).
const MAX_CELL: usize = 48;

fn clip(s: &str) -> String {
    if s.chars().count() <= MAX_CELL {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(MAX_CELL - 1).collect();
        t.push('…');
        t
    }
}

/// A size reported by a device, or `None` for the values that stand for "no limit" (the
/// largest sizes: as much as the address space allows) or "not known" (0).
fn known_size(bytes: u64) -> Option<u64> {
    (bytes > 0 && bytes < isize::MAX as u64).then_some(bytes)
}

/// A size for the table.
fn size_cell(bytes: u64) -> String {
    match known_size(bytes) {
        Some(b) => human_bytes(b),
        None if bytes == 0 => "unknown".to_string(),
        None => "no limit".to_string(),
    }
}

/// Runs `syncmem devices`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let reports = probe();
    if args.json {
        return super::print_json(&json_entries(&reports));
    }
    print_table(&reports)
}

/// The entries of `--json`: every device of every backend, or why a backend has none.
fn json_entries(reports: &[BackendReport]) -> Vec<Entry> {
    let mut entries = Vec::new();
    for r in reports {
        match why_none(r) {
            Some(error) => entries.push(Entry::Unavailable {
                backend: r.backend.as_str(),
                compiled: r.compiled,
                error,
            }),
            None => {
                if let Ok(list) = &r.devices {
                    entries.extend(list.iter().map(Entry::device));
                }
            }
        }
    }
    entries
}

/// Columns of the table.
const HEADER: [&str; 7] = [
    "BACKEND",
    "DEVICE",
    "NAME",
    "VENDOR",
    "MEMORY",
    "MAX ALLOC",
    "HOST-UNIFIED",
];

/// The table: a row per device, then a line per backend without devices saying why.
fn print_table(reports: &[BackendReport]) -> anyhow::Result<()> {
    let mut rows: Vec<[String; 7]> = Vec::new();
    let mut notes = Vec::new();
    for r in reports {
        match why_none(r) {
            Some(why) => notes.push(format!("{}: {why}", r.backend)),
            None => {
                for d in r.devices.iter().flatten() {
                    rows.push([
                        d.backend.to_string(),
                        d.label(),
                        clip(&d.name),
                        clip(&d.vendor),
                        size_cell(d.total_memory),
                        size_cell(d.max_alloc),
                        if d.host_unified { "yes" } else { "no" }.to_string(),
                    ]);
                }
            }
        }
    }
    let mut width = HEADER.map(str::len);
    for row in &rows {
        for (w, cell) in width.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    outln!("{}", table_line(&HEADER.map(String::from), &width));
    for row in &rows {
        outln!("{}", table_line(row, &width));
    }
    for note in notes {
        outln!("{note}");
    }
    Ok(())
}

/// One line of the table, each cell padded to its column's width.
fn table_line(cells: &[String], width: &[usize; 7]) -> String {
    let mut s = String::new();
    for (i, (cell, &w)) in cells.iter().zip(width).enumerate() {
        // Byte counts are right-aligned, text left-aligned.
        let part = if i == 4 || i == 5 {
            format!("{cell:>w$}")
        } else {
            format!("{cell:<w$}")
        };
        if i > 0 {
            s.push_str("  ");
        }
        s.push_str(&part);
    }
    s.trim_end().to_string()
}
