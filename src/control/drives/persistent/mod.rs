//! Persistent drives inside the daemon: where their state directories live,
//! whether a directory holds a drive to restore, creating and opening them,
//! their background sync threads, and finding them at start.
//!
//! `Drives` decides *when* (create, restore, delete, shutdown); this
//! module does the disk side. The engine is `crate::persist`.
//!
//! # Life of a persistent drive
//!
//! ```text
//!  create --persist ──► STATE/drives/NAME has a meta? ── no ──► new drive ──► ready
//!  (API, config,               │ yes                                            ▲
//!   daemon start)              ▼                                                │
//!                         restoring ──(restore thread, one at a time)── ok ─────┘
//!                              │ error (corrupt meta/image/journal, wrong key)
//!                              ▼
//!                           failed ──► ramd restore NAME [--force|--discard-journal]
//!                                      ──► restoring ──► ready | failed
//! ```
//!
//! While restoring or failed the drive is listed (with its progress or its
//! precise error) and its NBD export refuses clients with that text; its
//! state directory is not touched until a restore has verified and loaded
//! everything (see `persist::restore`).
//!
//! # Start-up
//!
//! The daemon registers every drive first (restores start at once in the
//! background), binds NBD and the API, and sends READY=1 to systemd only
//! when no drive is restoring any more: services ordered after ramd see
//! their data, while `ramd list` / the API already show restore progress.

pub mod disk;
pub mod modes;
pub mod settings;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use super::spec::{DriveSpec, PersistSpec};
use super::store_options;
use crate::block::backend::{self, Backend, Caps, Extent};
use crate::persist::restore::read_meta;
use crate::persist::{
    names, DirStorage, Key, PersistConfig, PersistentDrive, RestoreOptions, RestoreProgress,
    RestoreReport, SyncScheduler,
};
use crate::store::compressed::{Algorithm, CompressedStore, KeptFiles};
use crate::store::{KeptMemory, MemoryBudget, RamStore, StoreOptions};
pub use disk::DiskDrive;

/// Where persistent drives live inside the daemon's state directory.
pub fn drives_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("drives")
}

/// What a drive's state directory holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// Nothing (or an empty, never-committed directory): create a drive.
    New,
    /// A drive to restore.
    Existing {
        /// Its size as of its last checkpoint.
        size_bytes: u64,
    },
    /// Something that cannot be restored as it is; the text says why.
    Broken(String),
}

/// Looks at `dir` (reads only the meta file).
pub fn probe(dir: &Path) -> Found {
    if !dir.is_dir() {
        return Found::New;
    }
    if dir.join(names::META).exists() {
        return match DirStorage::open_dir(dir)
            .map_err(|e| e.to_string())
            .and_then(|s| read_meta(&s).map_err(|e| e.to_string()))
        {
            Ok(meta) => Found::Existing {
                size_bytes: meta.drive_size,
            },
            Err(e) => Found::Broken(e),
        };
    }
    // The meta is written last at creation: without it nothing was ever
    // acknowledged, unless someone removed it from a used directory.
    let image_len = std::fs::metadata(dir.join(names::IMAGE)).map_or(0, |m| m.len());
    let image_data =
        image_len > 0 && std::fs::metadata(dir.join(names::PAGES)).is_ok_and(|m| m.len() > 0);
    if image_data {
        return Found::Broken(format!(
            "{} holds an image but no meta file; nothing was changed. Move the directory away \
             (the image is a raw copy of the drive unless it was encrypted) or delete the drive",
            dir.display()
        ));
    }
    Found::New
}

/// The engine settings for `spec`.
pub fn engine_config(spec: &PersistSpec) -> PersistConfig {
    PersistConfig {
        durability: spec.durability,
        sync_interval_ms: spec.sync_interval_ms,
        ..PersistConfig::default()
    }
}

/// Why a persistent drive's files could not be created or opened. The
/// messages are for people: they name the file and what to do next.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// The key file does not hold a key. Never suggests a command that
    /// writes to the named file (it may be anything: `/etc/shadow`).
    /// Its size is not said: the path may come from a caller over TCP,
    /// and the file may be any file.
    #[error("key file {} must hold 32 raw bytes or 64 hex digits: is it the right file? To make a new key, write it to a new file (ramd never writes key files): (umask 077; set -C; head -c 32 /dev/urandom > NEW_KEY_FILE)", path.display())]
    KeyFormat { path: PathBuf },
    /// The key file does not exist.
    #[error("key file {} does not exist: give the file the drive was encrypted with, or for a new drive create one that does not exist yet with (umask 077; set -C; head -c 32 /dev/urandom > {})", path.display(), path.display())]
    KeyMissing { path: PathBuf },
    /// The key file could not be read otherwise.
    #[error(transparent)]
    Key(crate::persist::crypto::CryptoError),
    /// The state directory could not be created.
    #[error("cannot create the state directory {}: {source}", path.display())]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The state directory could not be opened.
    #[error(transparent)]
    OpenDir(std::io::Error),
    /// `drive.json` could not be written.
    #[error(transparent)]
    Settings(#[from] settings::SettingsError),
    /// The engine refused (its precise message).
    #[error(transparent)]
    Engine(#[from] crate::persist::Error),
}

/// Asks the kernel to drop the state directory's files from the page
/// cache (clean pages only: nothing unsaved is lost), after a restore the
/// host's memory refused.
pub fn drop_page_cache(dir: &Path) {
    use std::os::fd::AsRawFd;
    let files = std::fs::read_dir(dir).into_iter().flatten().flatten();
    for f in files.filter_map(|e| std::fs::File::open(e.path()).ok()) {
        // SAFETY: advice on a descriptor this function owns for the call;
        // it changes no memory of this process.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
}

impl DiskError {
    /// True when the RAM store refused pages because the host is short of
    /// memory: a restore that meets it may succeed once the host recovers.
    pub fn is_host_short(&self) -> bool {
        matches!(
            self,
            DiskError::Engine(crate::persist::Error::Store(
                crate::block::backend::Error::HostShort
            ))
        )
    }
}

fn read_key(spec: &PersistSpec) -> Result<Option<Key>, DiskError> {
    spec.key_file
        .as_deref()
        .map(|f| Key::from_file(f).map_err(|e| key_error(f, e)))
        .transpose()
}

/// Which key file error `e` is, for people.
fn key_error(path: &Path, e: crate::persist::crypto::CryptoError) -> DiskError {
    use crate::persist::crypto::CryptoError as E;
    match e {
        E::KeyFormat { .. } => DiskError::KeyFormat {
            path: path.to_owned(),
        },
        E::KeyFile { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            DiskError::KeyMissing {
                path: path.to_owned(),
            }
        }
        other => DiskError::Key(other),
    }
}

/// Creates a new drive in `dir` (which must hold none): its settings file,
/// then the engine's files (the meta last: the commit point). On failure a
/// directory this call created is removed again.
pub fn create_new(
    dir: &Path,
    spec: &DriveSpec,
    persist: &PersistSpec,
    origin: &str,
    budget: Arc<MemoryBudget>,
    shared_memory: bool,
) -> Result<DiskDrive, DiskError> {
    let key = read_key(persist)?;
    let existed = dir.exists();
    let result = (|| {
        let storage = DirStorage::create_dir(dir).map_err(|source| DiskError::CreateDir {
            path: dir.to_owned(),
            source,
        })?;
        settings::write(
            dir,
            &settings::DriveSettings::from_spec(spec, persist, origin),
        )?;
        let (size, limit, cfg) = (
            spec.size_bytes,
            spec.mem_limit_bytes,
            engine_config(persist),
        );
        let lock = spec.lock_memory;
        Ok(match spec.compress {
            None => DiskDrive::Raw(Arc::new(PersistentDrive::create(
                storage,
                size,
                key.as_ref(),
                cfg,
                StoreOptions {
                    shared_memory,
                    ..store_options(limit, lock)
                },
                budget,
            )?)),
            Some(algo) => {
                let store = match shared_memory {
                    true => CompressedStore::kept(size, algo, limit, budget, lock, true),
                    false => CompressedStore::with_lock(size, algo, limit, budget, lock),
                }
                .map_err(crate::persist::Error::from)?;
                DiskDrive::Compressed(Arc::new(PersistentDrive::create_with(
                    storage,
                    store,
                    key.as_ref(),
                    cfg,
                )?))
            }
        })
    })();
    if result.is_err() && !existed {
        let _ = std::fs::remove_dir_all(dir);
    }
    result
}

/// How a drive's data is held in memory once restored.
#[derive(Debug, Clone, Copy)]
pub struct Memory {
    /// The drive's own memory limit.
    pub mem_limit_bytes: Option<u64>,
    /// Its compression (None: the raw store). The state directory holds
    /// raw pages either way, so this may differ from what saved them.
    pub compress: Option<Algorithm>,
    /// Lock its memory in RAM.
    pub lock_memory: bool,
    /// A raw store in a memfd, for a supervisor to keep (issue 31).
    pub shared_memory: bool,
}

/// Memory of a persistent drive a supervisor kept across a restart of
/// the serving process: its size and descriptors.
pub struct Kept {
    pub size_bytes: u64,
    pub memory: KeptStore,
}

/// A kept store's descriptors, by kind.
pub enum KeptStore {
    /// The raw store's memfd and ledger.
    Raw(KeptMemory),
    /// A compressed store's memfds and ledger, and its compression.
    Compressed { files: KeptFiles, algo: Algorithm },
}

/// Opens the drive in `dir` over the memory a supervisor `kept` (see
/// `persist::restore::adopt`: nothing loaded, the pages not saved yet
/// saved by the next sync), or restores it into the store `memory` asks
/// for when nothing was kept, the drive is compressed, or the kept
/// memory cannot be mapped or is older than the directory (logged: the
/// directory's data is served then). Errors are the engine's precise
/// messages.
pub fn open(
    dir: &Path,
    persist: &PersistSpec,
    opts: RestoreOptions,
    progress: &RestoreProgress,
    memory: Memory,
    budget: Arc<MemoryBudget>,
    kept: Option<Kept>,
) -> Result<(DiskDrive, RestoreReport), DiskError> {
    let key = read_key(persist)?;
    let (cfg, limit, lock) = (
        engine_config(persist),
        memory.mem_limit_bytes,
        memory.lock_memory,
    );
    let opts_store = StoreOptions {
        shared_memory: memory.shared_memory,
        ..store_options(limit, lock)
    };
    if let Some(k) = kept {
        let storage = DirStorage::open_dir(dir).map_err(DiskError::OpenDir)?;
        let size = k.size_bytes;
        let adopted = match k.memory {
            KeptStore::Raw(m) => RamStore::adopt(size, m, opts_store, budget.clone())
                .map_err(crate::persist::Error::from)
                .and_then(|store| PersistentDrive::adopt_with(storage, key.as_ref(), cfg, store))
                .map(|(d, r)| (DiskDrive::Raw(Arc::new(d)), r)),
            KeptStore::Compressed { files, algo } => {
                CompressedStore::adopt(size, files, algo, limit, budget.clone(), lock)
                    .map_err(crate::persist::Error::from)
                    .and_then(|store| {
                        PersistentDrive::adopt_with(storage, key.as_ref(), cfg, store)
                    })
                    .map(|(d, r)| (DiskDrive::Compressed(Arc::new(d)), r))
            }
        };
        match adopted {
            Ok(done) => return Ok(done),
            Err(
                e @ (crate::persist::Error::Store(_)
                | crate::persist::Error::StaleKeptMemory { .. }),
            ) => {
                tracing::error!(
                    dir = %dir.display(),
                    "the memory kept across the restart cannot be used ({e}): restoring from the state directory instead"
                )
            }
            Err(e) => return Err(e.into()),
        }
    }
    let storage = DirStorage::open_dir(dir).map_err(DiskError::OpenDir)?;
    Ok(match memory.compress {
        None => {
            let (d, r) = PersistentDrive::open(
                storage,
                key.as_ref(),
                opts,
                progress,
                cfg,
                opts_store,
                budget,
            )?;
            (DiskDrive::Raw(Arc::new(d)), r)
        }
        Some(algo) => {
            let kept = memory.shared_memory;
            let make = |size| match kept {
                true => CompressedStore::kept(size, algo, limit, budget, lock, true),
                false => CompressedStore::with_lock(size, algo, limit, budget, lock),
            };
            let (d, r) =
                PersistentDrive::open_with(storage, key.as_ref(), opts, progress, cfg, make)?;
            (DiskDrive::Compressed(Arc::new(d)), r)
        }
    })
}

/// Where the last restore of a drive stands.
#[derive(Debug, Clone)]
pub enum RestoreRecord {
    /// Created new: nothing was restored.
    None,
    /// Waiting for another drive's restore (they run one at a time, as
    /// they share the disk).
    Queued,
    /// Running; the progress is shared with the restore thread.
    Running(Arc<RestoreProgress>),
    /// Attempt `attempt` was refused because the host is short of memory
    /// (`error`); the next starts when it recovers.
    WaitingForMemory { attempt: u32, error: String },
    /// Finished: what it did.
    Done(RestoreReport),
    /// Refused with this error (the drive is failed).
    Failed(String),
}

/// The daemon's side of one persistent drive, shared by `Drives`
/// entries it has over its life (restoring, failed, ready).
pub struct Persistence {
    /// The state directory (STATE/drives/NAME).
    pub dir: PathBuf,
    /// Durability, interval and key file as declared or last changed.
    pub spec: Mutex<PersistSpec>,
    /// The last restore.
    pub restore: Mutex<RestoreRecord>,
    /// Who created the drive ("api", "config", "command-line"), written
    /// into its settings file.
    pub origin: String,
    /// The background sync thread while the drive is ready.
    scheduler: Mutex<Option<SyncScheduler>>,
}

impl Persistence {
    pub fn new(dir: PathBuf, spec: PersistSpec, origin: &str, restore: RestoreRecord) -> Self {
        Persistence {
            dir,
            spec: Mutex::new(spec),
            restore: Mutex::new(restore),
            origin: origin.to_owned(),
            scheduler: Mutex::new(None),
        }
    }

    /// Starts the background sync thread for `drive`.
    pub fn start_scheduler(&self, drive: &DiskDrive, name: &str) {
        match drive.spawn_scheduler(name) {
            Ok(s) => *self.scheduler.lock() = Some(s),
            Err(e) => tracing::error!(
                drive = %name,
                "cannot start the sync thread: {e}; only FLUSH, `ramd sync` and shutdown will save the drive"
            ),
        }
    }

    /// Stops the sync thread (a running sync finishes first).
    pub fn stop_scheduler(&self) {
        let s = self.scheduler.lock().take();
        if let Some(s) = s {
            s.stop();
        }
    }

    /// Wakes the sync thread (it re-reads the interval).
    pub fn wake_scheduler(&self) {
        if let Some(s) = self.scheduler.lock().as_ref() {
            s.wake();
        }
    }

    /// One line for people about where a restore stands (NBD refusals,
    /// logs).
    pub fn restore_text(&self) -> String {
        match &*self.restore.lock() {
            RestoreRecord::None => "not restored".into(),
            RestoreRecord::Queued => "waiting for another drive's restore".into(),
            RestoreRecord::Running(p) => {
                let (done, total) = (p.done_bytes(), p.total_bytes());
                let pct = (done * 100).checked_div(total).unwrap_or(0);
                format!("{} {pct}%", phase_name(p.phase()).replace('_', " "))
            }
            RestoreRecord::WaitingForMemory { attempt, .. } => format!(
                "waiting for the host's memory: attempt {attempt} was refused for it (see `ramd info`: memory pressure); it starts again once memory is freed"
            ),
            RestoreRecord::Done(_) => "restored".into(),
            RestoreRecord::Failed(e) => e.clone(),
        }
    }

    /// Rewrites the settings file (after a change), logging a failure: the
    /// change holds until the daemon stops either way.
    pub fn save_settings(&self, spec: &DriveSpec) {
        let p = self.spec.lock().clone();
        let s = settings::DriveSettings::from_spec(spec, &p, &self.origin);
        if let Err(e) = settings::write(&self.dir, &s) {
            tracing::warn!(
                drive = %spec.name,
                "cannot record the drive's settings: {e}; the change lasts until the daemon restarts"
            );
        }
    }
}

/// Lower-case name of a restore phase, as the API shows it.
pub fn phase_name(p: crate::persist::restore::RestorePhase) -> &'static str {
    use crate::persist::restore::RestorePhase as P;
    match p {
        P::Verifying => "verifying",
        P::LoadingImage => "loading_image",
        P::Replaying => "replaying",
        P::Checkpointing => "checkpointing",
        P::Done => "done",
    }
}

/// A one-line summary of a restore report, for logs and `ramd info`.
pub fn report_text(r: &RestoreReport) -> String {
    if let Some(n) = r.kept_dirty_pages {
        return format!(
            "kept across a restart of the serving process: its memory adopted, nothing loaded; {} not yet saved go to the state directory with the next sync (directory checked in {:.2}s, generation {})",
            crate::size::format_size(n * crate::persist::format::PAGE_BYTES as u64),
            r.duration.as_secs_f64(),
            r.restored_gen
        );
    }
    // A drive synced but never checkpointed has everything in the journal
    // and nothing in the image: both are counted ("restored 0 B" said it
    // had nothing).
    let mut s = format!(
        "restored {} from the image and {} of pages from the journal in {:.2}s (image generation {}, now {}; {} journal generation{} replayed)",
        crate::size::format_size(r.image_data_bytes),
        crate::size::format_size(r.journal_pages * crate::persist::format::PAGE_BYTES as u64),
        r.duration.as_secs_f64(),
        r.image_gen,
        r.restored_gen,
        r.journal_gens,
        if r.journal_gens == 1 { "" } else { "s" }
    );
    if let Some(t) = &r.torn_tail {
        s.push_str(&format!(
            "; a torn journal tail of {} bytes at byte {} was cut ({}): the last sync before the crash had not completed",
            t.bytes, t.damage_offset, t.detail
        ));
    }
    if r.journal_discarded {
        s.push_str("; the journal was discarded on request");
    }
    if let Some((at, d)) = &r.forced_journal_damage {
        s.push_str(&format!(
            "; forced past journal damage at byte {at} ({d}): later generations were dropped"
        ));
    }
    if r.forced_bad_page_count > 0 {
        s.push_str(&format!(
            "; forced: {} page(s) failed verification and were loaded as they are (first: {:?})",
            r.forced_bad_page_count,
            &r.forced_bad_pages[..r.forced_bad_pages.len().min(8)]
        ));
    }
    if let Some(e) = &r.checkpoint_error {
        s.push_str(&format!(
            "; the checkpoint after loading failed ({e}), the next sync retries it"
        ));
    }
    s
}

/// The backend an export has while its drive is restoring or failed. The
/// handshake refuses such exports, so no request reaches it; should one,
/// it fails cleanly.
pub struct Offline {
    /// The size to report.
    pub size_bytes: u64,
}

impl Offline {
    fn refuse<T>(&self) -> backend::Result<T> {
        Err(backend::Error::Io(std::io::Error::other(
            "the drive is not ready (restoring or failed)",
        )))
    }
}

impl Backend for Offline {
    fn size(&self) -> u64 {
        self.size_bytes
    }
    fn read(&self, _: u64, _: &mut [u8]) -> backend::Result<()> {
        self.refuse()
    }
    fn write(&self, _: u64, _: &[u8], _: bool) -> backend::Result<()> {
        self.refuse()
    }
    fn write_zeroes(&self, _: u64, _: u64, _: bool) -> backend::Result<()> {
        self.refuse()
    }
    fn trim(&self, _: u64, _: u64) -> backend::Result<()> {
        self.refuse()
    }
    fn flush(&self) -> backend::Result<()> {
        self.refuse()
    }
    fn extents(&self, _: u64, _: u64) -> backend::Result<Vec<Extent>> {
        self.refuse()
    }
    fn capabilities(&self) -> Caps {
        Caps::NONE
    }
}

/// A drive found in the state directory at start that no config entry or
/// flag declares.
#[derive(Debug)]
pub enum Stored {
    /// Restore it with these settings (from its `drive.json`, or defaults
    /// when it has none).
    Drive(DriveSpec),
    /// Its settings file is unusable: listed as failed with this error.
    Unusable { name: String, error: String },
}

/// Every drive directory in `drives_dir` whose name is not in `declared`,
/// by name. Directories with invalid names, and directories that hold
/// neither a meta nor a settings file, are skipped (logged).
pub fn scan(drives_dir: &Path, declared: &[String]) -> Vec<Stored> {
    let entries = match std::fs::read_dir(drives_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            tracing::error!(
                "cannot read the state directory {}: {e}; persistent drives there are not restored",
                drives_dir.display()
            );
            return Vec::new();
        }
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    let mut out = Vec::new();
    for name in names {
        if declared.contains(&name) {
            continue;
        }
        let dir = drives_dir.join(&name);
        if super::spec::check_name(&name).is_err() {
            tracing::warn!("ignoring {}: not a drive name", dir.display());
            continue;
        }
        let has_meta = dir.join(names::META).exists();
        match settings::read(&dir) {
            Ok(Some(s)) if s.name == name => match s.to_spec() {
                Ok(spec) => {
                    if s.origin != "api" {
                        tracing::info!(
                            "drive '{name}' was declared in the {} but no longer is: restoring it from {} like a drive created through the API (`ramd delete {name}` removes it and its data)",
                            if s.origin == "config" { "config file" } else { "daemon's command line" },
                            dir.display()
                        );
                    }
                    out.push(Stored::Drive(spec))
                }
                Err(e) => out.push(Stored::Unusable {
                    name,
                    error: format!("{}: {e}", dir.join(settings::FILE).display()),
                }),
            },
            Ok(Some(s)) => out.push(Stored::Unusable {
                error: format!(
                    "{} names drive '{}', not '{name}'",
                    dir.join(settings::FILE).display(),
                    s.name
                ),
                name,
            }),
            Ok(None) if has_meta => {
                tracing::warn!(
                    "{} has no {}: restoring drive '{name}' with default settings (periodic, 60s)",
                    dir.display(),
                    settings::FILE
                );
                out.push(Stored::Drive(DriveSpec {
                    name,
                    size_bytes: 1,
                    mem_limit_bytes: None,
                    read_only: false,
                    overcommit: false,
                    persist: Some(PersistSpec::default()),
                    access: Default::default(),
                    compress: None,
                    lock_memory: false,
                }));
            }
            Ok(None) => {
                tracing::info!(
                    "ignoring {}: it holds no drive (no meta, no settings)",
                    dir.display()
                );
            }
            Err(e) => out.push(Stored::Unusable {
                name,
                error: e.to_string(),
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::persist::Durability;

    fn spec(name: &str) -> DriveSpec {
        DriveSpec {
            name: name.into(),
            size_bytes: 1 << 20,
            mem_limit_bytes: None,
            read_only: false,
            overcommit: false,
            persist: Some(PersistSpec {
                durability: Durability::Flush,
                ..PersistSpec::default()
            }),
            access: Default::default(),
            compress: None,
            lock_memory: false,
        }
    }

    #[test]
    fn probe_tells_new_existing_and_broken_apart() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("db");
        assert_eq!(probe(&dir), Found::New);
        let s = spec("db");
        let budget = Arc::new(MemoryBudget::new(1 << 30));
        let d = create_new(&dir, &s, s.persist.as_ref().unwrap(), "api", budget, false).unwrap();
        d.close().unwrap();
        drop(d);
        assert_eq!(
            probe(&dir),
            Found::Existing {
                size_bytes: 1 << 20
            }
        );
        std::fs::write(dir.join(names::META), b"garbage").unwrap();
        match probe(&dir) {
            Found::Broken(e) => assert!(e.contains("metadata"), "{e}"),
            other => panic!("{other:?}"),
        }
        std::fs::remove_file(dir.join(names::META)).unwrap();
        // An image with data but no meta is not silently overwritten.
        std::fs::write(dir.join(names::IMAGE), [1u8; 4096]).unwrap();
        std::fs::write(dir.join(names::PAGES), [1u8; 8]).unwrap();
        assert!(matches!(probe(&dir), Found::Broken(e) if e.contains("no meta")));
    }

    #[test]
    fn failed_create_removes_the_directory_it_made() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("db");
        let mut s = spec("db");
        s.persist.as_mut().unwrap().key_file = Some(root.path().join("missing.key"));
        let budget = Arc::new(MemoryBudget::new(1 << 30));
        let e = match create_new(&dir, &s, s.persist.as_ref().unwrap(), "api", budget, false) {
            Err(e) => e,
            Ok(_) => panic!("created without a key"),
        };
        assert!(e.to_string().contains("does not exist"), "{e}");
        assert!(!dir.exists());
    }

    #[test]
    fn scan_finds_undeclared_drives_by_their_settings() {
        let root = tempfile::tempdir().unwrap();
        let budget = Arc::new(MemoryBudget::new(1 << 30));
        for n in ["a", "b", "c"] {
            let s = spec(n);
            let d = create_new(
                &root.path().join(n),
                &s,
                s.persist.as_ref().unwrap(),
                "api",
                budget.clone(),
                false,
            )
            .unwrap();
            d.close().unwrap();
        }
        std::fs::write(root.path().join("c").join(settings::FILE), "{").unwrap();
        std::fs::create_dir(root.path().join("Bad")).unwrap();
        std::fs::create_dir(root.path().join("empty")).unwrap();
        let found = scan(root.path(), &["a".to_owned()]);
        assert_eq!(found.len(), 2, "{found:?}");
        match &found[0] {
            Stored::Drive(s) => {
                assert_eq!(s.name, "b");
                assert_eq!(s.persist.as_ref().unwrap().durability, Durability::Flush);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(&found[1], Stored::Unusable { name, .. } if name == "c"));
    }
}
