//! Running the built `syncmem` binary from the CLI tests.

// Each test file uses a part of these helpers.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::process::{Command, Output};

use serde_json::Value;

/// Runs `syncmem args` with extra environment variables. `SYNCMEM_TRACE`, `SYNCMEM_HISTORY`,
/// `SYNCMEM_TRACE_STACKS` and `SYNCMEM_ZERO_COPY` are removed from the inherited environment, so a caller's setting cannot
/// change what a test sees (a test that wants one passes it).
pub fn run_env<V: AsRef<OsStr>>(args: &[&str], env: &[(&str, V)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_syncmem"));
    c.args(args)
        .env_remove("SYNCMEM_TRACE")
        .env_remove("SYNCMEM_HISTORY")
        .env_remove("SYNCMEM_TRACE_STACKS")
        .env_remove("SYNCMEM_ZERO_COPY");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run the syncmem binary")
}

/// Runs `syncmem args` with a stdout whose reader is already gone: every write to it fails
/// with a broken pipe, as when the output is piped into `head` and `head` has exited.
#[cfg(unix)]
pub fn run_into_closed_stdout(args: &[&str]) -> Output {
    use std::os::fd::OwnedFd;
    use std::os::unix::net::UnixStream;
    let (reader, writer) = UnixStream::pair().expect("a socket pair");
    drop(reader);
    Command::new(env!("CARGO_BIN_EXE_syncmem"))
        .args(args)
        .env_remove("SYNCMEM_TRACE")
        .stdout(std::process::Stdio::from(OwnedFd::from(writer)))
        .output()
        .expect("run the syncmem binary")
}

/// Runs `syncmem args` with its address space limited to `mib` MiB (`ulimit -v`), so that a
/// runaway allocation fails at once instead of exhausting the machine. Unix only (`sh`).
#[cfg(unix)]
pub fn run_limited(args: &[&str], mib: u64) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {}; exec \"$0\" \"$@\"", mib * 1024))
        .arg(env!("CARGO_BIN_EXE_syncmem"))
        .args(args)
        .env_remove("SYNCMEM_TRACE")
        .output()
        .expect("run the syncmem binary under sh")
}

/// Exit status of a failure while running (bad input found at run time: a file, a setting).
pub const RUNTIME_FAILURE: i32 = 1;

/// Exit status of a usage error (an unknown flag, a value its parser rejects): clap's.
pub const USAGE_ERROR: i32 = 2;

/// Requires `out` to be a clean failure with exit status `code`: no panic, one line on stderr;
/// returns stderr.
pub fn one_line_failure(what: &str, out: &Output, code: i32) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(code),
        "{what}: {}\n{stderr}",
        out.status
    );
    assert!(!stderr.contains("panicked"), "{what}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{what}: {stderr}");
    stderr
}

/// Requires `out` to be a clean failure, as bad input found while running gets: exit status
/// 1, no panic, one line on stderr; returns stderr.
pub fn refused(what: &str, out: &Output) -> String {
    one_line_failure(what, out, RUNTIME_FAILURE)
}

/// Requires `out` to be a value rejected on the command line: exit status 2, no panic, one
/// line on stderr; returns stderr.
pub fn rejected_value(what: &str, out: &Output) -> String {
    one_line_failure(what, out, USAGE_ERROR)
}

/// Runs `syncmem args`.
pub fn run(args: &[&str]) -> Output {
    run_env::<&str>(args, &[])
}

/// Runs `syncmem args`, requires success, returns stdout.
pub fn ok(args: &[&str]) -> String {
    let out = run(args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "syncmem {args:?} failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// As [`ok`], with extra environment variables.
pub fn ok_env(args: &[&str], env: &[(&str, &str)]) -> String {
    let out = run_env(args, env);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "syncmem {args:?} {env:?} failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Runs `syncmem args`, requires an exit with a non-zero code, returns stderr.
pub fn fails(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.code().is_some_and(|c| c != 0),
        "syncmem {args:?} should fail with an exit code ({}):\nstdout:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs `syncmem args`, requires success and one JSON document on stdout.
pub fn json(args: &[&str]) -> Value {
    json_env(args, &[])
}

/// As [`json`], with extra environment variables.
pub fn json_env(args: &[&str], env: &[(&str, &str)]) -> Value {
    let out = run_env(args, env);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "syncmem {args:?} {env:?} failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("syncmem {args:?}: stdout is not JSON ({e}):\n{stdout}"))
}

/// True when the buffers of `device` share memory with the host by default (zero-copy `auto`).
pub fn zero_copy_by_default(device: &str) -> bool {
    syncmem::Device::open(device)
        .is_ok_and(|d| syncmem::ZeroCopy::Auto.protocol_for(d.info()).is_some())
}

/// `v` as an unsigned integer.
pub fn u(v: &Value) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("not an unsigned integer: {v}"))
}

/// `v` as a number.
pub fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// A file in the temporary directory named after the test file (`syncmem-cli-TEST-PID-NAME`),
/// removed when dropped.
pub struct TempPath(pub std::path::PathBuf);

impl TempPath {
    /// `name` under the test's prefix `test` (a file extension goes in `name`).
    pub fn new(test: &str, name: &str) -> TempPath {
        TempPath(
            std::env::temp_dir().join(format!("syncmem-cli-{test}-{}-{name}", std::process::id())),
        )
    }

    /// The path as a command-line argument.
    pub fn arg(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
