//! `syncmem inspect`: the tensors of a safetensors file (name, element type, shape, bytes).

use serde::Serialize;
use syncmem::alloc::stats::human_bytes;
use syncmem::workspace::io::{inspect, FileInfo, FileTensor};

/// Arguments of `syncmem inspect`.
#[derive(clap::Args)]
#[command(after_long_help = JSON_SCHEMA)]
pub struct Args {
    /// The safetensors file (e.g. written by `Workspace::save` or Python's `safetensors`).
    pub file: std::path::PathBuf,
    /// Print one JSON object instead of a table (schema: see `syncmem inspect --help`).
    #[arg(long)]
    pub json: bool,
}

const JSON_SCHEMA: &str = "\
Names and metadata that hold control or other unprintable characters are shown quoted and
escaped in the table (\"two\\nlines\"); the JSON output holds them as they are. Table cells
longer than 80 characters (a long name, a shape of many dims) are cut with an ellipsis (…);
the JSON output keeps them whole.

Only the header is read; its offsets are checked against the file's size, so a truncated or
corrupt file is an error (exit status 1, message on stderr).

JSON output (--json): one object
  {\"file\": string,
   \"file_bytes\": integer     size of the file,
   \"header_bytes\": integer   size of the JSON header (after its 8-byte length),
   \"metadata\": object        the header's __metadata__ strings ({} when absent),
   \"count\": integer          number of tensors,
   \"total_bytes\": integer    bytes of tensor data, the sum of \"bytes\",
   \"tensors\": array, sorted by name, of
     {\"name\": string,
      \"dtype\": string        as the file names it: \"F32\", \"BOOL\", \"BF16\", \"F8_E4M3\", ...,
      \"shape\": [integer]     [] for a scalar,
      \"bytes\": integer,
      \"offset\": integer      start of its bytes within the data section,
      \"loadable\": bool       false for element types syncmem does not have (F8_*, C64, ...)}}";

#[derive(Serialize)]
struct JsonTensor<'a> {
    name: &'a str,
    dtype: &'a str,
    shape: &'a [usize],
    bytes: usize,
    offset: usize,
    loadable: bool,
}

#[derive(Serialize)]
struct JsonFile<'a> {
    file: String,
    file_bytes: u64,
    header_bytes: u64,
    metadata: &'a std::collections::BTreeMap<String, String>,
    count: usize,
    total_bytes: u64,
    tensors: Vec<JsonTensor<'a>>,
}

fn json(info: &FileInfo) -> JsonFile<'_> {
    JsonFile {
        file: info.path.display().to_string(),
        file_bytes: info.file_bytes,
        header_bytes: info.header_bytes,
        metadata: &info.metadata,
        count: info.tensors.len(),
        total_bytes: info.total_bytes(),
        tensors: info
            .tensors
            .iter()
            .map(|t| JsonTensor {
                name: &t.name,
                dtype: &t.dtype,
                shape: &t.shape,
                bytes: t.nbytes,
                offset: t.offset,
                loadable: t.element.is_some(),
            })
            .collect(),
    }
}

/// Text from the file, safe for a terminal: as it is when Rust's `{:?}` would change nothing,
/// otherwise in `{:?}` form (quoted, with control characters, bidirectional overrides and
/// other unprintable characters escaped), so a newline cannot break the table and an escape
/// sequence cannot reach the terminal.
fn text_cell(s: &str) -> String {
    let debug = format!("{s:?}");
    if debug.len() == s.len() + 2 {
        s.to_string()
    } else {
        debug
    }
}

/// Longest cell of the table, in characters: a longer one is cut and ends with `…`.
const MAX_CELL: usize = 80;

/// `cell` cut to [`MAX_CELL`] characters, the last one an ellipsis when it was cut.
fn fit(cell: String) -> String {
    match cell.char_indices().nth(MAX_CELL - 1) {
        Some((end, _)) if cell[end..].chars().nth(1).is_some() => {
            format!("{}…", &cell[..end])
        }
        _ => cell,
    }
}

fn shape_cell(shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    format!("[{}]", dims.join(", "))
}

fn dtype_cell(t: &FileTensor) -> String {
    match t.element {
        Some(_) => text_cell(&t.dtype),
        None => format!("{} (not loadable)", text_cell(&t.dtype)),
    }
}

/// Runs `syncmem inspect`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let info = inspect(&args.file)?;
    if args.json {
        return super::print_json(&json(&info));
    }
    let header = ["NAME", "DTYPE", "SHAPE", "BYTES"];
    let rows: Vec<[String; 4]> = info
        .tensors
        .iter()
        .map(|t| {
            [
                fit(text_cell(&t.name)),
                fit(dtype_cell(t)),
                fit(shape_cell(&t.shape)),
                t.nbytes.to_string(),
            ]
        })
        .collect();
    let mut width = header.map(str::len);
    for row in &rows {
        for (w, cell) in width.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let parts: Vec<String> = cells
            .iter()
            .zip(width)
            .enumerate()
            .map(|(i, (cell, w))| {
                if i == 3 {
                    format!("{cell:>w$}")
                } else {
                    format!("{cell:<w$}")
                }
            })
            .collect();
        parts.join("  ").trim_end().to_string()
    };
    outln!("{}", line(&header.map(String::from)));
    for row in &rows {
        outln!("{}", line(row));
    }
    let total = info.total_bytes();
    let n = info.tensors.len();
    outln!(
        "total: {n} tensor{}, {total} bytes ({}) of data; file {} bytes, header {} bytes",
        if n == 1 { "" } else { "s" },
        human_bytes(total),
        info.file_bytes,
        info.header_bytes
    );
    for (k, v) in &info.metadata {
        outln!("metadata: {} = {}", text_cell(k), text_cell(v));
    }
    Ok(())
}
