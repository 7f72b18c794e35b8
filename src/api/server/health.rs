//! `GET /v1/health`: is the daemon up, and where is everything.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;

use crate::api::wire::health::{Budget, Health, MemoryPressure, Supervisor};
use crate::control::Daemon;

pub(crate) fn budget(d: &Daemon) -> Budget {
    let b = d.drives.budget();
    Budget {
        limit_bytes: b.limit_bytes(),
        used_bytes: b.used_bytes(),
        committed_bytes: d.drives.committed_bytes(),
    }
}

pub async fn get(State(d): State<Arc<Daemon>>) -> Json<Health> {
    let s = &d.settings;
    Json(Health {
        status: "ok".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        pid: std::process::id(),
        uptime_s: d.started.elapsed().as_secs_f64(),
        started_unix_s: d.started_unix_s,
        api_socket: s.api_socket.display().to_string(),
        nbd_socket: s.nbd_socket.display().to_string(),
        nbd_tcp: d.tcp_addrs.iter().map(|a| a.to_string()).collect(),
        state_dir: s.state_dir.display().to_string(),
        config_file: s.config_path.as_ref().map(|p| p.display().to_string()),
        metrics_enabled: d.drives.metrics_enabled(),
        drives: d.drives.list().len() as u64,
        memory_budget: budget(&d),
        memory_pressure: pressure(&d),
        supervisor: crate::handover::serving::get().map(|s| {
            let st = s.status();
            Supervisor {
                pid: st.supervisor_pid,
                alive: st.supervisor_alive,
                restarts: st.restarts,
                last_restart_reason: st.last_restart_reason,
            }
        }),
    })
}

pub(crate) fn pressure(d: &Daemon) -> MemoryPressure {
    let s = d.pressure.status();
    let t = s.thresholds.unwrap_or(d.settings.pressure);
    MemoryPressure {
        short: s.short,
        episodes: s.episodes,
        refused_allocations: d.drives.budget().refused_under_pressure(),
        given_back_bytes: s.given_back_bytes,
        available_bytes: s.reading.available_bytes,
        min_available_bytes: t.min_available_bytes,
        full_avg10_pct: s.reading.full_avg10_pct,
        max_full_avg10_pct: t.full_avg10_pct,
        some_avg10_pct: s.reading.some_avg10_pct,
        cgroup_limit_bytes: s.reading.cgroup_limit_bytes,
    }
}
