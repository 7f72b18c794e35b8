//! Snapshot jobs: a push or a restore running in the background, which
//! the API reports (`GET /v1/snapshots/jobs/{id}`) so the CLI can draw a
//! progress bar and say how it ended.
//!
//! A job is created running and ends exactly once (`finish`); finished
//! jobs are forgotten an hour after they end (bounded: at most
//! [`MAX_JOBS`] are kept, oldest finished dropped first).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::snapshot::{Progress, PushReport, RestoreReport};

/// Most jobs kept (running ones are never dropped).
pub const MAX_JOBS: usize = 256;
/// How long a finished job stays visible.
const KEEP_MS: u64 = 3_600_000;

/// What a job does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobKind {
    Push,
    Restore,
}

impl JobKind {
    pub fn name(self) -> &'static str {
        match self {
            JobKind::Push => "push",
            JobKind::Restore => "restore",
        }
    }
}

/// How a job ended.
#[derive(Debug, Clone)]
pub enum Outcome {
    Running,
    Pushed {
        id: String,
        /// As given ("" for none).
        label: String,
        report: PushReport,
    },
    Restored {
        id: String,
        /// The snapshot's, from its manifest ("" for none).
        label: String,
        drive: String,
        report: RestoreReport,
        /// Into a persistent drive.
        persistent: bool,
    },
    Failed(String),
}

/// One job.
#[derive(Debug)]
pub struct Job {
    pub id: u64,
    pub kind: JobKind,
    /// The drive pushed, or the drive whose snapshot is restored.
    pub drive: String,
    pub remote: String,
    pub started_unix_ms: u64,
    /// Updated after each chunk.
    pub progress: Mutex<Progress>,
    /// (outcome, when it ended).
    pub outcome: Mutex<(Outcome, Option<u64>)>,
}

impl Job {
    pub fn finish(&self, outcome: Outcome) {
        *self.outcome.lock() = (outcome, Some(crate::snapshot::remote::now_ms()));
    }

    pub fn is_running(&self) -> bool {
        matches!(self.outcome.lock().0, Outcome::Running)
    }
}

/// The jobs the daemon remembers.
#[derive(Default)]
pub struct Jobs {
    next: AtomicU64,
    map: Mutex<BTreeMap<u64, Arc<Job>>>,
}

impl Jobs {
    /// Starts remembering a new running job.
    pub fn start(&self, kind: JobKind, drive: &str, remote: &str) -> Arc<Job> {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let job = Arc::new(Job {
            id,
            kind,
            drive: drive.to_owned(),
            remote: remote.to_owned(),
            started_unix_ms: crate::snapshot::remote::now_ms(),
            progress: Mutex::new(Progress::default()),
            outcome: Mutex::new((Outcome::Running, None)),
        });
        let mut map = self.map.lock();
        let now = crate::snapshot::remote::now_ms();
        map.retain(|_, j| {
            j.outcome
                .lock()
                .1
                .map_or(true, |end| now.saturating_sub(end) < KEEP_MS)
        });
        while map.len() >= MAX_JOBS {
            let Some(old) = map.iter().find(|(_, j)| !j.is_running()).map(|(k, _)| *k) else {
                break;
            };
            map.remove(&old);
        }
        map.insert(id, job.clone());
        job
    }

    pub fn get(&self, id: u64) -> Option<Arc<Job>> {
        self.map.lock().get(&id).cloned()
    }
}
