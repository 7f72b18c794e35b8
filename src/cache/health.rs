//! The backing's health: whether it is failing, since when, how many errors,
//! and when the flusher should try it again (bounded exponential backoff).
//!
//! Every backing call reports its outcome here. The data path only touches
//! an atomic on success (and only writes it when the state changes), so a
//! healthy backing costs nothing extra.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// What kind of backing call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    Flush,
}

/// A view of the backing's health for stats and `ramd info`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HealthSnapshot {
    /// True while the last backing call failed (and no later one succeeded).
    pub failing: bool,
    /// How long it has been failing.
    pub failing_for_ms: u64,
    /// Failed calls in a row.
    pub consecutive_failures: u64,
    pub read_errors: u64,
    pub write_errors: u64,
    pub flush_errors: u64,
    /// Write-back retries the flusher made after failures.
    pub retries: u64,
    /// When the flusher tries again (0: not waiting).
    pub next_retry_in_ms: u64,
    /// The most recent error message.
    pub last_error: Option<String>,
}

/// Live health state of one backing.
pub struct Health {
    /// Fast check for the data path.
    failing: AtomicBool,
    read_errors: AtomicU64,
    write_errors: AtomicU64,
    flush_errors: AtomicU64,
    retries: AtomicU64,
    /// Details, changed only on failures and recoveries.
    detail: Mutex<Detail>,
    retry_initial: Duration,
    retry_max: Duration,
}

struct Detail {
    since: Option<Instant>,
    consecutive: u64,
    next_retry: Option<Instant>,
    last_error: Option<String>,
}

impl Health {
    pub fn new(retry_initial: Duration, retry_max: Duration) -> Self {
        Health {
            failing: AtomicBool::new(false),
            read_errors: AtomicU64::new(0),
            write_errors: AtomicU64::new(0),
            flush_errors: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            detail: Mutex::new(Detail {
                since: None,
                consecutive: 0,
                next_retry: None,
                last_error: None,
            }),
            retry_initial,
            retry_max,
        }
    }

    pub fn is_failing(&self) -> bool {
        self.failing.load(Ordering::Relaxed)
    }

    /// A backing call succeeded.
    #[inline]
    pub fn ok(&self) {
        if self.failing.load(Ordering::Relaxed) {
            let mut d = self.detail.lock();
            if self.failing.swap(false, Ordering::Relaxed) {
                let for_ms = d.since.map_or(0, |s| s.elapsed().as_millis());
                tracing::info!(
                    "cache backing is back after {for_ms} ms and {} failed calls",
                    d.consecutive
                );
            }
            d.since = None;
            d.consecutive = 0;
            d.next_retry = None;
        }
    }

    /// A backing call failed with `err`.
    pub fn failed(&self, op: Op, err: &dyn std::fmt::Display) {
        match op {
            Op::Read => &self.read_errors,
            Op::Write => &self.write_errors,
            Op::Flush => &self.flush_errors,
        }
        .fetch_add(1, Ordering::Relaxed);
        let mut d = self.detail.lock();
        if !self.failing.swap(true, Ordering::Relaxed) {
            tracing::warn!("cache backing failing: {err}");
            d.since = Some(Instant::now());
        }
        d.consecutive += 1;
        d.last_error = Some(err.to_string());
    }

    /// The flusher failed a write-back: when should it try again? Doubles
    /// from the initial wait per consecutive failure, up to the maximum.
    pub fn schedule_retry(&self) -> Duration {
        let mut d = self.detail.lock();
        let shift = d.consecutive.saturating_sub(1).min(20) as u32;
        let wait = self
            .retry_initial
            .saturating_mul(1 << shift)
            .min(self.retry_max);
        d.next_retry = Some(Instant::now() + wait);
        self.retries.fetch_add(1, Ordering::Relaxed);
        wait
    }

    pub fn snapshot(&self) -> HealthSnapshot {
        let d = self.detail.lock();
        let now = Instant::now();
        HealthSnapshot {
            failing: self.is_failing(),
            failing_for_ms: d
                .since
                .map_or(0, |s| now.duration_since(s).as_millis() as u64),
            consecutive_failures: d.consecutive,
            read_errors: self.read_errors.load(Ordering::Relaxed),
            write_errors: self.write_errors.load(Ordering::Relaxed),
            flush_errors: self.flush_errors.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
            next_retry_in_ms: d
                .next_retry
                .map_or(0, |t| t.saturating_duration_since(now).as_millis() as u64),
            last_error: d.last_error.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_backoff_and_recovery() {
        let h = Health::new(Duration::from_millis(100), Duration::from_millis(1000));
        assert!(!h.is_failing());
        h.failed(Op::Write, &"boom");
        assert_eq!(h.schedule_retry(), Duration::from_millis(100));
        h.failed(Op::Write, &"boom");
        assert_eq!(h.schedule_retry(), Duration::from_millis(200));
        for _ in 0..10 {
            h.failed(Op::Read, &"gone");
        }
        assert_eq!(h.schedule_retry(), Duration::from_millis(1000));
        let s = h.snapshot();
        assert!(s.failing);
        assert_eq!((s.write_errors, s.read_errors, s.retries), (2, 10, 3));
        assert_eq!(s.last_error.as_deref(), Some("gone"));
        h.ok();
        let s = h.snapshot();
        assert!(!s.failing && s.consecutive_failures == 0 && s.next_retry_in_ms == 0);
        assert_eq!(s.read_errors, 10);
    }
}
