//! `/metrics` families of persistent drives (pure: the daemon gathers a
//! [`PersistSample`] per persistent drive, this encodes them).
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `ramd_drive_state` | gauge (1 for the current state) | `drive`, `state` (ready, restoring, failed) |
//! | `ramd_drive_sync_duration_seconds` | histogram (1 µs .. 17 s) | `drive` |
//! | `ramd_drive_sync_errors_total` | counter | `drive` |
//! | `ramd_drive_sync_written_bytes_total` | counter | `drive` (journal, image, table, meta) |
//! | `ramd_drive_sync_consecutive_failures` | gauge | `drive` |
//! | `ramd_drive_dirty_bytes`, `ramd_drive_journal_bytes` | gauge | `drive` |
//! | `ramd_drive_last_sync_timestamp_seconds` | gauge | `drive` (absent before the first sync) |
//! | `ramd_drive_restore_duration_seconds` | gauge | `drive` (absent for drives created new) |

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

use super::prometheus::{family, Labels, BOUNDS_POW2};
use super::Histogram;

/// One persistent drive at the moment of the scrape.
#[derive(Debug, Clone)]
pub struct PersistSample {
    pub name: String,
    /// "ready", "restoring" or "failed".
    pub state: &'static str,
    /// The live figures; None unless ready.
    pub live: Option<PersistLive>,
    /// How long the restore at open took (None: created new, or not yet).
    pub restore_seconds: Option<f64>,
}

/// The figures of a ready persistent drive.
#[derive(Debug, Clone)]
pub struct PersistLive {
    pub sync_durations: Histogram,
    pub syncs_failed: u64,
    pub bytes_written: u64,
    pub consecutive_failures: u64,
    pub dirty_bytes: u64,
    pub journal_bytes: u64,
    pub last_sync_unix_ms: Option<u64>,
}

/// The collector `/metrics` registers next to the drive families.
#[derive(Debug)]
pub struct PersistCollector(pub Vec<PersistSample>);

fn label(s: &PersistSample) -> Labels {
    vec![("drive", s.name.clone())]
}

impl Collector for PersistCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let all = &self.0;
        let g = |v: u64| ConstGauge::new(v as i64);
        family(
            &mut enc,
            "ramd_drive_state",
            "1 for the state a persistent drive is in (ready, restoring, failed)",
            None,
            all.iter()
                .flat_map(|s| {
                    ["ready", "restoring", "failed"].map(|st| {
                        (
                            vec![("drive", s.name.clone()), ("state", st.to_owned())],
                            g((s.state == st) as u64),
                        )
                    })
                })
                .collect(),
        )?;
        family(
            &mut enc,
            "ramd_drive_restore_duration",
            "How long the drive's restore took",
            Some(Unit::Seconds),
            all.iter()
                .filter_map(|s| s.restore_seconds.map(|v| (label(s), ConstGauge::new(v))))
                .collect(),
        )?;
        let live: Vec<(&PersistSample, &PersistLive)> = all
            .iter()
            .filter_map(|s| s.live.as_ref().map(|l| (s, l)))
            .collect();
        let per = |f: &dyn Fn(&PersistLive) -> u64| -> Vec<(Labels, ConstGauge)> {
            live.iter().map(|(s, l)| (label(s), g(f(l)))).collect()
        };
        family(
            &mut enc,
            "ramd_drive_dirty",
            "Bytes changed in RAM and not yet on disk",
            Some(Unit::Bytes),
            per(&|l| l.dirty_bytes),
        )?;
        family(
            &mut enc,
            "ramd_drive_journal",
            "Committed journal bytes not yet checkpointed into the image",
            Some(Unit::Bytes),
            per(&|l| l.journal_bytes),
        )?;
        family(
            &mut enc,
            "ramd_drive_sync_consecutive_failures",
            "Syncs failed in a row (0 when healthy)",
            None,
            per(&|l| l.consecutive_failures),
        )?;
        family(
            &mut enc,
            "ramd_drive_last_sync_timestamp",
            "When the last successful sync finished (Unix time)",
            Some(Unit::Seconds),
            live.iter()
                .filter_map(|(s, l)| {
                    l.last_sync_unix_ms
                        .map(|ms| (label(s), ConstGauge::new(ms as f64 / 1000.0)))
                })
                .collect(),
        )?;
        family(
            &mut enc,
            "ramd_drive_sync_errors",
            "Syncs that failed (disk full, I/O error) since the drive was opened",
            None,
            live.iter()
                .map(|(s, l)| (label(s), ConstCounter::new(l.syncs_failed)))
                .collect(),
        )?;
        family(
            &mut enc,
            "ramd_drive_sync_written",
            "Bytes written to the state directory since the drive was opened",
            Some(Unit::Bytes),
            live.iter()
                .map(|(s, l)| (label(s), ConstCounter::new(l.bytes_written)))
                .collect(),
        )?;
        if !live.is_empty() {
            let unit = Unit::Seconds;
            let mut m = enc.encode_descriptor(
                "ramd_drive_sync_duration",
                "Duration of successful syncs (cut to durable in the journal)",
                Some(&unit),
                MetricType::Histogram,
            )?;
            let bounds_ns: Vec<u64> = BOUNDS_POW2.map(|p| (1u64 << p) - 1).collect();
            for (s, l) in &live {
                let h = &l.sync_durations;
                let cum = h.cumulative_at(&bounds_ns);
                let mut buckets: Vec<(f64, u64)> = Vec::with_capacity(bounds_ns.len() + 1);
                let mut prev = 0;
                for (&b, n) in bounds_ns.iter().zip(cum) {
                    buckets.push(((b + 1) as f64 / 1e9, n - prev));
                    prev = n;
                }
                buckets.push((f64::INFINITY, h.count() - prev));
                m.encode_family(&label(s))?.encode_histogram::<Labels>(
                    h.sum_ns as f64 / 1e9,
                    h.count(),
                    &buckets,
                    None,
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::prometheus::{encode_with, DaemonSample};

    #[test]
    fn encodes_persistence_families() {
        let mut h = Histogram::default();
        h.record_n(3_000_000, 2);
        let samples = vec![
            PersistSample {
                name: "db".into(),
                state: "ready",
                live: Some(PersistLive {
                    sync_durations: h,
                    syncs_failed: 3,
                    bytes_written: 8192,
                    consecutive_failures: 1,
                    dirty_bytes: 4096,
                    journal_bytes: 12288,
                    last_sync_unix_ms: Some(1_500),
                }),
                restore_seconds: Some(0.25),
            },
            PersistSample {
                name: "bad".into(),
                state: "failed",
                live: None,
                restore_seconds: None,
            },
        ];
        let text = encode_with(
            DaemonSample {
                budget_used_bytes: 0,
                budget_limit_bytes: 1,
                uptime_seconds: 1.0,
                metrics_enabled: true,
                connection_buffer_bytes: 0,
                drives: Vec::new(),
            },
            vec![Box::new(PersistCollector(samples))],
        );
        for want in [
            "ramd_drive_state{drive=\"bad\",state=\"failed\"} 1\n",
            "ramd_drive_state{drive=\"db\",state=\"failed\"} 0\n",
            "ramd_drive_sync_errors_total{drive=\"db\"} 3\n",
            "ramd_drive_sync_written_bytes_total{drive=\"db\"} 8192\n",
            "ramd_drive_dirty_bytes{drive=\"db\"} 4096\n",
            "ramd_drive_journal_bytes{drive=\"db\"} 12288\n",
            "ramd_drive_sync_duration_seconds_count{drive=\"db\"} 2\n",
            "ramd_drive_restore_duration_seconds{drive=\"db\"} 0.25\n",
            "ramd_drive_last_sync_timestamp_seconds{drive=\"db\"} 1.5\n",
        ] {
            assert!(text.contains(want), "want {want:?} in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
    }
}
