//! Scheduled pushes: one task per drive or cache whose `[[drive]]` or
//! `[[cache]]` has `snapshot_interval` and `snapshot_remote`. Every
//! interval it pushes it (a point-in-time cut; it keeps serving; a cache
//! is written back first, see `target.rs`) and, when a retention is set,
//! prunes the remote after a successful push.
//!
//! A push that fails is recorded (`last_error`, the failures counter) and
//! tried again at the next tick; a drive or cache that is missing or not
//! ready at a tick is skipped (logged at debug). Ticks missed while a push
//! ran long are skipped, not queued, so a slow remote never piles up
//! pushes.

use std::sync::Arc;
use std::time::Duration;

use super::error::SnapshotsError;
use super::policy::TargetKind;
use super::service::{PushRequest, Snapshots};
use super::target::Target;
use crate::control::caches::Caches;
use crate::control::drives::Drives;

/// The drives and caches a push may name.
#[derive(Clone)]
struct Objects {
    drives: Arc<Drives>,
    caches: Arc<Caches>,
}

/// Starts the schedule on its own thread and runtime (so scheduled
/// pushes never slow the API's), when any drive or cache has one.
pub fn start(
    snapshots: &Arc<Snapshots>,
    drives: &Arc<Drives>,
    caches: &Arc<Caches>,
) -> Result<(), SnapshotsError> {
    let scheduled = snapshots
        .policies()
        .values()
        .any(|p| p.interval_ms.is_some());
    if !scheduled {
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(SnapshotsError::Runtime)?;
    let (s, o) = (
        snapshots.clone(),
        Objects {
            drives: drives.clone(),
            caches: caches.clone(),
        },
    );
    std::thread::Builder::new()
        .name("snapshot-schedule".into())
        .spawn(move || {
            rt.block_on(async move {
                spawn_all(&s, &o);
                std::future::pending::<()>().await
            })
        })
        .map_err(SnapshotsError::Runtime)?;
    Ok(())
}

/// Spawns one task per scheduled drive or cache on the current runtime.
fn spawn_all(snapshots: &Arc<Snapshots>, objects: &Objects) {
    for (drive, policy) in snapshots.policies() {
        let (Some(interval_ms), Some(remote)) = (policy.interval_ms, &policy.remote) else {
            continue;
        };
        let req = PushRequest {
            drive: drive.clone(),
            remote: remote.clone(),
            label: "scheduled".into(),
            encrypt: policy.encrypt,
        };
        tracing::info!(name = %drive, kind = policy.kind.name(), remote = %remote, every_ms = interval_ms, "scheduled snapshots");
        tokio::spawn(run_one(
            snapshots.clone(),
            objects.clone(),
            policy.kind,
            req,
            Duration::from_millis(interval_ms),
            policy.retention,
        ));
    }
}

async fn run_one(
    snapshots: Arc<Snapshots>,
    objects: Objects,
    kind: TargetKind,
    req: PushRequest,
    every: Duration,
    retention: crate::snapshot::Retention,
) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        let target = match Target::find(kind, &objects.drives, &objects.caches, &req.drive) {
            Ok(t) => t,
            Err(e) => {
                tracing::debug!(name = %req.drive, "scheduled snapshot skipped: {e}");
                continue;
            }
        };
        let handle = match snapshots.start_push(target, &req) {
            Ok((_, h)) => h,
            Err(e) => {
                tracing::warn!(drive = %req.drive, remote = %req.remote, "scheduled snapshot not started: {e}");
                continue;
            }
        };
        let _ = handle.await;
        let ok = snapshots
            .statuses()
            .iter()
            .any(|(d, r, s)| *d == req.drive && *r == req.remote && s.last_error.is_none());
        if ok && (retention.keep_last.is_some() || retention.keep_daily.is_some()) {
            if let Err(e) = snapshots.prune(&req.remote, retention, None).await {
                tracing::warn!(drive = %req.drive, remote = %req.remote, "prune after the scheduled snapshot failed: {e}");
            }
        }
    }
}
