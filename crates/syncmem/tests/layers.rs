//! The layers of the crate import one way, bottom-up:
//!
//! `error`/`dtype`/`file` → `backend` → `alloc` → `device` → `synced`/`report` →
//! `tensor`/`param`/`context`/`kernels` → `blob`/`workspace` → `ops`/`net`.
//!
//! This test reads every source file under `src/` and fails when a file of one layer names a
//! module of a higher layer (`crate::x` in code, comments excluded; `crate::Name` re-exported
//! at the crate root counts as the module it comes from). Test code is held to the same rule:
//! files named `tests.rs` or `*_tests.rs` and the `#[cfg(test)] mod tests` of a file live in
//! the layer whose imports they need (the backends' tests, which open devices, are in
//! `device/`). `testing` (test helpers) may use anything and may be used by the tests of every
//! layer; `lib.rs` only declares and re-exports.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// The layer of each top-level module.
const LAYERS: &[(&str, u32)] = &[
    ("error", 0),
    ("dtype", 0),
    ("file", 0),
    ("backend", 1),
    ("alloc", 2),
    ("device", 3),
    ("synced", 4),
    ("report", 4),
    ("tensor", 5),
    ("param", 5),
    ("context", 5),
    ("kernels", 5),
    ("blob", 6),
    ("workspace", 6),
    ("ops", 7),
    ("net", 7),
    ("testing", 8),
];

fn layer(module: &str) -> Option<u32> {
    LAYERS.iter().find(|(m, _)| *m == module).map(|(_, l)| *l)
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The code of a line, without its `//` comment (string literals containing `//` are rare
/// enough in this crate not to matter: a false hit shows up as a test failure to look at).
fn code(line: &str) -> &str {
    line.find("//").map_or(line, |i| &line[..i])
}

/// Every identifier that follows `crate::` in `text`.
fn crate_paths(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().next_back();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue; // `$crate::`, `some_crate::`
        }
        if let Some(stripped) = rest.strip_prefix('{') {
            // `use crate::{a::b, c}`: every top-level name in the braces.
            let end = stripped.find('}').unwrap_or(stripped.len());
            for part in stripped[..end].split(',') {
                let name: String = part
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.push(name);
                }
            }
            continue;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            out.push(name);
        }
    }
    out
}

/// The crate root's re-exports: `Name` -> the module it comes from.
fn root_exports(lib: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    let text: String = lib.lines().map(code).collect::<Vec<_>>().join("\n");
    for stmt in text.split(';') {
        let stmt = stmt.trim();
        let Some(rest) = stmt.strip_prefix("pub use ") else {
            continue;
        };
        let module: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let names = match (rest.find('{'), rest.rfind('}')) {
            (Some(a), Some(b)) => rest[a + 1..b].to_string(),
            _ => rest.rsplit("::").next().unwrap_or("").to_string(),
        };
        for name in names.split(',') {
            let name = name.trim().rsplit("::").next().unwrap_or("").trim();
            let name = name.split(" as ").last().unwrap_or(name).trim();
            if !name.is_empty() {
                map.insert(name.to_string(), module.clone());
            }
        }
    }
    map
}

#[test]
fn lower_layers_never_name_higher_ones() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let exports = root_exports(&fs::read_to_string(src.join("lib.rs")).unwrap());
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut violations = Vec::new();
    let mut checked = 0;
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let top = top.trim_end_matches(".rs").to_string();
        if top == "lib" {
            continue;
        }
        let Some(own) = layer(&top) else {
            violations.push(format!(
                "{}: module `{top}` has no layer in this test",
                rel.display()
            ));
            continue;
        };
        checked += 1;
        let text = fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            for name in crate_paths(code(line)) {
                let module = exports.get(&name).cloned().unwrap_or(name.clone());
                let Some(theirs) = layer(&module) else {
                    continue; // a macro or item of the crate root
                };
                if module == "testing" {
                    continue; // test support, used by the tests of every layer
                }
                if theirs > own {
                    violations.push(format!(
                        "{}:{}: `{top}` (layer {own}) names `crate::{name}` (`{module}`, layer \
                         {theirs})",
                        rel.display(),
                        n + 1
                    ));
                }
            }
        }
    }
    assert!(checked > 50, "only {checked} files were checked");
    assert!(
        violations.is_empty(),
        "{} import(s) against the layers:\n{}",
        violations.len(),
        violations.join("\n")
    );
}

#[test]
fn the_scanner_sees_imports() {
    assert_eq!(crate_paths("use crate::device::Device;"), ["device"]);
    assert_eq!(
        crate_paths("use crate::{alloc::pool::Pool, synced::Head};"),
        ["alloc", "synced"]
    );
    assert_eq!(
        crate_paths("$crate::device::X; foo_crate::bar"),
        Vec::<String>::new()
    );
    assert_eq!(code("let x = 1; // crate::synced"), "let x = 1; ");
    let map = root_exports("pub use synced::{Head, SyncedMemory};\npub use blob::Blob;");
    assert_eq!(map.get("Head").map(String::as_str), Some("synced"));
    assert_eq!(map.get("Blob").map(String::as_str), Some("blob"));
}
