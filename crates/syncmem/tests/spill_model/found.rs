//! Cases the property test found, kept as programs of their own.

use super::{device, run, streams, Op};
use syncmem::ZeroCopy;

/// A case the property test found: with two mirrors, the pool failed although a clean mirror
/// no guard held (and a stale one) could have been dropped.
#[test]
fn a_found_case_with_two_mirrors() {
    let Some(base) = syncmem::testing::opencl_or_skip("spill model, found case") else {
        return;
    };
    let dev = device(&base, ZeroCopy::Off);
    let ops = [
        Op::DeviceRead { slot: 2 },
        Op::host_write(1, 17477444433381155742, 48),
        Op::guard(5, true),
        Op::DeviceRead { slot: 4 },
        Op::Scale { slot: 7, a: 0.5 },
        Op::Scale { slot: 0, a: 0.5 },
        Op::alloc(3, 1, 1, 187),
        Op::prefetch(3, 1, false),
        Op::host_write(2, 16195540195430635671, -104),
        Op::HostRead { slot: 6 },
        Op::DeviceRead { slot: 3 },
        Op::prefetch(2, 1, false),
        Op::prefetch(5, 0, false),
        Op::alloc(7, 1, 1, 198),
        Op::DeviceRead { slot: 4 },
        Op::alloc(6, 0, 1, 121),
        Op::alloc(0, 1, 1, 166),
        Op::Drop { slot: 1 },
        Op::axpy(6, 6, -1.0),
        Op::HostRead { slot: 3 },
        Op::alloc(1, 1, 1, 104),
        Op::prefetch(0, 1, true),
        Op::host_write(7, 9614069386335630893, -72),
        Op::guard(6, true),
        Op::DeviceRead { slot: 2 },
        Op::alloc(5, 0, 1, 185),
        Op::Scale { slot: 0, a: -1.0 },
        Op::guard(1, true),
        Op::host_write(5, 8892928699882156549, -86),
        Op::HostRead { slot: 6 },
        Op::Scale { slot: 2, a: -1.0 },
        Op::Scale { slot: 1, a: 2.0 },
        Op::axpy(5, 7, -1.0),
        Op::Release,
        Op::Scale { slot: 4, a: 0.5 },
        Op::host_write(0, 3979312645902168649, 83),
        Op::guard(6, true),
        Op::HostRead { slot: 5 },
        Op::alloc(5, 1, 1, 8),
        Op::alloc(4, 1, 1, 52),
        Op::HostOverwrite { slot: 2, seed: 238 },
        Op::prefetch(7, 0, false),
        Op::alloc(6, 0, 1, 52),
        Op::DeviceOverwrite { slot: 2, value: 2 },
        Op::host_write(3, 13120408832017867155, 111),
        Op::Drop { slot: 4 },
        Op::alloc(6, 0, 1, 203),
        Op::Release,
        Op::axpy(5, 3, -1.0),
        Op::axpy(4, 2, 1.0),
        Op::axpy(2, 7, -1.0),
        Op::Release,
        Op::DeviceOverwrite { slot: 4, value: 7 },
    ];
    run(&dev, &streams(&dev), &ops).unwrap();
}

/// A case the property test found: with zero-copy, a host view of a spilled buffer was freed
/// under its guard when a device read on the same thread moved the data into shared memory.
#[test]
fn a_found_case_with_zero_copy() {
    let Some(base) = syncmem::testing::opencl_or_skip("spill model, zero-copy case") else {
        return;
    };
    let dev = device(&base, ZeroCopy::Auto);
    let ops = [
        Op::alloc(3, 0, 1, 49),
        Op::guard(6, false),
        Op::alloc(0, 0, 0, 198),
        Op::alloc(5, 1, 0, 62),
        Op::HostOverwrite { slot: 4, seed: 51 },
        Op::Scale { slot: 7, a: -1.0 },
        Op::host_write(3, 14561089530153548858, 18),
        Op::HostOverwrite { slot: 7, seed: 142 },
        Op::HostRead { slot: 1 },
        Op::HostOverwrite { slot: 2, seed: 1 },
        Op::Release,
        Op::alloc(7, 1, 1, 238),
        Op::guard(1, true),
        Op::host_write(4, 7024755581130613340, 96),
        Op::DeviceOverwrite { slot: 2, value: 6 },
        Op::Drop { slot: 2 },
        Op::axpy(4, 2, 1.0),
        Op::axpy(5, 4, -1.0),
        Op::DeviceRead { slot: 2 },
        Op::axpy(3, 0, 1.0),
        Op::alloc(6, 1, 0, 103),
        Op::prefetch(2, 0, true),
        Op::Scale { slot: 1, a: 2.0 },
        Op::host_write(2, 6285705539075717315, 125),
        Op::prefetch(0, 0, false),
        Op::Scale { slot: 0, a: -1.0 },
        Op::DeviceRead { slot: 2 },
        Op::Drop { slot: 1 },
        Op::DeviceRead { slot: 0 },
        Op::DeviceRead { slot: 0 },
        Op::HostRead { slot: 1 },
        Op::Release,
        Op::axpy(2, 4, 1.0),
        Op::alloc(6, 1, 1, 214),
        Op::alloc(7, 1, 0, 32),
        Op::DeviceRead { slot: 7 },
        Op::DeviceRead { slot: 1 },
        Op::alloc(0, 1, 0, 95),
        Op::HostOverwrite { slot: 4, seed: 243 },
        Op::HostRead { slot: 0 },
        Op::alloc(7, 0, 0, 35),
        Op::HostRead { slot: 5 },
        Op::DeviceRead { slot: 4 },
        Op::axpy(4, 6, -1.0),
        Op::host_write(2, 16199026695163719472, 71),
        Op::Release,
        Op::alloc(2, 1, 1, 58),
        Op::host_write(3, 4858432362331682890, 43),
        Op::Scale { slot: 1, a: 0.5 },
        Op::alloc(7, 1, 0, 238),
        Op::alloc(3, 0, 1, 193),
        Op::prefetch(0, 0, false),
        Op::prefetch(7, 0, false),
        Op::Scale { slot: 6, a: 2.0 },
        Op::Scale { slot: 5, a: 2.0 },
        Op::HostRead { slot: 6 },
        Op::guard(7, false),
        Op::axpy(7, 0, 1.0),
    ];
    run(&dev, &streams(&dev), &ops).unwrap();
}
