//! Rate-limited log lines: what a client can trigger at will (a refused
//! connection, a broken handshake) is logged at most once per interval per
//! call site, and the next line says how many were left out.
//!
//! Invariant: a flood of N events writes at most `1 + elapsed / interval`
//! lines, whatever N is, so logs cannot be used to fill a disk; and no event
//! is lost from the count (each suppressed one is reported by the next line
//! that is written at that call site).
//!
//! ```ignore
//! static REFUSED: RateLimit = RateLimit::per_10s();
//! if let Some(more) = REFUSED.admit() {
//!     tracing::warn!("connection refused: ...{}", more);
//! }
//! ```

use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One call site's limit. A `static` in the function that logs.
pub struct RateLimit {
    interval: Duration,
    state: Mutex<State>,
}

struct State {
    /// When the last line was written (None: never).
    last: Option<Instant>,
    /// Events left out since then.
    suppressed: u64,
}

/// How many events the admitted line stands for besides itself; displays as
/// `" (N more like this in the last S s)"`, or nothing when N is 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Suppressed {
    pub count: u64,
    pub over: Duration,
}

impl fmt::Display for Suppressed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.count == 0 {
            return Ok(());
        }
        write!(
            f,
            " ({} more like this in the last {} s)",
            self.count,
            self.over.as_secs().max(1)
        )
    }
}

impl RateLimit {
    /// At most one line per `interval`.
    pub const fn new(interval: Duration) -> RateLimit {
        RateLimit {
            interval,
            state: Mutex::new(State {
                last: None,
                suppressed: 0,
            }),
        }
    }

    /// The default for client-triggered messages: one line per 10 s.
    pub const fn per_10s() -> RateLimit {
        RateLimit::new(Duration::from_secs(10))
    }

    /// Counts one event; `Some` when it should be logged now, carrying the
    /// number left out since the last logged one.
    pub fn admit(&self) -> Option<Suppressed> {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> Option<Suppressed> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match s.last {
            Some(last) if now.duration_since(last) < self.interval => {
                s.suppressed += 1;
                None
            }
            last => {
                let over = last.map_or(Duration::ZERO, |l| now.duration_since(l));
                let count = std::mem::take(&mut s.suppressed);
                s.last = Some(now);
                Some(Suppressed { count, over })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_gives_one_line_per_interval_with_the_count() {
        let limit = RateLimit::new(Duration::from_secs(10));
        let t0 = Instant::now();
        let first = limit.admit_at(t0).expect("the first event is logged");
        assert_eq!(first.count, 0);
        assert_eq!(first.to_string(), "");
        let mut written = 0;
        for i in 1..100_000u64 {
            // 100k events over 20 s.
            let at = t0 + Duration::from_micros(i * 200);
            if let Some(s) = limit.admit_at(at) {
                written += 1;
                assert_eq!(s.count, 49_999, "every event in between is counted");
                assert_eq!(s.to_string(), " (49999 more like this in the last 10 s)");
            }
        }
        assert_eq!(written, 1, "one more line after 10 s, none before");
    }

    #[test]
    fn quiet_call_sites_log_every_event() {
        let limit = RateLimit::new(Duration::from_secs(1));
        let t0 = Instant::now();
        for i in 0..5 {
            let s = limit.admit_at(t0 + Duration::from_secs(2 * i));
            assert_eq!(s.map(|s| s.count), Some(0));
        }
    }
}
