//! Pool environment variables are checked when the first device opens: every variable, even
//! one whose pool is never used, fails the opening with an error naming it. Each case runs in
//! a child process (the check runs once per process, and the environment is the process's).
//! A cap set by a variable is reported before the pool it caps is built.

use std::process::Command;

use syncmem::{BackendKind, Device, Error};

const CHILD: &str = "SYNCMEM_ENV_CONFIG_TEST_CHILD";

/// Every pool variable with a value it rejects.
const GARBAGE: [(&str, &str); 6] = [
    ("SYNCMEM_DEVICE_POOL", "garbage"),
    ("SYNCMEM_POOL_CONF", "garbage"),
    ("SYNCMEM_PINNED_POOL", "garbage"),
    ("SYNCMEM_PINNED_POOL_CONF", "round=3"),
    ("SYNCMEM_HOST_POOL", "garbage"),
    ("SYNCMEM_HOST_POOL_CONF", "memory_cap=12 parsecs"),
];

/// Runs `mode` of [`env_child_probe`] in a child process with `env` set (and every other pool
/// variable removed).
fn run_child(mode: &str, env: &[(&str, &str)]) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "env_child_probe",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD, mode);
    for (var, _) in GARBAGE {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child {mode} {env:?} failed:\n{text}");
    assert!(text.contains(&format!("probe {mode} ok")), "{text}");
}

#[test]
fn every_pool_variable_is_checked_when_the_first_device_opens() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    for (var, value) in GARBAGE {
        run_child(var, &[(var, value)]);
    }
    run_child("valid", &[]);
}

#[test]
fn a_cap_from_the_environment_is_reported_before_the_first_allocation() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    run_child("cap", &[("SYNCMEM_POOL_CONF", "memory_cap=64MiB")]);
    run_child("half", &[("SYNCMEM_POOL_CONF", "memory_cap=50%")]);
}

/// Asserts that `r` failed with a configuration error naming `var`.
fn names<T: std::fmt::Debug>(r: syncmem::Result<T>, var: &str, what: &str) {
    match r {
        Err(Error::InvalidConfig { what: w, .. }) => {
            assert!(w.starts_with(&format!("{var} (")), "{what}: {w:?}");
        }
        other => panic!("{what}: expected an invalid configuration naming {var}, got {other:?}"),
    }
}

/// Runs only in the child processes of the test above.
#[test]
fn env_child_probe() {
    let Ok(mode) = std::env::var(CHILD) else {
        return;
    };
    if mode == "valid" {
        Device::open("cpu").unwrap();
        drop(Device::cpu().alloc(10).unwrap());
    } else if mode == "cap" || mode == "half" {
        let dev = Device::cpu();
        let cap = match mode.as_str() {
            "cap" => 64 << 20,
            _ => dev.info().total_memory / 2,
        };
        let fresh = dev.isolated();
        for d in [&dev, &fresh] {
            assert!(d.pool_stats().is_none(), "no allocation yet");
            assert_eq!(d.memory_cap(), Some(cap), "before the first allocation");
            drop(d.alloc(10).unwrap());
            assert_eq!(d.memory_cap(), Some(cap), "after it");
            assert_eq!(d.pool_stats().unwrap().cap, Some(cap));
        }
    } else {
        let var = mode.as_str();
        // Neither the first opening, nor a later one, nor the first pool of a device.
        names(Device::open("cpu"), var, "Device::open(\"cpu\")");
        names(Device::all(BackendKind::Cpu), var, "Device::all(cpu)");
        names(Device::cpu().alloc(10), var, "the first device allocation");
        let e = Device::open("cpu").unwrap_err();
        assert!(e.to_string().contains(var), "{e}");
    }
    println!("probe {mode} ok");
}
