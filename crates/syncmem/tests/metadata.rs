//! Package metadata of both crates, as crates.io and docs.rs read it, the license texts every
//! package ships, and the feature badges of feature-gated public items on docs.rs.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `cargo metadata --no-deps` of the workspace.
fn metadata() -> Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--no-deps",
            "--offline",
            "--format-version",
            "1",
        ])
        .current_dir(workspace_root())
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON")
}

fn is_keyword(k: &str) -> bool {
    (1..=20).contains(&k.len())
        && k.starts_with(|c: char| c.is_ascii_alphabetic())
        && k.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}

#[test]
fn every_crate_has_complete_metadata() {
    let m = metadata();
    let packages = m["packages"].as_array().expect("packages");
    let mut names: Vec<&str> = packages
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        ["syncmem", "syncmem-bench", "syncmem-cli", "syncmem-nn"]
    );
    let manifest = std::fs::read_to_string(workspace_root().join("Cargo.toml")).unwrap();
    assert!(
        !manifest.contains(".invalid"),
        "placeholder address in the workspace manifest"
    );
    for p in packages {
        let name = p["name"].as_str().unwrap();
        let text = |key: &str| p[key].as_str().unwrap_or_default().to_string();
        assert!(!text("description").is_empty(), "{name}: description");
        assert_eq!(text("license"), "MIT OR Apache-2.0", "{name}: license");
        // No placeholder address: either a real repository or none.
        assert!(
            !text("repository").contains(".invalid"),
            "{name}: placeholder repository {}",
            text("repository")
        );
        assert!(
            text("documentation").starts_with("https://docs.rs/syncmem"),
            "{name}: documentation {:?}",
            text("documentation")
        );
        let readme = text("readme");
        assert!(!readme.is_empty(), "{name}: readme");
        let manifest_dir = Path::new(p["manifest_path"].as_str().unwrap())
            .parent()
            .unwrap()
            .to_path_buf();
        assert!(
            manifest_dir.join(&readme).is_file(),
            "{name}: readme {readme}"
        );
        let keywords = p["keywords"].as_array().expect("keywords");
        assert!((1..=5).contains(&keywords.len()), "{name}: {keywords:?}");
        for k in keywords {
            assert!(is_keyword(k.as_str().unwrap()), "{name}: keyword {k}");
        }
        let categories = p["categories"].as_array().expect("categories");
        assert!(
            (1..=5).contains(&categories.len()),
            "{name}: {categories:?}"
        );
    }
    let lib = packages.iter().find(|p| p["name"] == "syncmem").unwrap();
    let docs_rs = &lib["metadata"]["docs"]["rs"];
    assert_eq!(docs_rs["all-features"], true, "{docs_rs}");
    assert_eq!(
        docs_rs["rustdoc-args"],
        serde_json::json!(["--cfg", "docsrs"]),
        "{docs_rs}"
    );
}

/// The license texts every copy of the software must carry.
const LICENSES: [&str; 2] = ["LICENSE-MIT", "LICENSE-APACHE"];

/// Each published crate's package holds both license texts (as `cargo package --list` lists
/// it), the same as the repository's; the Python package names them in `license-files`, so
/// that its wheel carries them too (CI also checks the built wheel's files).
#[test]
fn published_packages_ship_the_license_texts() {
    let root = workspace_root();
    let read =
        |p: &Path| std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let m = metadata();
    let mut published = Vec::new();
    for p in m["packages"].as_array().expect("packages") {
        let name = p["name"].as_str().unwrap();
        if p["publish"] == serde_json::json!([]) {
            continue; // publish = false
        }
        published.push(name);
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = Command::new(cargo)
            .args([
                "package",
                "--list",
                "--offline",
                "--allow-dirty",
                "-p",
                name,
            ])
            .current_dir(&root)
            .output()
            .expect("run cargo package --list");
        let listed = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "cargo package --list -p {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let dir = Path::new(p["manifest_path"].as_str().unwrap())
            .parent()
            .unwrap();
        for license in LICENSES {
            assert!(
                listed.lines().any(|l| l == license),
                "{name}: {license} is not in the package:\n{listed}"
            );
            assert_eq!(
                read(&dir.join(license)),
                read(&root.join(license)),
                "{name}: {license}"
            );
        }
    }
    published.sort_unstable();
    assert_eq!(published, ["syncmem", "syncmem-cli", "syncmem-nn"]);

    let py = root.join("crates/syncmem-py");
    let pyproject = read(&py.join("pyproject.toml"));
    let files = pyproject
        .lines()
        .find_map(|l| l.trim().strip_prefix("license-files = "))
        .expect("pyproject.toml: license-files");
    for license in LICENSES {
        assert!(
            files.contains(&format!("\"{license}\"")),
            "license-files: {files}"
        );
        assert_eq!(
            read(&py.join(license)),
            read(&root.join(license)),
            "syncmem-py: {license}"
        );
    }
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// docs.rs builds with `--cfg docsrs`: the crate turns on `doc_cfg` there, and every public
/// item behind a backend feature says which feature it needs.
#[test]
fn feature_gated_public_items_show_their_feature_on_docs_rs() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    assert!(
        lib.contains("#![cfg_attr(docsrs, feature(doc_cfg))]"),
        "lib.rs enables doc_cfg on docs.rs"
    );
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut gated = 0;
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        for (i, line) in lines.iter().enumerate() {
            let Some(feature) = line
                .strip_prefix("#[cfg(feature = \"")
                .and_then(|r| r.strip_suffix("\")]"))
            else {
                continue;
            };
            // The attributes and the item that follow the cfg.
            let rest: Vec<&str> = lines[i + 1..]
                .iter()
                .copied()
                .take_while(|l| l.starts_with("#[") || l.starts_with("pub") || l.is_empty())
                .collect();
            let item = rest.iter().find(|l| !l.starts_with("#["));
            let public = item.is_some_and(|l| l.starts_with("pub ") && !l.starts_with("pub use"));
            if !public {
                continue;
            }
            gated += 1;
            let badge = format!("#[cfg_attr(docsrs, doc(cfg(feature = \"{feature}\")))]");
            let before: Vec<&str> = lines[..i]
                .iter()
                .rev()
                .copied()
                .take_while(|l| l.starts_with("#[") || l.starts_with("///"))
                .collect();
            assert!(
                rest.contains(&badge.as_str()) || before.contains(&badge.as_str()),
                "{}:{}: {:?} is public behind feature {feature:?} without {badge}",
                file.display(),
                i + 1,
                item.unwrap()
            );
        }
    }
    assert!(gated >= 4, "found only {gated} feature-gated public items");
}
