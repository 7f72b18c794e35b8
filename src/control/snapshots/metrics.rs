//! The snapshot families of `/metrics`, per drive (or cache) and remote:
//! a drive's series carry `drive="NAME"`, a cache's `cache="NAME"`.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;

use super::service::PushStatus;
use crate::metrics::prometheus::family;

/// (drive, remote, state) of every drive+remote, and now (Unix ms).
#[derive(Debug)]
pub struct SnapshotCollector {
    pub statuses: Vec<(String, String, PushStatus)>,
    pub now_unix_ms: u64,
}

type Labels = Vec<(&'static str, String)>;

fn labels(s: &PushStatus, d: &str, r: &str) -> Labels {
    vec![(s.kind.name(), d.to_owned()), ("remote", r.to_owned())]
}

impl Collector for SnapshotCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let all = &self.statuses;
        let success = |f: &dyn Fn(u64) -> f64| -> Vec<(Labels, ConstGauge<f64>)> {
            all.iter()
                .filter_map(|(d, r, s)| {
                    s.last_success_unix_ms
                        .map(|ms| (labels(s, d, r), ConstGauge::new(f(ms))))
                })
                .collect()
        };
        family(
            &mut enc,
            "ramd_snapshot_last_success_timestamp",
            "When the last successful snapshot push finished (Unix time)",
            Some(Unit::Seconds),
            success(&|ms| ms as f64 / 1000.0),
        )?;
        family(
            &mut enc,
            "ramd_snapshot_age",
            "Time since the last successful snapshot push",
            Some(Unit::Seconds),
            success(&|ms| self.now_unix_ms.saturating_sub(ms) as f64 / 1000.0),
        )?;
        let counter = |f: &dyn Fn(&PushStatus) -> u64| -> Vec<(Labels, ConstCounter<u64>)> {
            all.iter()
                .map(|(d, r, s)| (labels(s, d, r), ConstCounter::new(f(s))))
                .collect()
        };
        family(
            &mut enc,
            "ramd_snapshot_uploaded",
            "Object bytes sent by snapshot pushes (chunks and manifests, after compression)",
            Some(Unit::Bytes),
            counter(&|s| s.bytes_uploaded_total),
        )?;
        family(
            &mut enc,
            "ramd_snapshot_pushes",
            "Snapshot pushes finished (successful or not)",
            None,
            counter(&|s| s.pushes_total),
        )?;
        family(
            &mut enc,
            "ramd_snapshot_failures",
            "Snapshot pushes that failed",
            None,
            counter(&|s| s.failures_total),
        )?;
        family(
            &mut enc,
            "ramd_snapshot_dedup_ratio",
            "The last push's drive data per plaintext byte uploaded (higher: less sent)",
            None,
            all.iter()
                .filter_map(|(d, r, s)| {
                    s.last_dedup_ratio
                        .map(|v| (labels(s, d, r), ConstGauge::new(v)))
                })
                .collect(),
        )
    }
}
