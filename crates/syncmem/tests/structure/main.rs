//! The shape of the workspace's code, checked on every run of the tests:
//!
//! - **File size.** No Rust source file over [`MAX_FILE_LINES`] lines, in every crate of the
//!   workspace (`crates/*/src`, `crates/*/tests`, `crates/*/examples`, `crates/*/benches`,
//!   the Python package's Rust included).
//! - **Function size.** No function over [`MAX_FN_LINES`] lines, counted from its `fn` line to
//!   its closing brace, except the declarative tables listed in [`ALLOWED`] with their reason.
//!   Test functions are held to the same rule: a long test is as hard to read as a long
//!   function, and splits the same way, into named steps (a setup helper, a check helper).
//! - **Circles.** At most [`MAX_CIRCLES`] import circles inside one room, a room being a
//!   top-level module of `crates/syncmem/src`. A circle is a strongly connected component of
//!   more than one file in the graph of the imports between the room's files: paths through
//!   `super::`, `self::` and `crate::<room>::`, in code (comments and strings excluded), test
//!   modules included. A parent module naming its children's items by their bare module name
//!   (`use state::Valid` in `mod.rs`) is not counted: the room's own declarations.
//!
//! Every violation is printed. The ones in [`KNOWN`] predate this check and are being fixed
//! elsewhere; they are tolerated, but an entry that no longer violates fails the check, so
//! the list only shrinks. The layer rule is checked by `tests/layers.rs`.

mod scan;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use scan::{blank, circles, functions, imports, Imports};

/// The longest source file, in lines.
const MAX_FILE_LINES: usize = 600;
/// The longest function, in lines from its `fn` line to its closing brace.
const MAX_FN_LINES: usize = 80;
/// The most import circles one room may hold.
const MAX_CIRCLES: usize = 3;

/// Functions allowed past [`MAX_FN_LINES`]: declarative tables. `(file, function, reason)`.
const ALLOWED: &[(&str, &str, &str)] = &[];

/// Violations that predate this check, by key (a file: its path; a function: `path: fn name`;
/// the circles of a room: `room/: circles`). Each goes when the code it names is fixed.
const KNOWN: &[&str] = &[];

/// One finding: the key [`KNOWN`] names it by, and what to print.
struct Violation {
    key: String,
    message: String,
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every `.rs` file under `dir`, recursively, sorted.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).collect();
    paths.sort();
    for p in paths {
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The Rust sources of every crate, as paths relative to the workspace root.
fn workspace_sources(root: &Path) -> Vec<String> {
    let mut crates: Vec<PathBuf> = fs::read_dir(root.join("crates"))
        .expect("the workspace's crates")
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("Cargo.toml").is_file())
        .collect();
    crates.sort();
    let mut files = Vec::new();
    for krate in &crates {
        for dir in ["src", "tests", "examples", "benches"] {
            sources(&krate.join(dir), &mut files);
        }
    }
    files
        .iter()
        .map(|f| {
            let rel = f.strip_prefix(root).unwrap();
            rel.to_string_lossy().replace('\\', "/")
        })
        .collect()
}

fn allowed(path: &str, name: &str) -> bool {
    ALLOWED.iter().any(|(p, f, _)| *p == path && *f == name)
}

/// The files over [`MAX_FILE_LINES`] and the functions over [`MAX_FN_LINES`] in `files`.
fn size_violations(root: &Path, files: &[String]) -> Vec<Violation> {
    let mut out = Vec::new();
    for path in files {
        let text = fs::read_to_string(root.join(path)).unwrap();
        let lines = text.lines().count();
        if lines > MAX_FILE_LINES {
            out.push(Violation {
                key: path.clone(),
                message: format!("{path}: {lines} lines (limit {MAX_FILE_LINES})"),
            });
        }
        for f in functions(&blank(&text)) {
            if f.lines > MAX_FN_LINES && !allowed(path, &f.name) {
                out.push(Violation {
                    key: format!("{path}: fn {}", f.name),
                    message: format!(
                        "{path}:{}: fn {} is {} lines (limit {MAX_FN_LINES})",
                        f.line, f.name, f.lines
                    ),
                });
            }
        }
    }
    out
}

/// The module path of a source file of `crates/syncmem/src` (`alloc/pool/mod.rs` is
/// `alloc::pool`, `alloc/pool/stats.rs` is `alloc::pool::stats`).
fn module_path(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel.split('/').map(str::to_string).collect();
    let file = parts.pop().unwrap();
    if file != "mod.rs" && file != "lib.rs" {
        parts.push(file.trim_end_matches(".rs").to_string());
    }
    parts
}

/// The rooms with more than [`MAX_CIRCLES`] circles, each circle listed.
fn circle_violations(root: &Path) -> Vec<Violation> {
    let src = root.join("crates/syncmem/src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut rooms: BTreeMap<String, Vec<(Vec<String>, Imports)>> = BTreeMap::new();
    for file in &files {
        let rel = file
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        let module = module_path(&rel);
        let Some(room) = module.first().cloned() else {
            continue; // lib.rs
        };
        let text = blank(&fs::read_to_string(file).unwrap());
        let found = imports(&text, &module);
        rooms.entry(room).or_default().push((module, found));
    }
    let mut out = Vec::new();
    for (room, modules) in &rooms {
        let found = circles(modules);
        let listed: Vec<String> = found
            .iter()
            .map(|c| format!("  {{{}}}", c.join(", ")))
            .collect();
        if !found.is_empty() {
            println!("{room}/: {} circle(s)\n{}", found.len(), listed.join("\n"));
        }
        if found.len() > MAX_CIRCLES {
            out.push(Violation {
                key: format!("{room}/: circles"),
                message: format!(
                    "{room}/: {} import circles (limit {MAX_CIRCLES}):\n{}",
                    found.len(),
                    listed.join("\n")
                ),
            });
        }
    }
    out
}

/// Prints every violation and fails on the ones [`KNOWN`] does not list, and on the entries
/// of [`KNOWN`] that no longer violate.
fn judge(violations: &[Violation]) {
    let mut new = Vec::new();
    for v in violations {
        let known = KNOWN.contains(&v.key.as_str());
        println!("{} {}", if known { "known:" } else { "NEW:  " }, v.message);
        if !known {
            new.push(v.message.clone());
        }
    }
    let stale: Vec<&str> = KNOWN
        .iter()
        .copied()
        .filter(|k| !violations.iter().any(|v| v.key == *k))
        .collect();
    println!(
        "{} violation(s), {} known, {} new; {} KNOWN entr(ies) fixed since",
        violations.len(),
        violations.len() - new.len(),
        new.len(),
        stale.len()
    );
    assert!(
        new.is_empty() && stale.is_empty(),
        "the structure check failed.\nnew violations (fix them, or add a declarative table to \
         ALLOWED with its reason):\n{}\nKNOWN entries that no longer violate (remove them):\n{}",
        new.join("\n"),
        stale.join("\n")
    );
}

#[test]
fn files_functions_and_rooms_keep_their_sizes() {
    let root = workspace_root();
    let files = workspace_sources(&root);
    assert!(files.len() > 250, "only {} files were found", files.len());
    for (path, name, reason) in ALLOWED {
        assert!(
            !reason.is_empty(),
            "{path}: fn {name} is allowed without a reason"
        );
    }
    let mut violations = size_violations(&root, &files);
    violations.extend(circle_violations(&root));
    judge(&violations);
}

#[test]
fn the_scanner_blanks_comments_and_literals() {
    let text = "let a = \"{ fn x\"; // fn y {\nlet b = '{'; /* fn /* z */ { */ let c = 'a;\n";
    let out = blank(text);
    assert_eq!(out.len(), text.len());
    assert_eq!(out.lines().count(), 2);
    assert!(!out.contains('{') && !out.contains("fn"), "{out}");
    assert!(
        out.contains("let c = 'a;"),
        "a lifetime or label stays: {out}"
    );
    let raw = blank("r#\"a \" { \"#; br\"}\"; b'}'; x");
    assert!(
        !raw.contains('{') && !raw.contains('}') && raw.ends_with('x'),
        "{raw}"
    );
    assert_eq!(blank("'\\''; '\\\\'; x"), "    ;     ; x");
}

#[test]
fn the_scanner_measures_functions() {
    let text = "fn one() {\n}\n\nfn two(a: [u8; 2]) -> u8\nwhere\n{\n    let f = |x| { x };\n    \
                fn inner() {}\n    a[0]\n}\ntrait T { fn decl(&self); }\n";
    let found = functions(&blank(text));
    let got: Vec<(String, usize, usize)> = found
        .iter()
        .map(|f| (f.name.clone(), f.line, f.lines))
        .collect();
    let want = [("one", 1, 2), ("two", 4, 7), ("inner", 8, 1)];
    let want: Vec<(String, usize, usize)> = want
        .iter()
        .map(|(n, l, c)| (n.to_string(), *l, *c))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn the_scanner_finds_circles() {
    let m = |p: &str| p.split("::").map(str::to_string).collect::<Vec<_>>();
    // a::b uses a (its parent, through super), and a uses a::b: a circle; a::c joins it (it
    // uses a::b, which uses it). a::d uses a::e from its test module; a::e names a::d only in
    // a visibility, which is no import: no circle.
    let files = [
        (m("a"), "use crate::a::b::X; // use super::c;"),
        (m("a::b"), "use super::{Y, c::Z as _};"),
        (m("a::c"), "fn f() { super::b::X::new(); }"),
        (
            m("a::d"),
            "#[cfg(test)] mod tests { use super::*; use super::super::e; }",
        ),
        (
            m("a::e"),
            "pub(in crate::a::d) fn g() {} const S: &str = \"self::d\";",
        ),
    ];
    let modules: Vec<(Vec<String>, Imports)> = files
        .iter()
        .map(|(path, text)| (path.clone(), imports(&blank(text), path)))
        .collect();
    assert_eq!(modules[1].1, [m("a::Y"), m("a::c::Z")]);
    assert_eq!(modules[3].1, [m("a::d"), m("a::e")]);
    assert!(modules[4].1.is_empty(), "{:?}", modules[4].1);
    let found = circles(&modules);
    assert_eq!(found, [vec!["a".to_string(), "a::b".into(), "a::c".into()]]);
}
