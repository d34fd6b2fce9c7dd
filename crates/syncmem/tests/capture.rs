//! `LaunchCapture`: the kernels the crate launched, replayed with raw OpenCL calls, do the same
//! work again.

#![cfg(feature = "opencl")]

use syncmem::device::LaunchCapture;
use syncmem::{kernels, SyncedMemory};

#[test]
fn a_captured_kernel_replays_with_the_same_arguments() {
    let Some(dev) = syncmem::testing::opencl_or_skip("launch capture") else {
        return;
    };
    let m = SyncedMemory::new(64 * 4, &dev);
    m.host_mut()
        .unwrap()
        .as_mut_slice_of::<f32>()
        .unwrap()
        .fill(1.5);
    let ((), mut capture) = LaunchCapture::record(|| {
        kernels::scale(64, 2.0f32, &mut m.device_mut()?)?;
        kernels::scale(64, 3.0f32, &mut m.device_mut()?)
    })
    .unwrap();
    assert_eq!(capture.len(), 2);
    // Outside a capture nothing is recorded.
    kernels::scale(64, 1.0f32, &mut m.device_mut().unwrap()).unwrap();
    assert_eq!(capture.len(), 2);
    let stream = dev.default_stream().unwrap();
    {
        // Held for writing: the replay writes the buffer, and is waited for before the guard goes.
        let _g = m.device_mut().unwrap();
        capture.replay(stream.as_opencl().unwrap()).unwrap();
        stream.synchronize().unwrap();
    }
    let v = m.host().unwrap().as_slice_of::<f32>().unwrap().to_vec();
    assert!(v.iter().all(|&x| x == 1.5 * 6.0 * 6.0), "{:?}", &v[..4]);
    // An error of the body is returned, and the capture closes.
    let e = LaunchCapture::record(|| -> syncmem::Result<()> {
        Err(syncmem::Error::NotFound {
            kind: "blob",
            name: "y".into(),
            detail: String::new(),
        })
    });
    assert!(e.is_err());
}
