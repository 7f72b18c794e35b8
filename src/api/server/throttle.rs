//! Failed sign-ins per client address: a token bucket each, and a log
//! line per address at most every [`LOG_EVERY`] (pure: the caller passes
//! the time).
//!
//! ```text
//! a request with a credential from ADDR ──► ADDR's bucket empty ──► 429 too_many_failures,
//!                                           │                       Retry-After: seconds to a token
//!                                           └► checked ──► refused (unknown, revoked, expired
//!                                                          token; unknown session or code)
//!                                                          ──► one token taken from the bucket
//! ```
//!
//! A bucket holds [`BURST`] failures and refills at [`REFILL_PER_S`], so a
//! user who mistypes a few times never notices, and a guesser gets one
//! try a second instead of thousands. While the bucket is empty no
//! credential from that address is even checked, a good one included:
//! otherwise the limit would still answer a guesser's question (the
//! secrets are 256 bits, so this is about the cost of the checks and the
//! log, not the odds). Successful requests take nothing. At most
//! [`MAX_ADDRESSES`] buckets are kept (full ones are forgotten first).

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Failures an address may make at once.
pub const BURST: f64 = 10.0;
/// Failures per second an address gets back.
pub const REFILL_PER_S: f64 = 1.0;
/// Most addresses tracked.
pub const MAX_ADDRESSES: usize = 4096;
/// Shortest time between two log lines about one address.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
    last_log: Option<Instant>,
    /// Failures not logged since `last_log`.
    unlogged: u64,
}

impl Bucket {
    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + dt * REFILL_PER_S).min(BURST);
        self.at = now;
    }
}

/// Whether to log a failure, and how many went unlogged before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogIt {
    /// Log it, saying `suppressed` more happened since the last line.
    Yes {
        suppressed: u64,
    },
    No,
}

/// Every address's bucket.
#[derive(Debug, Default)]
pub struct Throttle {
    buckets: Mutex<HashMap<IpAddr, Bucket>>,
}

impl Throttle {
    /// Ok when `addr` may have a credential checked at `now`; else the
    /// whole seconds until it may (for `Retry-After`).
    pub fn check(&self, addr: IpAddr, now: Instant) -> Result<(), u64> {
        let mut buckets = self.buckets.lock();
        let Some(b) = buckets.get_mut(&addr) else {
            return Ok(());
        };
        b.refill(now);
        if b.tokens >= 1.0 {
            return Ok(());
        }
        Err(((1.0 - b.tokens) / REFILL_PER_S).ceil().max(1.0) as u64)
    }

    /// Counts a failed credential from `addr` at `now`.
    pub fn failed(&self, addr: IpAddr, now: Instant) -> LogIt {
        let mut buckets = self.buckets.lock();
        if buckets.len() >= MAX_ADDRESSES && !buckets.contains_key(&addr) {
            forget_one(&mut buckets, now);
        }
        let b = buckets.entry(addr).or_insert(Bucket {
            tokens: BURST,
            at: now,
            last_log: None,
            unlogged: 0,
        });
        b.refill(now);
        b.tokens = (b.tokens - 1.0).max(0.0);
        let due = b
            .last_log
            .map_or(true, |t| now.saturating_duration_since(t) >= LOG_EVERY);
        if !due {
            b.unlogged += 1;
            return LogIt::No;
        }
        let suppressed = std::mem::take(&mut b.unlogged);
        b.last_log = Some(now);
        LogIt::Yes { suppressed }
    }
}

/// Forgets a full bucket (one that has refilled), else the fullest.
fn forget_one(buckets: &mut HashMap<IpAddr, Bucket>, now: Instant) {
    let fullest = buckets
        .iter_mut()
        .map(|(a, b)| {
            b.refill(now);
            (*a, b.tokens)
        })
        .max_by(|x, y| x.1.total_cmp(&y.1))
        .map(|(a, _)| a);
    if let Some(a) = fullest {
        buckets.remove(&a);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, last))
    }

    #[test]
    fn a_burst_then_one_a_second() {
        let t = Throttle::default();
        let t0 = Instant::now();
        for _ in 0..BURST as usize {
            assert_eq!(t.check(ip(1), t0), Ok(()));
            t.failed(ip(1), t0);
        }
        assert_eq!(t.check(ip(1), t0), Err(1));
        assert_eq!(
            t.check(ip(2), t0),
            Ok(()),
            "other addresses are not limited"
        );
        let later = t0 + Duration::from_millis(1100);
        assert_eq!(t.check(ip(1), later), Ok(()));
        t.failed(ip(1), later);
        assert!(t.check(ip(1), later).is_err());
        // Quiet for long enough, the whole burst is back.
        let much_later = later + Duration::from_secs(60);
        for _ in 0..BURST as usize {
            assert_eq!(t.check(ip(1), much_later), Ok(()));
            t.failed(ip(1), much_later);
        }
    }

    #[test]
    fn one_log_line_per_address_per_period() {
        let t = Throttle::default();
        let t0 = Instant::now();
        assert_eq!(t.failed(ip(1), t0), LogIt::Yes { suppressed: 0 });
        for _ in 0..5 {
            assert_eq!(t.failed(ip(1), t0), LogIt::No);
        }
        assert_eq!(t.failed(ip(2), t0), LogIt::Yes { suppressed: 0 });
        assert_eq!(
            t.failed(ip(1), t0 + LOG_EVERY),
            LogIt::Yes { suppressed: 5 }
        );
    }

    #[test]
    fn the_table_is_bounded() {
        let t = Throttle::default();
        let t0 = Instant::now();
        for i in 0..(MAX_ADDRESSES + 10) as u32 {
            let a = IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i));
            t.failed(a, t0);
        }
        assert_eq!(t.buckets.lock().len(), MAX_ADDRESSES);
    }
}
