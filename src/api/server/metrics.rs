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
use crate::metrics::persist::PersistCollector;
use crate::metrics::prometheus::{encode_with, DaemonSample, DriveSample, CONTENT_TYPE};
use crate::nbd::access::RefusalCollector;

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
                Box::new(CacheCollector(caches)),
                Box::new(AttachCollector(d.attachments.list())),
                Box::new(RefusalCollector::of(&d.nbd_refusals)),
                Box::new(SnapshotCollector {
                    statuses: d.snapshots.statuses(),
                    now_unix_ms: crate::snapshot::remote::now_ms(),
                }),
            ],
        ),
    )
}
