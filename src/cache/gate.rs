//! The door requests pass through: it counts requests inside the cache so
//! that closing can wait for them, without a shared counter on the hit path.
//!
//! Each thread counts in its own cache-line-aligned stripe (the stripe of
//! `stats`), so connections on different CPUs never write the same line.
//! Entering and closing form a Dekker pair with sequentially consistent
//! operations: a request increments its stripe and then checks the flag; a
//! closer sets the flag and then sums the stripes. Either the closer sees
//! the request (and waits for it) or the request sees the flag (and leaves).

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use super::stats::my_stripe;

const STRIPES: usize = 16;

#[repr(align(128))]
struct Stripe(AtomicI64);

pub(crate) struct Gate {
    /// Requests inside, per stripe (a request leaves through the stripe it
    /// entered by; only the sum means anything).
    inside: Box<[Stripe]>,
    /// Set by `close`: no request enters from then on.
    closed: AtomicBool,
}

/// A request inside the gate; leaves on drop.
pub(crate) struct Pass<'a> {
    stripe: &'a AtomicI64,
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        self.stripe.fetch_sub(1, Ordering::Release);
    }
}

impl Gate {
    pub fn new() -> Self {
        Gate {
            inside: (0..STRIPES).map(|_| Stripe(AtomicI64::new(0))).collect(),
            closed: AtomicBool::new(false),
        }
    }

    /// Lets a request in, unless the gate is closed.
    #[inline]
    pub fn enter(&self) -> Option<Pass<'_>> {
        let stripe = &self.inside[my_stripe() % STRIPES].0;
        stripe.fetch_add(1, Ordering::SeqCst);
        if self.closed.load(Ordering::SeqCst) {
            stripe.fetch_sub(1, Ordering::Release);
            return None;
        }
        Some(Pass { stripe })
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Closes the gate and waits (at most `timeout`) for the requests
    /// inside to leave. False when some were still inside at the deadline.
    pub fn close(&self, timeout: Duration) -> bool {
        self.closed.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + timeout;
        loop {
            let n: i64 = self.inside.iter().map(|s| s.0.load(Ordering::SeqCst)).sum();
            if n == 0 {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Opens a closed gate again (a close that could not finish).
    pub fn reopen(&self) {
        self.closed.store(false, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn close_waits_for_requests_inside() {
        let g = Arc::new(Gate::new());
        let pass = g.enter().unwrap();
        assert!(!g.close(Duration::from_millis(20)));
        assert!(g.enter().is_none());
        let g2 = g.clone();
        // Generous: only a close that never sees the pass go would use it.
        let t = std::thread::spawn(move || g2.close(Duration::from_secs(60)));
        // A head start for the close to wait; if it comes late, it finds
        // the gate empty and passes all the same.
        std::thread::sleep(Duration::from_millis(20));
        drop(pass);
        assert!(t.join().unwrap());
        g.reopen();
        assert!(g.enter().is_some());
    }
}
