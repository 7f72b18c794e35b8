//! `GET /metrics`: Prometheus / OpenMetrics text.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use crate::cache::prometheus::{CacheCollector, CacheSample};
use crate::control::snapshots::metrics::SnapshotCollector;
use crate::control::Daemon;
use crate::dirsync::metrics::DirsCollector;
use crate::fuse::metrics::AttachCollector;
use crate::metrics::compressed::{CompressedCollector, CompressedSample};
use crate::metrics::persist::PersistCollector;
use crate::metrics::prometheus::{encode_with, DaemonSample, DriveSample, CONTENT_TYPE};
use crate::nbd::access::RefusalCollector;

/// The compressed drives' figures (zram's `mm_stat`).
fn compressed_samples(d: &Daemon) -> Vec<CompressedSample> {
    d.drives
        .list()
        .iter()
        .filter_map(|x| {
            let s = x.compression_stats()?;
            Some(CompressedSample {
                name: x.name.clone(),
                orig_data_bytes: s.orig_data_bytes,
                compr_data_bytes: s.compr_data_bytes,
                mem_used_bytes: s.mem_used_bytes(),
                same_pages: s.same_pages,
                huge_pages: s.huge_pages,
                compressed_pages: s.compressed_pages,
                compact_runs: s.compact_runs,
                compact_moved_objects: s.compact_moved_objects,
                compact_freed_bytes: s.compact_freed_bytes,
                recompressed_pages: s.recompressed_pages,
                recompress_saved_bytes: s.recompress_saved_bytes,
                ratio: s.ratio(),
            })
        })
        .collect()
}

pub async fn get(State(d): State<Arc<Daemon>>) -> impl IntoResponse {
    let drives = d
        .drives
        .list()
        .iter()
        .map(|x| DriveSample {
            name: x.name.clone(),
            size_bytes: x.size_bytes(),
            allocated_bytes: x.allocated_bytes(),
            mem_limit_bytes: x.mem_limit_bytes(),
            connections: (x.connections() + x.attachments.lock().len()) as u64,
            read_only: x.export.is_read_only(),
            totals: x.metrics.as_ref().map(|m| m.snapshot()),
        })
        .collect();
    let b = d.drives.budget();
    let sample = DaemonSample {
        budget_used_bytes: b.used_bytes(),
        budget_limit_bytes: b.limit_bytes(),
        uptime_seconds: d.started.elapsed().as_secs_f64(),
        metrics_enabled: d.drives.metrics_enabled(),
        connection_buffer_bytes: crate::nbd::conn::buffer_bytes(),
        drives,
    };
    let persist = super::persistence::metrics_samples(&d.drives.list());
    // Listing directories stats their tmpfs: off the async threads.
    let d2 = d.clone();
    let dirs = super::blocking(move || Ok(d2.dirs.manager.list()))
        .await
        .unwrap_or_default();
    let caches = d
        .caches
        .list()
        .iter()
        .map(|e| {
            let live = e.live();
            CacheSample {
                name: e.name.clone(),
                stats: live.as_ref().map(|l| l.cache.stats()),
                connections: live.as_ref().map_or(0, |l| l.export.connections() as u64),
                totals: live
                    .as_ref()
                    .and_then(|l| l.metrics.as_ref().map(|m| m.snapshot())),
            }
        })
        .collect();
    (
        [(header::CONTENT_TYPE, CONTENT_TYPE)],
        encode_with(
            sample,
            vec![
                Box::new(DirsCollector(dirs)),
                Box::new(PersistCollector(persist)),
                Box::new(CompressedCollector(compressed_samples(&d))),
                Box::new(CacheCollector(caches)),
                Box::new(AttachCollector(d.attachments.list())),
                Box::new(crate::ublk::metrics::UblkCollector(d.ublk.list())),
                Box::new(RefusalCollector::of(&d.nbd_refusals)),
                Box::new(crate::control::pressure::PressureCollector {
                    status: d.pressure.status(),
                    refused_allocations: d.drives.budget().refused_under_pressure(),
                }),
                Box::new(SnapshotCollector {
                    statuses: d.snapshots.statuses(),
                    now_unix_ms: crate::snapshot::remote::now_ms(),
                }),
            ],
        ),
    )
}
