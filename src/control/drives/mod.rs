//! The drives: the one place drives are created, changed and deleted, at
//! start-up (command line, config, state directory) and at run time (API,
//! snapshot restores). Names, budget promises, the export table and the
//! delete rule are the ledger's (`control::ledger`); this module keeps the
//! drives themselves.
//!
//! # Invariants
//!
//! - Every drive is created through [`Drives::create_from`] (`create.rs`),
//!   whoever asks ([`Source`]: a declaration in the config or on the
//!   command line, the API, a drive stored in the state directory, an
//!   unusable one, a snapshot restored into a store or into a state
//!   directory): the name rule, the size and compression rules, the
//!   `RLIMIT_MEMLOCK` check, the budget promise and what a persistent
//!   drive's state directory holds are decided there once, the same way
//!   for every source. No other code claims a new drive's name. (A drive
//!   that *replaces* a registered one, restored or failed, keeps its
//!   claim; one put back after a failed keep-data delete gets its old
//!   promise back: neither is a new drive.)
//! - A name is in the drive map iff the ledger holds a drive claim for it
//!   (claimed before the drive is built, released when it leaves the map;
//!   both under the drive map mutex, which is taken before the ledger's).
//!   A drive's export is served iff it is in the map.
//! - A drive's ledger promise is its commitment: `min(size, mem_limit)`
//!   plus its metadata, only the metadata for a drive created with
//!   `overcommit` (which then relies on the budget's hard limit at write
//!   time, ENOSPC, never on the host's memory), nothing for a drive that
//!   holds no memory (failed before its size was known). A change that
//!   grows it raises the promise first (refused when it does not fit); one
//!   that shrinks it lowers the promise once done, so a resize in progress
//!   (which runs without the map lock: a persistent drive's resize waits
//!   for a running sync) counts the larger size.
//! - The map mutex is a plain (parking_lot) one, never held across an
//!   `.await`: API handlers call in from `spawn_blocking`.
//! - A [`Drive`] value never changes kind or data: a persistent drive that
//!   goes from restoring (or failed) to ready is *replaced* in the map and
//!   the export table by a new `Drive` (same name, claim, metrics and
//!   [`Persistence`]). Holders of the old `Arc<Drive>` see the old state.
//! - At most one restore reads the disk at a time (`restore_turn`).
//! - A served drive's access rules are in the NBD server's access table
//!   under its name (set before its export is published, removed after
//!   it is withdrawn, changed under the map lock), so no client ever
//!   meets a drive without its rules. [`Drive::access`] is the drive's
//!   own copy, for the API and `drive.json`.
//!
//! # Kinds and states
//!
//! [`DriveKind`]: RAM only or persistent (the disk side is `persistent/`,
//! the operations on it `persistent_ops.rs`). [`DriveState`]: ready,
//! restoring (NBD clients refused with the progress), failed (NBD clients
//! refused with the precise error; `ramd restore` decides).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use parking_lot::Mutex;

mod create;
mod cut;
pub mod error;
mod give_back;
mod kept;
pub mod memlock;
pub mod persistent;
mod persistent_ops;
pub mod spec;

use super::access::{Closed, Servers};
use super::ledger::{self, Claim, Kind, Ledger, LedgerError, NotFound, Origin, Promise};
use crate::block::backend::Backend;
use crate::metrics::DriveMetrics;
pub use crate::nbd::access::AccessChange;
use crate::nbd::access::{AccessRules, AccessTable};
use crate::nbd::{Export, ShutdownHandle};
use crate::size::format_size;
use crate::store::compressed::{Algorithm, CompressedStats, CompressedStore};
use crate::store::{MemoryBudget, RamStore, StoreOptions, MAX_DRIVE_BYTES, SEGMENT_BYTES};
pub use create::{Created, Source};
pub use error::DriveError;
use persistent::{DiskDrive, Offline, Persistence};
use spec::{DriveSpec, SizeError, SpecError};

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
    /// A RAM store (raw or compressed) with a state directory.
    Persistent(DiskDrive),
    /// A compressed RAM store (`--compress`).
    Compressed(Arc<CompressedStore>),
    /// Nothing in memory: the drive is restoring or failed.
    Offline {
        /// Its size as far as known (0 when even that is unreadable).
        size_bytes: u64,
        /// The memory limit it will get.
        mem_limit_bytes: Option<u64>,
        /// The compression it will get (None: the raw store).
        compress: Option<Algorithm>,
    },
}

impl DriveData {
    /// The compression (None: the raw store).
    fn compress(&self) -> Option<Algorithm> {
        match self {
            DriveData::Offline { compress, .. } => *compress,
            DriveData::Compressed(c) => Some(c.algorithm()),
            DriveData::Persistent(p) => p.compressed_store().map(|c| c.algorithm()),
            DriveData::Ram(_) => None,
        }
    }
}

/// One drive.
pub struct Drive {
    pub name: String,
    pub kind: DriveKind,
    pub state: Mutex<DriveState>,
    /// Its name in the ledger: origin and budget promise.
    pub claim: Arc<Claim>,
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
    /// Who may see it over NBD (see the module invariants).
    pub access: Mutex<AccessRules>,
    /// Its memory is locked in RAM (`--lock-memory`; `memlock.rs`).
    pub lock_memory: bool,
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
    /// Who asked for the drive.
    pub fn origin(&self) -> &Origin {
        &self.claim.origin
    }

    /// The RAM store, when the drive has its data in memory.
    pub fn store(&self) -> Option<&RamStore> {
        match &self.data {
            DriveData::Ram(s) => Some(s),
            DriveData::Persistent(p) => p.raw_store(),
            DriveData::Compressed(_) | DriveData::Offline { .. } => None,
        }
    }

    /// The compressed store, for a compressed drive (persistent or not).
    pub fn compressed(&self) -> Option<&CompressedStore> {
        match &self.data {
            DriveData::Compressed(c) => Some(c),
            DriveData::Persistent(p) => p.compressed_store(),
            _ => None,
        }
    }

    /// The drive's compression (None: the raw store), also while it is
    /// restoring or failed.
    pub fn compress(&self) -> Option<Algorithm> {
        self.data.compress()
    }

    /// A compressed drive's memory figures (zram's `mm_stat`).
    pub fn compression_stats(&self) -> Option<CompressedStats> {
        self.compressed().map(|c| c.stats())
    }

    /// True when the drive's data is in memory (not restoring or failed).
    fn has_data(&self) -> bool {
        !matches!(self.data, DriveData::Offline { .. })
    }

    /// True when the drive is encrypted at rest (a persistent drive with
    /// a key file): its snapshots must be encrypted too.
    pub fn is_encrypted(&self) -> bool {
        self.persist
            .as_ref()
            .is_some_and(|p| p.spec.lock().key_file.is_some())
    }

    /// The persistent drive, when ready.
    pub fn persistent(&self) -> Option<&DiskDrive> {
        match &self.data {
            DriveData::Persistent(p) => Some(p),
            _ => None,
        }
    }

    pub fn size_bytes(&self) -> u64 {
        match &self.data {
            DriveData::Offline { size_bytes, .. } => *size_bytes,
            DriveData::Ram(s) => s.size(),
            DriveData::Persistent(p) => p.size(),
            DriveData::Compressed(c) => c.size(),
        }
    }

    /// Memory the drive holds now.
    pub fn allocated_bytes(&self) -> u64 {
        match (self.store(), self.compressed()) {
            (Some(s), _) => s.allocated_bytes(),
            (None, Some(c)) => c.allocated_bytes(),
            (None, None) => 0,
        }
    }

    /// Resizes the drive's data (nothing while restoring or failed).
    fn resize_data(&self, size_bytes: u64) -> Result<(), DriveError> {
        match (self.store(), self.compressed()) {
            (Some(s), _) => Ok(s.resize(size_bytes)?),
            (None, Some(c)) => Ok(c.resize(size_bytes)?),
            (None, None) => Ok(()),
        }
    }

    /// The drive's own memory limit, None when unlimited.
    pub fn mem_limit_bytes(&self) -> Option<u64> {
        let limit = match (&self.data, self.store(), self.compressed()) {
            (
                DriveData::Offline {
                    mem_limit_bytes, ..
                },
                _,
                _,
            ) => return *mem_limit_bytes,
            (_, Some(s), _) => s.mem_limit_bytes(),
            (_, None, Some(c)) => c.mem_limit_bytes(),
            _ => return None,
        };
        Some(limit).filter(|&l| l != u64::MAX)
    }

    /// True when the drive serves I/O.
    pub fn is_ready(&self) -> bool {
        *self.state.lock() == DriveState::Ready
    }

    /// True while its restore waits for the host's memory.
    pub fn waits_for_memory(&self) -> bool {
        self.persist.as_ref().is_some_and(|p| {
            matches!(
                *p.restore.lock(),
                persistent::RestoreRecord::WaitingForMemory { .. }
            )
        })
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
            access: self.access.lock().clone(),
            compress: self.compress(),
            lock_memory: self.lock_memory,
        }
    }

    /// Open NBD connections.
    pub fn connections(&self) -> usize {
        self.export.connections()
    }

    /// What this drive counts against `RLIMIT_MEMLOCK` (0 unless locked).
    fn locked_bytes(&self) -> u64 {
        match self.lock_memory {
            true => memlock::locked_bytes(
                self.size_bytes(),
                self.mem_limit_bytes(),
                self.compress().is_some(),
            ),
            false => 0,
        }
    }

    /// Budget this drive takes as it is now (see the module invariants).
    fn commitment(&self) -> u64 {
        if matches!(self.data, DriveData::Offline { size_bytes: 0, .. }) {
            0
        } else {
            promise_for(
                self.size_bytes(),
                self.mem_limit_bytes(),
                *self.overcommit.lock(),
            )
            .bytes()
        }
    }
}

/// The raw store's options for a drive.
pub(crate) fn store_options(mem_limit_bytes: Option<u64>, lock_memory: bool) -> StoreOptions {
    StoreOptions {
        mem_limit_bytes,
        lock_memory,
        ..StoreOptions::default()
    }
}

/// Metadata a drive of `size` keeps (bitmaps and locks: ~12.3 KiB per
/// 64 MiB segment, see `store`), rounded up.
pub fn metadata_estimate(size: u64) -> u64 {
    size.div_ceil(SEGMENT_BYTES) * 12_600
}

/// What a drive of `size` asks of the budget: the memory it can reach plus
/// its metadata, or only its metadata when overcommitted.
fn promise_for(size: u64, mem_limit: Option<u64>, overcommit: bool) -> Promise {
    let meta = metadata_estimate(size);
    if overcommit {
        Promise::Metadata { size, meta }
    } else {
        Promise::Drive {
            size,
            data: size.min(mem_limit.unwrap_or(u64::MAX)),
            meta,
        }
    }
}

/// The daemon's drives.
pub struct Drives {
    /// Drives by name. Held only for short, non-blocking work.
    drives: Mutex<BTreeMap<String, Arc<Drive>>>,
    /// Names, budget promises and the export table, shared with the other
    /// kinds.
    ledger: Arc<Ledger>,
    /// Record per-request metrics for new drives.
    metrics_enabled: bool,
    /// The servers its connections live in (set once they bind): forced
    /// deletes and access changes close connections there.
    servers: Servers,
    /// The daemon's state directory (persistent drives live in its
    /// `drives/`); None: persistent drives are refused.
    state_dir: Option<PathBuf>,
    /// Held by the restore running now: restores share the disk, so they
    /// run one at a time (the others show as queued).
    restore_turn: Mutex<()>,
    /// Set at shutdown: restores that finish later are not served.
    shutting_down: AtomicBool,
    /// The access rules of served drives, by name; the NBD server reads
    /// them at every decision (see the module invariants).
    access: Arc<AccessTable>,
    /// Drives whose memory a supervisor keeps (`kept`).
    kept: kept::Keepers,
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

impl Drives {
    pub fn new(ledger: Arc<Ledger>, metrics_enabled: bool) -> Self {
        Drives {
            drives: Mutex::new(BTreeMap::new()),
            ledger,
            metrics_enabled,
            servers: Servers::default(),
            state_dir: None,
            restore_turn: Mutex::new(()),
            shutting_down: AtomicBool::new(false),
            access: Arc::default(),
            kept: kept::Keepers::default(),
        }
    }

    /// The access rules of every served drive, for the NBD server.
    pub fn access_table(&self) -> Arc<AccessTable> {
        self.access.clone()
    }

    /// Keeps persistent drives in `state_dir/drives/NAME`.
    pub fn with_state_dir(mut self, state_dir: PathBuf) -> Self {
        self.state_dir = Some(state_dir);
        self
    }

    /// The state directory of drive `name`.
    pub fn drive_dir(&self, name: &str) -> Result<PathBuf, DriveError> {
        let dir = self.state_dir.as_ref().ok_or(DriveError::NoStateDir)?;
        Ok(persistent::drives_dir(dir).join(name))
    }

    /// Lets forced deletes close NBD connections and access changes
    /// recheck NBD connections and NVMe/TCP controllers.
    pub fn set_servers(&self, nbd: ShutdownHandle, nvme: Option<Arc<crate::nvme::Target>>) {
        self.servers.set(nbd, nvme);
    }

    /// The daemon-wide memory budget (the ledger's).
    pub fn budget(&self) -> &Arc<MemoryBudget> {
        self.ledger.budget()
    }

    pub fn metrics_enabled(&self) -> bool {
        self.metrics_enabled
    }

    /// Budget promised to every object, drives and caches (the ledger's).
    pub fn committed_bytes(&self) -> u64 {
        self.ledger.committed_bytes()
    }

    /// Every drive, by name.
    pub fn list(&self) -> Vec<Arc<Drive>> {
        self.drives.lock().values().cloned().collect()
    }

    pub fn get(&self, name: &str) -> Result<Arc<Drive>, DriveError> {
        self.drives
            .lock()
            .get(name)
            .cloned()
            .ok_or_else(|| not_found(name))
    }

    /// A drive that serves I/O (not restoring or failed).
    pub fn get_ready(&self, name: &str) -> Result<Arc<Drive>, DriveError> {
        let d = self.get(name)?;
        if !d.has_data() {
            return Err(not_ready(&d));
        }
        Ok(d)
    }

    /// Checks that `drive` may be promised `promise` instead of what it
    /// holds, raising its promise at once when it grows; a smaller promise
    /// is recorded by [`Drives::recommit`] once the change is done.
    fn promise_change(&self, drive: &Drive, promise: &Promise) -> Result<(), DriveError> {
        if promise.bytes() > drive.claim.promised_bytes() {
            self.ledger.repromise(&drive.claim, promise)?;
        } else {
            self.ledger.check_repromise(&drive.claim, promise)?;
        }
        Ok(())
    }

    /// Records `drive`'s commitment as its promise (after a change).
    fn recommit(&self, drive: &Drive) {
        self.ledger.record(&drive.claim, drive.commitment());
    }

    /// Checks that drive `name` of `spec`'s kind, locked in RAM with
    /// `size` and `mem_limit`, fits the daemon's `RLIMIT_MEMLOCK` beside
    /// the other locked drives in `drives` (`memlock.rs`). Nothing to check
    /// for a drive that is not locked.
    fn check_memlock(
        &self,
        drives: &BTreeMap<String, Arc<Drive>>,
        spec: &DriveSpec,
        size: u64,
        mem_limit: Option<u64>,
    ) -> Result<(), DriveError> {
        if !spec.lock_memory {
            return Ok(());
        }
        let others = drives
            .values()
            .filter(|d| d.name != spec.name)
            .map(|d| d.locked_bytes())
            .sum();
        let compressed = spec.compress.is_some();
        let want = memlock::locked_bytes(size, mem_limit, compressed);
        let limit = memlock::MemlockLimit::current();
        memlock::check(limit, &spec.name, compressed, want, others)?;
        Ok(())
    }

    /// Builds a drive and its export (not yet registered). `metrics`: the
    /// counters of the entry this one replaces, so they run on.
    #[allow(clippy::too_many_arguments)]
    fn assemble(
        &self,
        spec: &DriveSpec,
        claim: Arc<Claim>,
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
            DriveData::Persistent(p) => (p.backend(), p.size()),
            DriveData::Compressed(c) => (c.clone(), c.size()),
            DriveData::Offline { size_bytes, .. } => (
                Arc::new(Offline {
                    size_bytes: *size_bytes,
                }),
                *size_bytes,
            ),
        };
        let desc = match (&state, &persist) {
            (DriveState::Ready, None) => match &data {
                DriveData::Compressed(c) => format!(
                    "ramd RAM drive, {}, compressed ({})",
                    format_size(size),
                    c.algorithm()
                ),
                _ => format!("ramd RAM drive, {}", format_size(size)),
            },
            (DriveState::Ready, Some(p)) => format!(
                "ramd persistent drive, {}, durability {}{}",
                format_size(size),
                p.spec.lock().durability,
                match data.compress() {
                    Some(a) => format!(", compressed ({a})"),
                    None => String::new(),
                }
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
        if persist.is_none() {
            let memfd = match &data {
                DriveData::Ram(s) => s.memfd_inode(),
                _ => None,
            };
            export = match memfd {
                Some(inode) => export.with_memfd_identity(inode),
                None => export.with_volatile_identity(),
            };
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
            claim,
            data,
            persist,
            export: Arc::new(export),
            metrics,
            overcommit: Mutex::new(spec.overcommit),
            created_unix_s,
            attachments: Mutex::new(Vec::new()),
            access: Mutex::new(spec.access.clone()),
            lock_memory: spec.lock_memory,
        })
    }

    /// Registers a new drive (its name claimed) and serves its export; on
    /// failure the claim is released.
    fn insert(
        &self,
        drives: &mut BTreeMap<String, Arc<Drive>>,
        drive: &Arc<Drive>,
    ) -> Result<(), DriveError> {
        // Before the export is published: the claim makes the name ours.
        self.access.set(&drive.name, drive.access.lock().clone());
        if let Err(e) = self.ledger.publish(&drive.claim, drive.export.clone()) {
            self.ledger.release(&drive.claim);
            self.access.set(&drive.name, AccessRules::default());
            return Err(e.into());
        }
        drives.insert(drive.name.clone(), drive.clone());
        Ok(())
    }

    /// Puts `new` where `old` is registered (same name and claim).
    fn replace(
        &self,
        drives: &mut BTreeMap<String, Arc<Drive>>,
        old: &Arc<Drive>,
        new: &Arc<Drive>,
    ) {
        debug_assert!(Arc::ptr_eq(&old.claim, &new.claim));
        old.export.close();
        self.access.set(&new.name, new.access.lock().clone());
        drives.insert(new.name.clone(), new.clone());
        self.ledger.republish(&new.claim, new.export.clone());
        self.recommit(new);
    }

    /// Applies a change: resize, lock/unlock, memory limit.
    pub fn change(&self, name: &str, change: &DriveChange) -> Result<Arc<Drive>, DriveError> {
        let drives = self.drives.lock();
        let drive = drives.get(name).cloned().ok_or_else(|| not_found(name))?;
        if !drive.has_data() {
            return Err(not_ready(&drive));
        }
        let size = change.size_bytes.unwrap_or(drive.size_bytes());
        let limit = change.mem_limit_bytes.unwrap_or(drive.mem_limit_bytes());
        if let Some(new_size) = change.size_bytes {
            check_size(new_size)?;
        }
        cut::check_resize(&drive, change.size_bytes)?;
        if change.size_bytes.is_some() || change.mem_limit_bytes.is_some() {
            self.check_memlock(&drives, &drive.spec(), size, limit)?;
            let overcommit = *drive.overcommit.lock();
            self.promise_change(&drive, &promise_for(size, limit, overcommit))?;
        }
        let old_size = drive.size_bytes();
        if size < old_size && !change.force {
            let end = data_end(&*drive.export.backend, size, old_size);
            if !matches!(end, Ok(None)) {
                // Nothing changes: the promise goes back to what it was.
                self.recommit(&drive);
            }
            if let Some(end) = end? {
                return Err(error::DataBeyondSize {
                    name: name.to_owned(),
                    size,
                    end,
                }
                .into());
            }
        }
        if let Some(l) = change.mem_limit_bytes {
            match (drive.store(), drive.compressed()) {
                (Some(s), _) => s.set_mem_limit_bytes(l),
                (None, Some(c)) => c.set_mem_limit_bytes(l),
                (None, None) => {}
            }
        }
        if let Some(ro) = change.read_only {
            drive.export.set_read_only(ro);
            tracing::info!(drive = %name, read_only = ro, "drive {}", if ro { "locked" } else { "unlocked" });
        }
        // Outside the map lock: a resize may wait for a running sync. The
        // promise stays the larger of the two sizes until it is done.
        drop(drives);
        let resized = match size != old_size {
            true => drive.resize_data(size),
            false => Ok(()),
        };
        self.recommit(&drive);
        resized?;
        if size != old_size {
            tracing::info!(drive = %name, from = %format_size(old_size), to = %format_size(size), "drive resized");
        }
        if let Some(p) = &drive.persist {
            p.save_settings(&drive.spec());
        }
        self.kept_settings_changed(&drive.spec());
        Ok(drive)
    }

    /// Changes a drive's access rules. New connections see them at once;
    /// open connections the new rules no longer allow what they
    /// negotiated (hidden, or read-only where they write) are closed after
    /// their pending requests. A persistent drive keeps them in its
    /// `drive.json`. NVMe/TCP controllers the new rules no longer allow
    /// are closed too. Returns the drive and what closed.
    pub fn set_access(
        &self,
        name: &str,
        change: &AccessChange,
    ) -> Result<(Arc<Drive>, Closed), DriveError> {
        let drives = self.drives.lock();
        let drive = drives.get(name).cloned().ok_or_else(|| not_found(name))?;
        if drive.persist.is_some() && !drive.has_data() {
            // Its drive.json is the restore's to read (or broken): not
            // rewritten behind the user's back.
            return Err(not_ready(&drive));
        }
        let rules = change.apply(&drive.access.lock());
        *drive.access.lock() = rules.clone();
        self.access.set(name, rules.clone());
        drop(drives);
        let closed = self.servers.rules_changed(Kind::Drive, name, &rules);
        self.kept_settings_changed(&drive.spec());
        if let Some(p) = &drive.persist {
            p.save_settings(&drive.spec());
        }
        Ok((drive, closed))
    }

    /// Deletes a drive. Without `force`, a drive with open connections or
    /// attachments is refused; with it, its connections are closed after
    /// their pending requests (attachments must be detached by the caller
    /// first). The memory is freed when the last connection has gone.
    ///
    /// A persistent drive: with `keep_data`, its last writes are saved
    /// (sync and checkpoint) and the state directory stays (a failed sync
    /// puts the drive back and returns the error); without, the state
    /// directory is removed. A restoring drive cannot be deleted, unless
    /// its restore waits for the host's memory (nothing reads its state
    /// directory then; the restore thread sees it gone and ends).
    /// Returns the drive and how many connections were closed.
    pub fn delete(
        &self,
        name: &str,
        force: bool,
        keep_data: bool,
    ) -> Result<(Arc<Drive>, usize), DriveError> {
        let mut drives = self.drives.lock();
        let drive = drives.get(name).cloned().ok_or_else(|| not_found(name))?;
        if keep_data && drive.persist.is_none() {
            return Err(DriveError::NotPersistent(name.to_owned()));
        }
        if *drive.state.lock() == DriveState::Restoring && !drive.waits_for_memory() {
            return Err(error::NotReady::DeleteWhileRestoring {
                name: name.to_owned(),
            }
            .into());
        }
        let attached = drive.attachments.lock().clone();
        ledger::check_delete(Kind::Drive, name, &attached, drive.connections(), force)?;
        drive.export.close();
        drives.remove(name);
        // Data kept for the state directory stays kept until it is saved
        // there (a failed final save puts the drive back, still kept).
        let saving = keep_data && drive.persistent().is_some();
        // The keeper is forgotten after the save, but only if the name's
        // keeper is still this drive's (the name is free meanwhile).
        let keeper = self.kept_keeper(name);
        if !saving {
            self.forget_kept(name);
        }
        self.ledger.release(&drive.claim);
        self.access.set(name, AccessRules::default());
        drop(drives);
        let closed = match self.servers.nbd() {
            Some(h) => h.close_export(&drive.export),
            None => 0,
        };
        if let Some(p) = &drive.persist {
            p.stop_scheduler();
            if keep_data {
                if let Some(pd) = drive.persistent() {
                    self.final_save(&drive, pd, p)?;
                    self.forget_kept_of(name, keeper);
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

/// The error for a name no drive has.
fn not_found(name: &str) -> DriveError {
    LedgerError::from(NotFound {
        kind: Kind::Drive,
        name: name.to_owned(),
    })
    .into()
}

/// The rules on a new drive's spec alone: its size, then its compression
/// (`create.rs`).
fn check_spec(spec: &DriveSpec) -> Result<(), DriveError> {
    check_size(spec.size_bytes)?;
    spec::check_compress(spec)?;
    Ok(())
}

fn check_size(size: u64) -> Result<(), DriveError> {
    spec::check_drive_size(size)?;
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
fn not_ready(drive: &Drive) -> DriveError {
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
fn data_end(store: &dyn Backend, from: u64, to: u64) -> Result<Option<u64>, DriveError> {
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
    use crate::block::ExportTable;
    use crate::control::drives::persistent::RestoreRecord;
    use crate::control::drives::spec::PersistSpec;
    use crate::persist::{Durability, RestoreOptions};
    use std::time::{Duration, Instant};

    fn ledger(budget: u64) -> Arc<Ledger> {
        Arc::new(Ledger::new(
            Arc::new(ExportTable::new()),
            Arc::new(MemoryBudget::new(budget)),
        ))
    }

    fn registry(budget: u64) -> Arc<Drives> {
        Arc::new(Drives::new(ledger(budget), true))
    }

    fn spec(name: &str, size: u64) -> DriveSpec {
        DriveSpec {
            name: name.into(),
            size_bytes: size,
            mem_limit_bytes: None,
            read_only: false,
            overcommit: false,
            persist: None,
            access: AccessRules::default(),
            compress: None,
            lock_memory: false,
        }
    }

    /// Every source `create_from` knows, each with a spec of a kind it
    /// may bring (RAM and, but for an adopted store, persistent): made
    /// afresh for each request (an adopted store is used up).
    fn every_source(s: &DriveSpec, budget: &Arc<MemoryBudget>) -> Vec<(DriveSpec, Source)> {
        let ram = DriveSpec {
            persist: None,
            ..s.clone()
        };
        let disk = DriveSpec {
            persist: Some(PersistSpec {
                durability: Durability::Flush,
                ..PersistSpec::default()
            }),
            ..s.clone()
        };
        let config = || Source::Declared(Origin::Config("/etc/ramd/ramd.toml".into()));
        let api = || {
            Source::Api(persistent::settings::Given {
                size: true,
                ..Default::default()
            })
        };
        // An empty store of the spec's size (a page for one below that,
        // refused before its store is looked at) stands in for one a
        // snapshot filled.
        let size = s.size_bytes.max(spec::MIN_DRIVE_BYTES);
        let store = RamStore::new(size, s.mem_limit_bytes, budget.clone()).unwrap();
        let mut out = vec![(ram.clone(), Source::Adopted(DriveData::Ram(store.into())))];
        for s in [ram, disk] {
            out.push((s.clone(), config()));
            out.push((s.clone(), Source::Declared(Origin::CommandLine)));
            out.push((s.clone(), api()));
            out.push((s.clone(), Source::Stored));
            out.push((s, Source::Restored));
        }
        out
    }

    /// The one creation path decides the same for every source: a bad
    /// name, a size below a page, a name taken and a promise over the
    /// budget are refused with the same error (the same message, so the
    /// same API code) whoever asks, and a refusal leaves nothing behind
    /// (no name, no promise, no state directory). A drive of an unusable
    /// `drive.json` holds nothing, so only the name rules apply to it.
    /// Accepted, the same spec is promised the same from every source,
    /// under the ledger origin the source names.
    #[test]
    fn create_from_decides_the_same_for_every_source() {
        let state = tempfile::tempdir().unwrap();
        let r =
            Arc::new(Drives::new(ledger(100 << 20), true).with_state_dir(state.path().to_owned()));
        r.create(&spec("taken", 1 << 20), Origin::Api).unwrap();
        let committed = r.committed_bytes();
        let budget = r.budget().clone();
        type Refused = fn(&DriveError) -> bool;
        let refusals: [(&str, u64, Refused); 4] = [
            ("Bad", 1 << 20, |e| {
                matches!(e, DriveError::Spec(SpecError::InvalidName(_)))
            }),
            ("small", 1024, |e| {
                matches!(e, DriveError::Spec(SpecError::InvalidSize(_)))
            }),
            ("taken", 1 << 20, |e| {
                matches!(e, DriveError::Ledger(LedgerError::Taken(_)))
            }),
            ("big", 1 << 30, |e| {
                matches!(e, DriveError::Ledger(LedgerError::OverBudget(_)))
            }),
        ];
        for (name, size, expected) in refusals {
            let mut cases = every_source(&spec(name, size), &budget);
            if size == 1 << 20 {
                let unusable = Source::Unusable("drive.json: not JSON".into());
                cases.push((DriveSpec::failed(name), unusable));
            }
            let mut messages = std::collections::BTreeSet::new();
            for (s, source) in cases {
                let from = source.name();
                let e = r.create_from(s, source).unwrap_err();
                assert!(expected(&e), "{name} from {from}: {e:?}");
                messages.insert(e.to_string());
                assert_eq!(r.names(), ["taken"], "{name} from {from}");
                assert_eq!(r.committed_bytes(), committed, "{name} from {from}");
            }
            assert_eq!(messages.len(), 1, "{name}: {messages:#?}");
            if name != "taken" {
                assert!(!r.drive_dir(name).unwrap().exists(), "{name}");
            }
        }
        // Accepted: the same promise from every source.
        let mut capped = spec("ok", 8 << 20);
        capped.mem_limit_bytes = Some(4 << 20);
        for (s, source) in every_source(&capped, &budget) {
            let (from, origin, persistent) = (source.name(), source.origin(), s.persist.is_some());
            let d = r.create_from(s, source).unwrap().drive;
            assert_eq!(d.origin(), &origin, "{from}");
            assert_eq!(d.persist.is_some(), persistent, "{from}");
            assert_eq!(d.size_bytes(), 8 << 20, "{from}");
            assert_eq!(d.mem_limit_bytes(), Some(4 << 20), "{from}");
            let want = promise_for(8 << 20, Some(4 << 20), false).bytes();
            assert_eq!(d.claim.promised_bytes(), want, "{from}");
            r.delete("ok", false, false).unwrap();
        }
        assert_eq!(r.committed_bytes(), committed);
    }

    #[test]
    fn budget_is_never_promised_twice() {
        let r = registry(100 << 20);
        r.create(&spec("a", 60 << 20), Origin::Api).unwrap();
        let e = r.create(&spec("b", 60 << 20), Origin::Api).unwrap_err();
        assert!(
            matches!(e, DriveError::Ledger(LedgerError::OverBudget(_))),
            "{e}"
        );
        let mut capped = spec("b", 60 << 20);
        capped.mem_limit_bytes = Some(30 << 20);
        r.create(&capped, Origin::Api).unwrap();
        let mut over = spec("c", 1 << 30);
        over.overcommit = true;
        r.create(&over, Origin::Api).unwrap();
        assert!(matches!(
            r.create(&spec("a", 4096), Origin::Api),
            Err(DriveError::Ledger(LedgerError::Taken(_)))
        ));
        // Growing past the budget is refused too.
        let grow = DriveChange {
            size_bytes: Some(90 << 20),
            ..Default::default()
        };
        assert!(matches!(
            r.change("a", &grow),
            Err(DriveError::Ledger(LedgerError::OverBudget(_)))
        ));
    }

    #[test]
    fn compressed_drives_are_promised_their_limit_and_change_like_raw_ones() {
        use crate::store::compressed::Algorithm;
        let r = registry(100 << 20);
        let mut z = spec("z", 1 << 30);
        z.compress = Some(Algorithm::Lz4);
        // Larger than the budget without a limit: promised its size.
        assert!(matches!(
            r.create(&z, Origin::Api),
            Err(DriveError::Ledger(LedgerError::OverBudget(_)))
        ));
        z.mem_limit_bytes = Some(32 << 20);
        let d = r.create(&z, Origin::Api).unwrap();
        assert!(d.claim.promised_bytes() < 40 << 20);
        assert_eq!(d.spec().compress, Some(Algorithm::Lz4));
        let text: Vec<u8> = b"compressible "
            .iter()
            .cycle()
            .take(1 << 20)
            .copied()
            .collect();
        for i in 0..64u64 {
            d.export.backend.write(i << 20, &text, false).unwrap();
        }
        let s = d.compression_stats().unwrap();
        assert_eq!(s.orig_data_bytes, 64 << 20);
        assert_eq!(d.allocated_bytes(), s.slab_bytes);
        assert!(s.slab_bytes < 32 << 20);
        // Shrinking below the data needs force; growing and the limit work.
        let shrink = DriveChange {
            size_bytes: Some(16 << 20),
            ..Default::default()
        };
        assert!(matches!(
            r.change("z", &shrink),
            Err(DriveError::DataBeyondSize(_))
        ));
        let grow = DriveChange {
            size_bytes: Some(2 << 30),
            mem_limit_bytes: Some(Some(48 << 20)),
            ..Default::default()
        };
        let d = r.change("z", &grow).unwrap();
        assert_eq!(
            (d.size_bytes(), d.mem_limit_bytes()),
            (2 << 30, Some(48 << 20))
        );
        // Trimming every other MiB leaves slack the sampler's pass compacts.
        for i in (0..64u64).step_by(2) {
            d.export.backend.trim(i << 20, 1 << 20).unwrap();
        }
        crate::control::sampler::compact_drives(&r);
        let after = d.compression_stats().unwrap();
        assert_eq!(after.orig_data_bytes, 32 << 20);
        assert!(after.slab_bytes < s.slab_bytes, "{s:?} -> {after:?}");
        d.compressed().unwrap().check().unwrap();
    }

    #[test]
    fn persistent_compressed_drives_come_back_compressed() {
        use crate::store::compressed::Algorithm;
        let state = tempfile::tempdir().unwrap();
        let make =
            || Arc::new(Drives::new(ledger(1 << 30), true).with_state_dir(state.path().to_owned()));
        let r = make();
        let mut z = persistent("z", 64 << 20);
        z.compress = Some(Algorithm::Zstd { level: 1 });
        z.mem_limit_bytes = Some(16 << 20);
        // Locked where the process may (root: CAP_IPC_LOCK).
        z.lock_memory = memlock::MemlockLimit::current().allows(64 << 20);
        let d = r.create(&z, Origin::Api).unwrap();
        assert_eq!((d.kind, d.compress()), (DriveKind::Persistent, z.compress));
        assert!(d.export.description.contains("compressed (zstd:1)"));
        let text: Vec<u8> = b"persistent and compressed "
            .iter()
            .cycle()
            .take(8 << 20)
            .copied()
            .collect();
        d.export.backend.write(4 << 20, &text, false).unwrap();
        d.export.backend.flush().unwrap();
        let before = d.compression_stats().unwrap();
        // A resize and a new limit go through the same paths as a raw
        // drive's.
        let change = DriveChange {
            size_bytes: Some(96 << 20),
            mem_limit_bytes: Some(Some(20 << 20)),
            ..Default::default()
        };
        let d = r.change("z", &change).unwrap();
        assert_eq!(d.mem_limit_bytes(), Some(20 << 20));
        r.shutdown_persistent();
        let dir = r.drive_dir("z").unwrap();
        let stored = std::fs::read_to_string(dir.join("drive.json")).unwrap();
        assert!(stored.contains("\"compress\": \"zstd:1\""), "{stored}");

        // Back from its directory with its own settings: compressed again,
        // with the same data and the same figures.
        let r = make();
        let stored = persistent::settings::read_checked(&dir, "z")
            .unwrap()
            .unwrap()
            .to_spec()
            .unwrap();
        assert_eq!(stored.compress, z.compress);
        r.create(&stored, Origin::Api).unwrap();
        let d = wait_state(&r, "z");
        assert!(d.is_ready(), "{:?}", d.state.lock());
        assert_eq!((d.size_bytes(), d.compress()), (96 << 20, z.compress));
        // Locked again, as it was.
        assert_eq!(d.lock_memory, z.lock_memory);
        assert_eq!(d.compressed().unwrap().is_locked(), z.lock_memory);
        let mut back = vec![0u8; text.len()];
        d.export.backend.read(4 << 20, &mut back).unwrap();
        assert!(back == text);
        let after = d.compression_stats().unwrap();
        assert_eq!(after.orig_data_bytes, before.orig_data_bytes);
        assert_eq!(after.compr_data_bytes, before.compr_data_bytes);
        d.compressed().unwrap().check().unwrap();
        r.shutdown_persistent();
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
        assert!(matches!(e, DriveError::DataBeyondSize(_)), "{e}");
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
        assert!(matches!(
            r.get("a"),
            Err(DriveError::Ledger(LedgerError::NotFound(_)))
        ));
        assert!(d.export.is_closed());
        drop(guard);
        assert!(matches!(
            r.delete("a", true, false),
            Err(DriveError::Ledger(LedgerError::NotFound(_)))
        ));
    }

    fn wait_state(r: &Drives, name: &str) -> Arc<Drive> {
        wait_for(&format!("the restore of {name} to end"), || {
            *r.get(name).unwrap().state.lock() != DriveState::Restoring
        });
        r.get(name).unwrap()
    }

    /// Polls `cond` until it holds (60 s at most).
    #[track_caller]
    fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !cond() {
            assert!(Instant::now() < deadline, "waited 60 s for {what}");
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

    /// What only the API's source brings: a persistent drive whose state
    /// directory holds one keeps the stored settings the request did not
    /// give (and says which), and its size on disk when it gave none; a
    /// RAM drive, or a persistent one with nothing stored, needs a size.
    /// An unusable `drive.json` is registered failed, promising nothing.
    #[test]
    fn api_requests_are_completed_from_the_state_directory() {
        let state = tempfile::tempdir().unwrap();
        let make =
            || Arc::new(Drives::new(ledger(1 << 30), true).with_state_dir(state.path().to_owned()));
        let r = make();
        let mut stored = persistent("p", 2 << 20);
        stored.mem_limit_bytes = Some(1 << 20);
        stored.persist.as_mut().unwrap().sync_interval_ms = 5000;
        r.create(&stored, Origin::Api).unwrap();
        r.delete("p", false, true).unwrap();

        let r = make();
        let no_size = |s: DriveSpec| DriveSpec { size_bytes: 0, ..s };
        let given = persistent::settings::Given {
            durability: true,
            ..Default::default()
        };
        let missing = |e: DriveError| {
            matches!(
                e,
                DriveError::Spec(SpecError::Malformed(spec::MalformedSpec::MissingSize))
            )
        };
        let e = r
            .create_from(no_size(spec("ram", 1 << 20)), Source::Api(given.clone()))
            .unwrap_err();
        assert!(missing(e));
        let e = r
            .create_from(
                no_size(persistent("q", 1 << 20)),
                Source::Api(given.clone()),
            )
            .unwrap_err();
        assert!(missing(e));
        assert!(r.names().is_empty());
        let created = r
            .create_from(no_size(persistent("p", 1 << 20)), Source::Api(given))
            .unwrap();
        let notice = created.notice.unwrap();
        assert!(notice.contains("drive.json"), "{notice}");
        assert!(notice.contains("sync interval 5s"), "{notice}");
        assert!(notice.contains("memory limit 1 MiB"), "{notice}");
        assert!(
            !notice.contains("durability"),
            "durability was given: {notice}"
        );
        let d = wait_state(&r, "p");
        assert!(d.is_ready(), "{:?}", d.state.lock());
        assert_eq!(
            (d.size_bytes(), d.mem_limit_bytes()),
            (2 << 20, Some(1 << 20))
        );
        assert_eq!(
            d.persist.as_ref().unwrap().spec.lock().sync_interval_ms,
            5000
        );
        r.shutdown_persistent();

        let reason = "drive.json: not JSON";
        let failed = Source::Unusable(reason.into());
        let d = r.create_from(DriveSpec::failed("u"), failed).unwrap().drive;
        assert_eq!(*d.state.lock(), DriveState::Failed(reason.into()));
        assert_eq!(d.claim.promised_bytes(), 0);
        assert!(d.export.unavailable().unwrap().contains(reason));
    }

    #[test]
    fn a_restore_the_hosts_memory_refuses_waits_for_it_and_starts_again() {
        let state = tempfile::tempdir().unwrap();
        let make =
            || Arc::new(Drives::new(ledger(1 << 30), true).with_state_dir(state.path().to_owned()));
        let r = make();
        let d = r.create(&persistent("p", 1 << 20), Origin::Api).unwrap();
        d.export.backend.write(4096, b"kept", false).unwrap();
        d.export.backend.flush().unwrap();
        r.delete("p", false, true).unwrap();

        // The watcher's word: short, no room above what drives hold.
        let r = make();
        r.budget().set_host_short(true);
        r.budget().set_host_cap_bytes(0);
        let d = r.create(&persistent("p", 1 << 20), Origin::Api).unwrap();
        let record = || d.persist.as_ref().unwrap().restore.lock().clone();
        wait_for("the restore to wait for memory", || match record() {
            RestoreRecord::Failed(e) => panic!("failed at once: {e}"),
            r => matches!(r, RestoreRecord::WaitingForMemory { .. }),
        });
        match record() {
            RestoreRecord::WaitingForMemory { attempt: 1, error } => {
                assert!(error.contains("memory is down to the reserve"), "{error}");
            }
            r => panic!("{r:?}"),
        }
        let d = r.get("p").unwrap();
        assert_eq!(*d.state.lock(), DriveState::Restoring);
        let text = d.export.unavailable().unwrap();
        assert!(text.contains("waiting for the host's memory"), "{text}");
        assert_eq!(
            r.budget().used_bytes(),
            0,
            "the refused attempt's pages are freed"
        );

        // Still short a while: it keeps waiting (no second attempt yet).
        std::thread::sleep(Duration::from_millis(1500));
        assert!(matches!(
            &*d.persist.as_ref().unwrap().restore.lock(),
            RestoreRecord::WaitingForMemory { attempt: 1, .. }
        ));
        // The host recovers: the restore starts again and serves the data.
        r.budget().set_host_cap_bytes(u64::MAX);
        r.budget().set_host_short(false);
        let d = wait_state(&r, "p");
        assert!(d.is_ready(), "{:?}", d.state.lock());
        let mut buf = [0u8; 4];
        d.export.backend.read(4096, &mut buf).unwrap();
        assert_eq!(&buf, b"kept");
        r.delete("p", false, true).unwrap();

        // A drive waiting for memory can be deleted; its data stays.
        r.budget().set_host_short(true);
        r.budget().set_host_cap_bytes(r.budget().used_bytes());
        r.create(&persistent("p", 1 << 20), Origin::Api).unwrap();
        wait_for("the restore to wait for memory", || {
            r.get("p").unwrap().waits_for_memory()
        });
        r.delete("p", false, true).unwrap();
        assert!(r.get("p").is_err());
        r.budget().set_host_cap_bytes(u64::MAX);
        r.budget().set_host_short(false);
        r.create(&persistent("p", 1 << 20), Origin::Api).unwrap();
        let d = wait_state(&r, "p");
        d.export.backend.read(4096, &mut buf).unwrap();
        assert_eq!(&buf, b"kept");
        r.shutdown_persistent();
    }

    #[test]
    fn persistent_drives_restore_keep_or_drop_their_data() {
        let state = tempfile::tempdir().unwrap();
        let make =
            || Arc::new(Drives::new(ledger(1 << 30), true).with_state_dir(state.path().to_owned()));
        let r = make();
        let d = r.create(&persistent("p", 1 << 20), Origin::Api).unwrap();
        assert_eq!(d.kind, DriveKind::Persistent);
        assert!(d.is_ready());
        d.export.backend.write(4096, b"kept", false).unwrap();
        d.export.backend.flush().unwrap();
        // Syncing a RAM drive, or restoring a ready one, is refused.
        r.create(&spec("ram", 1 << 20), Origin::Api).unwrap();
        assert!(matches!(r.sync("ram"), Err(DriveError::NotPersistent(_))));
        assert!(matches!(
            r.restore("p", RestoreOptions::default(), None),
            Err(DriveError::NotReady(_))
        ));
        assert!(matches!(
            r.delete("ram", false, true),
            Err(DriveError::NotPersistent(_))
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
        assert!(matches!(r.sync("p"), Err(DriveError::NotReady(_))));
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
