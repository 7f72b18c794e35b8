//! `/v1/drives/{name}/sync`, and the persistence part of a drive's JSON
//! (`DriveInfo.persist`, `DriveStats.persist`). The restore route lives
//! with the drive routes (`drives.rs`), since it answers a `DriveInfo`.

use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::Json;

use super::{blocking, ApiError};
use crate::api::wire::persistence::{
    PersistInfo, PersistStatusInfo, Progress, RestoreInfo, SyncResult,
};
use crate::api::wire::values::{DurationValue, SizeValue};
use crate::control::drives::persistent::{phase_name, report_text, RestoreRecord};
use crate::control::drives::spec::{
    check_sync_interval_ms, parse_mem_limit, parse_sync_interval_ms, PersistError, SpecError,
};
use crate::control::drives::Drive;
use crate::control::Daemon;
use crate::metrics::persist::{PersistLive, PersistSample};
use crate::persist::{Durability, PersistStatus};

/// A sync interval from a request.
pub(crate) fn interval_ms(v: &DurationValue) -> Result<u64, SpecError> {
    match v {
        DurationValue::Millis(ms) => check_sync_interval_ms(*ms).map(|_| *ms),
        DurationValue::Text(t) => parse_sync_interval_ms(t),
    }
}

/// A key file path from a request (absolute, as the daemon reads it).
pub(crate) fn key_path(text: &str) -> Result<PathBuf, SpecError> {
    let p = PathBuf::from(text);
    if !p.is_absolute() {
        return Err(PersistError::RelativeKeyFile { path: p }.into());
    }
    Ok(p)
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The live figures of a persistent drive.
pub(crate) fn status_info(s: &PersistStatus) -> PersistStatusInfo {
    PersistStatusInfo {
        sync_state: s.state.as_str().into(),
        last_sync_unix_ms: s.last_sync_unix_ms,
        durable_as_of_unix_ms: s.durable_as_of_unix_ms,
        last_sync_duration_ms: s.last_sync_duration.map(ms),
        max_sync_duration_ms: ms(s.max_sync_duration),
        durable_generation: s.durable_gen,
        dirty_bytes: s.dirty_bytes,
        journal_bytes: s.journal_bytes,
        snapshot_copy_bytes: s.snapshot_copy_bytes,
        bytes_written: s.bytes_written,
        syncs_ok: s.syncs_ok,
        syncs_failed: s.syncs_failed,
        consecutive_failures: s.consecutive_failures as u64,
        checkpoints: s.checkpoints,
        last_error: s.last_error.clone(),
        last_error_unix_ms: s.last_error_unix_ms,
        sync_progress: (s.sync_total_bytes > 0).then_some(Progress {
            done_bytes: s.sync_done_bytes,
            total_bytes: s.sync_total_bytes,
        }),
        sync_count: s.sync_durations.count(),
        sync_seconds_total: s.sync_durations.sum_ns as f64 / 1e9,
        restore_duration_ms: s.restore_duration.map(ms),
    }
}

fn restore_info(r: &RestoreRecord) -> Option<RestoreInfo> {
    let blank = |phase: &str| RestoreInfo {
        phase: phase.into(),
        done_bytes: 0,
        total_bytes: 0,
        duration_ms: None,
        summary: None,
        torn_tail: None,
        error: None,
    };
    Some(match r {
        RestoreRecord::None => return None,
        RestoreRecord::Queued => blank("queued"),
        RestoreRecord::Running(p) => RestoreInfo {
            done_bytes: p.done_bytes(),
            total_bytes: p.total_bytes(),
            ..blank(phase_name(p.phase()))
        },
        RestoreRecord::Done(rep) => RestoreInfo {
            done_bytes: rep.image_data_bytes,
            total_bytes: rep.image_data_bytes,
            duration_ms: Some(ms(rep.duration)),
            summary: Some(report_text(rep)),
            torn_tail: rep.torn_tail.as_ref().map(|t| {
                format!(
                    "{} bytes at byte {} cut: {}",
                    t.bytes, t.damage_offset, t.detail
                )
            }),
            ..blank("done")
        },
        RestoreRecord::WaitingForMemory { error, .. } => RestoreInfo {
            error: Some(error.clone()),
            ..blank("waiting_for_memory")
        },
        RestoreRecord::Failed(e) => RestoreInfo {
            error: Some(e.clone()),
            ..blank("failed")
        },
    })
}

/// The persistence part of a drive's JSON (None for RAM drives).
pub(crate) fn persist_info(drive: &Drive) -> Option<PersistInfo> {
    let p = drive.persist.as_ref()?;
    let spec = p.spec.lock().clone();
    let status = drive.persistent().map(|pd| pd.status());
    let durability = status.as_ref().map_or(spec.durability, |s| s.durability);
    Some(PersistInfo {
        state_dir: p.dir.display().to_string(),
        durability: durability.as_str().into(),
        flush_is_noop: durability == Durability::None,
        sync_interval_ms: status
            .as_ref()
            .map_or(spec.sync_interval_ms, |s| s.sync_interval_ms),
        encrypted: spec.key_file.is_some(),
        key_file: spec.key_file.as_ref().map(|k| k.display().to_string()),
        status: status.as_ref().map(status_info),
        restore: restore_info(&p.restore.lock()),
    })
}

/// The `/metrics` samples of every persistent drive.
pub(crate) fn metrics_samples(drives: &[Arc<Drive>]) -> Vec<PersistSample> {
    drives
        .iter()
        .filter_map(|d| {
            let p = d.persist.as_ref()?;
            let state = d.state.lock().name();
            let restore_seconds = match &*p.restore.lock() {
                RestoreRecord::Done(r) => Some(r.duration.as_secs_f64()),
                _ => None,
            };
            let live = d.persistent().map(|pd| {
                let s = pd.status();
                PersistLive {
                    sync_durations: s.sync_durations,
                    syncs_failed: s.syncs_failed,
                    bytes_written: s.bytes_written,
                    consecutive_failures: s.consecutive_failures as u64,
                    dirty_bytes: s.dirty_bytes,
                    journal_bytes: s.journal_bytes,
                    last_sync_unix_ms: s.last_sync_unix_ms,
                }
            });
            Some(PersistSample {
                name: d.name.clone(),
                state,
                live,
                restore_seconds,
            })
        })
        .collect()
}

pub async fn sync(
    State(d): State<Arc<Daemon>>,
    Path(name): Path<String>,
) -> Result<Json<SyncResult>, ApiError> {
    blocking(move || {
        let (drive, r) = d.drives.sync(&name)?;
        let as_of = drive
            .persistent()
            .and_then(|pd| pd.status().durable_as_of_unix_ms);
        Ok(Json(SyncResult {
            name: drive.name.clone(),
            generation: r.gen,
            data_bytes: r.data_pages * crate::store::PAGE_BYTES,
            zero_bytes: r.zero_pages * crate::store::PAGE_BYTES,
            journal_bytes: r.journal_bytes,
            duration_ms: ms(r.duration),
            durable_as_of_unix_ms: as_of,
        }))
    })
    .await
}

/// A memory limit in a request: a size of at least 1 byte, or `"none"`
/// (`"unlimited"`) for no limit. 0 is refused (it would refuse every
/// write; docs/api.md).
pub(super) fn mem_limit(v: &SizeValue) -> Result<Option<u64>, SpecError> {
    match v {
        SizeValue::Text(t) if matches!(t.trim(), "none" | "unlimited") => Ok(None),
        v => parse_mem_limit(&v.as_text()).map(Some),
    }
}
