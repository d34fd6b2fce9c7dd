//! Exit statuses (2 for a usage error, 1 for a failure while running) and shell completions.

mod common;

use common::{ok, run, run_env, RUNTIME_FAILURE, USAGE_ERROR};

/// Every subcommand, as the completion scripts must name them.
const SUBCOMMANDS: [&str; 7] = [
    "devices",
    "demo",
    "inspect",
    "bench",
    "train",
    "trace",
    "completions",
];

/// Requires `syncmem args` to fail with clap's usage error: status 2, the usage on stderr,
/// nothing on stdout; returns stderr.
fn usage_error(args: &[&str]) -> String {
    let out = run(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(USAGE_ERROR), "{args:?}: {stderr}");
    assert!(out.stdout.is_empty(), "{args:?} printed to stdout");
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    stderr
}

#[test]
fn an_unknown_flag_is_a_usage_error_on_every_command() {
    for command in [
        &[][..],
        &["devices"],
        &["demo"],
        &["inspect", "weights.safetensors"],
        &["bench"],
        &["train"],
        &["trace", "record"],
        &["trace", "replay", "run.jsonl"],
        &["completions", "bash"],
    ] {
        let mut args = command.to_vec();
        args.push("--no-such-flag");
        let stderr = usage_error(&args);
        assert!(stderr.contains("--no-such-flag"), "{args:?}: {stderr}");
        assert!(stderr.contains("Usage"), "{args:?}: {stderr}");
    }
}

#[test]
fn missing_or_unknown_commands_and_arguments_are_usage_errors() {
    usage_error(&[]);
    assert!(usage_error(&["frobnicate"]).contains("frobnicate"));
    usage_error(&["inspect"]);
    usage_error(&["trace"]);
    usage_error(&["completions"]);
    assert!(usage_error(&["completions", "tcsh"]).contains("tcsh"));
    // Two options that exclude each other.
    usage_error(&["train", "--test-data", "a", "--validation-split", "0.5"]);
}

#[test]
fn a_rejected_value_is_a_usage_error_and_a_failure_while_running_is_not() {
    // The value is rejected before anything runs: status 2.
    for args in [
        &["demo", "--device", "bogus"][..],
        &["train", "--lr", "-1"],
        &["train", "--memory-cap", "0"],
        &["trace", "replay", "run.jsonl", "--pool", "lru"],
    ] {
        let out = run(args);
        let stderr = common::rejected_value(&format!("{args:?}"), &out);
        assert!(
            stderr.starts_with("syncmem: error: --"),
            "{args:?}: {stderr}"
        );
    }
    // Well-formed arguments that fail while running keep status 1: a file that is not there,
    // a device that is not there.
    let missing = std::env::temp_dir().join(format!("syncmem-usage-{}.st", std::process::id()));
    let out = run(&["inspect", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(RUNTIME_FAILURE), "{out:?}");
    let out = run(&["demo", "--device", "cuda:99"]);
    assert_eq!(out.status.code(), Some(RUNTIME_FAILURE), "{out:?}");
}

#[test]
fn help_and_version_succeed() {
    assert!(ok(&["--help"]).contains("completions"));
    assert!(ok(&["completions", "--help"]).contains("SHELL"));
    assert!(ok(&["--version"]).starts_with("syncmem "));
}

/// The script for `shell`, with the marker that shell's completion system needs.
fn completion_script(shell: &str, marker: &str) -> String {
    let script = ok(&["completions", shell]);
    assert!(
        script.contains(marker),
        "{shell}: no {marker:?} in\n{script}"
    );
    for name in SUBCOMMANDS
        .iter()
        .chain(&["record", "replay", "view", "export-torch"])
    {
        assert!(script.contains(name), "{shell}: {name} missing");
    }
    for flag in ["memory-cap", "validation-split", "no-fuse"] {
        assert!(script.contains(flag), "{shell}: --{flag} missing");
    }
    script
}

#[test]
fn completions_for_bash_zsh_and_fish_name_every_subcommand() {
    let bash = completion_script("bash", "complete -F _syncmem");
    completion_script("zsh", "#compdef syncmem");
    completion_script("fish", "complete -c syncmem");
    // Where bash is installed, the script must at least parse.
    match std::process::Command::new("bash")
        .args(["-n", "-c", &bash])
        .output()
    {
        Ok(out) => assert!(
            out.status.success(),
            "bash -n rejects the script: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => println!("SKIPPED the bash syntax check: {e}"),
    }
}

#[test]
fn completions_ignore_the_pool_settings() {
    // Every other command fails on a bad setting; a completion script does not depend on it.
    let out = run_env(
        &["completions", "fish"],
        &[("SYNCMEM_POOL_CONF", "garbage")],
    );
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("complete -c syncmem"));
    let out = run_env(&["devices"], &[("SYNCMEM_POOL_CONF", "garbage")]);
    assert_eq!(out.status.code(), Some(RUNTIME_FAILURE), "{out:?}");
}
