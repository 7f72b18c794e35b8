//! `/v1/stats` and `/v1/drives/{name}/stats`: counters since creation,
//! rates and latency of the last second, memory.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::Json;

use super::counters::{rates, totals};
use super::health::budget;
use super::ApiError;
use crate::api::wire::stats::{DriveStats, StatsReport};
use crate::control::drives::Drive;
use crate::control::Daemon;

pub(crate) fn drive_stats(d: &Daemon, drive: &Drive) -> DriveStats {
    DriveStats {
        name: drive.name.clone(),
        size_bytes: drive.size_bytes(),
        allocated_bytes: drive.allocated_bytes(),
        mem_limit_bytes: drive.mem_limit_bytes(),
        connections: drive.connections() as u64,
        totals: drive.metrics.as_ref().map(|m| totals(&m.snapshot())),
        rates: d.sampler.window(&drive.name).as_ref().map(rates),
        persist: drive
            .persistent()
            .map(|pd| super::persistence::status_info(&pd.status())),
        compression: super::drives::compression_info(drive),
    }
}

pub async fn drive(
    State(d): State<Arc<Daemon>>,
    Path(name): Path<String>,
) -> Result<Json<DriveStats>, ApiError> {
    let drive = d.drives.get(&name)?;
    Ok(Json(drive_stats(&d, &drive)))
}

pub async fn all(State(d): State<Arc<Daemon>>) -> Json<StatsReport> {
    Json(report(&d))
}

/// Every drive's and cache's figures now (also each event of `/v1/events`).
pub(crate) fn report(d: &Daemon) -> StatsReport {
    StatsReport {
        metrics_enabled: d.drives.metrics_enabled(),
        memory_budget: budget(d),
        drives: d.drives.list().iter().map(|x| drive_stats(d, x)).collect(),
        caches: super::caches::all(d),
    }
}
