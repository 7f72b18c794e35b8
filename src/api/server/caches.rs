//! `/v1/caches`: list, create, get, change access rules, delete (writing
//! back first), sync.

use std::sync::Arc;

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;

use super::{blocking, ApiError};
use crate::api::wire::caches::{
    BackingInfo, CacheCounters, CacheDeleted, CacheInfo, CacheIo, CacheList, CacheSettings,
    CacheSynced, CreateCache, DeleteCacheQuery, PatchCache,
};
use crate::control::caches::{CacheEntry, CacheSpec, CacheState};
use crate::control::drives::spec::parse_access;
use crate::control::ledger::Origin;
use crate::control::Daemon;

/// The settings part of a cache's view.
fn settings(spec: &CacheSpec) -> CacheSettings {
    let c = &spec.config;
    CacheSettings {
        mode: c.mode.name().into(),
        policy: c.policy.name().into(),
        block_bytes: c.block_bytes,
        cache_bytes: c.cache_bytes,
        sequential_cutoff_bytes: c.sequential_cutoff_bytes,
        dirty_high_percent: c.dirty_high_percent,
        dirty_low_percent: c.dirty_low_percent,
        max_dirty_age_ms: c.max_dirty_age_ms,
        writeback_max_io_bytes: c.writeback_max_io_bytes,
        retry_initial_ms: c.retry_initial_ms,
        retry_max_ms: c.retry_max_ms,
        direct: spec.options.direct_io,
        nbd_connections: spec.options.nbd_connections as u64,
        nbd_timeout_ms: spec.options.nbd_timeout.as_millis() as u64,
        shutdown_timeout_ms: spec.shutdown_timeout_ms,
    }
}

/// The API view of a cache.
pub(crate) fn info(d: &Daemon, e: &CacheEntry, notice: Option<String>) -> CacheInfo {
    let state = e.state();
    let mut backing = BackingInfo {
        spec: e.spec.backing.clone(),
        kind: e.backing_kind.name().into(),
        state: "healthy".into(),
        failing_for_ms: 0,
        consecutive_failures: 0,
        read_errors: 0,
        write_errors: 0,
        flush_errors: 0,
        retries: 0,
        next_retry_in_ms: 0,
        last_error: None,
        open_attempts: 0,
    };
    let (mut size_bytes, mut stats, mut io, mut connections) = (None, None, None, 0);
    match &state {
        CacheState::Ready(live) => {
            let s = live.cache.stats();
            let h = &s.backing;
            backing.state = if h.failing { "failing" } else { "healthy" }.into();
            backing.failing_for_ms = h.failing_for_ms;
            backing.consecutive_failures = h.consecutive_failures;
            backing.read_errors = h.read_errors;
            backing.write_errors = h.write_errors;
            backing.flush_errors = h.flush_errors;
            backing.retries = h.retries;
            backing.next_retry_in_ms = h.next_retry_in_ms;
            backing.last_error = h.last_error.clone();
            size_bytes = Some(s.size_bytes);
            connections = live.export.connections() as u64;
            stats = Some(CacheCounters {
                capacity_bytes: s.capacity_bytes,
                resident_bytes: s.resident_bytes,
                memory_bytes: s.memory_bytes,
                dirty_bytes: s.dirty_bytes,
                read_hits: s.read_hits,
                read_misses: s.read_misses,
                read_hit_ratio: s.read_hit_ratio(),
                write_hits: s.write_hits,
                write_misses: s.write_misses,
                write_hit_ratio: s.write_hit_ratio(),
                hit_ratio: s.hit_ratio(),
                evictions: s.evictions,
                invalidations: s.invalidations,
                writeback_bytes: s.writeback_bytes,
                writeback_rate_bytes_per_s: s.writeback_rate_bytes_per_s,
                writeback_lag_ms: s.writeback_lag_ms,
                bypassed_requests: s.bypassed_requests,
                bypassed_bytes: s.bypassed_bytes,
                backing_read_bytes: s.backing_read_bytes,
                backing_write_bytes: s.backing_write_bytes,
                given_back_bytes: s.given_back_bytes,
            });
            io = Some(CacheIo {
                totals: live
                    .metrics
                    .as_ref()
                    .map(|m| super::counters::totals(&m.snapshot())),
                rates: d
                    .caches
                    .sampler
                    .window(&e.name)
                    .as_ref()
                    .map(super::counters::rates),
            });
        }
        CacheState::Unavailable(o) => {
            backing.state = "unavailable".into();
            backing.last_error = Some(o.error.clone());
            backing.open_attempts = o.attempts as u64;
            backing.next_retry_in_ms = o
                .next_attempt
                .saturating_duration_since(std::time::Instant::now())
                .as_millis() as u64;
        }
        CacheState::Opening | CacheState::Closing => {}
    }
    CacheInfo {
        name: e.name.clone(),
        kind: "cache".into(),
        state: state.name().into(),
        origin: e.origin().name().into(),
        created_unix_s: e.created_unix_s,
        size_bytes,
        promised_bytes: e.promised_bytes(),
        connections,
        attachments: e
            .attachments
            .lock()
            .iter()
            .map(|p| p.display().to_string())
            .collect(),
        uri: d.unix_uri(&e.name),
        tcp_uris: d.tcp_uris(&e.name),
        backing,
        settings: settings(&e.spec),
        access: super::drives::wire_access(&e.access.lock()),
        stats,
        io,
        snapshots: super::snapshots::status_of(d, &e.name).statuses,
        nvme_nqn: super::drives::nvme_nqn(d, &e.name),
        nvme_hosts: super::drives::nvme_hosts(d, &e.name),
        notice,
    }
}

/// Every cache's view, by name.
pub(crate) fn all(d: &Daemon) -> Vec<CacheInfo> {
    d.caches.list().iter().map(|e| info(d, e, None)).collect()
}

/// A create request as a spec (every option through `CacheSpec::set`, as
/// the CLI flags and the config file).
fn spec_of(req: &CreateCache) -> Result<CacheSpec, ApiError> {
    let mut spec = CacheSpec::new(&req.name, &req.backing, &req.size.as_text(), &req.mode)?;
    let mut set = |key: &str, value: Option<String>| -> Result<(), ApiError> {
        match value {
            Some(v) => Ok(spec.set(key, &v)?),
            None => Ok(()),
        }
    };
    set("block-size", req.block_size.as_ref().map(|v| v.as_text()))?;
    set("policy", req.policy.clone())?;
    set(
        "sequential-cutoff",
        req.sequential_cutoff.as_ref().map(|v| v.as_text()),
    )?;
    set("dirty-high", req.dirty_high.as_ref().map(|v| v.as_text()))?;
    set("dirty-low", req.dirty_low.as_ref().map(|v| v.as_text()))?;
    set(
        "max-dirty-age",
        req.max_dirty_age.as_ref().map(|v| v.as_text()),
    )?;
    set(
        "writeback-max-io",
        req.writeback_max_io.as_ref().map(|v| v.as_text()),
    )?;
    set(
        "retry-initial",
        req.retry_initial.as_ref().map(|v| v.as_text()),
    )?;
    set("retry-max", req.retry_max.as_ref().map(|v| v.as_text()))?;
    set(
        "nbd-connections",
        req.nbd_connections.map(|n| n.to_string()),
    )?;
    set("nbd-timeout", req.nbd_timeout.as_ref().map(|v| v.as_text()))?;
    set(
        "shutdown-timeout",
        req.shutdown_timeout.as_ref().map(|v| v.as_text()),
    )?;
    spec.options.direct_io = req.direct;
    if let Some(a) = &req.access {
        spec.access = parse_access(
            &a.allow_identities,
            &a.read_only_identities,
            &a.allow_networks,
        )?;
    }
    spec.validate()?;
    Ok(spec)
}

/// The notice for run-time changes to a cache declared in the config.
fn ephemeral(e: &CacheEntry, what: &str) -> Option<String> {
    match e.origin() {
        Origin::Config(file) => Some(format!(
            "cache '{}' is declared in {}: {what} lasts until the daemon restarts; edit the file to keep it",
            e.name,
            file.display()
        )),
        _ => None,
    }
}

pub async fn list(State(d): State<Arc<Daemon>>) -> Json<CacheList> {
    Json(CacheList { caches: all(&d) })
}

pub async fn get(
    State(d): State<Arc<Daemon>>,
    Path(name): Path<String>,
) -> Result<Json<CacheInfo>, ApiError> {
    let e = d.caches.get(&name)?;
    Ok(Json(info(&d, &e, None)))
}

pub async fn create(
    State(d): State<Arc<Daemon>>,
    who: super::host_paths::Requester,
    body: Result<Json<CreateCache>, JsonRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let Json(req) = body?;
    super::host_paths::backing(&d.settings.api_policy, who, &req.backing)?;
    let spec = spec_of(&req)?;
    let d2 = d.clone();
    // Opening an NBD backing may take up to its timeout: off the async threads.
    let e = blocking(move || Ok(d2.caches.create(spec, Origin::Api)?)).await?;
    let location = format!("/v1/caches/{}", e.name);
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(info(&d, &e, None)),
    ))
}

/// `PATCH /v1/caches/{name}`: its access rules (the only run-time change a
/// cache takes; its size and mode need a new cache).
pub async fn patch(
    State(d): State<Arc<Daemon>>,
    Path(name): Path<String>,
    body: Result<Json<PatchCache>, JsonRejection>,
) -> Result<Json<CacheInfo>, ApiError> {
    let Json(req) = body?;
    let change = match &req.access {
        None => return Err(ApiError::invalid("nothing to change: give access")),
        Some(a) => super::drives::access_change(a)?,
    };
    let before = d
        .caches
        .live(&name)
        .map_or(0, |(_, l)| l.export.connections());
    let (e, closed) = d.caches.set_access(&name, &change)?;
    let notices: Vec<String> = [
        ephemeral(&e, "this change"),
        super::drives::access_notice(&name, before, closed),
    ]
    .into_iter()
    .flatten()
    .collect();
    let notice = (!notices.is_empty()).then(|| notices.join("; "));
    Ok(Json(info(&d, &e, notice)))
}

pub async fn delete(
    State(d): State<Arc<Daemon>>,
    Path(name): Path<String>,
    query: Result<Query<DeleteCacheQuery>, QueryRejection>,
) -> Result<Json<CacheDeleted>, ApiError> {
    let Query(q) = query?;
    blocking(move || {
        let e = d.caches.get(&name)?;
        if q.force {
            // A forced delete detaches first; a busy mount stops it.
            d.attachments.detach_drive(&name)?;
            d.ublk.detach_drive(&name)?;
        }
        let r = d.caches.delete(&name, q.force)?;
        Ok(Json(CacheDeleted {
            name: e.name.clone(),
            closed_connections: r.closed_connections as u64,
            written_back_bytes: r.written_back_bytes,
            dropped_dirty_bytes: r.dropped_dirty_bytes,
            notice: ephemeral(&e, "the deletion"),
        }))
    })
    .await
}

pub async fn sync(
    State(d): State<Arc<Daemon>>,
    Path(name): Path<String>,
) -> Result<Json<CacheSynced>, ApiError> {
    blocking(move || {
        let r = d.caches.sync(&name)?;
        Ok(Json(CacheSynced {
            name,
            written_back_bytes: r.written_back_bytes,
            dirty_bytes: r.dirty_bytes,
            duration_ms: r.duration_ms,
        }))
    })
    .await
}
