//! Once a second, a snapshot of every drive's metrics, so `ramd stats` can
//! show rates (IOPS, MiB/s) and the latency of the last second without
//! making clients sample twice. The same tick compacts compressed drives
//! whose slabs hold much free space ([`compact_drives`]): writes and trims
//! compact incrementally, but a drive that stops changing after a large
//! trim keeps its partly empty blocks until something frees them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::drives::Drives;
use crate::metrics::Totals;

/// How often drives are sampled.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// A compressed drive is compacted when its slab slack (free slots and
/// rounding) is at least this many bytes...
pub const COMPACT_SLACK_MIN_BYTES: u64 = 1 << 20;
/// ...and at least this fraction (1/N) of its slab bytes.
pub const COMPACT_SLACK_FRACTION: u64 = 4;

/// Compacts every compressed drive whose slack is large (see the
/// thresholds above); the store counts the runs, moves and bytes freed
/// (`ramd_drive_compaction_*`). Returns the bytes released.
pub fn compact_drives(drives: &Drives) -> u64 {
    let mut freed = 0;
    for d in drives.list() {
        let Some(c) = d.compressed() else { continue };
        let s = c.stats();
        let slack = s.slack_bytes();
        if slack >= COMPACT_SLACK_MIN_BYTES && slack >= s.slab_bytes / COMPACT_SLACK_FRACTION {
            let n = c.compact();
            if n > 0 {
                tracing::debug!(drive = %d.name, freed_bytes = n, "compacted");
            }
            freed += n;
        }
    }
    // Slab blocks freed by trims and compaction go back to the OS too.
    crate::store::compressed::return_freed_memory();
    freed
}

/// The last completed interval of one drive.
#[derive(Debug, Clone)]
pub struct Window {
    /// Length of the interval.
    pub interval: Duration,
    /// What was recorded during it.
    pub delta: Totals,
}

/// Per-drive previous snapshot and last window.
#[derive(Default)]
pub struct Sampler {
    /// By drive name. Std-free short critical sections; never across await.
    state: Mutex<HashMap<String, Slot>>,
}

struct Slot {
    at: Instant,
    totals: Totals,
    window: Option<Window>,
}

impl Sampler {
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes one sample of every drive with metrics.
    pub fn tick(&self, drives: &Drives) {
        let drives = drives.list();
        self.tick_totals(
            drives
                .iter()
                .filter_map(|d| d.metrics.as_ref().map(|m| (d.name.clone(), m.snapshot())))
                .collect(),
        );
    }

    /// Takes one sample of these (name, totals); names not given are
    /// forgotten. (Caches keep their own sampler and feed it this way.)
    pub fn tick_totals(&self, items: Vec<(String, Totals)>) {
        let now = Instant::now();
        let mut state = self.state.lock();
        state.retain(|name, _| items.iter().any(|(n, _)| n == name));
        for (name, totals) in items {
            match state.get_mut(&name) {
                Some(slot) => {
                    slot.window = Some(Window {
                        interval: now - slot.at,
                        delta: totals.since(&slot.totals),
                    });
                    slot.at = now;
                    slot.totals = totals;
                }
                None => {
                    state.insert(
                        name,
                        Slot {
                            at: now,
                            totals,
                            window: None,
                        },
                    );
                }
            }
        }
    }

    /// The last full interval of a drive (None until two samples exist).
    pub fn window(&self, name: &str) -> Option<Window> {
        self.state.lock().get(name).and_then(|s| s.window.clone())
    }

    /// Samples every [`INTERVAL`] until the runtime shuts down.
    pub async fn run(self: Arc<Self>, drives: Arc<Drives>) {
        let mut tick = tokio::time::interval(INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let (s, r) = (self.clone(), drives.clone());
            // Snapshots lock per-drive mutexes briefly: off the async threads.
            let _ = tokio::task::spawn_blocking(move || {
                s.tick(&r);
                compact_drives(&r);
            })
            .await;
        }
    }
}
