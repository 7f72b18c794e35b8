//! Once a second, a snapshot of every drive's metrics, so `ramd stats` can
//! show rates (IOPS, MiB/s) and the latency of the last second without
//! making clients sample twice.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::drives::Drives;
use crate::metrics::Totals;

/// How often drives are sampled.
pub const INTERVAL: Duration = Duration::from_secs(1);

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
            let _ = tokio::task::spawn_blocking(move || s.tick(&r)).await;
        }
    }
}
