//! The flusher: one background thread per cache that writes dirty blocks
//! back between the watermarks, writes back blocks older than the maximum
//! age, retries a failing backing with bounded exponential backoff, and
//! measures the write-back rate and lag.
//!
//! ```text
//!   dirty ≥ high watermark ──► drain, oldest first, until dirty ≤ low
//!   dirty block older than max_dirty_age_ms ──► write it back
//!   backing failed ──► wait (100 ms, 200 ms, ... ≤ retry_max_ms), try again
//!                      with a small batch (when nothing is dirty, probe with
//!                      a small read); once it answers, write back everything
//!                      held back during the outage
//! ```
//!
//! Write-through and write-around caches run it too, for the probe alone:
//! `ramd info` then shows a recovered backing as healthy without waiting
//! for a request to try it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::config::Mode;
use super::engine::Inner;
use super::stats::Ctr;

/// How often the flusher looks when nobody kicks it.
const TICK: Duration = Duration::from_millis(100);
/// Bytes written back per batch while draining (the stop flag and the
/// watermark are checked between batches).
const BATCH_BYTES: u64 = 8 << 20;

/// A running flusher; stopped and joined by [`Flusher::stop`].
pub(crate) struct Flusher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    inner: Arc<Inner>,
}

impl Flusher {
    pub fn spawn(inner: Arc<Inner>) -> std::io::Result<Flusher> {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (inner, stop) = (inner.clone(), stop.clone());
            std::thread::Builder::new()
                .name("ramd-cache-flush".into())
                .spawn(move || run(&inner, &stop))?
        };
        Ok(Flusher {
            stop,
            thread: Some(thread),
            inner,
        })
    }

    /// Asks the thread to stop and waits for it (it finishes the batch it
    /// is writing, which is bounded by `BATCH_BYTES`).
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.inner.flusher_signal.kick();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.halt();
    }
}

fn run(inner: &Inner, stop: &AtomicBool) {
    let mut next_try = Instant::now();
    let mut draining = false;
    let mut backlog = false;
    // (start, write-back counter at the start) of the rate's window.
    let mut rate_window = (Instant::now(), inner.stats.get(Ctr::WritebackBytes));
    loop {
        let wait = next_try.saturating_duration_since(Instant::now()).max(TICK);
        inner.flusher_signal.wait(if inner.health.is_failing() {
            wait
        } else {
            TICK
        });
        if stop.load(Ordering::Relaxed) {
            return;
        }
        if Instant::now() < next_try {
            continue;
        }
        let result = if inner.cfg.mode == Mode::WriteBack {
            round(inner, stop, &mut draining, &mut backlog, &mut rate_window)
        } else {
            Ok(())
        };
        match result {
            Err(()) => {
                next_try = Instant::now() + inner.health.schedule_retry();
            }
            Ok(()) if inner.health.is_failing() => {
                // Nothing to write back but the backing failed a request:
                // probe it so recovery shows without waiting for a request.
                let mut probe = vec![0u8; inner.size.min(512) as usize];
                if inner.backing_read(0, &mut probe).is_err() {
                    next_try = Instant::now() + inner.health.schedule_retry();
                }
            }
            Ok(()) => {}
        }
    }
}

/// One look at the dirty set: write back what the watermarks and the age
/// limit ask for. Err when the backing failed.
fn round(
    inner: &Inner,
    stop: &AtomicBool,
    draining: &mut bool,
    backlog: &mut bool,
    rate_window: &mut (Instant, u64),
) -> Result<(), ()> {
    let mut dirty = inner.scan_dirty();
    let now = inner.now_ms();
    let oldest = dirty.iter().map(|d| d.since_ms).min();
    inner
        .oldest_dirty_ms
        .store(oldest.unwrap_or(u64::MAX), Ordering::Relaxed);
    inner.flusher_scans.fetch_add(1, Ordering::Relaxed);
    let slots = inner.nslots as u64;
    let high = slots * inner.cfg.dirty_high_percent as u64 / 100;
    let low = slots * inner.cfg.dirty_low_percent as u64 / 100;
    let count = dirty.len() as u64;
    if count >= high.max(1) {
        *draining = true;
    }
    // Oldest first: the lag is what a crash of the host would lose.
    dirty.sort_unstable_by_key(|d| d.since_ms);
    let mut take = 0usize;
    if *draining {
        take = count.saturating_sub(low) as usize;
    }
    let max_age = inner.cfg.max_dirty_age_ms;
    let old = dirty
        .iter()
        .take_while(|d| now.saturating_sub(d.since_ms) >= max_age)
        .count();
    let failing = inner.health.is_failing();
    if failing && !dirty.is_empty() {
        // A failing backing is retried with a small batch, not a flood...
        *backlog = true;
        take = take.clamp(
            1,
            (inner.cfg.writeback_max_io_bytes / inner.bs).max(1) as usize,
        );
    } else if *backlog {
        // ...and once it answers again, everything held back during the
        // outage is written back at once.
        take = dirty.len();
    }
    let take = if failing { take } else { take.max(old) }.min(dirty.len());
    let mut result = Ok(());
    let batch = (BATCH_BYTES / inner.bs).max(1) as usize;
    for chunk in dirty[..take].chunks(batch) {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let list: Vec<(u64, u32)> = chunk.iter().map(|d| (d.block, d.slot)).collect();
        match inner.writeback_blocks_with(&list, inner.drain_workers()) {
            Ok(_) => {}
            Err(_) => {
                result = Err(());
                break;
            }
        }
    }
    if inner.dirty_count.load(Ordering::Relaxed) <= low {
        *draining = false;
    }
    if result.is_ok() && !failing && take == dirty.len() {
        *backlog = false;
    }
    if result.is_ok() && failing {
        // The retry batch went through: catch up without waiting a tick.
        inner.flusher_signal.kick();
    }
    // Rate over windows of at least a second, smoothed: every write-back
    // counts (this thread's, FLUSH's, FUA's, making room's).
    let elapsed = rate_window.0.elapsed();
    if elapsed >= Duration::from_secs(1) {
        let total = inner.stats.get(Ctr::WritebackBytes);
        let now_rate = (total.saturating_sub(rate_window.1) as f64 / elapsed.as_secs_f64()) as u64;
        let old = inner.writeback_rate.load(Ordering::Relaxed);
        inner
            .writeback_rate
            .store((old + 3 * now_rate) / 4, Ordering::Relaxed);
        *rate_window = (Instant::now(), total);
    }
    if result.is_ok() && *draining {
        // Still above the low watermark: go again without waiting.
        inner.flusher_signal.kick();
    }
    result
}
