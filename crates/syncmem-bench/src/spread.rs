//! The spread of a row's samples and the verdict on its goal.
//!
//! A comparison takes several samples of each side, sample `i` of ours and sample `i` of the
//! baseline back to back (alternating), so that a change of the machine's load between samples
//! moves both. The row reports the ratio of the medians (`baseline / ours`) and, as its spread,
//! the interquartile range of the per-sample ratios `base[i] / ours[i]` (the middle half of
//! them: one sample disturbed by another process does not widen it), widened to include the
//! ratio of the medians where that falls outside (it can: the two medians need not come from
//! the same pair). A row whose spread lies above its goal has met it, one whose spread lies
//! below has not, and one whose spread straddles it is within noise.

use serde::Serialize;

/// Per-call times (nanoseconds) of the samples of one comparison: `ours[i]` and `base[i]`
/// were taken back to back.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Samples {
    /// Ours, per sample.
    pub ours: Vec<f64>,
    /// The baseline, per sample.
    pub base: Vec<f64>,
}

impl Samples {
    /// Samples of two lists taken in turn (pairs by index; extra ones of the longer are
    /// dropped from the spread, not from the medians).
    pub fn new(ours: Vec<f64>, base: Vec<f64>) -> Self {
        Samples { ours, base }
    }

    /// The median of each side (0 for an empty side).
    pub fn medians(&self) -> (f64, f64) {
        (median(self.ours.clone()), median(self.base.clone()))
    }

    /// The row `name` of these samples: medians, their ratio and its spread.
    pub fn row(&self, name: &str, ours: &str, baseline: &str) -> crate::Row {
        let (o, b) = self.medians();
        let mut row = crate::Row::new(name, ours, baseline, o, b);
        let (low, high) = self.spread(row.ratio);
        row.ratio_low = low;
        row.ratio_high = high;
        row.samples = self.ours.len().min(self.base.len());
        row
    }

    /// The interquartile range of the per-sample ratios, widened to include `ratio`.
    pub fn spread(&self, ratio: f64) -> (f64, f64) {
        let mut r: Vec<f64> = self
            .ours
            .iter()
            .zip(&self.base)
            .map(|(o, b)| b / o.max(1e-9))
            .collect();
        if r.is_empty() {
            return (ratio, ratio);
        }
        r.sort_by(f64::total_cmp);
        let k = r.len() / 4;
        (r[k].min(ratio), r[r.len() - 1 - k].max(ratio))
    }
}

/// The median of `v` (0 for an empty list).
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// What the samples of a row with a goal say about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Verdict {
    /// The whole spread is at or above the goal.
    #[serde(rename = "met")]
    Met,
    /// The whole spread is below the goal.
    #[serde(rename = "not met")]
    NotMet,
    /// The spread straddles the goal: the samples do not decide.
    #[serde(rename = "within noise")]
    WithinNoise,
}

impl Verdict {
    /// The verdict on `goal` of a spread from `low` to `high`.
    pub fn of(low: f64, high: f64, goal: f64) -> Self {
        if low >= goal {
            Verdict::Met
        } else if high < goal {
            Verdict::NotMet
        } else {
            Verdict::WithinNoise
        }
    }

    /// The verdict on a ceiling `goal` (the ratio must not exceed it) of a spread from `low`
    /// to `high`.
    pub fn of_at_most(low: f64, high: f64, goal: f64) -> Self {
        if high <= goal {
            Verdict::Met
        } else if low > goal {
            Verdict::NotMet
        } else {
            Verdict::WithinNoise
        }
    }

    /// `met`, `NOT met` or `within noise`, as the table prints it.
    pub fn text(self) -> &'static str {
        match self {
            Verdict::Met => "met",
            Verdict::NotMet => "NOT met",
            Verdict::WithinNoise => "within noise",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spread_is_the_middle_half_of_the_paired_ratios() {
        // Ratios 1..=8 and one disturbed sample (ratio 100): quartiles of 9 values, k = 2.
        let ours = vec![10.0; 9];
        let base: Vec<f64> = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 100.0]
            .iter()
            .map(|r| r * 10.0)
            .collect();
        let s = Samples::new(ours, base);
        let row = s.row("x", "a", "b");
        assert_eq!(row.ratio, 5.0);
        assert_eq!((row.ratio_low, row.ratio_high), (3.0, 7.0));
        assert_eq!(row.samples, 9);
    }

    #[test]
    fn the_spread_always_holds_the_ratio_of_the_medians() {
        // Medians from different pairs: ours' median 1 (of 6, 1, 1, 1), the baseline's 7 (of
        // 9, 1, 7, 4): ratio 7, while the paired ratios 1.5, 1, 7, 4 have the middle 1.5..4.
        let s = Samples::new(vec![6.0, 1.0, 1.0, 1.0], vec![9.0, 1.0, 7.0, 4.0]);
        let row = s.row("x", "a", "b");
        assert_eq!(row.ratio, 7.0);
        assert_eq!((row.ratio_low, row.ratio_high), (1.5, 7.0));
    }

    #[test]
    fn a_single_sample_has_no_spread() {
        let row = Samples::new(vec![2.0], vec![4.0]).row("x", "a", "b");
        assert_eq!((row.ratio_low, row.ratio, row.ratio_high), (2.0, 2.0, 2.0));
    }

    #[test]
    fn verdicts_follow_the_spread() {
        assert_eq!(Verdict::of(1.0, 1.2, 1.0), Verdict::Met);
        assert_eq!(Verdict::of(0.8, 0.99, 1.0), Verdict::NotMet);
        assert_eq!(Verdict::of(0.9, 1.1, 1.0), Verdict::WithinNoise);
        assert_eq!(Verdict::of(0.9, 1.0, 1.0), Verdict::WithinNoise);
        assert_eq!(Verdict::of_at_most(0.5, 1.3, 1.3), Verdict::Met);
        assert_eq!(Verdict::of_at_most(1.31, 2.0, 1.3), Verdict::NotMet);
        assert_eq!(Verdict::of_at_most(1.2, 1.4, 1.3), Verdict::WithinNoise);
        assert_eq!(
            serde_json::to_string(&Verdict::WithinNoise).unwrap(),
            "\"within noise\""
        );
    }
}
