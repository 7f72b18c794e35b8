//! The reopener: one background thread that retries the backings of
//! config-declared caches that could not be opened at start (a network
//! disk not up yet, an NBD server that starts later), with exponential
//! backoff from 1 s to 60 s, and brings each cache up as soon as its
//! backing answers. Started on the first unavailable cache; stopped at
//! shutdown.

use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::{CacheState, Caches, Outage};

/// First wait before a retry; doubled per failed attempt...
const FIRST_RETRY: Duration = Duration::from_secs(1);
/// ...up to this.
const MAX_RETRY: Duration = Duration::from_secs(60);
/// How often the thread looks for due retries.
const TICK: Duration = Duration::from_millis(250);

/// The wait after `attempts` failed attempts.
pub(super) fn backoff(attempts: u32) -> Duration {
    FIRST_RETRY
        .saturating_mul(1 << attempts.saturating_sub(1).min(16))
        .min(MAX_RETRY)
}

/// The retry thread's handle and stop switch.
#[derive(Default)]
pub(super) struct Reopener {
    /// Set by `stop`; the thread waits on the condvar between looks.
    stop: Arc<(Mutex<bool>, Condvar)>,
    /// The running thread, if started.
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Reopener {
    /// Starts the thread unless it runs (or was stopped).
    pub fn start(&self, caches: Arc<Caches>) {
        let mut t = self.thread.lock();
        if t.is_some() || *self.stop.0.lock() {
            return;
        }
        // Weak: the thread must not keep the caches alive on its own.
        let weak = Arc::downgrade(&caches);
        let stop = self.stop.clone();
        match std::thread::Builder::new()
            .name("ramd-cache-reopen".into())
            .spawn(move || run(&weak, &stop))
        {
            Ok(h) => *t = Some(h),
            Err(e) => tracing::error!("cannot start the cache reopener thread: {e}"),
        }
    }

    /// Stops the thread and waits for it (an attempt in progress finishes:
    /// at most the NBD timeout).
    pub fn stop(&self) {
        *self.stop.0.lock() = true;
        self.stop.1.notify_all();
        if let Some(h) = self.thread.lock().take() {
            let _ = h.join();
        }
    }
}

fn run(caches: &Weak<Caches>, stop: &(Mutex<bool>, Condvar)) {
    loop {
        {
            let mut s = stop.0.lock();
            if !*s {
                stop.1.wait_for(&mut s, TICK);
            }
            if *s {
                return;
            }
        }
        let Some(caches) = caches.upgrade() else {
            return;
        };
        let now = Instant::now();
        for entry in caches.list() {
            let CacheState::Unavailable(outage) = entry.state() else {
                continue;
            };
            if outage.next_attempt > now {
                continue;
            }
            match caches.open(&entry) {
                Ok(()) => tracing::info!(
                    cache = %entry.name,
                    "cache '{}' is up: its backing {} answered after {} failed attempt(s)",
                    entry.name,
                    entry.spec.backing,
                    outage.attempts
                ),
                Err(e) => {
                    let attempts = outage.attempts + 1;
                    let wait = backoff(attempts);
                    let mut st = entry.state.lock();
                    if let CacheState::Unavailable(_) = &*st {
                        *st = CacheState::Unavailable(Outage {
                            error: e.to_string(),
                            attempts,
                            next_attempt: Instant::now() + wait,
                        });
                        tracing::warn!(
                            cache = %entry.name,
                            "cache '{}' still unavailable ({e}); next attempt in {wait:?}",
                            entry.name
                        );
                    }
                }
            }
            if *stop.0.lock() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_a_minute() {
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(2), Duration::from_secs(2));
        assert_eq!(backoff(6), Duration::from_secs(32));
        assert_eq!(backoff(7), MAX_RETRY);
        assert_eq!(backoff(1000), MAX_RETRY);
    }
}
