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
}

const COUNTERS: usize = 11;
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
    /// Age of the oldest dirty block (0 when nothing is dirty).
    pub writeback_lag_ms: u64,
    pub bypassed_requests: u64,
    pub bypassed_bytes: u64,
    pub backing_read_bytes: u64,
    pub backing_write_bytes: u64,
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

impl CacheStats {
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
