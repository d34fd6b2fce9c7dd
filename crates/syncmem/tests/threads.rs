//! Threads hammering `SyncedMemory`, on the `cpu` device and on OpenCL:
//!
//! - one buffer shared by 8 threads doing mixed host/device reads and whole-buffer writes:
//!   every reader sees a uniform buffer holding exactly the last value written (write guards
//!   are exclusive, copies are never torn, and no reader sees a stale mirror);
//! - 8 threads each driving their own buffer through many transitions: exact per-buffer copy
//!   counts at the end (counters of one buffer are not disturbed by the others).

use std::sync::atomic::{AtomicU8, Ordering::SeqCst};
use std::sync::{Arc, Barrier};

use syncmem::{Device, Head, SyncedMemory};

const THREADS: usize = 8;

/// A small deterministic generator (xorshift64*), one per thread.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) % n
    }
}

/// Asserts that every byte of `bytes` is `want`, naming the first byte that differs.
fn assert_uniform(bytes: &[u8], want: u8, what: &str) {
    if let Some(i) = bytes.iter().position(|&b| b != want) {
        let first = bytes[0];
        let uniform = bytes.iter().all(|&b| b == first);
        panic!(
            "{what}: byte {i} is {} but the last write was {want} (buffer uniform: {uniform}, \
             first byte {first})",
            bytes[i]
        );
    }
}

// ----- (a) one buffer, many threads ------------------------------------------------------------

fn shared_buffer_readers_see_whole_writes(dev: &Device) {
    // Two mirrors, then zero-copy (one allocation: the threads race on the same memory).
    shared_buffer_with(dev, false);
    shared_buffer_with(dev, true);
}

/// The shared buffer's length (not a multiple of any block or word).
const SHARED_LEN: usize = 64 * 1024 + 3;

fn shared_buffer_with(dev: &Device, zero_copy: bool) {
    const OPS: usize = 250;
    let m = Arc::new(
        SyncedMemory::new(SHARED_LEN, dev)
            .with_zero_copy(zero_copy)
            .with_label("shared"),
    );
    // The value of the last whole-buffer write. Written only under a write guard, read only
    // under a read guard, so it cannot change while a reader looks at the buffer.
    let last = Arc::new(AtomicU8::new(1));
    m.host_mut().unwrap().fill(1);
    let start = Arc::new(Barrier::new(THREADS));

    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (m, last, start) = (m.clone(), last.clone(), start.clone());
            scope.spawn(move || {
                let mut rng = Rng::new(t as u64 + 1);
                let mut scratch = vec![0u8; SHARED_LEN];
                start.wait();
                for i in 0..OPS {
                    let what = format!("thread {t} op {i}");
                    random_access(&m, &last, &mut rng, t, &what, &mut scratch);
                }
            });
        }
    });
    check_shared_end(&m, last.load(SeqCst));
}

/// One random access of thread `t` to the shared buffer: a read sees the last whole write
/// (`last`); a write stores a new value there, always another than the one before (`t + 1` is
/// in 1..=8).
fn random_access(
    m: &SyncedMemory,
    last: &AtomicU8,
    rng: &mut Rng,
    t: usize,
    what: &str,
    scratch: &mut [u8],
) {
    let next = |prev: u8| prev.wrapping_add(t as u8 + 1);
    match rng.below(10) {
        0 | 1 => {
            let g = m.host().unwrap();
            assert_uniform(&g, last.load(SeqCst), &format!("{what}: host read"));
        }
        2 | 3 => {
            let g = m.device().unwrap();
            g.read_into(scratch).unwrap();
            assert_uniform(scratch, last.load(SeqCst), &format!("{what}: device read"));
        }
        4 => {
            let mut g = m.host_mut().unwrap();
            let prev = last.load(SeqCst);
            // host_mut must have brought the newest data to the host.
            assert_uniform(&g, prev, &format!("{what}: seen by host_mut"));
            g.fill(next(prev));
            last.store(next(prev), SeqCst);
        }
        5 => {
            let mut g = m.device_mut().unwrap();
            let prev = last.load(SeqCst);
            g.read_into(scratch).unwrap();
            assert_uniform(scratch, prev, &format!("{what}: seen by device_mut"));
            g.fill(next(prev)).unwrap();
            last.store(next(prev), SeqCst);
        }
        6 => {
            let mut g = m.device_mut().unwrap();
            let k = next(last.load(SeqCst));
            g.write_from(0, &vec![k; SHARED_LEN]).unwrap();
            last.store(k, SeqCst);
        }
        7 => {
            let mut g = m.host_overwrite().unwrap();
            let k = next(last.load(SeqCst));
            g.fill(k);
            last.store(k, SeqCst);
        }
        8 => {
            let mut g = m.device_overwrite().unwrap();
            let k = next(last.load(SeqCst));
            g.write_from(0, &vec![k; SHARED_LEN]).unwrap();
            last.store(k, SeqCst);
        }
        _ => {
            // The buffer is initialised before the threads start: never an error.
            if rng.below(2) == 0 {
                m.prefetch_to_device(None).unwrap();
            } else {
                m.prefetch_to_host(None).unwrap();
            }
        }
    }
}

/// After the threads: both sides hold the last value, and every transfer was whole (copies
/// with two mirrors, syncs with zero-copy).
fn check_shared_end(m: &SyncedMemory, want: u8) {
    assert_uniform(&m.host().unwrap(), want, "final host read");
    let g = m.device().unwrap();
    let mut out = vec![0u8; SHARED_LEN];
    g.read_into(&mut out).unwrap();
    assert_uniform(&out, want, "final device read");
    drop(g);
    assert_eq!(m.head(), Head::Synced);
    let s = m.copy_stats();
    if m.zero_copy_protocol().is_some() {
        // Shared memory: no copy at all, every transfer a whole-buffer sync.
        assert_eq!(s.total_count(), 0, "{s:?}");
        assert!(
            s.mapped.count > 0,
            "2000 mixed accesses made no sync: {s:?}"
        );
        assert_eq!(s.mapped.bytes, s.mapped.count * SHARED_LEN as u64, "{s:?}");
        return;
    }
    for (name, d) in [("h2d", s.host_to_device), ("d2h", s.device_to_host)] {
        assert!(
            d.count > 0,
            "{name}: 2000 mixed accesses made no copy: {s:?}"
        );
        assert_eq!(
            d.bytes,
            d.count * SHARED_LEN as u64,
            "{name}: every copy is whole: {s:?}"
        );
    }
    assert_eq!(s.device_to_device.count, 0);
}

// ----- (b) one buffer per thread ---------------------------------------------------------------

fn device_bytes(m: &SyncedMemory) -> Vec<u8> {
    let g = m.device().unwrap();
    let mut out = vec![0u8; m.len()];
    g.read_into(&mut out).unwrap();
    out
}

/// One round of transitions from `AtHost` holding `v` back to `AtHost`, with 2 host-to-device
/// and 3 device-to-host copies.
fn round(m: &SyncedMemory, v: u8, what: &str) {
    let n = m.len();
    let ctx = |step: &str| format!("{what}: {step}");
    // AtHost -> device read: copy H2D, Synced.
    assert_eq!(device_bytes(m), vec![v; n], "{}", ctx("device read"));
    assert_eq!(m.head(), Head::Synced);
    // Synced -> device write: no copy, AtDevice.
    m.device_mut().unwrap().fill(v ^ 1).unwrap();
    assert_eq!(m.head(), Head::AtDevice);
    // AtDevice -> host read: copy D2H, Synced.
    assert_uniform(&m.host().unwrap(), v ^ 1, &ctx("host read"));
    assert_eq!(m.head(), Head::Synced);
    // Synced -> host write: no copy, AtHost.
    m.host_mut().unwrap().fill(v ^ 2);
    assert_eq!(m.head(), Head::AtHost);
    // AtHost -> prefetch to device: copy H2D (queued), Synced.
    let queued = m.prefetch_to_device(None).unwrap();
    assert_eq!(queued.is_some(), m.zero_copy_protocol().is_none());
    assert_eq!(m.head(), Head::Synced);
    // Device write waits for the copy: no copy, AtDevice.
    m.device_mut()
        .unwrap()
        .write_from(1, &vec![v ^ 3; n - 1])
        .unwrap();
    assert_eq!(m.head(), Head::AtDevice);
    // AtDevice -> prefetch to host: copy D2H (queued), Synced.
    // A copy is queued (nothing where the sides share memory).
    let queued = m.prefetch_to_host(None).unwrap();
    assert_eq!(queued.is_some(), m.zero_copy_protocol().is_none());
    assert!(
        m.prefetch_to_host(None).unwrap().is_none(),
        "host already current"
    );
    {
        let h = m.host().unwrap();
        assert_eq!(
            h[0],
            v ^ 2,
            "{}",
            ctx("byte 0 came from the prefetched device copy")
        );
        assert_uniform(&h[1..], v ^ 3, &ctx("host read after prefetch"));
    }
    // Synced -> device overwrite: no copy, AtDevice.
    m.device_overwrite()
        .unwrap()
        .write_from(0, &vec![v ^ 4; n])
        .unwrap();
    // AtDevice -> host write: copy D2H first, AtHost.
    {
        let mut h = m.host_mut().unwrap();
        assert_uniform(&h, v ^ 4, &ctx("seen by host_mut"));
        h.fill(v.wrapping_add(1));
    }
    assert_eq!(m.head(), Head::AtHost);
}

fn own_buffers_exact_copy_counts(dev: &Device) {
    const ROUNDS: u64 = 40;
    let start = Barrier::new(THREADS);
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let start = &start;
            scope.spawn(move || {
                let len = 1000 + t * 517;
                // Every other pair of threads keeps two mirrors.
                let mut m = SyncedMemory::new(len, dev)
                    .with_zero_copy(t % 4 < 2)
                    .with_label(format!("own#{t}"));
                if t % 2 == 1 {
                    // Half the threads copy on a stream of their own.
                    m = m.with_stream(&dev.new_stream().unwrap()).unwrap();
                }
                let mut v = t as u8 * 16;
                m.host_mut().unwrap().fill(v);
                start.wait();
                for r in 0..ROUNDS {
                    round(&m, v, &format!("thread {t} round {r}"));
                    v = v.wrapping_add(1);
                }
                let s = m.copy_stats();
                let len = len as u64;
                // With shared memory, the same transfers as zero-copy syncs.
                let (h2d, d2h, mapped) = if m.zero_copy_protocol().is_some() {
                    (0, 0, 5 * ROUNDS)
                } else {
                    (2 * ROUNDS, 3 * ROUNDS, 0)
                };
                assert_eq!(
                    (s.host_to_device.count, s.host_to_device.bytes),
                    (h2d, h2d * len),
                    "thread {t}: host-to-device copies"
                );
                assert_eq!(
                    (s.device_to_host.count, s.device_to_host.bytes),
                    (d2h, d2h * len),
                    "thread {t}: device-to-host copies"
                );
                assert_eq!((s.mapped.count, s.mapped.bytes), (mapped, mapped * len));
                assert_eq!(s.device_to_device.count, 0);
                assert_uniform(
                    &m.host().unwrap(),
                    v,
                    &format!("thread {t}: final contents"),
                );
            });
        }
    });
}

syncmem::for_each_device!(
    shared_buffer_readers_see_whole_writes,
    own_buffers_exact_copy_counts
);
