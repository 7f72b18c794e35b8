//! The registry of drives: the one place drives are created, changed and
//! deleted, at start-up (command line, config) and at run time (API).
//!
//! # Invariants
//!
//! - A name is in the registry iff its export is in the NBD export table
//!   (both change under the registry mutex, table after registry on
//!   create, table first on delete).
//! - The daemon budget is never promised twice: the sum of every drive's
//!   commitment (`min(size, mem_limit)` plus its metadata; only metadata for
//!   a drive created with `overcommit`), plus what caches were promised
//!   ([`Registry::promise`]), stays within the budget. An
//!   overcommitted drive relies on the budget's hard limit at write time
//!   (ENOSPC), never on the host's memory.
//! - The registry mutex is a plain (parking_lot) one, never held across an
//!   `.await`: API handlers call in from `spawn_blocking`.
//!
//! # Seams for later kinds
//!
//! [`DriveKind`] and [`DriveState`] are enums so persistent drives
//! (restoring, failed) and caches join as variants; [`Drive`] keeps the
//! store behind the `Backend` the export serves.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use super::spec::{check_name, DriveSpec, SpecError};
use crate::backend::Backend;
use crate::metrics::DriveMetrics;
use crate::nbd::{Export, ExportTable, ShutdownHandle};
use crate::size::format_size;
use crate::store::{MemoryBudget, RamStore, MAX_DRIVE_BYTES, SEGMENT_BYTES};

/// What kind of storage a drive is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriveKind {
    /// Memory only: contents are lost when the daemon stops.
    Ram,
}

impl DriveKind {
    pub fn name(self) -> &'static str {
        match self {
            DriveKind::Ram => "ram",
        }
    }
}

/// Where a drive is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriveState {
    /// Serving I/O.
    Ready,
}

impl DriveState {
    pub fn name(&self) -> &'static str {
        match self {
            DriveState::Ready => "ready",
        }
    }
}

/// Who asked for a drive: config-declared drives come back at every start,
/// so run-time changes to them are reported as lasting until a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A `[[drive]]` in this config file.
    Config(PathBuf),
    /// `--drive` on the daemon's command line (or the built-in default).
    CommandLine,
    /// Created through the API (`ramd create`).
    Api,
}

impl Origin {
    pub fn name(&self) -> &'static str {
        match self {
            Origin::Config(_) => "config",
            Origin::CommandLine => "command-line",
            Origin::Api => "api",
        }
    }

    /// A notice for run-time changes to a drive the daemon re-creates at
    /// start, or None.
    pub fn ephemeral_notice(&self, name: &str) -> Option<String> {
        match self {
            Origin::Config(file) => Some(format!(
                "drive '{name}' is declared in {}: this change lasts until the daemon restarts; edit the file to keep it",
                file.display()
            )),
            Origin::CommandLine => Some(format!(
                "drive '{name}' comes from the daemon's command line: this change lasts until the daemon restarts"
            )),
            Origin::Api => None,
        }
    }
}

/// One drive.
pub struct Drive {
    pub name: String,
    pub kind: DriveKind,
    pub state: Mutex<DriveState>,
    pub origin: Origin,
    /// The memory behind the drive.
    pub store: Arc<RamStore>,
    /// What NBD clients (and FUSE attachments) see: the store plus the
    /// read-only switch and the connection count.
    pub export: Arc<Export>,
    /// None when metrics recording is off.
    pub metrics: Option<Arc<DriveMetrics>>,
    /// Created with `overcommit` (see the module invariants).
    pub overcommit: Mutex<bool>,
    /// Seconds since the epoch at creation, for listings.
    pub created_unix_s: u64,
    /// Mountpoints where the drive is attached through FUSE (kept by
    /// `attach::Attachments`, read by delete and listings).
    pub attachments: Mutex<Vec<PathBuf>>,
}

impl std::fmt::Debug for Drive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Drive")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("size_bytes", &self.size_bytes())
            .finish_non_exhaustive()
    }
}

impl Drive {
    pub fn size_bytes(&self) -> u64 {
        self.store.size()
    }

    /// The drive's own memory limit, None when unlimited.
    pub fn mem_limit_bytes(&self) -> Option<u64> {
        Some(self.store.mem_limit_bytes()).filter(|&l| l != u64::MAX)
    }

    /// Open NBD connections.
    pub fn connections(&self) -> usize {
        self.export.connections()
    }

    /// Budget promised to this drive: its reachable memory plus metadata,
    /// or only its metadata when it was created with overcommit.
    fn commitment(&self) -> u64 {
        if *self.overcommit.lock() {
            metadata_estimate(self.size_bytes())
        } else {
            commitment(self.size_bytes(), self.mem_limit_bytes())
        }
    }
}

/// Metadata a drive of `size` keeps (bitmaps and locks: ~12.3 KiB per
/// 64 MiB segment, see `store`), rounded up.
pub fn metadata_estimate(size: u64) -> u64 {
    size.div_ceil(SEGMENT_BYTES) * 12_600
}

fn commitment(size: u64, mem_limit: Option<u64>) -> u64 {
    size.min(mem_limit.unwrap_or(u64::MAX)) + metadata_estimate(size)
}

/// Why a registry operation was refused. The API maps each to a code and an
/// HTTP status; messages say what to do next.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// A name or size was malformed.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// The name is taken.
    #[error("a drive named '{0}' already exists; pick another name or delete it first")]
    Exists(String),
    /// No such drive.
    #[error("no drive named '{0}' (see `ramd list`)")]
    NotFound(String),
    /// The drive would not fit in the memory budget.
    #[error("{0}")]
    OverBudget(String),
    /// A shrink would discard data.
    #[error("{0}")]
    DataBeyondSize(String),
    /// The drive is in use.
    #[error("{0}")]
    Busy(String),
    /// The store refused.
    #[error("{0}")]
    Store(#[from] crate::backend::Error),
}

/// The daemon's drives.
pub struct Registry {
    /// Drives by name. Held only for short, non-blocking work.
    drives: Mutex<BTreeMap<String, Arc<Drive>>>,
    /// What the NBD server serves (kept equal to `drives`).
    exports: Arc<ExportTable>,
    /// The daemon-wide memory budget every store charges.
    budget: Arc<MemoryBudget>,
    /// Record per-request metrics for new drives.
    metrics_enabled: bool,
    /// Closes NBD connections on forced delete (set once the server binds).
    nbd: OnceLock<ShutdownHandle>,
    /// Budget promised to caches (`promise`), counted by every drive's
    /// budget check; changed only under the `drives` mutex.
    promised_elsewhere: AtomicU64,
}

/// A change to a drive (`PATCH`). Absent fields stay as they are.
#[derive(Debug, Clone, Default)]
pub struct DriveChange {
    pub size_bytes: Option<u64>,
    pub read_only: Option<bool>,
    /// Some(None) removes the limit.
    pub mem_limit_bytes: Option<Option<u64>>,
    /// Shrink even when data lies beyond the new end (it is discarded).
    pub force: bool,
}

impl Registry {
    pub fn new(
        exports: Arc<ExportTable>,
        budget: Arc<MemoryBudget>,
        metrics_enabled: bool,
    ) -> Self {
        Registry {
            drives: Mutex::new(BTreeMap::new()),
            exports,
            budget,
            metrics_enabled,
            nbd: OnceLock::new(),
            promised_elsewhere: AtomicU64::new(0),
        }
    }

    /// Promises `bytes` of the budget to something other than a drive (a
    /// cache), under the same rule as drives: refused (with `what` and how
    /// to make room in the message) unless the unpromised budget holds it.
    pub fn promise(&self, what: &str, bytes: u64) -> Result<(), RegistryError> {
        let drives = self.drives.lock();
        let promised = drives.values().map(|d| d.commitment()).sum::<u64>()
            + self.promised_elsewhere.load(Ordering::Relaxed);
        let limit = self.budget.limit_bytes();
        let room = limit.saturating_sub(promised);
        if bytes > room {
            return Err(RegistryError::OverBudget(format!(
                "{what} needs {} but only {} of the {} memory budget is not promised to drives and caches; \
                 use a smaller --size, delete a drive or cache, or start the daemon with a larger --mem-budget",
                format_size(bytes),
                format_size(room),
                format_size(limit)
            )));
        }
        self.promised_elsewhere.fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    }

    /// Gives back budget promised with [`Registry::promise`].
    pub fn unpromise(&self, bytes: u64) {
        let _drives = self.drives.lock();
        let prev = self.promised_elsewhere.fetch_sub(bytes, Ordering::Relaxed);
        debug_assert!(prev >= bytes, "unpromised more than promised");
    }

    /// Lets forced deletes close NBD connections.
    pub fn set_nbd(&self, handle: ShutdownHandle) {
        let _ = self.nbd.set(handle);
    }

    pub fn budget(&self) -> &Arc<MemoryBudget> {
        &self.budget
    }

    pub fn metrics_enabled(&self) -> bool {
        self.metrics_enabled
    }

    /// Budget promised to drives (see the module invariants).
    pub fn committed_bytes(&self) -> u64 {
        let drives = self.drives.lock();
        drives.values().map(|d| d.commitment()).sum::<u64>()
            + self.promised_elsewhere.load(Ordering::Relaxed)
    }

    /// Every drive, by name.
    pub fn list(&self) -> Vec<Arc<Drive>> {
        self.drives.lock().values().cloned().collect()
    }

    pub fn get(&self, name: &str) -> Result<Arc<Drive>, RegistryError> {
        self.drives
            .lock()
            .get(name)
            .cloned()
            .ok_or_else(|| RegistryError::NotFound(name.to_owned()))
    }

    fn check_budget(
        &self,
        drives: &BTreeMap<String, Arc<Drive>>,
        except: Option<&str>,
        name: &str,
        size: u64,
        mem_limit: Option<u64>,
        overcommit: bool,
    ) -> Result<(), RegistryError> {
        let others: u64 = drives
            .values()
            .filter(|d| Some(d.name.as_str()) != except)
            .map(|d| d.commitment())
            .sum::<u64>()
            + self.promised_elsewhere.load(Ordering::Relaxed);
        let limit = self.budget.limit_bytes();
        let room = limit.saturating_sub(others);
        let meta = metadata_estimate(size);
        if overcommit {
            if meta > room {
                return Err(RegistryError::OverBudget(format!(
                    "drive '{name}' of {} needs {} of metadata but only {} of the {} memory budget is free; choose a smaller size",
                    format_size(size), format_size(meta), format_size(room), format_size(limit)
                )));
            }
            return Ok(());
        }
        let need = commitment(size, mem_limit);
        if need > room {
            return Err(RegistryError::OverBudget(format!(
                "drive '{name}' could hold {} (plus {} of metadata) but only {} of the daemon's {} memory budget is unpromised; \
                 choose a smaller size, cap its memory with mem-limit, allow overcommit (writes past the budget then fail with ENOSPC), \
                 or start the daemon with a larger --mem-budget",
                format_size(need - meta), format_size(meta), format_size(room), format_size(limit)
            )));
        }
        Ok(())
    }

    /// Creates a drive and starts serving it.
    pub fn create(&self, spec: &DriveSpec, origin: Origin) -> Result<Arc<Drive>, RegistryError> {
        check_name(&spec.name)?;
        if spec.size_bytes == 0 {
            return Err(
                SpecError::InvalidSize("a drive size must be at least 1 byte".into()).into(),
            );
        }
        if spec.size_bytes > MAX_DRIVE_BYTES {
            return Err(SpecError::InvalidSize(format!(
                "{} is larger than the largest drive ({})",
                format_size(spec.size_bytes),
                format_size(MAX_DRIVE_BYTES)
            ))
            .into());
        }
        let mut drives = self.drives.lock();
        if drives.contains_key(&spec.name) {
            return Err(RegistryError::Exists(spec.name.clone()));
        }
        self.check_budget(
            &drives,
            None,
            &spec.name,
            spec.size_bytes,
            spec.mem_limit_bytes,
            spec.overcommit,
        )?;
        let store = Arc::new(RamStore::new(
            spec.size_bytes,
            spec.mem_limit_bytes,
            self.budget.clone(),
        )?);
        let metrics = self.metrics_enabled.then(|| Arc::new(DriveMetrics::new()));
        let desc = format!("ramd RAM drive, {}", format_size(spec.size_bytes));
        let mut export = Export::new(
            &spec.name,
            &desc,
            store.clone() as Arc<dyn Backend>,
            spec.read_only,
        );
        if let Some(m) = &metrics {
            export = export.with_metrics(m.clone());
        }
        let export = Arc::new(export);
        let drive = Arc::new(Drive {
            name: spec.name.clone(),
            kind: DriveKind::Ram,
            state: Mutex::new(DriveState::Ready),
            origin,
            store,
            export: export.clone(),
            metrics,
            overcommit: Mutex::new(spec.overcommit),
            created_unix_s: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            attachments: Mutex::new(Vec::new()),
        });
        drives.insert(spec.name.clone(), drive.clone());
        if !self.exports.insert(export) {
            // Only a table changed behind the registry's back gets here.
            drives.remove(&spec.name);
            return Err(RegistryError::Exists(spec.name.clone()));
        }
        tracing::info!(
            drive = %spec.name,
            size = %format_size(spec.size_bytes),
            read_only = spec.read_only,
            "drive created"
        );
        Ok(drive)
    }

    /// Applies a change: resize, lock/unlock, memory limit.
    pub fn change(&self, name: &str, change: &DriveChange) -> Result<Arc<Drive>, RegistryError> {
        let drives = self.drives.lock();
        let drive = drives
            .get(name)
            .cloned()
            .ok_or_else(|| RegistryError::NotFound(name.to_owned()))?;
        let size = change.size_bytes.unwrap_or(drive.size_bytes());
        let limit = change.mem_limit_bytes.unwrap_or(drive.mem_limit_bytes());
        if let Some(new_size) = change.size_bytes {
            if new_size == 0 {
                return Err(
                    SpecError::InvalidSize("a drive size must be at least 1 byte".into()).into(),
                );
            }
            if new_size > MAX_DRIVE_BYTES {
                return Err(SpecError::InvalidSize(format!(
                    "{} is larger than the largest drive ({})",
                    format_size(new_size),
                    format_size(MAX_DRIVE_BYTES)
                ))
                .into());
            }
        }
        if change.size_bytes.is_some() || change.mem_limit_bytes.is_some() {
            let overcommit = *drive.overcommit.lock();
            self.check_budget(&drives, Some(name), name, size, limit, overcommit)?;
        }
        let old_size = drive.size_bytes();
        if size < old_size && !change.force {
            if let Some(end) = data_end(&drive.store, size, old_size)? {
                return Err(RegistryError::DataBeyondSize(format!(
                    "shrinking '{name}' to {} would discard data stored up to {}; pass force (ramd resize --force) to discard it",
                    format_size(size),
                    format_size(end)
                )));
            }
        }
        if let Some(l) = change.mem_limit_bytes {
            drive.store.set_mem_limit_bytes(l);
        }
        if size != old_size {
            drive.store.resize(size)?;
            tracing::info!(drive = %name, from = %format_size(old_size), to = %format_size(size), "drive resized");
        }
        if let Some(ro) = change.read_only {
            drive.export.set_read_only(ro);
            tracing::info!(drive = %name, read_only = ro, "drive {}", if ro { "locked" } else { "unlocked" });
        }
        Ok(drive)
    }

    /// Deletes a drive. Without `force`, a drive with open connections or
    /// attachments is refused; with it, its connections are closed after
    /// their pending requests (attachments must be detached by the caller
    /// first). The memory is freed when the last connection has gone.
    /// Returns the drive and how many connections were closed.
    pub fn delete(&self, name: &str, force: bool) -> Result<(Arc<Drive>, usize), RegistryError> {
        let mut drives = self.drives.lock();
        let drive = drives
            .get(name)
            .cloned()
            .ok_or_else(|| RegistryError::NotFound(name.to_owned()))?;
        let conns = drive.connections();
        let attached = drive.attachments.lock().clone();
        if !attached.is_empty() {
            let list: Vec<String> = attached.iter().map(|p| p.display().to_string()).collect();
            return Err(RegistryError::Busy(format!(
                "drive '{name}' is attached at {}; unmount what uses it and run `ramd detach MOUNTPOINT` first{}",
                list.join(", "),
                if force { "" } else { " (or delete with force)" }
            )));
        }
        if conns > 0 && !force {
            return Err(RegistryError::Busy(format!(
                "drive '{name}' has {conns} open NBD connection{}; disconnect the client{} or delete with force (ramd delete --force), which closes them",
                if conns == 1 { "" } else { "s" },
                if conns == 1 { "" } else { "s" },
            )));
        }
        drive.export.close();
        self.exports.remove(name);
        drives.remove(name);
        drop(drives);
        let closed = match self.nbd.get() {
            Some(h) => h.close_export(&drive.export),
            None => 0,
        };
        tracing::info!(drive = %name, closed_connections = closed, "drive deleted");
        Ok((drive, closed))
    }

    /// Names in order, for messages.
    pub fn names(&self) -> Vec<String> {
        self.drives.lock().keys().cloned().collect()
    }
}

/// The end of the last byte of data in `[from, to)`, or None when that
/// range holds no data (only holes).
fn data_end(store: &RamStore, from: u64, to: u64) -> Result<Option<u64>, RegistryError> {
    let mut pos = from;
    let mut last = None;
    while pos < to {
        let extents = store.extents(pos, to - pos)?;
        if extents.is_empty() {
            break;
        }
        for e in extents {
            if !e.hole {
                last = Some(pos + e.len);
            }
            pos += e.len;
        }
    }
    Ok(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry(budget: u64) -> Registry {
        Registry::new(
            Arc::new(ExportTable::new()),
            Arc::new(MemoryBudget::new(budget)),
            true,
        )
    }

    fn spec(name: &str, size: u64) -> DriveSpec {
        DriveSpec {
            name: name.into(),
            size_bytes: size,
            mem_limit_bytes: None,
            read_only: false,
            overcommit: false,
        }
    }

    #[test]
    fn budget_is_never_promised_twice() {
        let r = registry(100 << 20);
        r.create(&spec("a", 60 << 20), Origin::Api).unwrap();
        let e = r.create(&spec("b", 60 << 20), Origin::Api).unwrap_err();
        assert!(matches!(e, RegistryError::OverBudget(_)), "{e}");
        let mut capped = spec("b", 60 << 20);
        capped.mem_limit_bytes = Some(30 << 20);
        r.create(&capped, Origin::Api).unwrap();
        let mut over = spec("c", 1 << 30);
        over.overcommit = true;
        r.create(&over, Origin::Api).unwrap();
        assert!(matches!(
            r.create(&spec("a", 1), Origin::Api),
            Err(RegistryError::Exists(_))
        ));
        // Growing past the budget is refused too.
        let grow = DriveChange {
            size_bytes: Some(90 << 20),
            ..Default::default()
        };
        assert!(matches!(
            r.change("a", &grow),
            Err(RegistryError::OverBudget(_))
        ));
    }

    #[test]
    fn shrink_below_data_needs_force() {
        let r = registry(1 << 30);
        let d = r.create(&spec("a", 4 << 20), Origin::Api).unwrap();
        d.store.write(3 << 20, &[1u8; 4096], false).unwrap();
        let shrink = DriveChange {
            size_bytes: Some(1 << 20),
            ..Default::default()
        };
        let e = r.change("a", &shrink).unwrap_err();
        assert!(matches!(e, RegistryError::DataBeyondSize(_)), "{e}");
        assert!(e.to_string().contains("3 MiB"), "{e}");
        // Shrinking down to the end of the data is fine.
        let to_end = DriveChange {
            size_bytes: Some((3 << 20) + 4096),
            ..Default::default()
        };
        r.change("a", &to_end).unwrap();
        let forced = DriveChange {
            force: true,
            ..shrink
        };
        assert_eq!(r.change("a", &forced).unwrap().size_bytes(), 1 << 20);
    }

    #[test]
    fn delete_with_connections_needs_force() {
        let r = registry(1 << 30);
        let d = r.create(&spec("a", 1 << 20), Origin::Api).unwrap();
        let guard = d.export.connect();
        let e = r.delete("a", false).unwrap_err();
        assert!(e.to_string().contains("1 open NBD connection"), "{e}");
        let (_, _) = r.delete("a", true).unwrap();
        assert!(matches!(r.get("a"), Err(RegistryError::NotFound(_))));
        assert!(d.export.is_closed());
        drop(guard);
        assert!(matches!(
            r.delete("a", true),
            Err(RegistryError::NotFound(_))
        ));
    }
}
