//! A bad pool environment variable fails the command at once, naming the variable, even when
//! the pool it configures is never used.

mod common;

use common::run_env;

#[test]
fn train_with_a_garbage_pinned_pool_setting_fails_naming_the_variable() {
    // Without --device (the default device, or the cpu fallback) and with an explicit one.
    for args in [
        &["train", "--epochs", "1"][..],
        &["train", "--epochs", "1", "--device", "cpu"][..],
        &["devices"][..],
        &["devices", "--json"][..],
    ] {
        let out = run_env(args, &[("SYNCMEM_PINNED_POOL", "garbage")]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains("SYNCMEM_PINNED_POOL") && stderr.contains("garbage"),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn the_default_device_does_not_fall_back_to_cpu_over_a_bad_setting() {
    let out = run_env(
        &["train", "--epochs", "1"],
        &[("SYNCMEM_POOL_CONF", "memory_cap=lots")],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("SYNCMEM_POOL_CONF"), "{stderr}");
    assert!(!stderr.contains("training on cpu"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
}
