//! `syncmem train --help` documents the JSON of `train --json`: the keys of the schema it
//! prints are the keys of a real report, at the top level and in each object whose keys the
//! schema lists, so that the two cannot drift apart.

mod common;

use common::{json as train_json, ok};
use serde_json::Value;

/// The schema of `train --json` in `train --help`: from the object's opening brace to the
/// brace that closes it.
fn schema() -> String {
    let help = ok(&["train", "--help"]);
    let start = help
        .find("JSON output (--json), one object:")
        .expect("the JSON schema in train --help");
    let text = &help[start..];
    let open = text.find('{').expect("the schema's opening brace");
    let mut depth = 0usize;
    for (i, c) in text[open..].char_indices() {
        match c {
            '{' | '[' | '(' => depth += 1,
            '}' | ']' | ')' => {
                depth -= 1;
                if depth == 0 {
                    return text[open..=open + i].to_string();
                }
            }
            _ => {}
        }
    }
    panic!("the schema's braces do not close: {text}");
}

/// The keys an object's schema lists (`{"a": ..., "b", "c" (prose), ...}`): the quoted names
/// directly inside it (not in a nested object, list or parenthesis), each after its opening
/// brace or a comma, and followed by `:`, `,`, `}` or a parenthesis. Each key comes with the
/// text of its value up to the next key.
fn keys(object: &str) -> Vec<(String, String)> {
    let bytes: Vec<char> = object.chars().collect();
    let mut out: Vec<(String, String)> = Vec::new();
    let mut depth = 0usize;
    let mut prev = ' '; // the last character outside quotes that is not whitespace
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        match c {
            '{' | '[' | '(' => depth += 1,
            '}' | ']' | ')' => depth = depth.saturating_sub(1),
            '"' => {
                let end = i + 1 + bytes[i + 1..].iter().position(|&b| b == '"').unwrap();
                let name: String = bytes[i + 1..end].iter().collect();
                let next = bytes[end + 1..]
                    .iter()
                    .find(|b| !b.is_whitespace())
                    .copied()
                    .unwrap_or('}');
                if depth == 1 && matches!(prev, '{' | ',') && matches!(next, ':' | ',' | '}' | '(')
                {
                    out.push((name, String::new()));
                } else if let Some(last) = out.last_mut() {
                    last.1.push_str(&format!("\"{name}\""));
                }
                i = end + 1;
                prev = '"';
                continue;
            }
            _ => {}
        }
        if let Some(last) = out.last_mut() {
            last.1.push(c);
        }
        if !c.is_whitespace() {
            prev = c;
        }
        i += 1;
    }
    out
}

/// The first `{...}` of a value's text (the object itself, or a list's element), when the
/// schema spells out its keys (not `{...}`).
fn inner_object(value: &str) -> Option<&str> {
    let open = value.find('{')?;
    let mut depth = 0usize;
    for (i, c) in value[open..].char_indices() {
        match c {
            '{' | '[' | '(' => depth += 1,
            '}' | ']' | ')' => {
                depth -= 1;
                if depth == 0 {
                    let obj = &value[open..=open + i];
                    return (obj != "{...}").then_some(obj);
                }
            }
            _ => {}
        }
    }
    None
}

fn object_keys(v: &Value) -> Vec<String> {
    v.as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .cloned()
        .collect()
}

#[test]
fn the_help_schema_lists_every_key_of_the_report() {
    let schema = schema();
    let top = keys(&schema);
    let names: Vec<String> = top.iter().map(|(k, _)| k.clone()).collect();
    // A run with every optional part filled in where a flag does it (--memory-cap, --save,
    // --validation-split).
    let file = common::TempPath::new("train-schema", "w.safetensors");
    let report = train_json(&[
        "train",
        "--device",
        "cpu",
        "--epochs",
        "1",
        "--hidden",
        "8",
        "--memory-cap",
        "64MiB",
        "--save",
        file.arg(),
        "--validation-split",
        "0.25",
        "--json",
    ]);
    let (mut documented, mut real) = (names.clone(), object_keys(&report));
    documented.sort();
    real.sort();
    assert_eq!(documented, real, "train --help's schema vs train --json");
    // One level down: each object (or list of objects) whose keys the schema spells out.
    let mut checked = 0;
    for (key, value) in &top {
        let Some(inner) = inner_object(value) else {
            continue;
        };
        let mut real = &report[key];
        if let Some(list) = real.as_array() {
            let Some(first) = list.first() else {
                continue;
            };
            real = first;
        }
        if !real.is_object() {
            continue;
        }
        let documented: Vec<String> = keys(inner).into_iter().map(|(k, _)| k).collect();
        let mut want = object_keys(real);
        let mut got = documented.clone();
        want.sort();
        got.sort();
        assert_eq!(got, want, "{key}: the schema lists {documented:?}");
        checked += 1;
    }
    // data, model, settings, epochs, final, held_out, transfers, memory_cap, waits,
    // heap_allocations, blobs, memory, saved, planning.
    assert!(checked >= 14, "only {checked} objects checked");
}

/// The schema's parser itself, on a made-up schema: keys after `{` or `,`, not values, not
/// prose in parentheses, not nested keys.
#[test]
fn the_schema_parser_finds_top_level_keys_only() {
    let s = r#"{"a": string | null, "b": {"x", "y": "v" | "w"}, "c" (about "z"),
      "d": [{"e"}]: prose "f" and "g", "h"}"#;
    let names: Vec<String> = keys(s).into_iter().map(|(k, _)| k).collect();
    assert_eq!(names, ["a", "b", "c", "d", "h"]);
    let b = &keys(s)[1].1;
    let inner: Vec<String> = keys(inner_object(b).unwrap())
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(inner, ["x", "y"]);
}
