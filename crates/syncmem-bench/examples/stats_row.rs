//! What a reading of a pool costs while other threads keep magazines of it (its thread
//! caches): `stats_row [CALLS] [RUNS]` (defaults 200000, 5) times `HostPool::stats` in a loop
//! on a private caching host pool, alone, with a second thread that holds a magazine of the
//! pool and sleeps, and with that thread allocating and freeing 4 KiB all along. Prints the
//! median time per call of each case over the runs, with their range and the machine's load.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use syncmem::{HostPool, PoolConfig, PoolKind};
use syncmem_bench::load::LoadAverage;

/// The machine's load averages, or why there are none.
fn load() -> String {
    LoadAverage::read().map_or_else(|e| e, |l| l.to_string())
}

/// What the second thread does while the readings run.
#[derive(Clone, Copy, PartialEq)]
enum Other {
    None,
    Asleep,
    Allocating,
}

/// Nanoseconds per `stats` call over `calls` calls, with the second thread doing `other`.
fn run(calls: usize, other: Other) -> Result<f64, String> {
    let pool = Arc::new(
        HostPool::new("stats row", PoolConfig::new(PoolKind::Caching))
            .map_err(|e| e.to_string())?,
    );
    // This thread's own magazine too: a reading always meets it.
    drop(pool.alloc(4096).map_err(|e| e.to_string())?);
    let stop = Arc::new(AtomicBool::new(false));
    let ready = Arc::new(Barrier::new(2));
    let helper = (other != Other::None).then(|| {
        let (pool, stop, ready) = (pool.clone(), stop.clone(), ready.clone());
        std::thread::spawn(move || {
            // A magazine of the pool for this thread.
            drop(pool.alloc(4096));
            ready.wait();
            while !stop.load(Ordering::Relaxed) {
                match other {
                    Other::Allocating => drop(black_box(pool.alloc(4096))),
                    _ => std::thread::sleep(Duration::from_millis(1)),
                }
            }
        })
    });
    if helper.is_some() {
        ready.wait();
    }
    let start = Instant::now();
    for _ in 0..calls {
        black_box(pool.stats());
    }
    let ns = start.elapsed().as_nanos() as f64 / calls as f64;
    stop.store(true, Ordering::Relaxed);
    if let Some(h) = helper {
        h.join()
            .map_err(|_| "the second thread panicked".to_string())?;
    }
    Ok(ns)
}

fn main() -> Result<(), String> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().map_err(|e| format!("{a}: {e}")))
        .collect::<Result<_, _>>()?;
    let calls = args.first().copied().unwrap_or(200_000);
    let runs = args.get(1).copied().unwrap_or(5).max(1);
    println!("load before: {}", load());
    for (name, other) in [
        ("alone", Other::None),
        (
            "another thread's magazine, the thread asleep",
            Other::Asleep,
        ),
        (
            "another thread's magazine, the thread allocating",
            Other::Allocating,
        ),
    ] {
        let mut ns = (0..runs)
            .map(|_| run(calls, other))
            .collect::<Result<Vec<_>, _>>()?;
        ns.sort_by(f64::total_cmp);
        println!(
            "HostPool::stats, {name}: {:.0} ns a call (runs {:.0} to {:.0})",
            ns[ns.len() / 2],
            ns[0],
            ns[ns.len() - 1]
        );
    }
    println!("load after: {}", load());
    Ok(())
}
