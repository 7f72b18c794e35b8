//! What a test measured, and its figures with fio's conventions (pure).
//!
//! A job records every completed I/O into a [`Recorder`]: per direction a
//! latency histogram (`metrics::histogram`: log-linear buckets at most
//! 6.25% wide, so a percentile is never below the truth and at most 6.25%
//! above it), the exact sum, minimum and maximum, and the bytes moved.
//! Jobs merge their recorders by adding them, losing nothing.
//!
//! The figures follow fio: IOPS is completed I/Os divided by the measured
//! time, MiB/s is bytes / 2^20 divided by it, latency is `lat` (submission
//! to completion: for these engines fio's `clat` plus a sub-microsecond
//! `slat`), and the percentile list is fio's default one. The histogram
//! bucket chosen for a percentile follows fio too: the smallest value
//! with at least `ceil(p * n)` I/Os at or below it.

use std::time::Duration;

use crate::api::wire::bench::{BenchDirection, BenchLatency};
use crate::metrics::histogram::{bucket_upper, Histogram};

/// fio's default `percentile_list`.
pub const FIO_PERCENTILES: [f64; 17] = [
    1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95,
    99.99,
];

/// I/Os of one direction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DirStats {
    pub hist: Histogram,
    pub ios: u64,
    pub bytes: u64,
    pub max_ns: u64,
}

impl DirStats {
    #[inline]
    pub fn record(&mut self, latency_ns: u64, bytes: u64) {
        self.hist.record_n(latency_ns, 1);
        self.ios += 1;
        self.bytes += bytes;
        self.max_ns = self.max_ns.max(latency_ns);
    }

    pub fn add(&mut self, other: &DirStats) {
        self.hist.add(&other.hist);
        self.ios += other.ios;
        self.bytes += other.bytes;
        self.max_ns = self.max_ns.max(other.max_ns);
    }

    /// Mean and percentiles in microseconds (zeros when empty).
    pub fn latency(&self) -> BenchLatency {
        let q = |p: f64| us(self.hist.quantile_ns(p).unwrap_or(0).min(self.max_ns));
        let mean = if self.ios == 0 {
            0.0
        } else {
            self.hist.sum_ns as f64 / self.ios as f64 / 1000.0
        };
        BenchLatency {
            mean: round2(mean),
            p50: q(0.50),
            p95: q(0.95),
            p99: q(0.99),
            p99_9: q(0.999),
            max: us(self.max_ns),
        }
    }

    /// IOPS, MiB/s and latency over `elapsed`.
    pub fn direction(&self, elapsed: Duration) -> BenchDirection {
        let secs = elapsed.as_secs_f64().max(1e-9);
        BenchDirection {
            iops: round2(self.ios as f64 / secs),
            mib_s: round2(self.bytes as f64 / secs / (1u64 << 20) as f64),
            ios: self.ios,
            bytes: self.bytes,
            lat_us: self.latency(),
        }
    }
}

/// Everything one test measured on one target (all its jobs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recorder {
    pub read: DirStats,
    pub write: DirStats,
    /// Other operations of the file-level test (deletes): in the totals,
    /// in neither direction.
    pub other: DirStats,
    /// I/Os that failed.
    pub errors: u64,
}

impl Recorder {
    pub fn add(&mut self, other: &Recorder) {
        self.read.add(&other.read);
        self.write.add(&other.write);
        self.other.add(&other.other);
        self.errors += other.errors;
    }

    /// Every I/O, whatever its direction.
    pub fn total(&self) -> DirStats {
        let mut t = self.read.clone();
        t.add(&self.write);
        t.add(&self.other);
        t
    }
}

/// fio's percentile list as `[percentile, us]` pairs.
pub fn percentiles(d: &DirStats) -> Vec<[f64; 2]> {
    if d.ios == 0 {
        return Vec::new();
    }
    FIO_PERCENTILES
        .iter()
        .map(|&p| {
            let ns = d.hist.quantile_ns(p / 100.0).unwrap_or(0).min(d.max_ns);
            [p, us(ns)]
        })
        .collect()
}

/// The non-empty buckets as `[upper bound us, count]`, ascending (the
/// last bucket's bound is the exact maximum).
pub fn histogram_us(d: &DirStats) -> Vec<[f64; 2]> {
    d.hist
        .counts
        .iter()
        .enumerate()
        .filter(|(_, &c)| c > 0)
        .map(|(i, &c)| [us(bucket_upper(i).min(d.max_ns)), c as f64])
        .collect()
}

/// Nanoseconds as microseconds with 3 decimals (nanosecond resolution).
fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_follow_fio() {
        let mut r = Recorder::default();
        // 1000 reads of 10..=10_000 us, 4 KiB each, over 2 s.
        for i in 1..=1000u64 {
            r.read.record(i * 10_000, 4096);
        }
        r.write.record(5_000_000, 4096);
        let d = r.read.direction(Duration::from_secs(2));
        assert_eq!(d.iops, 500.0);
        assert_eq!(d.ios, 1000);
        assert!((d.mib_s - 1000.0 * 4096.0 / 2.0 / 1048576.0).abs() < 0.01);
        let l = d.lat_us;
        assert!((l.mean - 5005.0).abs() < 0.01, "{l:?}");
        // Percentiles bound the truth from above within 6.25%.
        for (got, truth) in [(l.p50, 5000.0), (l.p99, 9900.0), (l.p99_9, 9990.0)] {
            assert!(got >= truth && got <= truth * 1.0625, "{got} vs {truth}");
        }
        assert_eq!(l.max, 10_000.0);
        let t = r.total();
        assert_eq!(t.ios, 1001);
        assert_eq!(t.max_ns, 10_000_000);
    }

    #[test]
    fn merging_loses_nothing_and_lists_are_ordered() {
        let (mut a, mut b) = (Recorder::default(), Recorder::default());
        a.read.record(1_000, 4096);
        b.read.record(100_000, 4096);
        b.errors = 1;
        let mut sum = a.clone();
        sum.add(&b);
        assert_eq!(sum.read.ios, 2);
        assert_eq!(sum.errors, 1);
        let p = percentiles(&sum.read);
        assert_eq!(p.len(), FIO_PERCENTILES.len());
        assert!(p.windows(2).all(|w| w[0][1] <= w[1][1]));
        let h = histogram_us(&sum.read);
        assert_eq!(h.len(), 2);
        assert_eq!(h[1], [100.0, 1.0]);
        assert!(percentiles(&DirStats::default()).is_empty());
        assert_eq!(DirStats::default().latency().p99, 0.0);
    }
}
