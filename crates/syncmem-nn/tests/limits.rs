//! Limits checked before any memory is asked for: a request above a device's largest single
//! allocation is refused before the driver sees it (a driver may assert instead of failing),
//! naming the request and the limit; a dataset's class count is bounded.

use syncmem::{BackendKind, Device, Error};
use syncmem_nn::mlp::Dataset;

fn above_max_alloc_is_refused_naming_the_limit(dev: &Device) {
    let max = dev.info().max_alloc;
    let Some(too_big) = usize::try_from(max).ok().and_then(|m| m.checked_add(1)) else {
        return; // no request can exceed this device's limit
    };
    let stream = dev.default_stream().unwrap();
    let mut attempts = vec![
        ("alloc", dev.alloc(too_big).map(drop)),
        ("alloc_pooled", dev.alloc_pooled(too_big, &stream).map(drop)),
    ];
    // OpenCL pinned memory is a device buffer, bound by the same limit.
    if dev.backend() == BackendKind::OpenCl {
        attempts.push(("alloc_pinned", dev.alloc_pinned(too_big).map(drop)));
    }
    for (what, r) in attempts {
        let e = r.unwrap_err();
        assert!(e.is_out_of_memory(), "{what}: {e}");
        let text = e.to_string();
        for needle in [
            dev.label().to_string(),
            too_big.to_string(),
            max.to_string(),
        ] {
            assert!(
                text.contains(&needle),
                "{what}: {needle:?} missing from {text}"
            );
        }
    }
}

syncmem::for_each_device!(above_max_alloc_is_refused_naming_the_limit);

#[test]
fn the_class_count_is_bounded() {
    let top = Dataset::MAX_CLASSES;
    let ok = Dataset::new(vec![0.0, 1.0], vec![0, top as i32 - 1], 1).unwrap();
    assert_eq!(ok.classes, top);
    for label in [top as i32, 11_141_122, i32::MAX] {
        let e = Dataset::new(vec![0.0, 1.0], vec![0, label], 1).unwrap_err();
        assert!(matches!(e, Error::InvalidShape { .. }), "{e}");
        let text = e.to_string();
        assert!(text.contains(&format!("label {label}")), "{text}");
        assert!(text.contains(&top.to_string()), "{text}");
    }
}
