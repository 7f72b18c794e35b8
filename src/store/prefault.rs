//! The prefaulter: commits pages just ahead of a sequential fill, on its own
//! thread, so that the page faults of a first write (the kernel zeroing a
//! fresh page: about 1.6 us per 4 KiB page on our 2-core VM) overlap with the
//! connection receiving data instead of adding to it.
//!
//! Bounds and invariants:
//! - It only runs when a write that committed new pages starts exactly where
//!   the previous such write ended (a sequential fill), and it commits at most
//!   `AHEAD_BYTES` beyond the end of that write. Random first writes never
//!   trigger it.
//! - Pages it commits are charged to the budgets like written pages, but it
//!   stops while either budget has less than `MARGIN_BYTES` of headroom, so
//!   it never makes a writer hit ENOSPC earlier than it would have.
//! - Its pages are marked `zeroed`: they read as zeroes (they are), report
//!   as holes in block status, and are not dirty. A write clears the mark; a
//!   trim frees them like any page.
//! - Hints are sent over a bounded channel with `try_send`: the data path
//!   never blocks on it. The thread exits when the drive is dropped.
//!
//! The same thread collapses full 2 MiB ranges into huge pages once no
//! drive has committed a fresh page for `huge::IDLE_MS` (see `huge.rs`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::huge::{self, Pass};
use super::StoreState;

/// How far ahead of a sequential writer pages are committed.
pub const AHEAD_BYTES: u64 = 16 << 20;
/// Headroom both budgets keep before the prefaulter stops.
pub const MARGIN_BYTES: u64 = 64 << 20;

/// Work for the thread.
enum Job {
    /// Commit the pages of `[from, to)`.
    Prefault(u64, u64),
    /// A huge-page pass became due: start timing the idle period.
    Wake,
}

/// Handle to a drive's background thread.
pub struct Prefaulter {
    tx: SyncSender<Job>,
    /// Whether sequential fills get pages committed ahead.
    prefault: bool,
    /// End of the furthest range requested so far.
    requested_until: AtomicU64,
}

impl Prefaulter {
    /// Starts the thread for the drive behind `state`; `prefault` says
    /// whether `hint` does anything.
    pub fn spawn(state: Weak<StoreState>, prefault: bool) -> std::io::Result<Prefaulter> {
        let (tx, rx) = sync_channel::<Job>(4);
        std::thread::Builder::new()
            .name("prefault".into())
            .spawn(move || {
                let idle = Duration::from_millis(huge::IDLE_MS);
                let mut seen = huge::commits();
                loop {
                    // Time idle periods only while a huge-page pass is due;
                    // otherwise sleep until a job comes.
                    let pending = state.upgrade().is_some_and(|s| s.huge_pass_pending());
                    let job = if pending {
                        rx.recv_timeout(idle)
                    } else {
                        rx.recv().map_err(|_| RecvTimeoutError::Disconnected)
                    };
                    match job {
                        Ok(Job::Prefault(from, to)) => {
                            let Some(state) = state.upgrade() else { break };
                            state.prefault(from, to, MARGIN_BYTES);
                        }
                        Ok(Job::Wake) => seen = huge::commits(),
                        Err(RecvTimeoutError::Timeout) => {
                            let now = huge::commits();
                            if now == seen {
                                let Some(state) = state.upgrade() else { break };
                                // The drive was dropped by everyone else: stop.
                                let dropped = || Arc::strong_count(&state) == 1;
                                if state.collapse_pass(&dropped) == Pass::Failed {
                                    tracing::debug!("huge-page pass ended: no huge page free");
                                }
                            }
                            seen = now;
                        }
                        Err(RecvTimeoutError::Disconnected) => break,
                    }
                }
            })?;
        Ok(Prefaulter {
            tx,
            prefault,
            requested_until: AtomicU64::new(0),
        })
    }

    /// A huge-page pass became due (`huge.rs`): the thread starts watching
    /// for an idle period. A full queue drops it; the thread is then busy
    /// with prefault jobs and looks again after them.
    pub fn wake(&self) {
        let _ = self.tx.try_send(Job::Wake);
    }

    /// A sequential fill reached `end`: make sure pages up to
    /// `end + AHEAD_BYTES` are (being) committed.
    pub fn hint(&self, end: u64, size: u64) {
        if !self.prefault {
            return;
        }
        let target = (end + AHEAD_BYTES).min(size);
        let until = self.requested_until.load(Ordering::Relaxed);
        // Top up in halves of the window, so a request covers 8 MiB.
        if until >= end + AHEAD_BYTES / 2 && until <= target {
            return;
        }
        // A new fill elsewhere starts its own window.
        let from = if until > end && until <= target {
            until
        } else {
            end
        };
        if from >= target {
            return;
        }
        if self.tx.try_send(Job::Prefault(from, target)).is_ok() {
            self.requested_until.store(target, Ordering::Relaxed);
        }
    }
}
