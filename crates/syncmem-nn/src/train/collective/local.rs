//! [`Local`]: the ranks of a job as threads of one process.

use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use syncmem::{Error, Result};

use super::{check_lengths, Collective};

/// What a call contributes and how the contributions combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    SumF32,
    SumF64,
    GatherU64,
}

#[derive(Debug)]
struct State {
    /// Completed calls; a waiting rank waits for this to move.
    generation: u64,
    /// Each rank's contribution to the call in progress (`f32` and `f64` as their bits).
    inputs: Vec<Option<(Kind, Vec<u64>)>>,
    arrived: usize,
    /// The last completed call's result.
    result: Result<Vec<u64>>,
    /// Set by [`Collective::abort`]: every call fails from then on.
    failed: Option<String>,
}

#[derive(Debug)]
struct Group {
    size: usize,
    state: Mutex<State>,
    done: Condvar,
}

/// One rank of a group of ranks that are threads of one process ([`Local::group`]): each
/// thread calls its own rank's methods. A model of a distributed job without MPI, for tests and
/// for trying the distributed trainer on one machine; the sums are computed in rank order.
#[derive(Clone)]
pub struct Local {
    rank: usize,
    group: Arc<Group>,
}

impl fmt::Debug for Local {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Local(rank {} of {})", self.rank, self.group.size)
    }
}

impl Local {
    /// A group of `size` ranks (at least 1): element `r` is rank `r`.
    pub fn group(size: usize) -> Vec<Local> {
        let size = size.max(1);
        let group = Arc::new(Group {
            size,
            state: Mutex::new(State {
                generation: 0,
                inputs: vec![None; size],
                arrived: 0,
                result: Ok(Vec::new()),
                failed: None,
            }),
            done: Condvar::new(),
        });
        (0..size)
            .map(|rank| Local {
                rank,
                group: group.clone(),
            })
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A rank that panicked while holding the lock leaves nothing half-written that the
        // others could misread: every field is replaced whole.
        self.group
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Contributes `data` to the call every rank makes and returns the combined result.
    fn exchange(&self, kind: Kind, data: Vec<u64>) -> Result<Vec<u64>> {
        let mut st = self.lock();
        if let Some(reason) = &st.failed {
            return Err(failed(reason));
        }
        let generation = st.generation;
        st.inputs[self.rank] = Some((kind, data));
        st.arrived += 1;
        if st.arrived == self.group.size {
            st.result = combine(&st.inputs);
            st.inputs.iter_mut().for_each(|slot| *slot = None);
            st.arrived = 0;
            st.generation += 1;
            self.group.done.notify_all();
        } else {
            while st.generation == generation && st.failed.is_none() {
                st = self
                    .group
                    .done
                    .wait(st)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
        }
        if st.generation == generation {
            // Woken by an abort before the call completed.
            return Err(failed(st.failed.as_deref().unwrap_or("aborted")));
        }
        match &st.result {
            Ok(v) => Ok(v.clone()),
            Err(e) => Err(Error::InvalidState {
                op: "Local collective",
                buffer: format!("rank {}", self.rank),
                reason: e.to_string(),
            }),
        }
    }
}

fn failed(reason: &str) -> Error {
    Error::InvalidState {
        op: "Local collective",
        buffer: "the group of ranks".into(),
        reason: format!("the job was aborted: {reason}"),
    }
}

/// The result of one call from every rank's contribution, in rank order.
fn combine(inputs: &[Option<(Kind, Vec<u64>)>]) -> Result<Vec<u64>> {
    let Some(Some((kind, first))) = inputs.first() else {
        return Ok(Vec::new());
    };
    for (r, slot) in inputs.iter().enumerate() {
        let Some((k, v)) = slot else {
            return Err(mismatch(format!("rank {r} made no call")));
        };
        if k != kind || v.len() != first.len() {
            return Err(mismatch(format!(
                "rank 0 called {kind:?} with {} values, rank {r} {k:?} with {}",
                first.len(),
                v.len()
            )));
        }
    }
    let all = inputs.iter().flatten().map(|(_, v)| v);
    Ok(match kind {
        Kind::GatherU64 => all.flatten().copied().collect(),
        Kind::SumF32 => {
            let mut sum = vec![0.0f32; first.len()];
            for v in all {
                for (s, &b) in sum.iter_mut().zip(v) {
                    *s += f32::from_bits(b as u32);
                }
            }
            sum.iter().map(|s| u64::from(s.to_bits())).collect()
        }
        Kind::SumF64 => {
            let mut sum = vec![0.0f64; first.len()];
            for v in all {
                for (s, &b) in sum.iter_mut().zip(v) {
                    *s += f64::from_bits(b);
                }
            }
            sum.iter().map(|s| s.to_bits()).collect()
        }
    })
}

fn mismatch(reason: String) -> Error {
    Error::InvalidState {
        op: "Local collective",
        buffer: "the group of ranks".into(),
        reason: format!("the ranks made different calls: {reason}"),
    }
}

impl Collective for Local {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.group.size
    }

    fn describe(&self) -> String {
        format!("threads of one process, {} ranks", self.group.size)
    }

    fn all_reduce_sum(&self, send: &[f32], recv: &mut [f32]) -> Result<()> {
        check_lengths("all_reduce_sum", send.len(), recv.len())?;
        recv.copy_from_slice(send);
        self.all_reduce_sum_in_place(recv)
    }

    fn all_reduce_sum_in_place(&self, values: &mut [f32]) -> Result<()> {
        let data = values.iter().map(|v| u64::from(v.to_bits())).collect();
        let sum = self.exchange(Kind::SumF32, data)?;
        for (r, b) in values.iter_mut().zip(sum) {
            *r = f32::from_bits(b as u32);
        }
        Ok(())
    }

    fn all_reduce_sum_f64(&self, send: &[f64], recv: &mut [f64]) -> Result<()> {
        check_lengths("all_reduce_sum_f64", send.len(), recv.len())?;
        let sum = self.exchange(Kind::SumF64, send.iter().map(|v| v.to_bits()).collect())?;
        for (r, b) in recv.iter_mut().zip(sum) {
            *r = f64::from_bits(b);
        }
        Ok(())
    }

    fn all_gather_u64(&self, values: &[u64]) -> Result<Vec<u64>> {
        self.exchange(Kind::GatherU64, values.to_vec())
    }

    fn abort(&self, code: i32, reason: &str) {
        let mut st = self.lock();
        if st.failed.is_none() {
            st.failed = Some(format!(
                "rank {} ended the job ({code}): {reason}",
                self.rank
            ));
        }
        self.group.done.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn different_lengths_on_two_ranks_are_an_error_on_both() {
        let ranks = Local::group(2);
        let errors: Vec<String> = std::thread::scope(|s| {
            let handles: Vec<_> = ranks
                .iter()
                .map(|c| {
                    s.spawn(move || {
                        let n = 2 + c.rank();
                        let mut out = vec![0.0f32; n];
                        c.all_reduce_sum(&vec![1.0; n], &mut out)
                            .unwrap_err()
                            .to_string()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for e in errors {
            assert!(e.contains("different calls"), "{e}");
        }
    }

    /// A collective that keeps the provided in-place sum (a copy, then the plain sum).
    #[derive(Debug)]
    struct Plain(Local);

    impl Collective for Plain {
        fn rank(&self) -> usize {
            self.0.rank()
        }
        fn size(&self) -> usize {
            self.0.size()
        }
        fn describe(&self) -> String {
            self.0.describe()
        }
        fn all_reduce_sum(&self, send: &[f32], recv: &mut [f32]) -> Result<()> {
            self.0.all_reduce_sum(send, recv)
        }
        fn all_reduce_sum_f64(&self, send: &[f64], recv: &mut [f64]) -> Result<()> {
            self.0.all_reduce_sum_f64(send, recv)
        }
        fn all_gather_u64(&self, values: &[u64]) -> Result<Vec<u64>> {
            self.0.all_gather_u64(values)
        }
        fn abort(&self, code: i32, reason: &str) {
            self.0.abort(code, reason);
        }
    }

    #[test]
    fn in_place_sums_match_the_sums_into_a_receive_buffer() {
        let ranks = Local::group(3);
        let values = |rank: usize| -> Vec<f32> {
            (0..37)
                .map(|i| (i as f32 * 0.37 + rank as f32).sin())
                .collect()
        };
        let sums: Vec<[Vec<f32>; 3]> = std::thread::scope(|s| {
            let handles: Vec<_> = ranks
                .iter()
                .map(|c| {
                    s.spawn(move || {
                        let mine = values(c.rank());
                        let mut into = vec![0.0f32; mine.len()];
                        c.all_reduce_sum(&mine, &mut into).unwrap();
                        let mut local = mine.clone();
                        c.all_reduce_sum_in_place(&mut local).unwrap();
                        let mut provided = mine.clone();
                        Plain(c.clone())
                            .all_reduce_sum_in_place(&mut provided)
                            .unwrap();
                        [into, local, provided]
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let expected: Vec<f32> = (0..37)
            .map(|i| values(0)[i] + values(1)[i] + values(2)[i])
            .collect();
        for [into, local, provided] in sums {
            assert_eq!(into, expected);
            assert_eq!(local, expected);
            assert_eq!(provided, expected);
        }
    }

    #[test]
    fn an_abort_wakes_a_rank_waiting_in_a_call() {
        let ranks = Local::group(2);
        let (a, b) = (ranks[0].clone(), ranks[1].clone());
        let waiting = std::thread::spawn(move || a.all_gather_u64(&[1]).unwrap_err().to_string());
        std::thread::sleep(std::time::Duration::from_millis(20));
        b.abort(3, "out of memory");
        let e = waiting.join().unwrap();
        assert!(e.contains("rank 1 ended the job (3): out of memory"), "{e}");
        // Every later call fails too.
        assert!(b.all_gather_u64(&[1]).is_err());
    }
}
