//! When to sync: per-directory intervals, on demand, before suspend, on stop.
//!
//! [`Scheduler`] is pure (time is passed in) and decides which directories
//! are due. [`SyncWorker`] is the one background thread that sleeps until the
//! next due time (or a nudge), runs due syncs through the [`DirManager`], and
//! measures RAM usage every [`USAGE_CHECK_INTERVAL`]. A failed sync is
//! retried after [`RETRY_AFTER_FAILURE`] (or the interval, if shorter), so a
//! full disk is retried without spinning.
//!
//! The daemon wires it like this:
//!
//! ```text
//! start:    manager.recover_all(); worker = SyncWorker::start(manager)  → READY=1
//! add:      manager.add(req); worker.add(path, interval)
//! remove:   manager.remove(path, force); worker.remove(path)
//! dir sync: manager.sync(path)            (runs on the caller's thread)
//! suspend:  worker.before_suspend()       (= manager.sync_all())
//! stop:     worker.stop()                 (stops the thread, then manager.shutdown())
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::manager::{DirError, DirManager, StopOutcome};
use super::sync::SyncReport;

/// How often RAM usage is measured for the 80/95% warnings.
pub const USAGE_CHECK_INTERVAL: Duration = Duration::from_secs(5);
/// Wait before retrying a failed sync (capped by the directory's interval).
pub const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
struct Entry {
    interval: Duration,
    next_due: Instant,
}

/// Per-directory sync deadlines (pure).
#[derive(Debug, Default, Clone)]
pub struct Scheduler {
    entries: BTreeMap<PathBuf, Entry>,
}

impl Scheduler {
    /// Schedules `path` every `interval`, first due one interval from `now`.
    pub fn add(&mut self, path: &Path, interval: Duration, now: Instant) {
        self.entries.insert(
            path.to_path_buf(),
            Entry {
                interval,
                next_due: now + interval,
            },
        );
    }

    pub fn remove(&mut self, path: &Path) {
        self.entries.remove(path);
    }

    /// Changes the interval; the next sync is one new interval after `now`
    /// at the latest.
    pub fn set_interval(&mut self, path: &Path, interval: Duration, now: Instant) {
        if let Some(e) = self.entries.get_mut(path) {
            e.interval = interval;
            e.next_due = e.next_due.min(now + interval);
        }
    }

    /// Directories due at `now`, most overdue first.
    pub fn due(&self, now: Instant) -> Vec<PathBuf> {
        let mut v: Vec<(&PathBuf, Instant)> = self
            .entries
            .iter()
            .filter(|(_, e)| e.next_due <= now)
            .map(|(p, e)| (p, e.next_due))
            .collect();
        v.sort_by_key(|(_, t)| *t);
        v.into_iter().map(|(p, _)| p.clone()).collect()
    }

    /// A sync of `path` finished at `now` (also after an on-demand sync: the
    /// interval restarts).
    pub fn synced(&mut self, path: &Path, now: Instant) {
        if let Some(e) = self.entries.get_mut(path) {
            e.next_due = now + e.interval;
        }
    }

    /// A sync of `path` failed at `now`: retry sooner than a full interval.
    pub fn failed(&mut self, path: &Path, now: Instant) {
        if let Some(e) = self.entries.get_mut(path) {
            e.next_due = now + e.interval.min(RETRY_AFTER_FAILURE);
        }
    }

    /// The earliest deadline.
    pub fn next_due(&self) -> Option<Instant> {
        self.entries.values().map(|e| e.next_due).min()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

struct Shared {
    scheduler: Mutex<(Scheduler, bool)>,
    wake: Condvar,
}

/// The background sync thread (see the module docs).
pub struct SyncWorker {
    manager: Arc<DirManager>,
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SyncWorker {
    /// Starts the thread with every directory the manager holds.
    pub fn start(manager: Arc<DirManager>) -> SyncWorker {
        let now = Instant::now();
        let mut sched = Scheduler::default();
        for p in manager.paths() {
            if let Ok(c) = manager.config(&p) {
                sched.add(&p, Duration::from_millis(c.sync_interval_ms), now);
            }
        }
        let shared = Arc::new(Shared {
            scheduler: Mutex::new((sched, false)),
            wake: Condvar::new(),
        });
        let (m, s) = (manager.clone(), shared.clone());
        let thread = std::thread::Builder::new()
            .name("ramd-dirsync".into())
            .spawn(move || run(m, s))
            .expect("spawn the dirsync thread");
        SyncWorker {
            manager,
            shared,
            thread: Some(thread),
        }
    }

    /// Schedules a directory just added.
    pub fn add(&self, path: &Path, interval: Duration) {
        self.shared
            .scheduler
            .lock()
            .0
            .add(path, interval, Instant::now());
        self.shared.wake.notify_one();
    }

    /// A directory's interval changed: the next sync is one new interval
    /// from now at the latest.
    pub fn set_interval(&self, path: &Path, interval: Duration) {
        self.shared
            .scheduler
            .lock()
            .0
            .set_interval(path, interval, Instant::now());
        self.shared.wake.notify_one();
    }

    /// Unschedules a directory just removed.
    pub fn remove(&self, path: &Path) {
        self.shared.scheduler.lock().0.remove(path);
    }

    /// Syncs `path` now on the caller's thread; the interval restarts.
    pub fn sync_now(&self, path: &Path) -> Result<SyncReport, DirError> {
        let r = self.manager.sync(path);
        let mut g = self.shared.scheduler.lock();
        match &r {
            Ok(_) => g.0.synced(path, Instant::now()),
            Err(_) => g.0.failed(path, Instant::now()),
        }
        r
    }

    /// The hook before system suspend: sync everything now.
    pub fn before_suspend(&self) -> Vec<(PathBuf, Result<SyncReport, DirError>)> {
        let out = self.manager.sync_all();
        let now = Instant::now();
        let mut g = self.shared.scheduler.lock();
        for (p, r) in &out {
            if r.is_ok() {
                g.0.synced(p, now);
            }
        }
        out
    }

    /// Stops the thread, then syncs and releases every directory
    /// ([`DirManager::shutdown`]).
    pub fn stop(mut self) -> Vec<(PathBuf, Result<StopOutcome, DirError>)> {
        self.stop_thread();
        self.manager.shutdown()
    }

    fn stop_thread(&mut self) {
        self.shared.scheduler.lock().1 = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for SyncWorker {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

fn run(manager: Arc<DirManager>, shared: Arc<Shared>) {
    let mut next_usage_check = Instant::now();
    loop {
        let due = {
            let mut g = shared.scheduler.lock();
            loop {
                if g.1 {
                    return;
                }
                let now = Instant::now();
                let due = g.0.due(now);
                if !due.is_empty() || now >= next_usage_check {
                    break due;
                }
                let until =
                    g.0.next_due()
                        .unwrap_or(next_usage_check)
                        .min(next_usage_check);
                shared.wake.wait_until(&mut g, until);
            }
        };
        for path in due {
            if shared.scheduler.lock().1 {
                return;
            }
            let r = manager.sync(&path);
            let mut g = shared.scheduler.lock();
            match r {
                Ok(_) => g.0.synced(&path, Instant::now()),
                Err(DirError::NotManaged(_)) => g.0.remove(&path),
                Err(_) => g.0.failed(&path, Instant::now()),
            }
        }
        if Instant::now() >= next_usage_check {
            manager.check_usage();
            manager.poll_draining(false);
            next_usage_check = Instant::now() + USAGE_CHECK_INTERVAL;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_directory_intervals() {
        let t0 = Instant::now();
        let s10 = Duration::from_secs(10);
        let s60 = Duration::from_secs(60);
        let mut s = Scheduler::default();
        s.add(Path::new("/a"), s10, t0);
        s.add(Path::new("/b"), s60, t0);
        assert!(s.due(t0).is_empty());
        assert_eq!(s.next_due(), Some(t0 + s10));
        assert_eq!(s.due(t0 + s10), [PathBuf::from("/a")]);
        s.synced(Path::new("/a"), t0 + s10);
        assert_eq!(s.next_due(), Some(t0 + 2 * s10));
        // At 60 s both are due; /a is more overdue (due at 20 s).
        assert_eq!(s.due(t0 + s60), [PathBuf::from("/a"), PathBuf::from("/b")]);
        s.failed(Path::new("/b"), t0 + s60);
        assert_eq!(
            s.due(t0 + s60 + RETRY_AFTER_FAILURE.min(s60)),
            [PathBuf::from("/a"), PathBuf::from("/b")]
        );
        s.set_interval(Path::new("/b"), Duration::from_secs(1), t0 + s60);
        assert_eq!(
            s.due(t0 + s60 + Duration::from_secs(1)),
            [PathBuf::from("/a"), PathBuf::from("/b")]
        );
        s.remove(Path::new("/a"));
        assert_eq!(s.len(), 1);
    }
}
