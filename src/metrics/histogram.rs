//! Latency histograms: log-linear buckets (pure arithmetic, no I/O).
//!
//! A value `v` (nanoseconds) falls in one of [`BUCKETS`] buckets:
//!
//! ```text
//!  v < 16                    bucket v                (exact)
//!  v in [2^m, 2^(m+1)), m>=4 bucket 16 + (m-4)*16 + (v >> (m-4)) & 15
//!                            (16 buckets per power of two: <= 6.25% wide)
//!  v >= 2^40 ns (~18 min)    the last bucket
//! ```
//!
//! Two histograms merge by adding bucket counts, so per-connection
//! histograms fold into a drive's without losing precision, and a window's
//! histogram is the difference of two snapshots. Quantiles report the upper
//! bound of the bucket holding the rank: never below the true value, at most
//! 6.25% above it.
//!
//! [`AtomicHistogram`] is the recording side: written by exactly one thread
//! (its connection), read by scrapes. Single-writer means an update is a
//! relaxed load and store (plain moves on x86), not a locked read-modify-write.

use std::sync::atomic::{AtomicU64, Ordering};

/// Sub-buckets per power of two (as a shift): 16.
const SUB_BITS: u32 = 4;
const SUB: usize = 1 << SUB_BITS;
/// Largest exponent tracked; larger values land in the last bucket.
const MAX_EXP: u32 = 40;
/// Number of buckets.
pub const BUCKETS: usize = SUB + (MAX_EXP as usize - SUB_BITS as usize + 1) * SUB;

/// The bucket of a value in nanoseconds.
#[inline]
pub fn bucket_of(v: u64) -> usize {
    if v < SUB as u64 {
        return v as usize;
    }
    let m = 63 - v.leading_zeros();
    if m > MAX_EXP {
        return BUCKETS - 1;
    }
    let shift = m - SUB_BITS;
    SUB + (shift as usize) * SUB + ((v >> shift) as usize & (SUB - 1))
}

/// The largest value that falls in bucket `i`.
pub fn bucket_upper(i: usize) -> u64 {
    if i < SUB {
        return i as u64;
    }
    if i >= BUCKETS - 1 {
        return u64::MAX;
    }
    let shift = ((i - SUB) / SUB) as u32;
    let sub = ((i - SUB) % SUB) as u64;
    // Values with exponent m = shift + SUB_BITS and top bits 1sub.
    let base = (SUB as u64 + sub) << shift;
    base + (1u64 << shift) - 1
}

/// A plain histogram: a snapshot, a sum of snapshots or a difference.
/// Serialized to hand a drive's counts to the next serving process.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Histogram {
    /// Count per bucket.
    pub counts: Box<[u64]>,
    /// Sum of every recorded value (ns), for means and Prometheus `_sum`.
    pub sum_ns: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; BUCKETS].into_boxed_slice(),
            sum_ns: 0,
        }
    }
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Histogram(count {}, sum {} ns)",
            self.count(),
            self.sum_ns
        )
    }
}

impl Histogram {
    /// Records `n` values of `v` ns.
    pub fn record_n(&mut self, v: u64, n: u64) {
        self.counts[bucket_of(v)] += n;
        self.sum_ns = self.sum_ns.wrapping_add(v.wrapping_mul(n));
    }

    /// True when it has this build's buckets (a deserialized one may not).
    pub fn is_well_formed(&self) -> bool {
        self.counts.len() == BUCKETS
    }

    /// Number of recorded values.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Adds another histogram's counts.
    pub fn add(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.sum_ns = self.sum_ns.wrapping_add(other.sum_ns);
    }

    /// The counts recorded since `earlier` (a snapshot of the same source).
    pub fn since(&self, earlier: &Histogram) -> Histogram {
        Histogram {
            counts: self
                .counts
                .iter()
                .zip(earlier.counts.iter())
                .map(|(a, b)| a.saturating_sub(*b))
                .collect(),
            sum_ns: self.sum_ns.wrapping_sub(earlier.sum_ns),
        }
    }

    /// The value at quantile `q` (0..=1) in ns: the upper bound of the
    /// bucket holding that rank. None when empty.
    pub fn quantile_ns(&self, q: f64) -> Option<u64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        // The rank (1-based) of the value at q: ceil(q * total), at least 1.
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(bucket_upper(i));
            }
        }
        Some(bucket_upper(BUCKETS - 1))
    }

    /// Cumulative counts at each of `bounds_ns` (ascending): how many values
    /// are <= each bound, as Prometheus `le` buckets want. Exact when every
    /// bound is a bucket's upper bound (the powers of two minus one are).
    pub fn cumulative_at(&self, bounds_ns: &[u64]) -> Vec<u64> {
        let mut out = Vec::with_capacity(bounds_ns.len());
        let mut seen = 0u64;
        let mut i = 0usize;
        for &b in bounds_ns {
            while i < BUCKETS && bucket_upper(i) <= b {
                seen += self.counts[i];
                i += 1;
            }
            out.push(seen);
        }
        out
    }
}

/// The recording side of a histogram, written by one thread only.
pub struct AtomicHistogram {
    counts: Box<[AtomicU64]>,
    sum_ns: AtomicU64,
}

impl Default for AtomicHistogram {
    fn default() -> Self {
        AtomicHistogram {
            counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
        }
    }
}

impl AtomicHistogram {
    /// Records `n` values of `v` ns. Only the owning thread may call this:
    /// the load-then-store is not atomic against another writer.
    #[inline]
    pub fn record_n_single_writer(&self, v: u64, n: u64) {
        let c = &self.counts[bucket_of(v)];
        c.store(c.load(Ordering::Relaxed) + n, Ordering::Relaxed);
        let s = self.sum_ns.load(Ordering::Relaxed);
        self.sum_ns
            .store(s.wrapping_add(v.wrapping_mul(n)), Ordering::Relaxed);
    }

    /// Adds the current counts into `into`.
    pub fn add_to(&self, into: &mut Histogram) {
        for (a, b) in into.counts.iter_mut().zip(self.counts.iter()) {
            *a += b.load(Ordering::Relaxed);
        }
        into.sum_ns = into
            .sum_ns
            .wrapping_add(self.sum_ns.load(Ordering::Relaxed));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_tight() {
        // Every bucket starts right after the previous one ends.
        let mut lower = 0u64;
        for i in 0..BUCKETS - 1 {
            assert_eq!(bucket_of(lower), i, "lower bound {lower} of bucket {i}");
            let upper = bucket_upper(i);
            assert_eq!(bucket_of(upper), i, "upper bound {upper} of bucket {i}");
            // Width at most 1/16 of the lower bound (6.25%).
            assert!(upper - lower < (lower / 16).max(1), "bucket {i} too wide");
            lower = upper + 1;
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        assert_eq!(bucket_of(1 << 41), BUCKETS - 1);
    }

    #[test]
    fn quantiles_bound_the_truth_within_6_percent() {
        let mut h = Histogram::default();
        for v in 1..=10_000u64 {
            h.record_n(v * 1000, 1);
        }
        assert_eq!(h.count(), 10_000);
        for (q, truth) in [(0.5, 5_000_000u64), (0.9, 9_000_000), (0.99, 9_900_000)] {
            let got = h.quantile_ns(q).unwrap();
            assert!(
                got >= truth && got <= truth + truth / 16,
                "q{q}: {got} vs {truth}"
            );
        }
        assert_eq!(Histogram::default().quantile_ns(0.5), None);
        assert_eq!(h.sum_ns, (1..=10_000u64).map(|v| v * 1000).sum::<u64>());
    }

    #[test]
    fn merge_and_difference() {
        let (mut a, mut b) = (Histogram::default(), Histogram::default());
        a.record_n(100, 3);
        b.record_n(5000, 2);
        let mut sum = a.clone();
        sum.add(&b);
        assert_eq!(sum.count(), 5);
        assert_eq!(sum.since(&a), b);
        assert_eq!(sum.cumulative_at(&[127, 8191, u64::MAX]), vec![3, 5, 5]);
    }

    #[test]
    fn atomic_records_like_plain() {
        let a = AtomicHistogram::default();
        let mut plain = Histogram::default();
        for (v, n) in [(7u64, 1u64), (1_000, 5), (123_456_789, 2)] {
            a.record_n_single_writer(v, n);
            plain.record_n(v, n);
        }
        let mut snap = Histogram::default();
        a.add_to(&mut snap);
        assert_eq!(snap, plain);
    }
}
