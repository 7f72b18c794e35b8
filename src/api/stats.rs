//! `/v1/stats` and `/v1/drives/{name}/stats`: counters since creation,
//! rates and latency of the last second, memory.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::Json;

use super::health::budget;
use super::types::{DriveStats, Latency, StatsRates, StatsReport, StatsTotals};
use super::ApiError;
use crate::daemon::registry::Drive;
use crate::daemon::sampler::Window;
use crate::daemon::Daemon;
use crate::metrics::{Histogram, Op, Timed, Totals, ERRNOS};

fn latency(h: &Histogram) -> Latency {
    let count = h.count();
    let us = |q: f64| h.quantile_ns(q).map(|ns| ns as f64 / 1000.0);
    Latency {
        count,
        mean_us: (count > 0).then(|| h.sum_ns as f64 / count as f64 / 1000.0),
        p50_us: us(0.5),
        p90_us: us(0.9),
        p99_us: us(0.99),
        p999_us: us(0.999),
    }
}

fn latencies(t: &Totals) -> BTreeMap<String, Latency> {
    Timed::ALL
        .iter()
        .map(|&k| (k.name().to_owned(), latency(t.latency(k))))
        .collect()
}

pub(crate) fn totals(t: &Totals) -> StatsTotals {
    StatsTotals {
        ops: Op::ALL
            .iter()
            .map(|&o| (o.name().to_owned(), t.ops(o)))
            .collect(),
        bytes: Op::ALL
            .iter()
            .map(|&o| (o.name().to_owned(), t.bytes(o)))
            .collect(),
        errors: ERRNOS
            .iter()
            .enumerate()
            .map(|(i, (_, name))| ((*name).to_owned(), t.errors[i]))
            .collect(),
        connections_opened: t.connections_total,
        latency: latencies(t),
    }
}

pub(crate) fn rates(w: &Window) -> StatsRates {
    let s = w.interval.as_secs_f64().max(1e-9);
    let t = &w.delta;
    StatsRates {
        interval_s: w.interval.as_secs_f64(),
        iops: t.ops.iter().sum::<u64>() as f64 / s,
        read_iops: t.ops(Op::Read) as f64 / s,
        write_iops: t.ops(Op::Write) as f64 / s,
        read_bytes_per_s: t.bytes(Op::Read) as f64 / s,
        write_bytes_per_s: t.bytes(Op::Write) as f64 / s,
        latency: latencies(t),
    }
}

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
    }
}

pub async fn drive(
    State(d): State<Arc<Daemon>>,
    Path(name): Path<String>,
) -> Result<Json<DriveStats>, ApiError> {
    let drive = d.registry.get(&name)?;
    Ok(Json(drive_stats(&d, &drive)))
}

pub async fn all(State(d): State<Arc<Daemon>>) -> Json<StatsReport> {
    Json(StatsReport {
        metrics_enabled: d.registry.metrics_enabled(),
        memory_budget: budget(&d),
        drives: d
            .registry
            .list()
            .iter()
            .map(|x| drive_stats(&d, x))
            .collect(),
        caches: super::caches::all(&d),
    })
}
