//! The directory manager: add, sync, remove, list, recover at start, stop.
//!
//! One [`DirManager`] per daemon. Every operation on one directory runs
//! under that directory's `op` mutex (syncs, removal and recovery never
//! overlap); the listing reads a separate, briefly held `live` record, so it
//! never waits for a long sync. No lock is held across two directories.
//!
//! Life of a directory:
//!
//! ```text
//! add ──► record saved ──► disk view + lock ──► tmpfs filled at <run>/…/ram ──► bound at PATH ──► Active
//!                                               (overlay: overlay mounted at PATH at once)
//! Active ── sync (interval, on demand, before suspend) ──► on-disk copy updated in place, safely
//! remove ─► PATH read-only ─► final sync ─► unmount ─► record dropped (a normal directory again)
//!           (forced, files open for writing: read-only bind on top ─► final sync ─► detach ─►
//!            RAM copy kept until its programs close it ─► later writes saved as a recovery copy)
//! stop ───► like remove but the record stays; if files are open for writing, sync and leave the
//!           mounts with a handover marker for the next daemon (see recovery)
//! start ──► recover each record (Fresh / Adopt / Stale / Covered), before anything is ready
//! ```

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use super::guard::{self, AddCheck, GuardError, Usage, UsageLevel, UsageTracker};
use super::holders;
use super::lock::{DirLock, LockError};
use super::meta::{self, Meta};
use super::mountinfo::{self, MountInfoError};
use super::mounts::{self, Layout, MountError, MountMode};
use super::recovery::{self, RecoveryCopy, RecoveryError, Situation, StaleSource};
pub use super::state::DirOrigin;
use super::state::{DirConfig, DirRecord, DirsState, StateError, StateFile};
use super::sync::{self, Known, SyncError, SyncOptions, SyncReport};
use crate::size::format_size;

/// Default time between a directory's periodic syncs (10 minutes).
pub const DEFAULT_DIR_SYNC_INTERVAL_MS: u64 = 600_000;
/// Default number of dated recovery copies kept per directory.
pub const DEFAULT_RECOVERY_GENERATIONS: u32 = 3;
/// Shortest sync interval of a directory (a sync walks the whole tree, so
/// it is 20 times a persistent drive's, see `control::spec`).
pub const MIN_DIR_SYNC_INTERVAL_MS: u64 = 1_000;

/// Errors of directory operations. `code()` gives a stable string for the API.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    /// the directory is not managed
    #[error("{0} is not kept in RAM by ramd (`ramd dir list` shows those that are)")]
    NotManaged(PathBuf),
    /// the directory is managed already
    #[error("{0} is already kept in RAM")]
    AlreadyManaged(PathBuf),
    /// the directory is not active (failed recovery, being added or removed)
    #[error("{path} is not active ({status}): {reason}")]
    NotActive {
        path: PathBuf,
        status: &'static str,
        reason: String,
    },
    /// a setting is invalid
    #[error("invalid setting: {0}")]
    Invalid(String),
    /// the RAM copy is too small for the content
    #[error("the RAM copy of {path} is full: its content needs more than the size limit {limit}; raise the size limit (or use overlay mode)")]
    RamFull { path: PathBuf, limit: String },
    /// files are open for writing in the RAM copy
    #[error("{path} is busy: a program has a file open for writing there (programs using it: {holders}; see `fuser -vm {path}`); close them and retry, or remove it with --force: PATH is then frozen (no new writes), synced and detached, and the RAM copy is kept until those programs close their files (what they write after the final sync is saved as a recovery copy)")]
    Busy { path: PathBuf, holders: String },
    /// PATH is covered by a mount that is not ours
    #[error("{path} is covered by another mount ({fs_type} from {source_name}); unmount it, then restart ramd")]
    Covered {
        path: PathBuf,
        fs_type: String,
        source_name: String,
    },
    #[error(transparent)]
    Guard(#[from] GuardError),
    #[error(transparent)]
    Mount(#[from] MountError),
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Sync(#[from] SyncError),
    #[error(transparent)]
    Recovery(#[from] RecoveryError),
    #[error(transparent)]
    MountInfo(#[from] MountInfoError),
    /// other I/O
    #[error("cannot {what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

impl DirError {
    /// A stable machine-readable code (the API's `error.code`).
    pub fn code(&self) -> &'static str {
        match self {
            DirError::NotManaged(_) => "dir_not_found",
            DirError::AlreadyManaged(_) => "dir_exists",
            DirError::NotActive { .. } => "dir_not_active",
            DirError::Invalid(_) => "invalid_request",
            DirError::RamFull { .. } => "ram_full",
            DirError::Guard(GuardError::TooBig { .. } | GuardError::NoMemory { .. }) => "ram_full",
            DirError::Covered { .. } => "dir_covered",
            DirError::Guard(GuardError::InUse { .. }) => "dir_busy",
            DirError::Guard(_) => "dir_refused",
            DirError::Mount(MountError::Busy { .. }) | DirError::Busy { .. } => "dir_busy",
            DirError::Lock(LockError::Held { .. }) => "dir_locked",
            DirError::Sync(SyncError::NoSpace { .. }) => "disk_full",
            _ => "dir_io_error",
        }
    }
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> DirError + 'a {
    move |source| DirError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// Where the manager keeps its files.
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    /// Runtime directory for mounts and markers (`<runtime>/dirs`, on /run
    /// so it vanishes at reboot).
    pub run_dir: PathBuf,
    /// Persistent directory for the state file and recovery copies
    /// (`<state>/dirs`).
    pub state_dir: PathBuf,
    /// How syncs run.
    pub sync: SyncOptions,
}

impl ManagerConfig {
    pub fn new(run_dir: PathBuf, state_dir: PathBuf) -> Self {
        ManagerConfig {
            run_dir,
            state_dir,
            sync: SyncOptions::default(),
        }
    }
}

/// A request to keep a directory in RAM.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AddRequest {
    /// The directory (absolute, canonical).
    pub path: PathBuf,
    /// tmpfs copy (default) or overlay.
    pub mode: MountMode,
    /// tmpfs size limit; None: the kernel default (half of RAM).
    pub size_limit_bytes: Option<u64>,
    /// Time between periodic syncs.
    pub sync_interval_ms: u64,
    /// Dated recovery copies kept.
    pub recovery_generations: u32,
    /// Refuse unless PATH is owned by this uid (the API passes the caller's).
    pub expected_uid: Option<u32>,
    /// Who asked for it (the daemon drops config-declared directories the
    /// config no longer declares).
    #[serde(default)]
    pub origin: DirOrigin,
    /// Add even though other processes use the directory (files open,
    /// working directory, mappings). Overrides nothing else.
    #[serde(default)]
    pub force: bool,
}

impl AddRequest {
    /// A request with the defaults.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        AddRequest {
            path: path.into(),
            mode: MountMode::Tmpfs,
            size_limit_bytes: None,
            sync_interval_ms: DEFAULT_DIR_SYNC_INTERVAL_MS,
            recovery_generations: DEFAULT_RECOVERY_GENERATIONS,
            expected_uid: None,
            origin: DirOrigin::Api,
            force: false,
        }
    }
}

/// New settings for a managed directory; `None` leaves one as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DirChange {
    /// Time between periodic syncs.
    pub sync_interval_ms: Option<u64>,
    /// New tmpfs size limit (`Some(None)`: the kernel default, half of RAM).
    pub size_limit_bytes: Option<Option<u64>>,
    /// Dated recovery copies kept (older ones are deleted at once).
    pub recovery_generations: Option<u32>,
}

/// Where a directory is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DirStatus {
    /// Being filled / mounted (add or start-up recovery).
    Activating,
    /// In RAM and synced on schedule.
    Active,
    /// Start-up recovery failed; see `last_error`. PATH is left as found.
    Failed,
}

impl DirStatus {
    fn name(self) -> &'static str {
        match self {
            DirStatus::Activating => "activating",
            DirStatus::Active => "active",
            DirStatus::Failed => "failed",
        }
    }
}

/// What start-up did for one directory.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum RecoverOutcome {
    /// Restored from the on-disk copy (after a reboot or a clean stop).
    Restored,
    /// The previous daemon's mounts were handed over and kept.
    Adopted,
    /// RAM content left by a crashed daemon was saved to `copy`, then the
    /// directory was restored from the on-disk copy.
    Recovered { copy: PathBuf },
}

/// What stopping a directory did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum StopOutcome {
    /// Synced and unmounted: PATH is a normal directory again.
    Released {
        report: SyncReport,
        lazy_unmount: bool,
        /// Forced remove: processes that still had files (or their working
        /// directory) in the RAM copy after PATH was detached, as
        /// `pid (comm): how path`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        still_open: Vec<String>,
        /// Forced remove with `still_open`: where the RAM copy stays until
        /// they close; what they write after the final sync is then saved
        /// as a recovery copy.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kept_until_closed: Option<PathBuf>,
    },
    /// Files were open for writing: synced and left mounted for the next
    /// daemon (handover marker written).
    HandedOver { report: SyncReport },
    /// Was not active; nothing to do.
    Inactive,
}

/// One directory as `ramd dir list` shows it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct DirInfo {
    pub path: PathBuf,
    pub id: String,
    pub mode: MountMode,
    pub size_limit_bytes: Option<u64>,
    pub sync_interval_ms: u64,
    pub status: DirStatus,
    /// Space and inodes of the tmpfs (None when not mounted).
    pub usage: Option<Usage>,
    /// The fuller of space and inodes, percent.
    pub usage_percent: Option<u64>,
    pub usage_level: Option<UsageLevel>,
    /// When the last successful sync finished (ms since the epoch).
    pub last_sync_unix_ms: Option<u64>,
    /// What the last successful sync did.
    pub last_sync: Option<SyncReport>,
    /// The last error (sync or recovery), cleared by a successful sync.
    pub last_error: Option<String>,
    /// Dated copies of RAM content a crashed daemon left (oldest first).
    pub recovery_copies: Vec<RecoveryCopy>,
    /// Things the user should know (recovery, lazy unmounts...).
    pub notes: Vec<String>,
    /// Who asked for it: the API, or a `[[dir]]` in a config file.
    pub origin: DirOrigin,
    /// Syncs since the daemon started.
    pub totals: SyncTotals,
}

/// Counters of a directory's syncs since the daemon started (metrics).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SyncTotals {
    /// Syncs that finished (complete or with files left for the next one).
    pub syncs: u64,
    /// Syncs that failed (disk full, I/O error).
    pub failed_syncs: u64,
    /// Regular files written to disk.
    pub files_copied: u64,
    /// Data bytes written to disk.
    pub bytes_copied: u64,
    /// Entries deleted from disk.
    pub entries_deleted: u64,
    /// Times a file was left for the next sync because it kept changing.
    pub files_skipped_changing: u64,
    /// Wall time of all syncs, for an average.
    pub duration_ms: u64,
}

/// Mutable facts about a directory, read by listings (held briefly).
#[derive(Debug)]
struct Live {
    status: DirStatus,
    /// The flock on the on-disk directory; dropped when released.
    lock: Option<DirLock>,
    last_sync_unix_ms: Option<u64>,
    last_report: Option<SyncReport>,
    last_error: Option<String>,
    usage: UsageTracker,
    notes: Vec<String>,
    /// Counters for metrics.
    totals: SyncTotals,
    /// The settings in force: the record's, changed by
    /// [`DirManager::reconfigure`] (path and mode never change).
    config: DirConfig,
}

#[derive(Debug)]
struct Managed {
    record: DirRecord,
    layout: Layout,
    /// Serializes operations (sync, remove, stop) on this directory; held
    /// for their whole duration.
    op: Mutex<()>,
    /// Status for listings; never held across I/O.
    live: Mutex<Live>,
    /// Entries the on-disk copy holds because ramd put them there (or they
    /// were there at add): a sync deletes only these (see
    /// [`sync::sync_tree_known`]). Used under `op`.
    known: Mutex<Known>,
}

/// A RAM copy detached from PATH by a forced remove while programs still
/// had files in it: kept (privately mounted in the runtime directory) until
/// they close them, then compared with the final sync (see
/// [`DirManager::poll_draining`]).
#[derive(Debug)]
struct Draining {
    path: PathBuf,
    id: String,
    layout: Layout,
    /// `st_dev` of the RAM copy (what the programs' files are on).
    dev: u64,
    /// Where its content is readable (tmpfs root, or the overlay's view).
    source: PathBuf,
    /// When the final sync started (ns since the epoch): anything changed
    /// since is saved as a recovery copy.
    synced_from_unix_ns: i128,
    recovery_generations: u32,
}

/// The directory manager (see the module docs).
pub struct DirManager {
    cfg: ManagerConfig,
    state_file: StateFile,
    /// The persisted records (saved on every add and remove).
    records: Mutex<DirsState>,
    /// Managed directories by path.
    dirs: Mutex<BTreeMap<PathBuf, Arc<Managed>>>,
    /// Serializes adds (check, record, insert, fill), so two adds of one
    /// path cannot both pass the checks. Syncs and listings do not take it.
    adding: Mutex<()>,
    /// flock on the state directory, taken before the first add or
    /// recovery and kept until shutdown: two managers (two daemons) sharing
    /// a state directory would overwrite each other's state file.
    state_claim: Mutex<Option<DirLock>>,
    /// RAM copies detached by a forced remove, waiting for their last
    /// programs to close them.
    draining: Mutex<Vec<Draining>>,
}

/// The daemon's own directory a manager directory lives in (`<state>` for
/// `<state>/dirs`): nothing in it may be kept in RAM.
fn daemon_dir(dir: &Path) -> PathBuf {
    match dir.parent() {
        Some(p) if p != Path::new("/") && !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => dir.to_path_buf(),
    }
}

fn now_unix_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as i128
}

/// Entries below `root` (relative paths) whose inode changed at or after
/// `since_unix_ns`, less a margin for the coarse clock of file times.
fn changed_since(root: &Path, since_unix_ns: i128) -> std::io::Result<Vec<PathBuf>> {
    const COARSE_CLOCK_MARGIN_NS: i128 = 20_000_000;
    let since = since_unix_ns - COARSE_CLOCK_MARGIN_NS;
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for ent in std::fs::read_dir(root.join(&rel))? {
            let ent = ent?;
            let md = match std::fs::symlink_metadata(ent.path()) {
                Ok(md) => md,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            let r = rel.join(ent.file_name());
            let ctime = md.ctime() as i128 * 1_000_000_000 + md.ctime_nsec() as i128;
            if ctime >= since {
                out.push(r.clone());
            }
            if md.is_dir() {
                stack.push(r);
            }
        }
    }
    Ok(out)
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

/// A stable, mount-option-safe id: the directory name (sanitized, at most
/// 32 characters) and a checksum of the whole path.
pub fn dir_id(path: &Path) -> String {
    let name: String = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(32)
        .collect();
    let name = name.trim_start_matches('.');
    let crc = crc32c::crc32c(path.as_os_str().as_encoded_bytes());
    if name.is_empty() {
        format!("{crc:08x}")
    } else {
        format!("{name}-{crc:08x}")
    }
}

impl DirManager {
    /// Opens the manager: reads the state file, mounts nothing. Call
    /// [`DirManager::recover_all`] next, before the daemon says it is ready.
    pub fn open(cfg: ManagerConfig) -> Result<DirManager, DirError> {
        let state_file = StateFile::new(&cfg.state_dir);
        for dir in [&cfg.state_dir, &cfg.run_dir] {
            match super::state::make_private(dir) {
                Ok(fixed) if fixed.is_empty() => {}
                Ok(fixed) => tracing::warn!(fixed = ?fixed,
                    "made ramd's directory state private (directories 0700, files 0600): they were readable by other users"),
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), "cannot check the modes of ramd's files: {e}")
                }
            }
        }
        let (state, warning) = state_file.load()?;
        if let Some(w) = warning {
            tracing::warn!("{w}");
        }
        Ok(DirManager {
            cfg,
            state_file,
            records: Mutex::new(state),
            dirs: Mutex::new(BTreeMap::new()),
            adding: Mutex::new(()),
            state_claim: Mutex::new(None),
            draining: Mutex::new(Vec::new()),
        })
    }

    /// Takes the state directory's lock (once; kept until shutdown).
    fn claim_state(&self) -> Result<(), DirError> {
        let mut claim = self.state_claim.lock();
        if claim.is_some() {
            return Ok(());
        }
        let dir = &self.cfg.state_dir;
        mounts::ensure_dir(dir)?;
        let file = std::fs::File::open(dir).map_err(io_err("open", dir))?;
        *claim = Some(DirLock::acquire(file, dir)?);
        Ok(())
    }

    /// The persisted records (what start-up will restore).
    pub fn records(&self) -> Vec<DirRecord> {
        self.records.lock().dirs.clone()
    }

    fn layout(&self, id: &str) -> Layout {
        Layout::new(&self.cfg.run_dir, id)
    }

    fn recovery_dir(&self, id: &str) -> PathBuf {
        self.cfg.state_dir.join(id).join("recovery")
    }

    fn get(&self, path: &Path) -> Result<Arc<Managed>, DirError> {
        self.dirs
            .lock()
            .get(path)
            .cloned()
            .ok_or_else(|| DirError::NotManaged(path.to_path_buf()))
    }

    /// The path of a managed directory named by its id or its path
    /// (trailing slashes and `.` components ignored).
    pub fn find(&self, key: &str) -> Result<PathBuf, DirError> {
        let dirs = self.dirs.lock();
        let found = if key.starts_with('/') {
            let want: PathBuf = Path::new(key).components().collect();
            dirs.keys().find(|p| **p == want).cloned()
        } else {
            dirs.iter()
                .find(|(_, m)| m.record.id == key)
                .map(|(p, _)| p.clone())
        };
        found.ok_or_else(|| DirError::NotManaged(PathBuf::from(key)))
    }

    /// Paths of managed directories.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.dirs.lock().keys().cloned().collect()
    }

    /// Settings of a managed directory.
    pub fn config(&self, path: &Path) -> Result<DirConfig, DirError> {
        Ok(self.get(path)?.live.lock().config.clone())
    }

    fn insert(&self, record: DirRecord, status: DirStatus) -> Arc<Managed> {
        let config = record.config.clone();
        let m = Arc::new(Managed {
            layout: self.layout(&record.id),
            record,
            op: Mutex::new(()),
            live: Mutex::new(Live {
                status,
                lock: None,
                last_sync_unix_ms: None,
                last_report: None,
                last_error: None,
                usage: UsageTracker::default(),
                notes: Vec::new(),
                totals: SyncTotals::default(),
                config,
            }),
            known: Mutex::new(Known::default()),
        });
        self.dirs
            .lock()
            .insert(m.record.config.path.clone(), m.clone());
        m
    }

    fn save_records(&self, change: impl FnOnce(&mut DirsState)) -> Result<(), DirError> {
        let mut records = self.records.lock();
        let mut next = records.clone();
        change(&mut next);
        self.state_file.save(&next)?;
        *records = next;
        Ok(())
    }

    /// Keeps a directory in RAM. Returns when PATH shows the RAM copy.
    pub fn add(&self, req: AddRequest) -> Result<DirInfo, DirError> {
        if req.sync_interval_ms < MIN_DIR_SYNC_INTERVAL_MS {
            return Err(DirError::Invalid(format!(
                "sync interval {} ms is below the minimum of {MIN_DIR_SYNC_INTERVAL_MS} ms",
                req.sync_interval_ms
            )));
        }
        if req.recovery_generations == 0 {
            return Err(DirError::Invalid(
                "recovery generations must be at least 1".into(),
            ));
        }
        let _adding = self.adding.lock();
        self.claim_state()?;
        let path = req.path.clone();
        let managed: Vec<PathBuf> = self
            .records
            .lock()
            .dirs
            .iter()
            .map(|r| r.config.path.clone())
            .collect();
        if managed.contains(&path) {
            return Err(DirError::AlreadyManaged(path));
        }
        guard::check_add(&AddCheck {
            path: &path,
            expected_uid: req.expected_uid,
            managed: &managed,
            own_dirs: &[
                ("runtime", daemon_dir(&self.cfg.run_dir)),
                ("state", daemon_dir(&self.cfg.state_dir)),
            ],
        })?;
        let in_use = holders::find(holders::Target::Under(&path));
        if !req.force {
            guard::check_not_in_use(&path, &in_use)?;
        } else if !in_use.is_empty() {
            tracing::warn!(path = %path.display(), holders = %holders::describe(&in_use, 8),
                "added with --force although other processes use it; what they write to the on-disk copy is kept and reported as conflicts");
        }
        if req.mode == MountMode::Tmpfs {
            let need = guard::content_bytes(&path).map_err(io_err("measure", &path))?;
            guard::check_size(
                &path,
                need,
                req.size_limit_bytes,
                guard::mem_available_bytes(),
            )?;
        }
        let mut id = dir_id(&path);
        let taken: Vec<String> = self
            .records
            .lock()
            .dirs
            .iter()
            .map(|r| r.id.clone())
            .chain(self.draining.lock().iter().map(|d| d.id.clone()))
            .collect();
        let mut n = 1;
        while taken.contains(&id) {
            n += 1;
            id = format!("{}-{n}", dir_id(&path));
        }
        let record = DirRecord {
            id,
            config: DirConfig {
                path: path.clone(),
                mode: req.mode,
                size_limit_bytes: req.size_limit_bytes,
                sync_interval_ms: req.sync_interval_ms,
                recovery_generations: req.recovery_generations,
                expected_uid: req.expected_uid,
            },
            added_unix_s: now_unix_ms() / 1000,
            origin: req.origin.clone(),
        };
        // Record first: a crash from here on is recovered at start (Fresh
        // restores from disk, which still has everything).
        self.save_records(|s| s.dirs.push(record.clone()))?;
        let m = self.insert(record.clone(), DirStatus::Activating);
        let _op = m.op.lock();
        let result = self
            .attach_and_lock(&path, &m.layout)
            .and_then(|lock| self.activate(&m, lock));
        match result {
            Ok(lock) => {
                let mut live = m.live.lock();
                live.lock = Some(lock);
                live.status = DirStatus::Active;
                drop(live);
                tracing::info!(path = %path.display(), mode = ?req.mode, "directory is now in RAM");
                drop(_op);
                self.info(&path)
            }
            Err(e) => {
                self.dirs.lock().remove(&path);
                let id = record.id.clone();
                let _ = self.save_records(|s| s.dirs.retain(|r| r.id != id));
                Err(e)
            }
        }
    }

    /// Binds the on-disk directory at the disk view and locks it.
    fn attach_and_lock(&self, path: &Path, layout: &Layout) -> Result<DirLock, DirError> {
        mounts::ensure_dir(&layout.base)?;
        let dir = mounts::attach_disk_view(path, layout)?;
        DirLock::acquire(dir, path).map_err(|e| {
            let _ = mounts::unmount(&layout.disk(), true);
            e.into()
        })
    }

    /// Mounts the RAM copy at PATH (disk view attached and locked). On
    /// failure every mount made here is undone and PATH is as before.
    fn activate(&self, m: &Managed, lock: DirLock) -> Result<DirLock, DirError> {
        let cfg = &m.record.config;
        let layout = &m.layout;
        let result = (|| -> Result<(), DirError> {
            if !mounts::is_mount_point(&layout.disk())? {
                mounts::attach_disk_view(&cfg.path, layout)?;
            }
            let _ = std::fs::remove_file(layout.handover());
            let disk = layout.disk();
            let root = Meta::lstat(&disk).map_err(io_err("stat", &disk))?;
            let size_limit_bytes = m.live.lock().config.size_limit_bytes;
            mounts::mount_tmpfs(&layout.ram(), &layout.tag, size_limit_bytes, 0o700)?;
            match cfg.mode {
                MountMode::Tmpfs => {
                    let (report, seen) =
                        sync::sync_tree_known(&disk, &layout.ram(), &SyncOptions::to_ram(), None)
                            .map_err(|e| match e {
                            SyncError::NoSpace { .. } => DirError::RamFull {
                                path: cfg.path.clone(),
                                limit: size_limit_bytes
                                    .map(format_size)
                                    .unwrap_or_else(|| "(tmpfs default)".into()),
                            },
                            e => e.into(),
                        })?;
                    tracing::info!(
                        path = %cfg.path.display(),
                        files = report.files_copied,
                        bytes = report.bytes_copied,
                        "filled the RAM copy from disk"
                    );
                    if !report.complete() {
                        tracing::warn!(path = %cfg.path.display(), files = ?report.changed_during_sync,
                            "files changed on disk while being copied into RAM; programs should not use the directory before ramd is ready");
                    }
                    // Fingerprints of the disk entries as found.
                    *m.known.lock() = seen.src;
                    mounts::bind(&layout.ram(), &cfg.path)?;
                }
                MountMode::Overlay => {
                    for d in [layout.upper(), layout.work()] {
                        std::fs::create_dir(&d).map_err(io_err("create", &d))?;
                    }
                    // The merged root is the upper root: give it PATH's attributes.
                    let x = meta::read_xattrs(&disk).map_err(io_err("read xattrs of", &disk))?;
                    meta::write_xattrs(&layout.upper(), &x)
                        .map_err(io_err("set xattrs on", &layout.upper()))?;
                    meta::apply_attributes(&layout.upper(), &root)
                        .map_err(io_err("set attributes on", &layout.upper()))?;
                    *m.known.lock() = Known::of_tree(&disk, true).map_err(io_err("read", &disk))?;
                    mounts::mount_overlay(
                        &cfg.path,
                        &layout.tag,
                        &disk,
                        &layout.upper(),
                        &layout.work(),
                    )?;
                    mounts::bind_private(&cfg.path, &layout.view())?;
                }
            }
            Ok(())
        })();
        match result {
            Ok(()) => Ok(lock),
            Err(e) => {
                self.unmount_path(m, true);
                let _ = mounts::detach_all_under(&layout.base);
                let _ = std::fs::remove_dir_all(&layout.base);
                Err(e)
            }
        }
    }

    /// Unmounts every mount of ours stacked at PATH. Returns true when one
    /// had to be detached lazily (still in use).
    fn unmount_path(&self, m: &Managed, lazy: bool) -> bool {
        let mut was_lazy = false;
        for _ in 0..8 {
            match mounts::our_mount_at(&m.record.config.path, &m.layout.tag) {
                Ok(Some(_)) => {}
                _ => break,
            }
            if mounts::unmount(&m.record.config.path, false).is_err() && lazy {
                was_lazy = true;
                let _ = mounts::unmount(&m.record.config.path, true);
            }
        }
        was_lazy
    }

    /// The sync source: the tmpfs root, or the private view of the overlay.
    fn source(&self, m: &Managed) -> PathBuf {
        match m.record.config.mode {
            MountMode::Tmpfs => m.layout.ram(),
            MountMode::Overlay => m.layout.view(),
        }
    }

    /// One sync under the op lock (held by the caller).
    fn run_sync(&self, m: &Managed) -> Result<SyncReport, DirError> {
        {
            let live = m.live.lock();
            if live.status != DirStatus::Active {
                return Err(DirError::NotActive {
                    path: m.record.config.path.clone(),
                    status: live.status.name(),
                    reason: live
                        .last_error
                        .clone()
                        .unwrap_or_else(|| "not ready".into()),
                });
            }
        }
        let path = &m.record.config.path;
        let mut known = m.known.lock();
        let result = sync::sync_tree_known(
            &self.source(m),
            &m.layout.disk(),
            &self.cfg.sync,
            Some(&mut known),
        )
        .map(|(r, seen)| {
            *known = seen.dst;
            r
        });
        drop(known);
        let mut live = m.live.lock();
        match &result {
            Ok(r) => {
                if !r.conflicts.is_empty() {
                    tracing::warn!(path = %path.display(), entries = ?r.conflicts,
                        "entries written to the on-disk copy behind the RAM copy (by programs that had it open before it went into RAM): kept on disk, not in RAM (a file RAM also has is kept under a .ramd-conflict- name); see docs/dirs.md");
                }
                live.last_sync_unix_ms = Some(now_unix_ms());
                live.last_report = Some(r.clone());
                live.last_error = None;
                let t = &mut live.totals;
                t.syncs += 1;
                t.files_copied += r.files_copied;
                t.bytes_copied += r.bytes_copied;
                t.entries_deleted += r.entries_deleted;
                t.files_skipped_changing += r.changed_during_sync.len() as u64;
                t.duration_ms += r.duration_ms;
                if r.complete() {
                    tracing::debug!(path = %path.display(), files = r.files_copied, bytes = r.bytes_copied,
                        deleted = r.entries_deleted, ms = r.duration_ms, "synced");
                } else {
                    tracing::warn!(path = %path.display(), files = ?r.changed_during_sync,
                        "files kept changing during the sync; their previous version stays on disk until the next sync");
                }
            }
            Err(e) => {
                live.last_error = Some(e.to_string());
                live.totals.failed_syncs += 1;
                tracing::error!(path = %path.display(), "sync failed: {e}");
            }
        }
        Ok(result?)
    }

    /// Syncs one directory now; returns when the on-disk copy is durable.
    pub fn sync(&self, path: &Path) -> Result<SyncReport, DirError> {
        let m = self.get(path)?;
        let _op = m.op.lock();
        self.run_sync(&m)
    }

    /// Syncs every active directory (the hook before suspend, `dir sync --all`).
    pub fn sync_all(&self) -> Vec<(PathBuf, Result<SyncReport, DirError>)> {
        let all: Vec<Arc<Managed>> = self.dirs.lock().values().cloned().collect();
        all.into_iter()
            .filter(|m| m.live.lock().status == DirStatus::Active)
            .map(|m| {
                let _op = m.op.lock();
                (m.record.config.path.clone(), self.run_sync(&m))
            })
            .collect()
    }

    /// Stops keeping `path` in RAM: makes PATH read-only (so nothing written
    /// after the final sync can be lost), syncs, unmounts and forgets it.
    /// Files open for writing make it fail with a busy error naming the
    /// programs, unless `force`: then PATH is frozen, synced and detached,
    /// and the RAM copy is kept until they close it (see `release_frozen`;
    /// nothing is lost). Returns the final sync's report.
    pub fn remove(&self, path: &Path, force: bool) -> Result<StopOutcome, DirError> {
        let m = self.get(path)?;
        let _op = m.op.lock();
        let status = m.live.lock().status;
        let outcome = if status == DirStatus::Active {
            self.release(&m, force, false)?
        } else {
            StopOutcome::Inactive
        };
        self.save_records(|s| s.dirs.retain(|r| r.config.path != path))?;
        self.dirs.lock().remove(path);
        tracing::info!(path = %path.display(), "directory is no longer in RAM");
        Ok(outcome)
    }

    /// Sync and unmount (or hand over). The op lock is held by the caller.
    fn release(
        &self,
        m: &Managed,
        force: bool,
        handover_if_busy: bool,
    ) -> Result<StopOutcome, DirError> {
        let path = &m.record.config.path;
        let read_only = match mounts::remount_read_only(path) {
            Ok(()) => true,
            Err(MountError::Busy { .. }) if handover_if_busy => {
                let report = self.run_sync(m)?;
                let known_file = m.layout.known();
                m.known
                    .lock()
                    .save(&known_file)
                    .map_err(io_err("write", &known_file))?;
                let marker = m.layout.handover();
                std::fs::write(
                    &marker,
                    format!("pid {} at {} ms\n", std::process::id(), now_unix_ms()),
                )
                .map_err(io_err("write", &marker))?;
                m.live.lock().lock = None;
                tracing::warn!(path = %path.display(),
                    "files are open for writing: synced and left in RAM for the next ramd to take over");
                return Ok(StopOutcome::HandedOver { report });
            }
            Err(MountError::Busy { .. }) if force => return self.release_frozen(m),
            Err(MountError::Busy { .. }) => {
                let holders = std::fs::metadata(path)
                    .map(|md| holders::find(holders::Target::Device(md.dev())))
                    .unwrap_or_default();
                return Err(DirError::Busy {
                    path: path.clone(),
                    holders: if holders.is_empty() {
                        "processes not visible to ramd".into()
                    } else {
                        holders::describe(&holders, 8)
                    },
                });
            }
            Err(e) => return Err(e.into()),
        };
        let report = match self.run_sync(m) {
            Ok(r) => r,
            Err(e) => {
                if read_only {
                    let _ = mounts::remount_read_write(path);
                }
                return Err(e);
            }
        };
        let lazy = self.unmount_path(m, true);
        if lazy {
            tracing::warn!(path = %path.display(),
                "still in use: detached lazily; programs keep their open (read-only, synced) files until they close them");
        }
        let _ = mounts::detach_all_under(&m.layout.base);
        let _ = std::fs::remove_dir_all(&m.layout.base);
        let mut live = m.live.lock();
        live.lock = None;
        live.status = DirStatus::Failed;
        live.last_error = Some("released".into());
        Ok(StopOutcome::Released {
            report,
            lazy_unmount: lazy,
            still_open: Vec::new(),
            kept_until_closed: None,
        })
    }

    /// Forced release while files are open for writing; loses nothing:
    /// 1. freeze: a read-only bind of the RAM copy on top of PATH, so new
    ///    opens cannot write (programs holding files keep writing);
    /// 2. the final sync;
    /// 3. PATH's mounts detached lazily: PATH shows the on-disk copy;
    /// 4. the programs still in the RAM copy are named; the copy stays
    ///    (privately) until they close it, then whatever changed since the
    ///    final sync started is saved as a recovery copy
    ///    ([`DirManager::poll_draining`]).
    fn release_frozen(&self, m: &Managed) -> Result<StopOutcome, DirError> {
        let path = &m.record.config.path;
        let dev = std::fs::metadata(path).map_err(io_err("stat", path))?.dev();
        let source = self.source(m);
        mounts::bind(&source, path)?;
        if let Err(e) = mounts::remount_read_only(path) {
            let _ = mounts::unmount(path, true);
            return Err(e.into());
        }
        let synced_from_unix_ns = now_unix_ns();
        let report = match self.run_sync(m) {
            Ok(r) => r,
            Err(e) => {
                let _ = mounts::unmount(path, true);
                return Err(e);
            }
        };
        self.unmount_path(m, true);
        let still = holders::find(holders::Target::Device(dev));
        let still_open: Vec<String> = still.iter().map(|h| h.to_string()).collect();
        {
            let mut live = m.live.lock();
            live.lock = None;
            live.status = DirStatus::Failed;
            live.last_error = Some("released".into());
        }
        let d = Draining {
            path: path.clone(),
            id: m.record.id.clone(),
            layout: m.layout.clone(),
            dev,
            source,
            synced_from_unix_ns,
            recovery_generations: m.live.lock().config.recovery_generations,
        };
        let kept_until_closed = (!still.is_empty()).then(|| d.source.clone());
        if still.is_empty() {
            self.finish_draining(d);
        } else {
            tracing::warn!(path = %path.display(), still_open = %holders::describe(&still, 8),
                ram_copy = %d.source.display(),
                "synced and detached; programs still have files in the RAM copy: it is kept until they close them, and what they write after the final sync is saved as a recovery copy");
            self.draining.lock().push(d);
        }
        Ok(StopOutcome::Released {
            report,
            lazy_unmount: true,
            still_open,
            kept_until_closed,
        })
    }

    /// Checks the RAM copies a forced remove left to their programs: once
    /// none uses one any more (or at `final`, daemon stop), what changed in
    /// it since its final sync is saved as a recovery copy, and it is
    /// unmounted. Called every few seconds by the sync thread.
    pub fn poll_draining(&self, last: bool) {
        let ready: Vec<Draining> = {
            let mut all = self.draining.lock();
            if all.is_empty() {
                return;
            }
            let procs = holders::scan(true);
            let own = std::process::id();
            let (done, wait): (Vec<Draining>, Vec<Draining>) =
                std::mem::take(&mut *all).into_iter().partition(|d| {
                    last || holders::holders(&procs, holders::Target::Device(d.dev), own).is_empty()
                });
            *all = wait;
            done
        };
        for d in ready {
            self.finish_draining(d);
        }
    }

    /// Saves what changed in a detached RAM copy since its final sync as a
    /// recovery copy, then unmounts it.
    fn finish_draining(&self, d: Draining) {
        match changed_since(&d.source, d.synced_from_unix_ns) {
            Ok(changed) if changed.is_empty() => {}
            Ok(changed) => {
                let rec_dir = self.recovery_dir(&d.id);
                match recovery::make_copy(&d.source, &rec_dir, now_unix_ms() / 1000) {
                    Ok((copy, _)) => {
                        recovery::prune(&rec_dir, d.recovery_generations);
                        tracing::warn!(path = %d.path.display(), copy = %copy.display(), changed = ?changed,
                            "programs wrote to the detached RAM copy after its final sync: saved as a recovery copy; copy back what you need");
                    }
                    Err(e) => tracing::error!(path = %d.path.display(),
                        "cannot save what programs wrote after the final sync: {e}; the RAM copy stays at {}", d.source.display()),
                }
            }
            Err(e) => {
                tracing::error!(path = %d.path.display(), "cannot read the detached RAM copy: {e}")
            }
        }
        let _ = mounts::detach_all_under(&d.layout.base);
        let _ = std::fs::remove_dir_all(&d.layout.base);
    }

    /// Daemon stop: every directory is synced and released, or handed over
    /// when files are open for writing. Records stay: the next start
    /// restores them.
    pub fn shutdown(&self) -> Vec<(PathBuf, Result<StopOutcome, DirError>)> {
        let all: Vec<Arc<Managed>> = self.dirs.lock().values().cloned().collect();
        let out = all
            .into_iter()
            .map(|m| {
                let _op = m.op.lock();
                let path = m.record.config.path.clone();
                if m.live.lock().status != DirStatus::Active {
                    return (path, Ok(StopOutcome::Inactive));
                }
                (path, self.release(&m, false, true))
            })
            .collect();
        self.dirs.lock().clear();
        self.poll_draining(true);
        *self.state_claim.lock() = None;
        out
    }

    /// Start-up: brings every recorded directory back (see
    /// [`super::recovery`]). Failures leave the directory listed as failed
    /// with its error; the others go on.
    pub fn recover_all(&self) -> Vec<(PathBuf, Result<RecoverOutcome, DirError>)> {
        let records = self.records();
        records
            .into_iter()
            .map(|record| {
                let path = record.config.path.clone();
                let m = self.insert(record, DirStatus::Activating);
                let _op = m.op.lock();
                let result = self.claim_state().and_then(|()| self.recover_one(&m));
                let mut live = m.live.lock();
                let result = match result {
                    Ok((outcome, lock)) => {
                        live.status = DirStatus::Active;
                        live.lock = Some(lock);
                        if let RecoverOutcome::Recovered { copy } = &outcome {
                            live.notes.push(format!(
                                "the previous ramd stopped without syncing; the RAM content it left was saved to {}; {} was restored from its last sync",
                                copy.display(),
                                path.display()
                            ));
                        }
                        Ok(outcome)
                    }
                    Err(e) => {
                        live.status = DirStatus::Failed;
                        live.last_error = Some(e.to_string());
                        tracing::error!(path = %path.display(), "cannot restore: {e}");
                        Err(e)
                    }
                };
                drop(live);
                (path, result)
            })
            .collect()
    }

    fn recover_one(&self, m: &Managed) -> Result<(RecoverOutcome, DirLock), DirError> {
        let cfg = &m.record.config;
        let layout = &m.layout;
        let path = &cfg.path;
        let mounts_now = mountinfo::read()?;
        let situation = recovery::classify(
            &mounts_now,
            path,
            layout,
            cfg.mode,
            layout.handover().exists(),
        );
        match situation {
            Situation::Covered(fs_type, source_name) => Err(DirError::Covered {
                path: path.clone(),
                fs_type,
                source_name,
            }),
            Situation::Adopt => {
                let lock = if mounts::is_mount_point(&layout.disk())? {
                    let dir = std::fs::File::open(layout.disk())
                        .map_err(io_err("open", &layout.disk()))?;
                    DirLock::acquire(dir, path)?
                } else {
                    self.attach_and_lock(path, layout)?
                };
                if cfg.mode == MountMode::Overlay && !mounts::is_mount_point(&layout.view())? {
                    mounts::bind_private(path, &layout.view())?;
                }
                *m.known.lock() = match Known::load(&layout.known()) {
                    Ok(k) => k,
                    Err(_) => {
                        let src = self.source(m);
                        // No fingerprints: only deletions are protected.
                        Known::of_tree(&src, false).map_err(io_err("read", &src))?
                    }
                };
                let _ = std::fs::remove_file(layout.known());
                let _ = std::fs::remove_file(layout.handover());
                tracing::info!(path = %path.display(), "took over the RAM copy a clean stop left mounted");
                Ok((RecoverOutcome::Adopted, lock))
            }
            Situation::Stale(source) => {
                // Lock first: a live daemon still managing it makes this fail
                // before anything is touched.
                let lock = self.attach_and_lock(path, layout)?;
                let src = match source {
                    StaleSource::Path => {
                        mounts::bind_private(path, &layout.stale_view())?;
                        layout.stale_view()
                    }
                    StaleSource::Ram => layout.ram(),
                    StaleSource::Upper => layout.upper(),
                };
                let rec_dir = self.recovery_dir(&m.record.id);
                let copy = recovery::make_copy(&src, &rec_dir, now_unix_ms() / 1000);
                if source == StaleSource::Path {
                    let _ = mounts::unmount(&layout.stale_view(), true);
                }
                let (copy, _) = copy?;
                let generations = m.live.lock().config.recovery_generations;
                for old in recovery::prune(&rec_dir, generations) {
                    tracing::info!(path = %old.display(), "deleted an old recovery copy");
                }
                tracing::warn!(path = %path.display(), copy = %copy.display(),
                    "the previous ramd stopped without syncing: saved the RAM content it left as a recovery copy; restoring from the last sync on disk");
                self.unmount_path(m, true);
                let _ = mounts::detach_all_under(&layout.base);
                let lock = self.activate(m, lock)?;
                Ok((RecoverOutcome::Recovered { copy }, lock))
            }
            Situation::Fresh => {
                let _ = mounts::detach_all_under(&layout.base);
                let lock = self.attach_and_lock(path, layout)?;
                let lock = self.activate(m, lock)?;
                tracing::info!(path = %path.display(), "restored into RAM from the on-disk copy");
                Ok((RecoverOutcome::Restored, lock))
            }
        }
    }

    /// Measures every active RAM copy and logs level changes (80% warning,
    /// 95% critical, full). Returns the changes. Call it periodically.
    pub fn check_usage(&self) -> Vec<(PathBuf, UsageLevel, Usage)> {
        let all: Vec<Arc<Managed>> = self.dirs.lock().values().cloned().collect();
        let mut changes = Vec::new();
        for m in all {
            if m.live.lock().status != DirStatus::Active {
                continue;
            }
            let Ok(u) = Usage::of(&m.layout.ram()) else {
                continue;
            };
            let Some(level) = m.live.lock().usage.update(&u) else {
                continue;
            };
            let path = m.record.config.path.display().to_string();
            let (used, total) = (format_size(u.used_bytes), format_size(u.total_bytes));
            match level {
                UsageLevel::Ok => tracing::info!(path, used, total, "RAM copy usage back to normal"),
                UsageLevel::Warning => tracing::warn!(path, used, total, percent = u.percent(), "RAM copy is over 80% full"),
                UsageLevel::Critical => tracing::warn!(path, used, total, percent = u.percent(), "RAM copy is over 95% full; raise its size limit soon"),
                UsageLevel::Full => tracing::error!(path, used, total,
                    "RAM copy is full: writes fail with 'No space left on device'; raise the size limit or delete files"),
            }
            changes.push((m.record.config.path.clone(), level, u));
        }
        changes
    }

    /// One directory's listing entry.
    pub fn info(&self, path: &Path) -> Result<DirInfo, DirError> {
        let m = self.get(path)?;
        Ok(self.info_of(&m))
    }

    /// Every managed directory, by path.
    pub fn list(&self) -> Vec<DirInfo> {
        let all: Vec<Arc<Managed>> = self.dirs.lock().values().cloned().collect();
        all.iter().map(|m| self.info_of(m)).collect()
    }

    fn info_of(&self, m: &Managed) -> DirInfo {
        let cfg = &m.record.config;
        let live = m.live.lock();
        let usage = (live.status == DirStatus::Active)
            .then(|| Usage::of(&m.layout.ram()).ok())
            .flatten();
        DirInfo {
            path: cfg.path.clone(),
            id: m.record.id.clone(),
            mode: cfg.mode,
            size_limit_bytes: live.config.size_limit_bytes,
            sync_interval_ms: live.config.sync_interval_ms,
            status: live.status,
            usage_percent: usage.map(|u| u.percent()),
            usage_level: usage.map(|u| u.level()),
            usage,
            last_sync_unix_ms: live.last_sync_unix_ms,
            last_sync: live.last_report.clone(),
            last_error: live.last_error.clone(),
            recovery_copies: recovery::list_copies(&self.recovery_dir(&m.record.id)),
            notes: live.notes.clone(),
            origin: m.record.origin.clone(),
            totals: live.totals.clone(),
        }
    }

    /// Changes a directory's interval, size limit or recovery generations,
    /// in RAM (the tmpfs is resized at once) and in the state file. A size
    /// limit below what the RAM copy holds is refused. The caller
    /// reschedules the syncs ([`super::schedule::SyncWorker::set_interval`]).
    pub fn reconfigure(&self, path: &Path, change: &DirChange) -> Result<DirInfo, DirError> {
        if change
            .sync_interval_ms
            .is_some_and(|ms| ms < MIN_DIR_SYNC_INTERVAL_MS)
        {
            return Err(DirError::Invalid(format!(
                "sync interval below the minimum of {MIN_DIR_SYNC_INTERVAL_MS} ms"
            )));
        }
        if change.recovery_generations == Some(0) {
            return Err(DirError::Invalid(
                "recovery generations must be at least 1".into(),
            ));
        }
        if change.size_limit_bytes == Some(Some(0)) {
            return Err(DirError::Invalid(
                "a size limit must be at least 1 byte".into(),
            ));
        }
        let m = self.get(path)?;
        let _op = m.op.lock();
        let (old, active) = {
            let live = m.live.lock();
            (live.config.clone(), live.status == DirStatus::Active)
        };
        let mut new = old.clone();
        if let Some(ms) = change.sync_interval_ms {
            new.sync_interval_ms = ms;
        }
        if let Some(g) = change.recovery_generations {
            new.recovery_generations = g;
        }
        if let Some(limit) = change.size_limit_bytes {
            new.size_limit_bytes = limit;
        }
        let resized = active && new.size_limit_bytes != old.size_limit_bytes;
        if resized {
            mounts::resize_tmpfs(&m.layout.ram(), new.size_limit_bytes).map_err(|e| match e {
                MountError::Failed { source, .. }
                    if source.raw_os_error() == Some(libc::EINVAL) =>
                {
                    let used = Usage::of(&m.layout.ram()).map(|u| u.used_bytes).unwrap_or(0);
                    DirError::Invalid(format!(
                        "the RAM copy of {} holds {}: a size limit below that cannot be set; delete files first",
                        path.display(),
                        format_size(used)
                    ))
                }
                e => e.into(),
            })?;
        }
        let saved = self.save_records(|s| {
            for r in s.dirs.iter_mut().filter(|r| r.config.path == path) {
                r.config = new.clone();
            }
        });
        if let Err(e) = saved {
            if resized {
                let _ = mounts::resize_tmpfs(&m.layout.ram(), old.size_limit_bytes);
            }
            return Err(e);
        }
        m.live.lock().config = new.clone();
        if new.recovery_generations < old.recovery_generations {
            for gone in recovery::prune(&self.recovery_dir(&m.record.id), new.recovery_generations)
            {
                tracing::info!(path = %gone.display(), "deleted an old recovery copy");
            }
        }
        tracing::info!(path = %path.display(), interval_ms = new.sync_interval_ms,
            size_limit = ?new.size_limit_bytes, generations = new.recovery_generations, "settings changed");
        drop(_op);
        Ok(self.info_of(&m))
    }

    /// The owner uid of PATH's on-disk directory (for API permission checks).
    pub fn owner_uid(path: &Path) -> std::io::Result<u32> {
        Ok(std::fs::metadata(path)?.uid())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_safe_and_distinct() {
        let a = dir_id(Path::new("/home/u/.cache"));
        assert!(a.starts_with("cache-"), "{a}");
        assert_ne!(a, dir_id(Path::new("/home/v/.cache")));
        let odd = dir_id(Path::new("/x/a b,c:d"));
        assert!(
            odd.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)),
            "{odd}"
        );
        assert_eq!(dir_id(Path::new("/")).len(), 8);
    }
}
