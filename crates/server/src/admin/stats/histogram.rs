//! A latency histogram with log-spaced buckets (each ~9% wider than the last), fine enough that
//! p50/p95 of inter-token latencies (a few ms apart) stay meaningful; Prometheus's export
//! buckets (5 ms, 10 ms, 25 ms, …) are too coarse for that.

use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bound of bucket 0, in seconds.
const FIRST_BOUND: f64 = 0.000_5;
/// Buckets per doubling.
const PER_OCTAVE: f64 = 8.0;
/// 0.5 ms · 2^(150/8) ≈ 220 s; anything slower lands in the last bucket.
pub(crate) const BUCKETS: usize = 151;

/// The bucket a value in seconds falls in: the first whose upper bound is ≥ it.
pub(crate) fn bucket_of(seconds: f64) -> usize {
    if seconds.is_nan() || seconds <= FIRST_BOUND {
        return 0;
    }
    let i = (PER_OCTAVE * (seconds / FIRST_BOUND).log2()).ceil();
    (i as usize).min(BUCKETS - 1)
}

pub(crate) fn upper_bound(bucket: usize) -> f64 {
    FIRST_BOUND * 2f64.powf(bucket as f64 / PER_OCTAVE)
}

/// Cumulative counts per bucket, written by the recorder from any thread.
pub(crate) struct AtomicHistogram {
    counts: Vec<AtomicU64>,
}

impl Default for AtomicHistogram {
    fn default() -> Self {
        Self { counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect() }
    }
}

impl AtomicHistogram {
    pub(crate) fn record(&self, seconds: f64) {
        self.counts[bucket_of(seconds)].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> Vec<u64> {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect()
    }
}

/// Counts per bucket observed over some span (differences of snapshots), kept sparse since
/// latencies cluster in a few buckets.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Counts(pub Vec<(u16, u64)>);

impl Counts {
    /// What was observed between two cumulative snapshots.
    pub(crate) fn between(before: &[u64], after: &[u64]) -> Self {
        let mut out = Vec::new();
        for (i, (b, a)) in before.iter().zip(after).enumerate() {
            if a > b {
                out.push((i as u16, a - b));
            }
        }
        Self(out)
    }

    pub(crate) fn add(&mut self, other: &Counts) {
        let mut dense = [0u64; BUCKETS];
        for &(i, n) in self.0.iter().chain(&other.0) {
            dense[i as usize] += n;
        }
        self.0 = dense.iter().enumerate().filter(|(_, n)| **n > 0).map(|(i, n)| (i as u16, *n)).collect();
    }

    pub(crate) fn total(&self) -> u64 {
        self.0.iter().map(|(_, n)| n).sum()
    }

    /// The `q`-quantile (0..1) as its bucket's upper bound, or `None` with no observations.
    pub(crate) fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.total();
        if total == 0 {
            return None;
        }
        let rank = (q * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for &(i, n) in &self.0 {
            seen += n;
            if seen >= rank {
                return Some(upper_bound(i as usize));
            }
        }
        self.0.last().map(|&(i, _)| upper_bound(i as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_within_ten_percent() {
        for v in [0.001, 0.0123, 0.02, 0.25, 3.0, 42.0] {
            let b = bucket_of(v);
            assert!(upper_bound(b) >= v && upper_bound(b) < v * 1.1, "{v} → bucket {b} ≤ {}", upper_bound(b));
        }
        assert_eq!(bucket_of(0.0), 0);
        assert_eq!(bucket_of(1e9), BUCKETS - 1);
    }

    #[test]
    fn quantiles_of_a_span() {
        let h = AtomicHistogram::default();
        let before = h.snapshot();
        for _ in 0..90 {
            h.record(0.010);
        }
        for _ in 0..10 {
            h.record(1.0);
        }
        let counts = Counts::between(&before, &h.snapshot());
        assert_eq!(counts.total(), 100);
        let p50 = counts.quantile(0.5).unwrap();
        assert!((0.010..0.011).contains(&p50), "{p50}");
        let p95 = counts.quantile(0.95).unwrap();
        assert!((1.0..1.1).contains(&p95), "{p95}");
        assert_eq!(Counts::default().quantile(0.5), None);
        let mut sum = counts.clone();
        sum.add(&counts);
        assert_eq!(sum.total(), 200);
        assert_eq!(sum.quantile(0.5), counts.quantile(0.5));
    }
}
