//! A missing OpenCL runtime or CUDA driver gives clean, typed errors, never a panic, and the
//! `cpu` device keeps working.
//!
//! OpenCL: the parent test re-runs this test binary as a child process whose ICD loader sees an
//! empty vendor directory (`OCL_ICD_VENDORS`, `OPENCL_VENDOR_PATH`), so no platform exists
//! there. The child test does nothing unless `SYNCMEM_CHILD=1`.
//!
//! CUDA: this machine has no `libcuda`; the test checks the error directly (and skips, saying
//! so, where a CUDA driver library is installed).

#[allow(unused_imports)]
use syncmem::{BackendKind, Device, Error, Head, SyncedMemory};

/// Set in the child's environment.
#[allow(dead_code)]
const CHILD_ENV: &str = "SYNCMEM_CHILD";

/// Printed by the child when all its checks passed.
#[allow(dead_code)]
const OPENCL_MARKER: &str = "SYNCMEM-CHILD-PASSED: no OpenCL runtime";

#[allow(dead_code)]
fn in_child() -> bool {
    std::env::var(CHILD_ENV).as_deref() == Ok("1")
}

/// The `cpu` device still works: a full host -> device -> host round trip.
#[allow(dead_code)]
fn cpu_round_trip() {
    let cpu = Device::open("cpu").expect("the cpu device is always present");
    let m = SyncedMemory::new(333, &cpu);
    m.host_mut().unwrap().fill(7);
    let mut out = vec![0u8; 333];
    m.device().unwrap().read_into(&mut out).unwrap();
    assert_eq!(out, vec![7u8; 333]);
    m.device_mut().unwrap().fill(9).unwrap();
    assert_eq!(&*m.host().unwrap(), &[9u8; 333][..]);
    assert_eq!(m.head(), Head::Synced);
    syncmem::testing::assert_syncs(&cpu, &m.copy_stats(), 1, 1, "round trip");
}

/// The probe line of `backend`, checked to report `err` as the reason it has no devices.
#[allow(dead_code)]
fn probe_reports(backend: BackendKind, err: &Error) {
    let reports = syncmem::device::probe();
    println!("probe: {reports:#?}");
    let r = reports
        .iter()
        .find(|r| r.backend == backend)
        .unwrap_or_else(|| panic!("probe lists no {backend} line"));
    assert!(r.compiled, "{backend} is compiled in");
    match &r.devices {
        Err(reason) => assert_eq!(reason, &err.to_string(), "probe gives the open error"),
        Ok(list) => panic!("probe lists {backend} devices without a runtime: {list:?}"),
    }
    let cpu = reports
        .iter()
        .find(|r| r.backend == BackendKind::Cpu)
        .expect("probe lists cpu");
    assert_eq!(
        cpu.devices.as_ref().map(Vec::len),
        Ok(1),
        "cpu is always present"
    );
}

// ----- OpenCL ----------------------------------------------------------------------------------

/// Runs in the child, with an empty ICD vendor directory: the ICD loader finds no platform.
#[cfg(feature = "opencl")]
#[test]
fn child_no_opencl_runtime() {
    if !in_child() {
        return;
    }
    let e = Device::open("opencl:0").expect_err("no OpenCL platform is visible in the child");
    println!("Device::open(\"opencl:0\") -> Err({e:?})");
    println!("  displayed: {e}");
    // ocl-icd answers clGetPlatformIDs with CL_PLATFORM_NOT_FOUND_KHR when it loads no
    // vendor: the runtime is unavailable (not "no such device").
    match &e {
        Error::RuntimeUnavailable {
            backend: BackendKind::OpenCl,
            reason,
        } => assert!(
            reason.contains("no platform"),
            "the reason says that no platform was found: {reason}"
        ),
        other => panic!("expected RuntimeUnavailable for OpenCL, got {other:?}"),
    }
    // Asking again gives the same error, without a panic, and so do the other entry points.
    let again = Device::open("opencl:1").expect_err("still no runtime");
    assert_eq!(again.to_string(), e.to_string());
    let all = Device::all(BackendKind::OpenCl).expect_err("no runtime");
    assert_eq!(all.to_string(), e.to_string());
    assert!(
        Device::first_accelerator().is_none_or(|d| d.backend() != BackendKind::OpenCl),
        "first_accelerator found an OpenCL device"
    );
    let skipped = std::panic::catch_unwind(|| syncmem::testing::opencl_or_skip("child"));
    assert!(
        matches!(skipped, Ok(None)),
        "opencl_or_skip skips (the child clears REQUIRE)"
    );
    probe_reports(BackendKind::OpenCl, &e);
    cpu_round_trip();
    println!("{OPENCL_MARKER}");
}

#[cfg(feature = "opencl")]
#[test]
fn no_opencl_runtime_gives_clean_errors() {
    if in_child() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("syncmem-empty-icd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(&exe)
        .args([
            "--exact",
            "child_no_opencl_runtime",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("OCL_ICD_VENDORS", &dir)
        .env("OPENCL_VENDOR_PATH", &dir)
        .env(CHILD_ENV, "1")
        .env_remove("OCL_ICD_FILENAMES")
        .env_remove(syncmem::testing::REQUIRE_OPENCL)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", exe.display()));
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("--- child stdout ---\n{stdout}--- child stderr ---\n{stderr}---");
    assert!(out.status.success(), "the child failed: {}", out.status);
    assert!(
        stdout.contains(OPENCL_MARKER),
        "the child test did not run to its end (filtered out, or returned early)"
    );
    assert!(stdout.contains("1 passed"), "exactly the child test ran");
}

// ----- CUDA ------------------------------------------------------------------------------------

/// Where a CUDA driver library is installed, if anywhere: the standard library directories,
/// `LD_LIBRARY_PATH`, and the dynamic linker's cache.
#[cfg(feature = "cuda")]
fn find_libcuda() -> Option<String> {
    let is_libcuda = |name: &str| name.starts_with("libcuda.so") || name == "nvcuda.dll";
    let mut dirs: Vec<std::path::PathBuf> = std::env::var_os("LD_LIBRARY_PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    for d in [
        "/lib",
        "/lib64",
        "/usr/lib",
        "/usr/lib64",
        "/lib/x86_64-linux-gnu",
        "/usr/lib/x86_64-linux-gnu",
        "/lib/aarch64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib/wsl/lib",
        "/usr/local/cuda/lib64",
    ] {
        dirs.push(d.into());
    }
    for d in dirs {
        if let Ok(entries) = std::fs::read_dir(&d) {
            for e in entries.flatten() {
                if is_libcuda(&e.file_name().to_string_lossy()) {
                    return Some(e.path().display().to_string());
                }
            }
        }
    }
    let cache = std::process::Command::new("ldconfig")
        .arg("-p")
        .output()
        .ok()?;
    String::from_utf8_lossy(&cache.stdout)
        .lines()
        .find(|l| l.trim_start().starts_with("libcuda.so"))
        .map(|l| l.trim().to_string())
}

#[cfg(feature = "cuda")]
#[test]
fn no_cuda_driver_gives_clean_errors() {
    if in_child() {
        return;
    }
    if let Some(lib) = find_libcuda() {
        eprintln!(
            "SKIPPED no_cuda_driver_gives_clean_errors: a CUDA driver library is installed \
             ({lib}); this test checks the no-driver path"
        );
        return;
    }
    let e = Device::open("cuda:0").expect_err("no libcuda on this machine");
    println!("Device::open(\"cuda:0\") -> Err({e:?})");
    match &e {
        Error::RuntimeUnavailable {
            backend: BackendKind::Cuda,
            reason,
        } => assert!(!reason.trim().is_empty()),
        other => panic!("expected RuntimeUnavailable for CUDA, got {other:?}"),
    }
    // A second call: the same error, no panic (the loader must not be tried half-way twice).
    let again = Device::open("cuda:0").expect_err("still no driver");
    assert_eq!(again.to_string(), e.to_string());
    assert!(matches!(
        again,
        Error::RuntimeUnavailable {
            backend: BackendKind::Cuda,
            ..
        }
    ));
    let all = Device::all(BackendKind::Cuda).expect_err("no driver");
    assert_eq!(all.to_string(), e.to_string());
    assert!(
        Device::first_accelerator().is_none_or(|d| d.backend() != BackendKind::Cuda),
        "first_accelerator found a CUDA device"
    );
    probe_reports(BackendKind::Cuda, &e);
    cpu_round_trip();
}
