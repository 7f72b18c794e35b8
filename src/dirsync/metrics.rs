//! Prometheus families for directories in RAM (pure: a listing in, a
//! collector out; `GET /metrics` adds it to the daemon's).
//!
//! | metric | type | meaning |
//! |---|---|---|
//! | `ramd_dirs` | gauge | directories managed |
//! | `ramd_dir_active` | gauge (0/1) | in RAM and syncing (0: activating or failed) |
//! | `ramd_dir_ram_used_bytes`, `ramd_dir_ram_size_bytes` | gauge | the RAM copy's tmpfs |
//! | `ramd_dir_ram_usage_ratio` | gauge (0-1) | fuller of space and inodes (warnings at 0.8, 0.95) |
//! | `ramd_dir_last_sync_timestamp_seconds` | gauge | end of the last successful sync |
//! | `ramd_dir_last_sync_duration_seconds` | gauge | how long it took |
//! | `ramd_dir_syncs_total`, `ramd_dir_sync_failures_total` | counter | since the daemon started |
//! | `ramd_dir_synced_bytes_total`, `ramd_dir_synced_files_total` | counter | data written to disk |
//! | `ramd_dir_files_skipped_changing_total` | counter | files left for the next sync |
//! | `ramd_dir_recovery_copies` | gauge | dated copies a crash left |
//!
//! Every series has a `dir` label: the directory's path.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;

use super::manager::{DirInfo, DirStatus};
use crate::metrics::prometheus::{family, Labels};

/// The directories at the moment of the scrape.
#[derive(Debug)]
pub struct DirsCollector(pub Vec<DirInfo>);

fn label(d: &DirInfo) -> Labels {
    vec![("dir", d.path.display().to_string())]
}

impl Collector for DirsCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let dirs = &self.0;
        let g = |v: u64| ConstGauge::new(v as i64);
        let c = ConstCounter::new;
        family(
            &mut enc,
            "ramd_dirs",
            "Directories kept in RAM",
            None,
            vec![(vec![], g(dirs.len() as u64))],
        )?;
        let per_g = |f: &dyn Fn(&DirInfo) -> Option<u64>| -> Vec<(Labels, ConstGauge)> {
            dirs.iter()
                .filter_map(|d| f(d).map(|v| (label(d), g(v))))
                .collect()
        };
        let per_f = |f: &dyn Fn(&DirInfo) -> Option<f64>| -> Vec<(Labels, ConstGauge<f64>)> {
            dirs.iter()
                .filter_map(|d| f(d).map(|v| (label(d), ConstGauge::new(v))))
                .collect()
        };
        let per_c = |f: &dyn Fn(&DirInfo) -> u64| -> Vec<(Labels, ConstCounter)> {
            dirs.iter().map(|d| (label(d), c(f(d)))).collect()
        };
        family(
            &mut enc,
            "ramd_dir_active",
            "1 while the directory is in RAM and synced on schedule",
            None,
            per_g(&|d| Some((d.status == DirStatus::Active) as u64)),
        )?;
        family(
            &mut enc,
            "ramd_dir_ram_used",
            "Space the RAM copy uses",
            Some(Unit::Bytes),
            per_g(&|d| d.usage.map(|u| u.used_bytes)),
        )?;
        family(
            &mut enc,
            "ramd_dir_ram_size",
            "Size of the RAM copy's tmpfs (its size limit)",
            Some(Unit::Bytes),
            per_g(&|d| d.usage.map(|u| u.total_bytes)),
        )?;
        family(
            &mut enc,
            "ramd_dir_ram_usage",
            "The fuller of space and inodes (warning at 0.8, critical at 0.95)",
            Some(Unit::Other("ratio".into())),
            per_f(&|d| d.usage_percent.map(|p| p as f64 / 100.0)),
        )?;
        family(
            &mut enc,
            "ramd_dir_last_sync_timestamp",
            "When the last successful sync finished (Unix time)",
            Some(Unit::Seconds),
            per_f(&|d| d.last_sync_unix_ms.map(|t| t as f64 / 1000.0)),
        )?;
        family(
            &mut enc,
            "ramd_dir_last_sync_duration",
            "How long the last successful sync took",
            Some(Unit::Seconds),
            per_f(&|d| d.last_sync.as_ref().map(|r| r.duration_ms as f64 / 1000.0)),
        )?;
        family(
            &mut enc,
            "ramd_dir_syncs",
            "Syncs that finished since the daemon started",
            None,
            per_c(&|d| d.totals.syncs),
        )?;
        family(
            &mut enc,
            "ramd_dir_sync_failures",
            "Syncs that failed (disk full, I/O error) since the daemon started",
            None,
            per_c(&|d| d.totals.failed_syncs),
        )?;
        family(
            &mut enc,
            "ramd_dir_synced",
            "Data bytes written to the on-disk copy",
            Some(Unit::Bytes),
            per_c(&|d| d.totals.bytes_copied),
        )?;
        family(
            &mut enc,
            "ramd_dir_synced_files",
            "Files written to the on-disk copy",
            None,
            per_c(&|d| d.totals.files_copied),
        )?;
        family(
            &mut enc,
            "ramd_dir_files_skipped_changing",
            "Times a file kept changing during a sync and was left for the next one",
            None,
            per_c(&|d| d.totals.files_skipped_changing),
        )?;
        family(
            &mut enc,
            "ramd_dir_recovery_copies",
            "Dated copies of RAM content a crashed daemon left",
            None,
            per_g(&|d| Some(d.recovery_copies.len() as u64)),
        )?;
        Ok(())
    }
}
