//! Cache counters and the snapshot the daemon shows (`ramd stats`, the API
//! and /metrics).
//!
//! Counters are striped: each thread adds to one of several cache-line
//! aligned copies, picked once per thread, so connections on different CPUs
//! never bounce a shared line on the hit path. A snapshot sums the stripes;
//! it is not atomic across counters, which is fine for monitoring.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::config::Mode;
use super::health::HealthSnapshot;
use super::policy::PolicyKind;

/// The counters, by index into a stripe.
#[derive(Debug, Clone, Copy)]
#[repr(usize)]
pub enum Ctr {
    /// Blocks read from the cache.
    ReadHits,
    /// Blocks read that had to come from the backing.
    ReadMisses,
    /// Blocks written that were cached already.
    WriteHits,
    /// Blocks written that were not cached.
    WriteMisses,
    /// Valid blocks dropped to make room.
    Evictions,
    /// Cached blocks dropped because the data changed underneath
    /// (write-around, zero, trim).
    Invalidations,
    /// Bytes written back to the backing (write-back mode).
    WritebackBytes,
    /// Requests that bypassed the cache (sequential cutoff or no room).
    BypassedRequests,
    /// Bytes of those requests.
    BypassedBytes,
    /// Bytes read from the backing.
    BackingReadBytes,
    /// Bytes written to the backing.
    BackingWriteBytes,
    /// Slot memory given back to the host under memory pressure.
    GivenBackBytes,
}

const COUNTERS: usize = 12;
const STRIPES: usize = 16;

#[repr(align(128))]
struct Stripe([AtomicU64; COUNTERS]);

/// Striped event counters.
pub struct Counters {
    stripes: Box<[Stripe]>,
}

static NEXT_STRIPE: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    static MY_STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// This thread's stripe number (assigned on first use, round robin).
pub(crate) fn my_stripe() -> usize {
    MY_STRIPE.with(|s| {
        let v = s.get();
        if v != usize::MAX {
            return v;
        }
        let v = NEXT_STRIPE.fetch_add(1, Ordering::Relaxed) % STRIPES;
        s.set(v);
        v
    })
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            stripes: (0..STRIPES)
                .map(|_| Stripe(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
        }
    }
}

impl Counters {
    #[inline]
    pub fn add(&self, c: Ctr, n: u64) {
        if n > 0 {
            self.stripes[my_stripe()].0[c as usize].fetch_add(n, Ordering::Relaxed);
        }
    }

    pub fn get(&self, c: Ctr) -> u64 {
        self.stripes
            .iter()
            .map(|s| s.0[c as usize].load(Ordering::Relaxed))
            .sum()
    }
}

/// A point-in-time view of a cache, for `ramd info` / `ramd stats`, the
/// API and /metrics. Counters are totals since the cache was created.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheStats {
    pub mode: Mode,
    pub policy: PolicyKind,
    pub block_bytes: u64,
    /// The export's size: the backing's.
    pub size_bytes: u64,
    /// RAM the cache may use for data.
    pub capacity_bytes: u64,
    /// RAM holding cached blocks now.
    pub resident_bytes: u64,
    /// RAM the cache holds now: slots in use plus empty ones it keeps
    /// (less than capacity before it fills, or after giving memory back).
    pub memory_bytes: u64,
    /// Cached data not yet written back (write-back mode).
    pub dirty_bytes: u64,
    pub read_hits: u64,
    pub read_misses: u64,
    pub write_hits: u64,
    pub write_misses: u64,
    pub evictions: u64,
    pub invalidations: u64,
    pub writeback_bytes: u64,
    /// Write-back throughput over the flusher's last interval.
    pub writeback_rate_bytes_per_s: u64,
    /// Age of the oldest dirty block (0 when nothing is dirty), now.
    pub writeback_lag_ms: u64,
    /// Scans of the dirty set the flusher has made (tests wait on it).
    pub flusher_scans: u64,
    pub bypassed_requests: u64,
    pub bypassed_bytes: u64,
    pub backing_read_bytes: u64,
    pub backing_write_bytes: u64,
    /// Memory given back to the host under memory pressure.
    pub given_back_bytes: u64,
    /// Errors from the backing and whether it is failing now.
    pub backing: HealthSnapshot,
}

fn ratio(hits: u64, misses: u64) -> f64 {
    if hits + misses == 0 {
        0.0
    } else {
        hits as f64 / (hits + misses) as f64
    }
}

/// Whether a metric only grows or goes up and down (Prometheus' counter and
/// gauge).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    Counter,
    Gauge,
}

/// One number of the stats with its name and meaning, so /metrics, the JSON
/// API and `ramd stats` tables can all be generated from one list.
#[derive(Debug, Clone, PartialEq)]
pub struct Metric {
    /// snake_case, units last (`_bytes`, `_ms`, `_total` for counters).
    pub name: &'static str,
    pub help: &'static str,
    pub kind: MetricKind,
    pub value: f64,
}

/// How to read one metric from the stats.
type ReadMetric = fn(&CacheStats) -> f64;

/// Every metric of a cache: name, help, kind and how to read it.
const METRICS: &[(&str, &str, MetricKind, ReadMetric)] = {
    use MetricKind::*;
    &[
        (
            "size_bytes",
            "Size of the export (the backing's size)",
            Gauge,
            |s| s.size_bytes as f64,
        ),
        ("capacity_bytes", "RAM the cache may hold", Gauge, |s| {
            s.capacity_bytes as f64
        }),
        ("resident_bytes", "RAM holding cached blocks", Gauge, |s| {
            s.resident_bytes as f64
        }),
        (
            "memory_bytes",
            "RAM the cache holds (cached blocks and empty slots it keeps)",
            Gauge,
            |s| s.memory_bytes as f64,
        ),
        (
            "dirty_bytes",
            "Cached data not yet written back",
            Gauge,
            |s| s.dirty_bytes as f64,
        ),
        (
            "read_hits_total",
            "Blocks read from the cache",
            Counter,
            |s| s.read_hits as f64,
        ),
        (
            "read_misses_total",
            "Blocks read from the backing",
            Counter,
            |s| s.read_misses as f64,
        ),
        (
            "read_hit_ratio",
            "Share of blocks read that were cached",
            Gauge,
            |s| s.read_hit_ratio(),
        ),
        (
            "write_hits_total",
            "Blocks written that were cached",
            Counter,
            |s| s.write_hits as f64,
        ),
        (
            "write_misses_total",
            "Blocks written that were not cached",
            Counter,
            |s| s.write_misses as f64,
        ),
        (
            "write_hit_ratio",
            "Share of blocks written that were cached",
            Gauge,
            |s| s.write_hit_ratio(),
        ),
        (
            "evictions_total",
            "Cached blocks evicted to make room",
            Counter,
            |s| s.evictions as f64,
        ),
        (
            "invalidations_total",
            "Cached blocks dropped because their data changed underneath",
            Counter,
            |s| s.invalidations as f64,
        ),
        (
            "writeback_bytes_total",
            "Bytes written back to the backing",
            Counter,
            |s| s.writeback_bytes as f64,
        ),
        (
            "writeback_rate_bytes_per_second",
            "Recent write-back throughput",
            Gauge,
            |s| s.writeback_rate_bytes_per_s as f64,
        ),
        (
            "writeback_lag_ms",
            "Age of the oldest dirty block",
            Gauge,
            |s| s.writeback_lag_ms as f64,
        ),
        (
            "bypassed_requests_total",
            "Requests that bypassed the cache",
            Counter,
            |s| s.bypassed_requests as f64,
        ),
        (
            "bypassed_bytes_total",
            "Bytes of requests that bypassed the cache",
            Counter,
            |s| s.bypassed_bytes as f64,
        ),
        (
            "backing_read_bytes_total",
            "Bytes read from the backing",
            Counter,
            |s| s.backing_read_bytes as f64,
        ),
        (
            "backing_write_bytes_total",
            "Bytes written to the backing",
            Counter,
            |s| s.backing_write_bytes as f64,
        ),
        (
            "given_back_bytes_total",
            "Memory given back to the host under memory pressure",
            Counter,
            |s| s.given_back_bytes as f64,
        ),
        (
            "backing_failing",
            "1 while the backing is failing",
            Gauge,
            |s| s.backing.failing as u8 as f64,
        ),
        (
            "backing_read_errors_total",
            "Failed backing reads",
            Counter,
            |s| s.backing.read_errors as f64,
        ),
        (
            "backing_write_errors_total",
            "Failed backing writes",
            Counter,
            |s| s.backing.write_errors as f64,
        ),
        (
            "backing_flush_errors_total",
            "Failed backing flushes",
            Counter,
            |s| s.backing.flush_errors as f64,
        ),
        (
            "backing_retries_total",
            "Write-back retries after backing failures",
            Counter,
            |s| s.backing.retries as f64,
        ),
    ]
};

impl CacheStats {
    /// Every number as a [`Metric`] (names are stable: dashboards use them).
    pub fn metrics(&self) -> Vec<Metric> {
        METRICS
            .iter()
            .map(|&(name, help, kind, read)| Metric {
                name,
                help,
                kind,
                value: read(self),
            })
            .collect()
    }

    /// Share of blocks read that were cached (0.0 with no reads).
    pub fn read_hit_ratio(&self) -> f64 {
        ratio(self.read_hits, self.read_misses)
    }

    /// Share of blocks written that were cached already.
    pub fn write_hit_ratio(&self) -> f64 {
        ratio(self.write_hits, self.write_misses)
    }

    /// Share of all block accesses that were hits.
    pub fn hit_ratio(&self) -> f64 {
        ratio(
            self.read_hits + self.write_hits,
            self.read_misses + self.write_misses,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_named_with_units_last_and_unique() {
        let s = CacheStats {
            mode: Mode::WriteBack,
            policy: PolicyKind::S3Fifo,
            block_bytes: 4096,
            size_bytes: 1 << 30,
            capacity_bytes: 1 << 20,
            resident_bytes: 4096,
            memory_bytes: 8192,
            dirty_bytes: 0,
            read_hits: 3,
            read_misses: 1,
            write_hits: 0,
            write_misses: 0,
            evictions: 0,
            invalidations: 0,
            writeback_bytes: 0,
            writeback_rate_bytes_per_s: 0,
            writeback_lag_ms: 0,
            flusher_scans: 0,
            bypassed_requests: 0,
            bypassed_bytes: 0,
            backing_read_bytes: 0,
            backing_write_bytes: 0,
            given_back_bytes: 0,
            backing: HealthSnapshot::default(),
        };
        let m = s.metrics();
        let mut names: Vec<_> = m.iter().map(|x| x.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), m.len());
        for x in &m {
            assert_eq!(
                x.kind == MetricKind::Counter,
                x.name.ends_with("_total"),
                "{}",
                x.name
            );
        }
        assert_eq!(
            m.iter().find(|x| x.name == "read_hit_ratio").unwrap().value,
            0.75
        );
    }
}
