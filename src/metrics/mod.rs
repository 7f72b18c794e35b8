//! Per-drive I/O metrics, recorded cheaply on the data path.
//!
//! # Shape
//!
//! ```text
//!  DriveMetrics (one per drive)
//!    ├ live: [Arc<ConnStats>]   one per open connection (or FUSE attachment)
//!    └ retired: Totals          what closed connections recorded
//!
//!  ConnRecorder (owned by one connection thread)
//!    └ Arc<ConnStats>: ops, bytes, errors by errno, latency histograms,
//!                      all atomics written by that thread alone
//! ```
//!
//! # Why it is cheap
//!
//! Each connection records into counters only it writes, so an update is a
//! relaxed load and a store on a cache line no other thread writes: no
//! locked instruction, no sharing, no global lock. The drive-wide mutex is
//! taken only when a connection opens or closes and when someone reads the
//! metrics (`snapshot`), never per request.
//!
//! Latency is measured per *batch*: the clock is read once when a read from
//! the socket returns and once when the batch's replies have been written;
//! every request of the batch is recorded with that span (the time the
//! server held it, including waiting behind earlier requests of the same
//! batch). Two clock reads per batch instead of two per request.
//!
//! # Invariants
//!
//! - Every request a connection handles is counted exactly once in `ops`
//!   (success or error); `bytes` counts the payload of successful requests;
//!   `errors` counts failed ones by errno.
//! - A closing connection's counts move from `live` to `retired` under the
//!   drive mutex, so a snapshot never counts them twice or loses them.

pub mod compressed;
pub mod histogram;
pub mod persist;
pub mod prometheus;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use histogram::AtomicHistogram;
pub use histogram::Histogram;

/// Request types counted separately.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Read = 0,
    Write = 1,
    Flush = 2,
    Trim = 3,
    WriteZeroes = 4,
    Cache = 5,
    BlockStatus = 6,
}

/// Number of [`Op`] kinds.
pub const OPS: usize = 7;

impl Op {
    /// Every op, in index order.
    pub const ALL: [Op; OPS] = [
        Op::Read,
        Op::Write,
        Op::Flush,
        Op::Trim,
        Op::WriteZeroes,
        Op::Cache,
        Op::BlockStatus,
    ];

    /// The name used in the API and in Prometheus labels.
    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Trim => "trim",
            Op::WriteZeroes => "write_zeroes",
            Op::Cache => "cache",
            Op::BlockStatus => "block_status",
        }
    }

    /// The latency histogram this op is timed in, if any.
    #[inline]
    fn timed(self) -> Option<Timed> {
        match self {
            Op::Read => Some(Timed::Read),
            Op::Write => Some(Timed::Write),
            Op::Flush => Some(Timed::Flush),
            _ => None,
        }
    }
}

/// Ops whose latency is kept in a histogram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timed {
    Read = 0,
    Write = 1,
    Flush = 2,
}

/// Number of [`Timed`] kinds.
pub const TIMED: usize = 3;

impl Timed {
    pub const ALL: [Timed; TIMED] = [Timed::Read, Timed::Write, Timed::Flush];

    pub fn name(self) -> &'static str {
        match self {
            Timed::Read => "read",
            Timed::Write => "write",
            Timed::Flush => "flush",
        }
    }
}

/// The errno values the NBD protocol can carry, in counter order.
pub const ERRNOS: [(u32, &str); 8] = [
    (1, "EPERM"),
    (5, "EIO"),
    (12, "ENOMEM"),
    (22, "EINVAL"),
    (28, "ENOSPC"),
    (75, "EOVERFLOW"),
    (95, "ENOTSUP"),
    (108, "ESHUTDOWN"),
];

#[inline]
fn errno_slot(errno: u32) -> usize {
    ERRNOS
        .iter()
        .position(|&(e, _)| e == errno)
        .unwrap_or(1 /* EIO: what an unknown errno is sent as */)
}

/// Counters of one connection; written by that connection's thread only.
#[derive(Default)]
pub struct ConnStats {
    ops: [AtomicU64; OPS],
    bytes: [AtomicU64; OPS],
    errors: [AtomicU64; ERRNOS.len()],
    latency: [AtomicHistogram; TIMED],
}

/// Adds `n` to a counter that only the calling thread writes.
#[inline]
fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

impl ConnStats {
    fn add_to(&self, t: &mut Totals) {
        for i in 0..OPS {
            t.ops[i] += self.ops[i].load(Ordering::Relaxed);
            t.bytes[i] += self.bytes[i].load(Ordering::Relaxed);
        }
        for i in 0..ERRNOS.len() {
            t.errors[i] += self.errors[i].load(Ordering::Relaxed);
        }
        for i in 0..TIMED {
            self.latency[i].add_to(&mut t.latency[i]);
        }
    }
}

/// Everything recorded for a drive up to a moment. Serialized to hand
/// a drive's counts to the next serving process (issue 31).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Totals {
    /// Requests handled, by [`Op`] index (successful or not).
    pub ops: [u64; OPS],
    /// Payload bytes of successful requests, by [`Op`] index (for trim,
    /// write_zeroes and cache: the length of the range).
    pub bytes: [u64; OPS],
    /// Failed requests, by [`ERRNOS`] index.
    pub errors: [u64; ERRNOS.len()],
    /// Latency of read, write and flush requests, by [`Timed`] index.
    pub latency: [Histogram; TIMED],
    /// Connections (and attachments) opened since the drive was created.
    pub connections_total: u64,
}

impl Totals {
    pub fn ops(&self, op: Op) -> u64 {
        self.ops[op as usize]
    }
    pub fn bytes(&self, op: Op) -> u64 {
        self.bytes[op as usize]
    }
    pub fn latency(&self, t: Timed) -> &Histogram {
        &self.latency[t as usize]
    }
    /// Failed requests in total.
    pub fn errors_total(&self) -> u64 {
        self.errors.iter().sum()
    }

    /// Adds another drive's (or an earlier process's) totals; refused
    /// (false, nothing added) when `other`'s histograms have another
    /// build's buckets.
    pub fn add(&mut self, other: &Totals) -> bool {
        if !other.latency.iter().all(Histogram::is_well_formed) {
            return false;
        }
        let add = |a: &mut [u64], b: &[u64]| {
            for (x, y) in a.iter_mut().zip(b) {
                *x = x.wrapping_add(*y);
            }
        };
        add(&mut self.ops, &other.ops);
        add(&mut self.bytes, &other.bytes);
        add(&mut self.errors, &other.errors);
        for i in 0..TIMED {
            self.latency[i].add(&other.latency[i]);
        }
        self.connections_total = self.connections_total.wrapping_add(other.connections_total);
        true
    }

    /// What was recorded after `earlier` (a snapshot of the same drive).
    pub fn since(&self, earlier: &Totals) -> Totals {
        let sub = |a: &[u64], b: &[u64], out: &mut [u64]| {
            for i in 0..out.len() {
                out[i] = a[i].saturating_sub(b[i]);
            }
        };
        let mut d = Totals::default();
        sub(&self.ops, &earlier.ops, &mut d.ops);
        sub(&self.bytes, &earlier.bytes, &mut d.bytes);
        sub(&self.errors, &earlier.errors, &mut d.errors);
        for i in 0..TIMED {
            d.latency[i] = self.latency[i].since(&earlier.latency[i]);
        }
        d.connections_total = self
            .connections_total
            .saturating_sub(earlier.connections_total);
        d
    }
}

/// A drive's metrics: live connections plus what closed ones recorded.
#[derive(Default)]
pub struct DriveMetrics {
    /// Taken at connect, disconnect and snapshot only (never per request).
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Counters of open connections.
    live: Vec<Arc<ConnStats>>,
    /// Sum of the counters of closed connections.
    retired: Totals,
}

impl DriveMetrics {
    pub fn new() -> Self {
        Self::default()
    }

    /// A recorder for a new connection; its counts join the drive's totals
    /// at once and stay there after it drops.
    pub fn connection(self: &Arc<Self>) -> ConnRecorder {
        let stats = Arc::new(ConnStats::default());
        {
            let mut inner = self.inner.lock();
            inner.live.push(stats.clone());
            inner.retired.connections_total += 1;
        }
        ConnRecorder {
            stats,
            drive: self.clone(),
            batch_start: None,
            pending: [0; TIMED],
        }
    }

    /// Everything recorded so far.
    pub fn snapshot(&self) -> Totals {
        let inner = self.inner.lock();
        let mut t = inner.retired.clone();
        for c in &inner.live {
            c.add_to(&mut t);
        }
        t
    }

    /// Counts an earlier serving process recorded for this drive (they
    /// survive a restart, issue 31); false when they do not fit this
    /// build (nothing added).
    pub fn seed(&self, earlier: &Totals) -> bool {
        self.inner.lock().retired.add(earlier)
    }

    fn retire(&self, stats: &Arc<ConnStats>) {
        let mut inner = self.inner.lock();
        if let Some(i) = inner.live.iter().position(|c| Arc::ptr_eq(c, stats)) {
            let c = inner.live.swap_remove(i);
            c.add_to(&mut inner.retired);
        }
    }
}

/// Records one connection's requests. Owned by the connection's thread.
pub struct ConnRecorder {
    /// This connection's counters (also listed in the drive's `live`).
    stats: Arc<ConnStats>,
    /// The drive, to retire the counters into when the connection ends.
    drive: Arc<DriveMetrics>,
    /// When the current batch of requests was read from the socket.
    batch_start: Option<Instant>,
    /// Timed requests of the current batch whose replies are not yet sent.
    pending: [u64; TIMED],
}

impl ConnRecorder {
    /// Marks the start of a batch: bytes just arrived from the client.
    #[inline]
    pub fn batch_started(&mut self) {
        self.batch_start = Some(Instant::now());
    }

    /// Counts a successful request of `bytes`.
    #[inline]
    pub fn done(&mut self, op: Op, bytes: u64) {
        let i = op as usize;
        bump(&self.stats.ops[i], 1);
        bump(&self.stats.bytes[i], bytes);
        if let Some(t) = op.timed() {
            self.pending[t as usize] += 1;
        }
    }

    /// Counts a failed request.
    #[inline]
    pub fn failed(&mut self, op: Option<Op>, errno: u32) {
        if let Some(op) = op {
            bump(&self.stats.ops[op as usize], 1);
            if let Some(t) = op.timed() {
                self.pending[t as usize] += 1;
            }
        }
        bump(&self.stats.errors[errno_slot(errno)], 1);
    }

    /// The replies of every request counted since the last call have been
    /// written: records their latency (from `batch_started`).
    #[inline]
    pub fn replies_sent(&mut self) {
        if self.pending == [0; TIMED] {
            return;
        }
        let ns = self
            .batch_start
            .map_or(0, |s| s.elapsed().as_nanos().min(u64::MAX as u128) as u64);
        for i in 0..TIMED {
            let n = std::mem::take(&mut self.pending[i]);
            if n > 0 {
                self.stats.latency[i].record_n_single_writer(ns, n);
            }
        }
    }

    /// Records one request timed by the caller (for paths without batches,
    /// like FUSE).
    pub fn record(&mut self, op: Op, bytes: u64, result: Result<(), u32>, started: Instant) {
        self.batch_start = Some(started);
        match result {
            Ok(()) => self.done(op, bytes),
            Err(errno) => self.failed(Some(op), errno),
        }
        self.replies_sent();
    }
}

impl Drop for ConnRecorder {
    fn drop(&mut self) {
        self.drive.retire(&self.stats);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_survive_disconnects_exactly_once() {
        let m = Arc::new(DriveMetrics::new());
        let mut a = m.connection();
        let mut b = m.connection();
        a.batch_started();
        a.done(Op::Read, 4096);
        a.done(Op::Read, 512);
        a.failed(Some(Op::Write), 28);
        a.replies_sent();
        b.done(Op::Flush, 0);
        b.failed(None, 22);
        b.replies_sent();
        let before = m.snapshot();
        drop(a);
        let after = m.snapshot();
        assert_eq!(before, after, "retiring must not change the totals");
        assert_eq!(after.ops(Op::Read), 2);
        assert_eq!(after.bytes(Op::Read), 4608);
        assert_eq!(after.ops(Op::Write), 1);
        assert_eq!(after.bytes(Op::Write), 0);
        assert_eq!(after.ops(Op::Flush), 1);
        assert_eq!(after.errors[errno_slot(28)], 1);
        assert_eq!(after.errors[errno_slot(22)], 1);
        assert_eq!(after.errors_total(), 2);
        assert_eq!(after.latency(Timed::Read).count(), 2);
        assert_eq!(after.latency(Timed::Write).count(), 1);
        assert_eq!(after.latency(Timed::Flush).count(), 1);
        assert_eq!(after.connections_total, 2);
        drop(b);
        let mut c = m.connection();
        c.record(Op::Write, 100, Ok(()), Instant::now());
        let d = m.snapshot().since(&after);
        assert_eq!(d.ops(Op::Write), 1);
        assert_eq!(d.bytes(Op::Write), 100);
        assert_eq!(d.connections_total, 1);
    }
}
