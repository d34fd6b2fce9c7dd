//! Reused device pool blocks: they keep their backend view (an OpenCL sub-buffer, a pointer
//! into the segment) while their placement lasts, so a reused block is the same memory object
//! and data written through it reads back; and they carry the work still in flight on them, so
//! that another stream takes them only once it is done.
//!
//! Device tests run on `Device::detached()` handles, whose pools no other test touches.

#[cfg(feature = "opencl")]
#[path = "common/gate.rs"]
mod gate;

use syncmem::{Device, DeviceBuffer};

#[cfg(feature = "opencl")]
const MIB: usize = 1 << 20;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// The buffer's memory object: the `cl_mem` of an OpenCL buffer, the device pointer of a CUDA
/// one, the address of a `cpu` one.
fn handle(b: &DeviceBuffer) -> usize {
    b.native_address().unwrap_or(0)
}

fn read(dev: &Device, b: &DeviceBuffer) -> Vec<u8> {
    let s = dev.default_stream().unwrap();
    let mut back = vec![0u8; b.len()];
    s.read(b, 0, &mut back).unwrap();
    back
}

fn a_reused_block_is_the_same_memory_and_reads_back(dev: &Device) {
    let dev = dev.detached();
    let s = dev.default_stream().unwrap();
    let mut neighbour = dev.alloc_pooled(4096, &s).unwrap();
    let mut a = dev.alloc_pooled(4096, &s).unwrap();
    s.write(&mut a, 0, &pattern(4096, 1)).unwrap();
    s.write(&mut neighbour, 0, &pattern(4096, 2)).unwrap();
    let first = handle(&a);
    assert_ne!(first, 0);
    drop(a);
    for round in 0..3u8 {
        // 4000 bytes round up to the same 4 KiB block, on the same stream: the cached block.
        let mut b = dev.alloc_pooled(4000, &s).unwrap();
        assert_eq!(
            handle(&b),
            first,
            "round {round}: the block's view is reused"
        );
        assert_eq!(b.len(), 4000);
        let data = pattern(4000, 10 + round);
        s.write(&mut b, 0, &data).unwrap();
        assert_eq!(read(&dev, &b), data, "round {round}");
        s.fill(&mut b, 1000, 500, 0xA5).unwrap();
        let back = read(&dev, &b);
        assert_eq!(&back[..1000], &data[..1000]);
        assert!(back[1000..1500].iter().all(|&x| x == 0xA5));
        assert_eq!(&back[1500..], &data[1500..]);
        // The neighbouring block is untouched by writes through the reused view.
        assert_eq!(read(&dev, &neighbour), pattern(4096, 2), "round {round}");
    }
    let stats = dev.pool_stats().unwrap();
    assert_eq!((stats.allocations, stats.cache_hits), (5, 4));
}

fn a_large_block_comes_back_with_its_view(dev: &Device) {
    let dev = dev.detached();
    let s = dev.default_stream().unwrap();
    let len = 24 << 20;
    let mut a = dev.alloc_pooled(len, &s).unwrap();
    let data = pattern(len, 3);
    s.write(&mut a, 0, &data).unwrap();
    let first = handle(&a);
    drop(a);
    let b = dev.alloc_pooled(len, &s).unwrap();
    assert_eq!(handle(&b), first);
    assert_eq!(
        read(&dev, &b),
        data,
        "the block's bytes are where they were"
    );
}

syncmem::for_each_device!(
    a_reused_block_is_the_same_memory_and_reads_back,
    a_large_block_comes_back_with_its_view
);

/// A block whose first user queued work on it, reused on the same stream by a user that queues
/// nothing, still carries that work: another stream gets new memory until the work is done.
#[cfg(feature = "opencl")]
#[test]
fn opencl_a_block_reused_on_its_stream_keeps_the_work_of_its_earlier_user() {
    let Some(dev) = syncmem::testing::opencl_or_skip("opencl_reuse_keeps_earlier_work") else {
        return;
    };
    let d = dev.detached();
    let (s1, s2) = (d.new_stream().unwrap(), d.new_stream().unwrap());
    let gate = gate::Gate::block(&s1);
    // 2 MiB: a segment of its own, so no free neighbour carries the work either.
    let mut x = d.alloc_pooled(2 * MIB, &s1).unwrap();
    s1.fill(&mut x, 0, 2 * MIB, 7).unwrap(); // queued behind the gate
    drop(x);
    let x2 = d.alloc_pooled(2 * MIB, &s1).unwrap();
    assert_eq!(
        d.pool_stats().unwrap().cache_hits,
        1,
        "same stream: at once"
    );
    drop(x2); // no work of its own
    let y = d.alloc_pooled(2 * MIB, &s2).unwrap();
    let s = d.pool_stats().unwrap();
    assert_eq!(
        (s.backend_allocs, s.cache_hits),
        (2, 1),
        "the fill is still queued: another stream must not take the block"
    );
    gate.open();
    s1.synchronize().unwrap();
    drop(y);
    let _y2 = d.alloc_pooled(2 * MIB, &s2).unwrap();
    let _y3 = d.alloc_pooled(2 * MIB, &s2).unwrap();
    let s = d.pool_stats().unwrap();
    assert_eq!(
        (s.backend_allocs, s.cache_hits),
        (2, 3),
        "both blocks settled: {s}"
    );
}
