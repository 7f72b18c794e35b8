//! The background sync thread of one persistent drive.
//!
//! Every `sync_interval_ms` (measured from the end of the previous sync, so
//! the disk is at most one interval plus one sync behind) it syncs and
//! checkpoints the drive. In `none` mode it only sleeps. After a failure it
//! retries with exponential backoff, at most `max_quick_retries` times, then
//! falls back to one attempt per interval; the drive keeps serving from RAM
//! throughout and its status says `retrying` / `failing` with the error.
//! Bounded: one thread, one sync at a time, no queue. The thread runs at a
//! lower CPU priority (nice 10) than the threads serving requests, so a
//! sync running on a busy machine does not take time slices from writers
//! (measured: the writes that wait over 1 ms during a sync are the ones
//! preempted, `persist_bench latency --explain`). A FLUSH that has to wait
//! for such a sync raises it back to normal priority (where the process
//! may), so the low priority never delays a FLUSH.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::drive::PersistentDrive;
use super::durability::{Durability, SyncCause};
use super::priority::lower_thread_priority;
use super::storage::Storage;
use crate::store::SyncStore;

#[derive(Default)]
struct Flags {
    stop: bool,
    wake: bool,
}

struct Shared {
    flags: Mutex<Flags>,
    cv: Condvar,
}

/// Handle to a drive's sync thread; stopping (or dropping) it joins the
/// thread. It does not run the final sync: `PersistentDrive::close` does.
pub struct SyncScheduler {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl SyncScheduler {
    /// Starts the thread for `drive`.
    pub fn spawn<S: Storage, M: SyncStore>(
        drive: Arc<PersistentDrive<S, M>>,
        name: &str,
    ) -> std::io::Result<SyncScheduler> {
        let shared = Arc::new(Shared {
            flags: Mutex::new(Flags::default()),
            cv: Condvar::new(),
        });
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("sync-{name}"))
            .spawn(move || run(drive, sh))?;
        Ok(SyncScheduler {
            shared,
            thread: Some(thread),
        })
    }

    /// Runs a sync now (and re-reads the interval).
    pub fn wake(&self) {
        self.shared.flags.lock().wake = true;
        self.shared.cv.notify_all();
    }

    /// Stops the thread and waits for it (a running sync finishes first).
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        self.shared.flags.lock().stop = true;
        self.shared.cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for SyncScheduler {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

fn run<S: Storage, M: SyncStore>(drive: Arc<PersistentDrive<S, M>>, shared: Arc<Shared>) {
    let mut failures = 0u32;
    let mut delay = Duration::from_millis(drive.config().sync_interval_ms);
    loop {
        {
            let deadline = Instant::now() + delay;
            let mut f = shared.flags.lock();
            while !f.stop && !f.wake {
                if shared.cv.wait_until(&mut f, deadline).timed_out() {
                    break;
                }
            }
            if f.stop {
                return;
            }
            f.wake = false;
        }
        let cfg = drive.config();
        let interval = Duration::from_millis(cfg.sync_interval_ms);
        if drive.durability() == Durability::None {
            delay = interval;
            continue;
        }
        // Low priority for each sync (a FLUSH waiting for the last one may
        // have raised it).
        lower_thread_priority();
        match drive.sync_with(SyncCause::Periodic) {
            Ok(_) => {
                failures = 0;
                drive.note_retrying(false);
                delay = interval;
            }
            Err(_) => {
                failures = failures.saturating_add(1);
                match cfg.retry.delay_ms(failures) {
                    Some(ms) => {
                        drive.note_retrying(true);
                        delay = Duration::from_millis(ms).min(interval);
                    }
                    None => {
                        drive.note_retrying(false);
                        delay = interval;
                    }
                }
            }
        }
    }
}
