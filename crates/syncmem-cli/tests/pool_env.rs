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

/// A cap of 0 is refused the same way in every place that sets one: `memory_cap=0` and
/// `memory_cap=0%` in `SYNCMEM_POOL_CONF` and `--memory-cap 0`, each naming the setting, before
/// anything is trained (the variable with status 1, the flag with the usage error's 2).
#[test]
fn a_zero_memory_cap_is_refused_everywhere_naming_the_setting() {
    for conf in ["memory_cap=0", "memory_cap=0%", "memory_cap=0MiB"] {
        let out = run_env(
            &["train", "--epochs", "1", "--device", "cpu", "--json"],
            &[("SYNCMEM_POOL_CONF", conf)],
        );
        let stderr = common::refused(conf, &out);
        assert!(out.stdout.is_empty(), "{conf}: trained before failing");
        assert!(
            stderr.contains("SYNCMEM_POOL_CONF") && stderr.contains("memory_cap"),
            "{conf}: {stderr}"
        );
    }
    for cap in ["0", "0B", "0KiB"] {
        let out = common::run(&[
            "train",
            "--epochs",
            "1",
            "--device",
            "cpu",
            "--memory-cap",
            cap,
        ]);
        // A value the command line rejects: a usage error.
        let stderr = common::rejected_value(cap, &out);
        assert!(out.stdout.is_empty(), "{cap}: trained before failing");
        assert!(stderr.contains("--memory-cap"), "{cap}: {stderr}");
    }
}
