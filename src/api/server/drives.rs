//! `/v1/drives`: list, create (RAM or persistent; a persistent drive whose
//! state directory holds one is restored), get, patch (resize, lock/unlock,
//! memory limit, durability, sync interval), delete (persistent drives:
//! keep or remove their data).

use std::sync::Arc;

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;

use super::persistence::{interval_ms, key_path, mem_limit, persist_info};
use super::{blocking, ApiError};
use crate::api::wire::drives::{
    AccessPatch, CompressionInfo, CreateDrive, DeleteQuery, Deleted, DriveAccess, DriveInfo,
    DriveList, NvmeHost, PatchDrive,
};
use crate::api::wire::persistence::RestoreRequest;
use crate::control::access::Closed;
use crate::control::drives::persistent::settings::Given;
use crate::control::drives::spec::{
    parse_access, parse_compress, parse_drive_size, parse_durability, parse_networks, AccessError,
    DriveSpec, PersistOptions, SpecError,
};
use crate::control::drives::{AccessChange, Drive, DriveChange, DriveState, Source};
use crate::control::ledger::Origin;
use crate::control::Daemon;
use crate::nbd::access::{AccessRules, EmptyIdentity};
use crate::persist::RestoreOptions;

/// The API view of a drive.
pub(crate) fn info(d: &Daemon, drive: &Drive, notice: Option<String>) -> DriveInfo {
    // One lock, released before anything else looks at the state.
    let state = drive.state.lock().clone();
    DriveInfo {
        name: drive.name.clone(),
        kind: drive.kind.name().into(),
        state: state.name().into(),
        size_bytes: drive.size_bytes(),
        read_only: drive.export.is_read_only(),
        mem_limit_bytes: drive.mem_limit_bytes(),
        allocated_bytes: drive.allocated_bytes(),
        overcommit: *drive.overcommit.lock(),
        lock_memory: drive.lock_memory,
        connections: drive.connections() as u64,
        attachments: drive
            .attachments
            .lock()
            .iter()
            .map(|p| p.display().to_string())
            .collect(),
        origin: drive.origin().name().into(),
        created_unix_s: drive.created_unix_s,
        uri: d.unix_uri(&drive.name),
        tcp_uris: d.tcp_uris(&drive.name),
        access: wire_access(&drive.access.lock()),
        notice,
        persist: persist_info(drive),
        error: match state {
            DriveState::Failed(e) => Some(e),
            _ => None,
        },
        compression: compression_info(drive),
        snapshots: super::snapshots::status_of(d, &drive.name).statuses,
        nvme_nqn: nvme_nqn(d, &drive.name),
        nvme_hosts: nvme_hosts(d, &drive.name),
    }
}

/// A compressed drive's figures as the API shows them (also in
/// `/v1/drives/{name}/stats`).
pub(crate) fn compression_info(drive: &Drive) -> Option<CompressionInfo> {
    let c = drive.compressed()?;
    let s = c.stats();
    Some(CompressionInfo {
        algorithm: c.algorithm().to_string(),
        orig_data_bytes: s.orig_data_bytes,
        compr_data_bytes: s.compr_data_bytes,
        slab_bytes: s.slab_bytes,
        metadata_bytes: s.metadata_bytes,
        mem_used_bytes: s.mem_used_bytes(),
        same_pages: s.same_pages,
        huge_pages: s.huge_pages,
        compressed_pages: s.compressed_pages,
        compact_runs: s.compact_runs,
        compact_moved_objects: s.compact_moved_objects,
        compact_freed_bytes: s.compact_freed_bytes,
        recompressed_pages: s.recompressed_pages,
        recompress_attempts: s.recompress_attempts,
        recompress_saved_bytes: s.recompress_saved_bytes,
        recompress_cpu_ms: s.recompress_cpu_ms,
        urgent_sweeps: s.urgent_sweeps,
        ratio: s.ratio(),
    })
}

/// Access rules as the API shows them.
pub(super) fn wire_access(rules: &AccessRules) -> DriveAccess {
    DriveAccess {
        allow_identities: rules.identities.clone(),
        read_only_identities: rules.read_only_identities.clone(),
        allow_networks: rules.networks.iter().map(|n| n.to_string()).collect(),
    }
}

/// A `PATCH`'s access change (of a drive or a cache), checked: something
/// to change, every network parses, no empty identity.
pub(super) fn access_change(p: &AccessPatch) -> Result<AccessChange, ApiError> {
    if p == &AccessPatch::default() {
        return Err(ApiError::invalid(
            "access: give allow_identities, read_only_identities or allow_networks (an empty list removes that rule)",
        ));
    }
    Ok(checked_change(p)?)
}

/// An access patch with every network parsed and no empty identity.
fn checked_change(p: &AccessPatch) -> Result<AccessChange, SpecError> {
    let no_empty = |ids: &Option<Vec<String>>| match ids {
        Some(v) if v.iter().any(|i| i.is_empty()) => {
            Err(SpecError::from(AccessError::from(EmptyIdentity)))
        }
        _ => Ok(ids.clone()),
    };
    Ok(AccessChange {
        identities: no_empty(&p.allow_identities)?,
        read_only_identities: no_empty(&p.read_only_identities)?,
        networks: p
            .allow_networks
            .as_deref()
            .map(parse_networks)
            .transpose()?,
    })
}

pub async fn list(State(d): State<Arc<Daemon>>) -> Json<DriveList> {
    let drives = d.drives.list().iter().map(|x| info(&d, x, None)).collect();
    Json(DriveList { drives })
}

pub async fn get(
    State(d): State<Arc<Daemon>>,
    Path(name): Path<String>,
) -> Result<Json<DriveInfo>, ApiError> {
    let drive = d.drives.get(&name)?;
    Ok(Json(info(&d, &drive, None)))
}

pub async fn create(
    State(d): State<Arc<Daemon>>,
    who: super::host_paths::Requester,
    body: Result<Json<CreateDrive>, JsonRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let Json(req) = body?;
    super::host_paths::key_file(&d.settings.api_policy, who, req.key_file.as_deref())?;
    let given = Given {
        size: req.size.is_some(),
        durability: req.durability.is_some(),
        sync_interval: req.sync_interval.is_some(),
        key_file: req.key_file.is_some(),
        mem_limit: req.mem_limit.is_some(),
        read_only: req.read_only,
        overcommit: req.overcommit,
        access: req.access.is_some(),
        compress: req.compress.is_some(),
        lock_memory: req.lock_memory,
    };
    let access = match &req.access {
        Some(a) => parse_access(
            &a.allow_identities,
            &a.read_only_identities,
            &a.allow_networks,
        )?,
        None => AccessRules::default(),
    };
    let persist = PersistOptions {
        persist: req.persist,
        durability: req
            .durability
            .as_deref()
            .map(parse_durability)
            .transpose()?,
        sync_interval_ms: req.sync_interval.as_ref().map(interval_ms).transpose()?,
        encrypt: req.encrypt,
        key_file: req.key_file.as_deref().map(key_path).transpose()?,
    }
    .into_spec()?;
    // Without a size (not read then), a persistent drive in the state
    // directory keeps its own: `create_from` decides.
    let spec = DriveSpec {
        name: req.name.clone(),
        size_bytes: match &req.size {
            Some(s) => parse_drive_size(&s.as_text())?,
            None => 0,
        },
        mem_limit_bytes: match &req.mem_limit {
            Some(v) => mem_limit(v)?,
            None => None,
        },
        read_only: req.read_only,
        overcommit: req.overcommit,
        persist,
        access,
        compress: req
            .compress
            .as_deref()
            .map(parse_compress)
            .transpose()?
            .flatten(),
        lock_memory: req.lock_memory,
    };
    // The name, the stored settings it did not give (an unusable
    // drive.json fails the drive in the registry, never silently
    // rewritten) and every other rule: `create_from`.
    let d2 = d.clone();
    let created = blocking(move || Ok(d2.drives.create_from(spec, Source::Api(given))?)).await?;
    let drive = created.drive;
    let location = format!("/v1/drives/{}", drive.name);
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(info(&d, &drive, created.notice)),
    ))
}

pub async fn patch(
    State(d): State<Arc<Daemon>>,
    Path(name): Path<String>,
    body: Result<Json<PatchDrive>, JsonRejection>,
) -> Result<Json<DriveInfo>, ApiError> {
    let Json(req) = body?;
    if req.size.is_none()
        && req.read_only.is_none()
        && req.mem_limit.is_none()
        && req.durability.is_none()
        && req.sync_interval.is_none()
        && req.access.is_none()
    {
        return Err(ApiError::invalid(
            "nothing to change: give size, read_only, mem_limit, durability, sync_interval or access",
        ));
    }
    let access = req.access.as_ref().map(access_change).transpose()?;
    let durability = req
        .durability
        .as_deref()
        .map(parse_durability)
        .transpose()?;
    let sync_interval_ms = req.sync_interval.as_ref().map(interval_ms).transpose()?;
    let change = DriveChange {
        size_bytes: match &req.size {
            Some(s) => Some(parse_drive_size(&s.as_text())?),
            None => None,
        },
        read_only: req.read_only,
        mem_limit_bytes: match &req.mem_limit {
            Some(v) => Some(mem_limit(v)?),
            None => None,
        },
        force: req.force,
    };
    let plain = change.size_bytes.is_some()
        || change.read_only.is_some()
        || change.mem_limit_bytes.is_some();
    let resizing = change.size_bytes.is_some();
    let d2 = d.clone();
    let (drive, closed) = blocking(move || {
        if durability.is_some() || sync_interval_ms.is_some() {
            // Checked (persistent, ready) before anything changes.
            d2.drives
                .set_persistence(&name, durability, sync_interval_ms)?;
        }
        let mut closed = None;
        if let Some(a) = &access {
            let before = d2.drives.get(&name)?.connections();
            closed = Some((before, d2.drives.set_access(&name, a)?.1));
        }
        if plain {
            return Ok((d2.drives.change(&name, &change)?, closed));
        }
        Ok((d2.drives.get(&name)?, closed))
    })
    .await?;
    let resized = resizing.then(|| resize_notice(&drive));
    let device = match resizing {
        true => {
            let (d3, name, size) = (d.clone(), drive.name.clone(), drive.size_bytes());
            blocking(move || Ok(d3.ublk.resize_drive(&name, size))).await?
        }
        false => None,
    };
    let notices: Vec<String> = [
        drive.origin().ephemeral_notice(&drive.name),
        resized.flatten(),
        device.map(|r| r.notice()),
        closed.and_then(|(before, n)| access_notice(&drive.name, before, n)),
    ]
    .into_iter()
    .flatten()
    .collect();
    let notice = (!notices.is_empty()).then(|| notices.join("; "));
    Ok(Json(info(&d, &drive, notice)))
}

/// What an access change did to the connections open to export `name`
/// (`connections` before the change).
/// Export `name`'s NVMe/TCP subsystem NQN, when the daemon serves NVMe/TCP.
pub(super) fn nvme_nqn(d: &Daemon, name: &str) -> Option<String> {
    d.nvme_node
        .as_ref()
        .map(|n| crate::nvme::names::subsystem_nqn(n, name))
}

/// The NVMe/TCP hosts connected to export `name` now.
pub(super) fn nvme_hosts(d: &Daemon, name: &str) -> Vec<NvmeHost> {
    d.nvme_target.as_ref().map_or_else(Vec::new, |t| {
        t.hosts_of(name)
            .into_iter()
            .map(|(host_nqn, n)| NvmeHost {
                host_nqn,
                controllers: n as u64,
            })
            .collect()
    })
}

/// What an access change did to open connections, `connections` being
/// the export's NBD connections before it.
pub(super) fn access_notice(name: &str, connections: usize, closed: Closed) -> Option<String> {
    let kept = connections.saturating_sub(closed.nbd);
    let nbd = match (closed.nbd, kept) {
        (0, 0) => None,
        (0, kept) => Some(format!(
            "the {kept} open NBD connection(s) to '{name}' are still allowed what they negotiated and keep it (a wider grant applies when they reconnect)"
        )),
        (n, _) => Some(format!(
            "closed {n} NBD connection(s) to '{name}' that the new rules no longer allow what they negotiated (after their pending requests); new connections get the new rules"
        )),
    };
    let nvme = (closed.nvme > 0).then(|| {
        format!(
            "closed {} NVMe/TCP controller(s) of '{name}' whose host the new rules refuse or allow only to read; their reconnects get the new rules",
            closed.nvme
        )
    });
    let both: Vec<String> = nbd.into_iter().chain(nvme).collect();
    (!both.is_empty()).then(|| both.join("; "))
}

/// What clients already connected see after a resize: NBD has no way to
/// tell them, so they keep the old size until they reconnect, and their
/// requests past the new end fail (EINVAL for reads, ENOSPC for writes).
fn resize_notice(drive: &Drive) -> Option<String> {
    match drive.connections() {
        0 => None,
        n => Some(format!(
            "{n} NBD connection(s) to '{}' keep the size they were given until they reconnect (NBD cannot announce a new size); their requests past the new end fail with EINVAL (reads) or ENOSPC (writes)",
            drive.name
        )),
    }
}

pub async fn delete(
    State(d): State<Arc<Daemon>>,
    Path(name): Path<String>,
    query: Result<Query<DeleteQuery>, QueryRejection>,
) -> Result<Json<Deleted>, ApiError> {
    let Query(q) = query?;
    let d2 = d.clone();
    blocking(move || {
        if q.force {
            // A forced delete detaches first; a busy mount stops it.
            d2.drives.get(&name)?;
            d2.attachments.detach_drive(&name)?;
            d2.ublk.detach_drive(&name)?;
        }
        let (drive, closed) = d2.drives.delete(&name, q.force, q.keep_data)?;
        Ok(Json(Deleted {
            name: drive.name.clone(),
            closed_connections: closed as u64,
            state_dir: drive.persist.as_ref().map(|p| p.dir.display().to_string()),
            data_kept: drive.persist.as_ref().map(|_| q.keep_data),
            notice: match drive.origin() {
                Origin::Api => None,
                o => o
                    .ephemeral_notice(&drive.name)
                    .map(|n| n.replace("this change", "the deletion")),
            },
        }))
    })
    .await
}

/// `POST /v1/drives/{name}/restore`: restores a failed persistent drive
/// again (answers at once; the restore runs in the background).
pub async fn restore(
    State(d): State<Arc<Daemon>>,
    Path(name): Path<String>,
    who: super::host_paths::Requester,
    body: Result<Json<RestoreRequest>, JsonRejection>,
) -> Result<(StatusCode, Json<DriveInfo>), ApiError> {
    let Json(req) = body?;
    super::host_paths::key_file(&d.settings.api_policy, who, req.key_file.as_deref())?;
    if req.force && req.discard_journal {
        return Err(ApiError::invalid(
            "give force or discard_journal, not both: force keeps the journal up to its damage, discard_journal drops it whole",
        ));
    }
    let key_file = req.key_file.as_deref().map(key_path).transpose()?;
    let opts = RestoreOptions {
        force: req.force,
        discard_journal: req.discard_journal,
    };
    let d2 = d.clone();
    let drive = blocking(move || Ok(d2.drives.restore(&name, opts, key_file)?)).await?;
    Ok((StatusCode::ACCEPTED, Json(info(&d, &drive, None))))
}
