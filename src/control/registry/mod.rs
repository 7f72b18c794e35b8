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
//! - A [`Drive`] value never changes kind or data: a persistent drive that
//!   goes from restoring (or failed) to ready is *replaced* in the registry
//!   and the export table by a new `Drive` (same name, origin, metrics and
//!   [`Persistence`]). Holders of the old `Arc<Drive>` see the old state.
//! - At most one restore reads the disk at a time (`restore_turn`).
//!
//! # Kinds and states
//!
//! [`DriveKind`]: RAM only or persistent (caches have their own registry,
//! `control::caches`, and share the export table and budget). [`DriveState`]:
//! ready, restoring (NBD clients refused with the progress), failed (NBD
//! clients refused with the precise error; `ramd restore` decides).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

pub mod error;
mod persistent_drives;

use super::persistent::{DiskDrive, Offline, Persistence};
use super::spec::{check_name, DriveSpec, SizeError, SpecError};
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
    /// Kept in a state directory too (`--persist`).
    Persistent,
}

impl DriveKind {
    pub fn name(self) -> &'static str {
        match self {
            DriveKind::Ram => "ram",
            DriveKind::Persistent => "persistent",
        }
    }
}

/// Where a drive is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriveState {
    /// Serving I/O.
    Ready,
    /// Loading its state directory; NBD clients are refused until ready.
    Restoring,
    /// Its state directory could not be loaded (the precise error); nothing
    /// on disk was changed. `ramd restore` or `ramd delete` decide.
    Failed(String),
}

impl DriveState {
    pub fn name(&self) -> &'static str {
        match self {
            DriveState::Ready => "ready",
            DriveState::Restoring => "restoring",
            DriveState::Failed(_) => "failed",
        }
    }
}

/// What holds a drive's bytes.
pub enum DriveData {
    /// A RAM store.
    Ram(Arc<RamStore>),
    /// A RAM store with a state directory.
    Persistent(Arc<DiskDrive>),
    /// Nothing in memory: the drive is restoring or failed.
    Offline {
        /// Its size as far as known (0 when even that is unreadable).
        size_bytes: u64,
        /// The memory limit it will get.
        mem_limit_bytes: Option<u64>,
    },
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
    /// The bytes behind the drive.
    pub data: DriveData,
    /// The state directory side of a persistent drive (None: RAM only).
    pub persist: Option<Arc<Persistence>>,
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
    /// `fuse::Attachments`, read by delete and listings).
    pub attachments: Mutex<Vec<PathBuf>>,
    /// The size a resize in progress is taking the drive to: the resize
    /// runs without the registry lock (a persistent drive's resize waits for
    /// a running sync), so budget checks meanwhile count the larger size.
    pending_size_bytes: Mutex<Option<u64>>,
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
    /// The RAM store, when the drive has its data in memory.
    pub fn store(&self) -> Option<&RamStore> {
        match &self.data {
            DriveData::Ram(s) => Some(s),
            DriveData::Persistent(p) => Some(p.store()),
            DriveData::Offline { .. } => None,
        }
    }

    /// The persistent drive, when ready.
    pub fn persistent(&self) -> Option<&Arc<DiskDrive>> {
        match &self.data {
            DriveData::Persistent(p) => Some(p),
            _ => None,
        }
    }

    pub fn size_bytes(&self) -> u64 {
        match (&self.data, self.store()) {
            (DriveData::Offline { size_bytes, .. }, _) => *size_bytes,
            (_, Some(s)) => s.size(),
            _ => 0,
        }
    }

    /// Memory the drive holds now.
    pub fn allocated_bytes(&self) -> u64 {
        self.store().map_or(0, |s| s.allocated_bytes())
    }

    /// The drive's own memory limit, None when unlimited.
    pub fn mem_limit_bytes(&self) -> Option<u64> {
        match (&self.data, self.store()) {
            (
                DriveData::Offline {
                    mem_limit_bytes, ..
                },
                _,
            ) => *mem_limit_bytes,
            (_, Some(s)) => Some(s.mem_limit_bytes()).filter(|&l| l != u64::MAX),
            _ => None,
        }
    }

    /// True when the drive serves I/O.
    pub fn is_ready(&self) -> bool {
        *self.state.lock() == DriveState::Ready
    }

    /// The spec that would make this drive again (for settings files and
    /// restores).
    fn spec(&self) -> DriveSpec {
        DriveSpec {
            name: self.name.clone(),
            size_bytes: self.size_bytes().max(1),
            mem_limit_bytes: self.mem_limit_bytes(),
            read_only: self.export.is_read_only(),
            overcommit: *self.overcommit.lock(),
            persist: self.persist.as_ref().map(|p| p.spec.lock().clone()),
        }
    }

    /// Open NBD connections.
    pub fn connections(&self) -> usize {
        self.export.connections()
    }

    /// Budget promised to this drive: its reachable memory plus metadata,
    /// or only its metadata when it was created with overcommit.
    fn commitment(&self) -> u64 {
        let size = self
            .size_bytes()
            .max(self.pending_size_bytes.lock().unwrap_or(0));
        if matches!(self.data, DriveData::Offline { size_bytes: 0, .. }) {
            0
        } else if *self.overcommit.lock() {
            metadata_estimate(size)
        } else {
            commitment(size, self.mem_limit_bytes())
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
    #[error(transparent)]
    OverBudget(#[from] error::OverBudget),
    /// A shrink would discard data.
    #[error(transparent)]
    DataBeyondSize(#[from] error::DataBeyondSize),
    /// The drive is in use.
    #[error(transparent)]
    Busy(#[from] error::Busy),
    /// The store refused.
    #[error("{0}")]
    Store(#[from] crate::backend::Error),
    /// The drive is restoring or failed.
    #[error(transparent)]
    NotReady(#[from] error::NotReady),
    /// The operation needs a persistent drive.
    #[error("drive '{0}' is not persistent (RAM only): it has no data on disk; create a drive with --persist to keep one")]
    NotPersistent(String),
    /// Persistent drives need a state directory and this daemon has none.
    #[error("this daemon has no state directory for persistent drives")]
    NoStateDir,
    /// A restore was asked of a drive whose state directory holds nothing.
    #[error("there is nothing to restore in {}: delete the drive (`ramd delete {name}`) and create it again", dir.display())]
    NothingToRestore { name: String, dir: PathBuf },
    /// A persistent drive's state directory could not be created or used.
    #[error(transparent)]
    Disk(#[from] super::persistent::DiskError),
    /// A sync failed; the drive keeps serving from RAM.
    #[error(transparent)]
    SyncFailed(#[from] error::SyncFailed),
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
    /// The daemon's state directory (persistent drives live in its
    /// `drives/`); None: persistent drives are refused.
    state_dir: Option<PathBuf>,
    /// Held by the restore running now: restores share the disk, so they
    /// run one at a time (the others show as queued).
    restore_turn: Mutex<()>,
    /// Set at shutdown: restores that finish later are not served.
    shutting_down: AtomicBool,
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
            state_dir: None,
            restore_turn: Mutex::new(()),
            shutting_down: AtomicBool::new(false),
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
            return Err(error::OverBudget::Other {
                what: what.to_owned(),
                bytes,
                room,
                limit,
            }
            .into());
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

    /// Keeps persistent drives in `state_dir/drives/NAME`.
    pub fn with_state_dir(mut self, state_dir: PathBuf) -> Self {
        self.state_dir = Some(state_dir);
        self
    }

    /// The state directory of drive `name`.
    pub fn drive_dir(&self, name: &str) -> Result<PathBuf, RegistryError> {
        let dir = self.state_dir.as_ref().ok_or(RegistryError::NoStateDir)?;
        Ok(super::persistent::drives_dir(dir).join(name))
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

    /// A drive that serves I/O (not restoring or failed).
    pub fn get_ready(&self, name: &str) -> Result<Arc<Drive>, RegistryError> {
        let d = self.get(name)?;
        if d.store().is_none() {
            return Err(not_ready(&d));
        }
        Ok(d)
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
                return Err(error::OverBudget::Metadata {
                    name: name.to_owned(),
                    size,
                    meta,
                    room,
                    limit,
                }
                .into());
            }
            return Ok(());
        }
        let need = commitment(size, mem_limit);
        if need > room {
            return Err(error::OverBudget::Drive {
                name: name.to_owned(),
                data: need - meta,
                meta,
                room,
                limit,
            }
            .into());
        }
        Ok(())
    }

    /// Creates a drive and starts serving it. A persistent drive whose
    /// state directory already holds one is restored instead: it is
    /// registered as restoring at once and becomes ready (or failed) when
    /// its restore thread is done.
    pub fn create(
        self: &Arc<Self>,
        spec: &DriveSpec,
        origin: Origin,
    ) -> Result<Arc<Drive>, RegistryError> {
        check_name(&spec.name)?;
        check_size(spec.size_bytes)?;
        if let Some(p) = &spec.persist {
            return self.create_persistent(spec, p, origin);
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
        let drive = self.assemble(
            spec,
            origin,
            DriveKind::Ram,
            DriveState::Ready,
            DriveData::Ram(store),
            None,
            None,
            now_unix_s(),
        );
        self.insert(&mut drives, &drive)?;
        tracing::info!(
            drive = %spec.name,
            size = %format_size(spec.size_bytes),
            read_only = spec.read_only,
            "drive created"
        );
        Ok(drive)
    }

    /// Builds a drive and its export (not yet registered). `metrics`: the
    /// counters of the entry this one replaces, so they run on.
    #[allow(clippy::too_many_arguments)]
    fn assemble(
        &self,
        spec: &DriveSpec,
        origin: Origin,
        kind: DriveKind,
        state: DriveState,
        data: DriveData,
        persist: Option<Arc<Persistence>>,
        metrics: Option<Option<Arc<DriveMetrics>>>,
        created_unix_s: u64,
    ) -> Arc<Drive> {
        let metrics =
            metrics.unwrap_or_else(|| self.metrics_enabled.then(|| Arc::new(DriveMetrics::new())));
        let (backend, size): (Arc<dyn Backend>, u64) = match &data {
            DriveData::Ram(s) => (s.clone(), s.size()),
            DriveData::Persistent(p) => (p.clone(), p.size()),
            DriveData::Offline { size_bytes, .. } => (
                Arc::new(Offline {
                    size_bytes: *size_bytes,
                }),
                *size_bytes,
            ),
        };
        let desc = match (&state, &persist) {
            (DriveState::Ready, None) => format!("ramd RAM drive, {}", format_size(size)),
            (DriveState::Ready, Some(p)) => format!(
                "ramd persistent drive, {}, durability {}",
                format_size(size),
                p.spec.lock().durability
            ),
            (s, _) => format!(
                "ramd persistent drive, {} ({})",
                format_size(size),
                s.name()
            ),
        };
        let mut export = Export::new(&spec.name, &desc, backend, spec.read_only);
        if let Some(m) = &metrics {
            export = export.with_metrics(m.clone());
        }
        match (&state, &persist) {
            (DriveState::Restoring, Some(p)) => {
                let (p, name) = (p.clone(), spec.name.clone());
                export = export.with_unavailable(Box::new(move || {
                    format!(
                        "drive '{name}' is restoring from {} ({}); it is served once ready (see `ramd info {name}`)",
                        p.dir.display(),
                        p.restore_text()
                    )
                }));
            }
            (DriveState::Failed(e), _) => {
                let text = format!(
                    "drive '{}' failed to restore: {e}. Decide with `ramd restore {} --force` or `--discard-journal`, or `ramd delete {}`",
                    spec.name, spec.name, spec.name
                );
                export = export.with_unavailable(Box::new(move || text.clone()));
            }
            _ => {}
        }
        Arc::new(Drive {
            name: spec.name.clone(),
            kind,
            state: Mutex::new(state),
            origin,
            data,
            persist,
            export: Arc::new(export),
            metrics,
            overcommit: Mutex::new(spec.overcommit),
            created_unix_s,
            attachments: Mutex::new(Vec::new()),
            pending_size_bytes: Mutex::new(None),
        })
    }

    /// Registers a new drive and its export.
    fn insert(
        &self,
        drives: &mut BTreeMap<String, Arc<Drive>>,
        drive: &Arc<Drive>,
    ) -> Result<(), RegistryError> {
        drives.insert(drive.name.clone(), drive.clone());
        if !self.exports.insert(drive.export.clone()) {
            // Only a table changed behind the registry's back gets here.
            drives.remove(&drive.name);
            return Err(RegistryError::Exists(drive.name.clone()));
        }
        Ok(())
    }

    /// Puts `new` where `old` is registered (same name).
    fn replace(
        &self,
        drives: &mut BTreeMap<String, Arc<Drive>>,
        old: &Arc<Drive>,
        new: &Arc<Drive>,
    ) {
        old.export.close();
        self.exports.remove(&old.name);
        drives.insert(new.name.clone(), new.clone());
        if !self.exports.insert(new.export.clone()) {
            tracing::error!(drive = %new.name, "export table out of step with the registry");
        }
    }

    /// Applies a change: resize, lock/unlock, memory limit.
    pub fn change(&self, name: &str, change: &DriveChange) -> Result<Arc<Drive>, RegistryError> {
        let drives = self.drives.lock();
        let drive = drives
            .get(name)
            .cloned()
            .ok_or_else(|| RegistryError::NotFound(name.to_owned()))?;
        let Some(store) = drive.store() else {
            return Err(not_ready(&drive));
        };
        let size = change.size_bytes.unwrap_or(drive.size_bytes());
        let limit = change.mem_limit_bytes.unwrap_or(drive.mem_limit_bytes());
        if let Some(new_size) = change.size_bytes {
            if new_size == 0 {
                return Err(SpecError::from(SizeError::ZeroDrive).into());
            }
            if new_size > MAX_DRIVE_BYTES {
                return Err(SpecError::from(SizeError::TooLarge {
                    size: new_size,
                    max: MAX_DRIVE_BYTES,
                })
                .into());
            }
        }
        if change.size_bytes.is_some() || change.mem_limit_bytes.is_some() {
            let overcommit = *drive.overcommit.lock();
            self.check_budget(&drives, Some(name), name, size, limit, overcommit)?;
        }
        let old_size = drive.size_bytes();
        if size < old_size && !change.force {
            if let Some(end) = data_end(store, size, old_size)? {
                return Err(error::DataBeyondSize {
                    name: name.to_owned(),
                    size,
                    end,
                }
                .into());
            }
        }
        if let Some(l) = change.mem_limit_bytes {
            store.set_mem_limit_bytes(l);
        }
        if let Some(ro) = change.read_only {
            drive.export.set_read_only(ro);
            tracing::info!(drive = %name, read_only = ro, "drive {}", if ro { "locked" } else { "unlocked" });
        }
        if size != old_size {
            // Outside the registry lock: it may wait for a running sync.
            *drive.pending_size_bytes.lock() = Some(size);
            drop(drives);
            let resized = store.resize(size);
            *drive.pending_size_bytes.lock() = None;
            resized?;
            tracing::info!(drive = %name, from = %format_size(old_size), to = %format_size(size), "drive resized");
        } else {
            drop(drives);
        }
        if let Some(p) = &drive.persist {
            p.save_settings(&drive.spec());
        }
        Ok(drive)
    }

    /// Deletes a drive. Without `force`, a drive with open connections or
    /// attachments is refused; with it, its connections are closed after
    /// their pending requests (attachments must be detached by the caller
    /// first). The memory is freed when the last connection has gone.
    ///
    /// A persistent drive: with `keep_data`, its last writes are saved
    /// (sync and checkpoint) and the state directory stays (a failed sync
    /// puts the drive back and returns the error); without, the state
    /// directory is removed. A restoring drive cannot be deleted.
    /// Returns the drive and how many connections were closed.
    pub fn delete(
        &self,
        name: &str,
        force: bool,
        keep_data: bool,
    ) -> Result<(Arc<Drive>, usize), RegistryError> {
        let mut drives = self.drives.lock();
        let drive = drives
            .get(name)
            .cloned()
            .ok_or_else(|| RegistryError::NotFound(name.to_owned()))?;
        if keep_data && drive.persist.is_none() {
            return Err(RegistryError::NotPersistent(name.to_owned()));
        }
        if *drive.state.lock() == DriveState::Restoring {
            return Err(error::NotReady::DeleteWhileRestoring {
                name: name.to_owned(),
            }
            .into());
        }
        let conns = drive.connections();
        let attached = drive.attachments.lock().clone();
        if !attached.is_empty() {
            return Err(error::Busy::Attached {
                name: name.to_owned(),
                mountpoints: attached,
                force,
            }
            .into());
        }
        if conns > 0 && !force {
            return Err(error::Busy::Connections {
                name: name.to_owned(),
                connections: conns,
            }
            .into());
        }
        drive.export.close();
        self.exports.remove(name);
        drives.remove(name);
        drop(drives);
        let closed = match self.nbd.get() {
            Some(h) => h.close_export(&drive.export),
            None => 0,
        };
        if let Some(p) = &drive.persist {
            p.stop_scheduler();
            if keep_data {
                if let Some(pd) = drive.persistent() {
                    self.final_save(&drive, pd, p)?;
                }
                tracing::info!(drive = %name, dir = %p.dir.display(), "drive deleted; its data stays in the state directory");
            } else {
                match std::fs::remove_dir_all(&p.dir) {
                    Ok(()) => {
                        tracing::warn!(drive = %name, dir = %p.dir.display(), "drive deleted with its saved data")
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => tracing::error!(
                        drive = %name,
                        "drive deleted, but its state directory {} could not be removed: {e}",
                        p.dir.display()
                    ),
                }
            }
        }
        tracing::info!(drive = %name, closed_connections = closed, "drive deleted");
        Ok((drive, closed))
    }

    /// Names in order, for messages.
    pub fn names(&self) -> Vec<String> {
        self.drives.lock().keys().cloned().collect()
    }
}

fn now_unix_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn check_size(size: u64) -> Result<(), RegistryError> {
    if size == 0 {
        return Err(SpecError::from(SizeError::ZeroDrive).into());
    }
    if size > MAX_DRIVE_BYTES {
        return Err(SpecError::from(SizeError::TooLarge {
            size,
            max: MAX_DRIVE_BYTES,
        })
        .into());
    }
    Ok(())
}

/// The error for an operation on a drive that is not ready.
fn not_ready(drive: &Drive) -> RegistryError {
    let name = &drive.name;
    match &*drive.state.lock() {
        DriveState::Failed(e) => error::NotReady::Failed {
            name: name.clone(),
            reason: e.clone(),
        }
        .into(),
        _ => error::NotReady::Restoring {
            name: name.clone(),
            progress: drive
                .persist
                .as_ref()
                .map_or_else(String::new, |p| p.restore_text()),
        }
        .into(),
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
    use crate::control::persistent::RestoreRecord;
    use crate::control::spec::PersistSpec;
    use crate::persist::{Durability, RestoreOptions};
    use std::time::{Duration, Instant};

    fn registry(budget: u64) -> Arc<Registry> {
        Arc::new(Registry::new(
            Arc::new(ExportTable::new()),
            Arc::new(MemoryBudget::new(budget)),
            true,
        ))
    }

    fn spec(name: &str, size: u64) -> DriveSpec {
        DriveSpec {
            name: name.into(),
            size_bytes: size,
            mem_limit_bytes: None,
            read_only: false,
            overcommit: false,
            persist: None,
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
        d.store()
            .unwrap()
            .write(3 << 20, &[1u8; 4096], false)
            .unwrap();
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
        let e = r.delete("a", false, false).unwrap_err();
        assert!(e.to_string().contains("1 open NBD connection"), "{e}");
        let (_, _) = r.delete("a", true, false).unwrap();
        assert!(matches!(r.get("a"), Err(RegistryError::NotFound(_))));
        assert!(d.export.is_closed());
        drop(guard);
        assert!(matches!(
            r.delete("a", true, false),
            Err(RegistryError::NotFound(_))
        ));
    }

    fn wait_state(r: &Registry, name: &str) -> Arc<Drive> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let d = r.get(name).unwrap();
            if *d.state.lock() != DriveState::Restoring {
                return d;
            }
            assert!(Instant::now() < deadline, "restore of {name} never ended");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn persistent(name: &str, size: u64) -> DriveSpec {
        DriveSpec {
            persist: Some(PersistSpec {
                durability: Durability::Flush,
                ..PersistSpec::default()
            }),
            ..spec(name, size)
        }
    }

    #[test]
    fn persistent_drives_restore_keep_or_drop_their_data() {
        let state = tempfile::tempdir().unwrap();
        let make = || {
            Arc::new(
                Registry::new(
                    Arc::new(ExportTable::new()),
                    Arc::new(MemoryBudget::new(1 << 30)),
                    true,
                )
                .with_state_dir(state.path().to_owned()),
            )
        };
        let r = make();
        let d = r.create(&persistent("p", 1 << 20), Origin::Api).unwrap();
        assert_eq!(d.kind, DriveKind::Persistent);
        assert!(d.is_ready());
        d.export.backend.write(4096, b"kept", false).unwrap();
        d.export.backend.flush().unwrap();
        // Syncing a RAM drive, or restoring a ready one, is refused.
        r.create(&spec("ram", 1 << 20), Origin::Api).unwrap();
        assert!(matches!(
            r.sync("ram"),
            Err(RegistryError::NotPersistent(_))
        ));
        assert!(matches!(
            r.restore("p", RestoreOptions::default(), None),
            Err(RegistryError::NotReady(_))
        ));
        assert!(matches!(
            r.delete("ram", false, true),
            Err(RegistryError::NotPersistent(_))
        ));
        r.delete("p", false, true).unwrap();
        let dir = r.drive_dir("p").unwrap();
        assert!(dir.join("meta").exists() && dir.join("drive.json").exists());

        // Created again: restored (asynchronously), with the data.
        let r = make();
        let d = r.create(&persistent("p", 1 << 20), Origin::Api).unwrap();
        assert_eq!(*d.state.lock(), DriveState::Restoring);
        assert!(d.export.unavailable().unwrap().contains("is restoring"));
        let d = wait_state(&r, "p");
        assert!(d.is_ready(), "{:?}", d.state.lock());
        let mut buf = [0u8; 4];
        d.export.backend.read(4096, &mut buf).unwrap();
        assert_eq!(&buf, b"kept");
        assert!(d.export.unavailable().is_none());
        assert!(matches!(
            &*d.persist.as_ref().unwrap().restore.lock(),
            RestoreRecord::Done(_)
        ));
        r.sync("p").unwrap();
        r.shutdown_persistent();

        // A corrupt meta: failed, with the reason, data untouched.
        std::fs::write(dir.join("meta"), b"not a meta").unwrap();
        let r = make();
        let d = r.create(&persistent("p", 1 << 20), Origin::Api).unwrap();
        match &*d.state.lock() {
            DriveState::Failed(e) => assert!(e.contains("metadata"), "{e}"),
            s => panic!("{s:?}"),
        }
        assert!(matches!(r.sync("p"), Err(RegistryError::NotReady(_))));
        assert!(d
            .export
            .unavailable()
            .unwrap()
            .contains("failed to restore"));
        assert_eq!(std::fs::read(dir.join("meta")).unwrap(), b"not a meta");
        // Deleting without keep_data removes the state directory.
        r.delete("p", false, false).unwrap();
        assert!(!dir.exists());
    }
}
