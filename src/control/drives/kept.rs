//! RAM drives kept across restarts of the serving process (issue 31,
//! docs/restart.md). When a supervisor started this process
//! (`ramd daemon --supervise`, `handover::serving`; or systemd's
//! descriptor store, `handover::fdstore`), every drive over the
//! raw store (plain RAM drives and persistent ones) keeps its memory in a
//! sealed memfd and its dirty set in a ledger (`StoreOptions::
//! shared_memory`, `store::ledger`) that the supervisor holds under
//! `drive/NAME` (plain) or `persistent/NAME`, with the drive's settings as
//! a JSON blob; a compressed RAM drive keeps its arena and its meta memfd
//! (`store::compressed::keep`) under `compressed/NAME`. After a restart the
//! plain and compressed drives handed back are adopted (`RamStore::adopt`,
//! `CompressedStore::adopt`: the same memory, so every byte written before
//! the kill) before any declared drive is created; a declared drive of
//! the same name is that adopted drive. A persistent drive's
//! memory waits until its state directory is opened, which then adopts
//! it instead of restoring (`persistent::open`): the memory is newer
//! than the directory, and the ledger's dirty set is what the directory
//! lacks; a persistent compressed drive's arena, meta and dirty ledger
//! go under `persistent-compressed/NAME` and wait the same way.
//! Persistent and compressed drives have their own prefixes so that an
//! older binary, which knows only `drive/` and ignores blob fields it
//! does not know, never serves one as a plain drive.
//!
//! Invariants:
//! - a drive's memfd is registered before its export is published (in
//!   `create_ram`), and before a grow publishes a larger size (the store
//!   calls [`DriveKeeper::keep`] under its resize lock): no write the
//!   supervisor could not keep is ever acknowledged;
//! - a deleted drive is forgotten; settings changed at run time (access,
//!   read-only, memory limit) are sent again, so a restart restores them;
//! - a blob this build cannot read leaves its entry with the supervisor,
//!   untouched (an older or newer format does not destroy a drive), and
//!   is logged; a declared drive of that name is then created empty and
//!   replaces it.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::create::Source;
use super::error::DriveError;
use super::persistent::{Kept, KeptStore};
use super::spec::DriveSpec;
use super::{store_options, DriveData, Drives};
use crate::block::backend::Error as StoreError;
use crate::control::ledger::Origin;
use crate::handover::serving::{self, Entry, Serving};
use crate::metrics::Totals;
use crate::nbd::access::{AccessRules, BadNetwork};
use crate::store::compressed::{Algorithm, CompressedStore, KeptFiles, ParseAlgorithmError};
use crate::store::{KeptMemory, RamStore, SegmentKeeper};

/// Why a drive handed back cannot be served again.
#[derive(Debug, thiserror::Error)]
pub enum KeptError {
    #[error("its settings are not readable: {0}")]
    Blob(#[from] serde_json::Error),
    #[error("its settings are version {found}, this ramd reads version {BLOB_VERSION}")]
    Version { found: u32 },
    #[error("its settings hold a bad network: {0}")]
    Network(#[from] BadNetwork),
    #[error("no memfd came with it")]
    NoMemfd,
    #[error("its compression is not readable: {0}")]
    Compress(#[from] ParseAlgorithmError),
    #[error("a compressed drive's entry without its compression")]
    NoCompression,
    #[error("no dirty ledger came with it (kept by an older build): the pages its state directory lacks are unknown")]
    NoLedger,
    #[error("its memory cannot be adopted: {0}")]
    Adopt(#[from] StoreError),
    #[error("it cannot be registered: {0}")]
    Create(#[from] DriveError),
}

/// The blob's layout version.
const BLOB_VERSION: u32 = 1;

/// The key prefix of plain RAM drives.
const KEY_PREFIX: &str = "drive/";
/// The key prefix of persistent drives (module docs).
const PERSISTENT_PREFIX: &str = "persistent/";
/// The key prefix of compressed RAM drives: their own, so that an older
/// binary never takes their memfds for a raw store's.
const COMPRESSED_PREFIX: &str = "compressed/";
/// The key prefix of persistent compressed drives (their own, as above).
const PERSISTENT_COMPRESSED_PREFIX: &str = "persistent-compressed/";
/// The key prefix of a kept drive's I/O counts (`metrics::Totals`, JSON).
const METRICS_PREFIX: &str = "metrics/";
/// How often kept drives' counts go to the supervisor: a kill loses at
/// most the counts of the last period (a stop for an upgrade none: the
/// counts are sent once more after the last request).
const METRICS_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// A drive's settings, as the supervisor keeps them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Blob {
    version: u32,
    name: String,
    size_bytes: u64,
    mem_limit_bytes: Option<u64>,
    read_only: bool,
    overcommit: bool,
    lock_memory: bool,
    /// `config`, `command-line` or `api`.
    origin: String,
    config_path: Option<PathBuf>,
    identities: Vec<String>,
    read_only_identities: Vec<String>,
    networks: Vec<String>,
    /// A persistent drive's state directory (its settings live there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    state_dir: Option<PathBuf>,
    /// A compressed drive's compression (`lz4`, `zstd:3`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    compress: Option<String>,
}

impl Blob {
    fn of(spec: &DriveSpec, origin: &Origin) -> Blob {
        Blob {
            version: BLOB_VERSION,
            name: spec.name.clone(),
            size_bytes: spec.size_bytes,
            mem_limit_bytes: spec.mem_limit_bytes,
            read_only: spec.read_only,
            overcommit: spec.overcommit,
            lock_memory: spec.lock_memory,
            origin: origin.name().to_owned(),
            config_path: match origin {
                Origin::Config(p) => Some(p.clone()),
                _ => None,
            },
            identities: spec.access.identities.clone(),
            read_only_identities: spec.access.read_only_identities.clone(),
            networks: spec.access.networks.iter().map(|n| n.to_string()).collect(),
            state_dir: None,
            compress: spec.compress.map(|a| a.to_string()),
        }
    }

    fn parse(bytes: &[u8]) -> Result<Blob, KeptError> {
        let b: Blob = serde_json::from_slice(bytes)?;
        if b.version != BLOB_VERSION {
            return Err(KeptError::Version { found: b.version });
        }
        Ok(b)
    }

    fn spec(&self) -> Result<(DriveSpec, Origin), KeptError> {
        let networks = self
            .networks
            .iter()
            .map(|n| n.parse())
            .collect::<Result<_, BadNetwork>>()?;
        let origin = match (self.origin.as_str(), &self.config_path) {
            ("config", Some(p)) => Origin::Config(p.clone()),
            ("command-line", _) => Origin::CommandLine,
            _ => Origin::Api,
        };
        let spec = DriveSpec {
            name: self.name.clone(),
            size_bytes: self.size_bytes,
            mem_limit_bytes: self.mem_limit_bytes,
            read_only: self.read_only,
            overcommit: self.overcommit,
            persist: None,
            access: AccessRules {
                identities: self.identities.clone(),
                read_only_identities: self.read_only_identities.clone(),
                networks,
            },
            compress: self
                .compress
                .as_deref()
                .map(str::parse::<Algorithm>)
                .transpose()?,
            lock_memory: self.lock_memory,
        };
        Ok((spec, origin))
    }
}

/// Tells the supervisor about one drive (see the module invariants).
pub(super) struct DriveKeeper {
    serving: &'static Serving,
    /// The supervisor's key: prefix and name.
    key: String,
    /// Where the drive came from (its settings change, this does not).
    origin: Origin,
    state: Mutex<KeeperState>,
}

/// What a keeper last sent, and whether it may send again.
struct KeeperState {
    blob: Blob,
    /// Copies of the store's descriptors, for sending the settings again.
    fds: Option<Vec<OwnedFd>>,
    /// The drive was deleted: nothing is sent any more, so a late resize
    /// or settings change cannot bring it back, or put its memory under a
    /// new drive of the same name.
    forgotten: bool,
}

impl DriveKeeper {
    /// Sends the settings, memfd and ledger; the caller holds `state` and
    /// has checked the drive is not forgotten.
    fn send(&self, blob: &Blob, fds: &[BorrowedFd<'_>]) {
        let bytes = serde_json::to_vec(blob).expect("a blob serializes");
        if let Err(e) = self.serving.put(&self.key, &bytes, fds) {
            tracing::error!(drive = %blob.name, "the supervisor could not be told about the drive's memory (a restart would lose it): {e}");
        }
    }
}

impl SegmentKeeper for DriveKeeper {
    fn keep(&self, size_bytes: u64, fds: &[BorrowedFd<'_>]) {
        let mut st = self.state.lock();
        if st.forgotten {
            return;
        }
        st.blob.size_bytes = size_bytes;
        if st.fds.is_none() {
            st.fds = fds
                .iter()
                .map(|f| f.try_clone_to_owned())
                .collect::<std::io::Result<_>>()
                .ok();
        }
        self.send(&st.blob, fds);
    }
}

/// The keepers of this process's drives, by name, and the drives this
/// process adopted at start (their data outlived the last one).
#[derive(Default)]
pub(super) struct Keepers {
    by_name: Mutex<HashMap<String, Arc<DriveKeeper>>>,
    adopted: Mutex<std::collections::HashSet<String>>,
    /// Persistent drives' memory handed back, until their directories
    /// are opened (by name).
    persistent: Mutex<HashMap<String, Entry>>,
    /// Counts an earlier process recorded, until their drive is served.
    metrics: Mutex<HashMap<String, Totals>>,
    /// The counts last sent, by drive (nothing is sent when unchanged).
    sent: Mutex<HashMap<String, Totals>>,
}

/// Whether new raw stores should live in memfds: a supervisor keeps them.
pub(super) fn supervised() -> bool {
    serving::get().is_some()
}

impl Drives {
    /// Registers a RAM store's memfd with the supervisor (nothing without
    /// one, or for a store without a memfd). Before the export is
    /// published.
    pub(super) fn keep(&self, spec: &DriveSpec, origin: &Origin, store: &RamStore) {
        self.keep_as(KEY_PREFIX, Blob::of(spec, origin), origin, |k| {
            store.set_keeper(k)
        });
    }

    /// `keep` for a compressed RAM drive (nothing when its store is not
    /// kept in memfds).
    pub(super) fn keep_compressed(
        &self,
        spec: &DriveSpec,
        origin: &Origin,
        store: &CompressedStore,
    ) {
        if store.is_kept() {
            self.keep_as(COMPRESSED_PREFIX, Blob::of(spec, origin), origin, |k| {
                store.set_keeper(k)
            });
        }
    }

    /// `keep` for a persistent drive over a compressed store in `dir`
    /// (nothing when its store is not kept in memfds).
    pub(super) fn keep_persistent_compressed(
        &self,
        spec: &DriveSpec,
        origin: &Origin,
        store: &CompressedStore,
        dir: &std::path::Path,
    ) {
        if !store.is_kept() {
            return;
        }
        let blob = Blob {
            state_dir: Some(dir.to_owned()),
            ..Blob::of(spec, origin)
        };
        self.keep_as(PERSISTENT_COMPRESSED_PREFIX, blob, origin, |k| {
            store.set_keeper(k)
        });
    }

    /// `keep` for a persistent drive over the raw store in `dir`.
    pub(super) fn keep_persistent(
        &self,
        spec: &DriveSpec,
        origin: &Origin,
        store: &RamStore,
        dir: &std::path::Path,
    ) {
        let blob = Blob {
            state_dir: Some(dir.to_owned()),
            ..Blob::of(spec, origin)
        };
        self.keep_as(PERSISTENT_PREFIX, blob, origin, |k| store.set_keeper(k));
    }

    /// Registers a keeper for a drive's memory under `prefix`; `set` gives
    /// it to the store (which sends its descriptors at once).
    fn keep_as(
        &self,
        prefix: &str,
        blob: Blob,
        origin: &Origin,
        set: impl FnOnce(Arc<dyn SegmentKeeper>),
    ) {
        let Some(serving) = serving::get() else {
            return;
        };
        let name = blob.name.clone();
        let keeper = Arc::new(DriveKeeper {
            serving,
            key: format!("{prefix}{name}"),
            origin: origin.clone(),
            state: Mutex::new(KeeperState {
                blob,
                fds: None,
                forgotten: false,
            }),
        });
        set(keeper.clone());
        self.kept.by_name.lock().insert(name, keeper);
    }

    /// The memory a supervisor kept of persistent drive `name`, once (a
    /// second call, or for a drive nothing was kept of: None). Memory of
    /// another store than the drive's now (`compress`: raw memory for a
    /// compressed drive, or another compression) is forgotten: the
    /// directory is restored, and stale memory must not outlive that. An
    /// entry that cannot be read, or has no ledger, is logged and left
    /// with the supervisor.
    pub(super) fn take_kept_persistent(
        &self,
        name: &str,
        compress: Option<Algorithm>,
    ) -> Option<Kept> {
        let entry = self.kept.persistent.lock().remove(name)?;
        let kept = Blob::parse(&entry.blob).and_then(|b| {
            let algo = b
                .compress
                .as_deref()
                .map(str::parse::<Algorithm>)
                .transpose()?;
            Ok((b.size_bytes, algo))
        });
        let (size_bytes, algo) = match kept {
            Ok(k) => k,
            Err(e) => {
                tracing::error!(drive = %name, "the memory of persistent drive kept across the restart cannot be used ({e}): restoring it from its state directory");
                return None;
            }
        };
        if algo != compress {
            let was = algo.map_or("raw".to_owned(), |a| a.to_string());
            let now = compress.map_or("raw".to_owned(), |a| a.to_string());
            tracing::warn!(drive = %name, "memory kept across the restart is of a {was} store, the drive is {now} now: restored from its state directory instead");
            if let Some(s) = serving::get() {
                let _ = s.forget(&entry.key);
            }
            return None;
        }
        let mut fds = entry.fds.into_iter();
        let memory = (|| {
            let first = fds.next().ok_or(KeptError::NoMemfd)?;
            Ok::<_, KeptError>(match algo {
                None => KeptStore::Raw(KeptMemory {
                    memfd: first,
                    ledger: Some(fds.next().ok_or(KeptError::NoLedger)?),
                }),
                Some(algo) => {
                    let meta = fds.next().ok_or(KeptError::NoMemfd)?;
                    let ledger = Some(fds.next().ok_or(KeptError::NoLedger)?);
                    let files = KeptFiles {
                        arena: first,
                        meta,
                        ledger,
                    };
                    KeptStore::Compressed { files, algo }
                }
            })
        })();
        memory
            .map(|memory| Kept { size_bytes, memory })
            .inspect_err(|e| tracing::error!(drive = %name, "the memory of persistent drive kept across the restart cannot be used ({e}): restoring it from its state directory"))
            .ok()
    }

    /// Drops the persistent drives' memory nobody claimed at start (their
    /// state directories are gone), and the counts of drives that are not
    /// there: the supervisor forgets them.
    pub fn forget_unclaimed_kept(&self) {
        let Some(serving) = serving::get() else {
            return;
        };
        for (name, entry) in self.kept.persistent.lock().drain() {
            tracing::warn!(drive = %name, "memory kept of a persistent drive whose state directory is gone: dropped");
            let _ = serving.forget(&entry.key);
        }
        // Names first: the drive map is never taken under the counts'
        // lock (a restore thread takes them in the other order).
        let names: Vec<String> = self.kept.metrics.lock().keys().cloned().collect();
        for name in names.iter().filter(|n| self.get(n).is_err()) {
            self.kept.metrics.lock().remove(name);
            let _ = serving.forget(&format!("{METRICS_PREFIX}{name}"));
        }
    }

    /// Adds the counts an earlier serving process recorded for `drive`
    /// (once; nothing when none were kept).
    pub(super) fn seed_kept_metrics(&self, drive: &super::Drive) {
        let Some(t) = self.kept.metrics.lock().remove(&drive.name) else {
            return;
        };
        if let Some(m) = &drive.metrics {
            if !m.seed(&t) {
                tracing::warn!(drive = %drive.name, "the I/O counts kept across the restart have another layout: counting from zero");
            }
        }
        // A drive no longer kept (its store is not in memfds now) sends no
        // counts: the old ones must not be seeded again at the next start.
        let kept = self.kept.by_name.lock().contains_key(&drive.name);
        if let (false, Some(s)) = (kept, serving::get()) {
            let _ = s.forget(&format!("{METRICS_PREFIX}{}", drive.name));
        }
    }

    /// Sends every kept drive's counts that changed since the last send
    /// (see [`METRICS_EVERY`]); under the keeper's lock, so nothing is
    /// sent for a drive once it is forgotten.
    pub fn send_kept_metrics(&self) {
        let Some(serving) = serving::get().filter(|s| s.status().supervisor_alive) else {
            return;
        };
        let keepers: Vec<_> = self.kept.by_name.lock().values().cloned().collect();
        for k in keepers {
            // The drive map before the keeper's lock, as everywhere else.
            let name = k.state.lock().blob.name.clone();
            let Some(m) = self.get(&name).ok().and_then(|d| d.metrics.clone()) else {
                continue;
            };
            let t = m.snapshot();
            let st = k.state.lock();
            if st.forgotten || self.kept.sent.lock().get(&name) == Some(&t) {
                continue;
            }
            let blob = serde_json::to_vec(&t).expect("counts serialize");
            match serving.put(&format!("{METRICS_PREFIX}{name}"), &blob, &[]) {
                Ok(()) => drop(self.kept.sent.lock().insert(name, t)),
                Err(e) => {
                    tracing::warn!(drive = %name, "the supervisor could not be sent the drive's I/O counts: {e}")
                }
            }
        }
    }

    /// Under a supervisor: a thread sending the kept drives' counts every
    /// [`METRICS_EVERY`], for as long as the drives exist.
    pub fn keep_metrics(self: &Arc<Self>) {
        if serving::get().is_none() {
            return;
        }
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("ramd-keep-counts".into())
            .spawn(move || loop {
                std::thread::sleep(METRICS_EVERY);
                let Some(d) = weak.upgrade() else { return };
                d.send_kept_metrics();
            });
        if let Err(e) = spawned {
            tracing::warn!("no thread to keep the drives' I/O counts across restarts: {e}");
        }
    }

    /// Sends a kept drive's settings again after a change (its size is
    /// the store's to tell: `keep`).
    pub(super) fn kept_settings_changed(&self, spec: &DriveSpec) {
        let Some(k) = self.kept.by_name.lock().get(&spec.name).cloned() else {
            return;
        };
        let mut st = k.state.lock();
        if st.forgotten {
            return;
        }
        st.blob = Blob {
            size_bytes: st.blob.size_bytes,
            state_dir: st.blob.state_dir.take(),
            ..Blob::of(spec, &k.origin)
        };
        if let Some(fds) = &st.fds {
            let fds: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
            k.send(&st.blob, &fds);
        }
    }

    /// Forgets a deleted drive: the supervisor drops its memfd. Marked
    /// and sent under the keeper's lock, so no send of it can follow.
    pub(super) fn forget_kept(&self, name: &str) {
        self.forget_kept_of(name, None);
    }

    /// The keeper of drive `name` now, to forget that one later
    /// ([`Drives::forget_kept_of`]) even if the name is taken meanwhile.
    pub(super) fn kept_keeper(&self, name: &str) -> Option<Arc<DriveKeeper>> {
        self.kept.by_name.lock().get(name).cloned()
    }

    /// [`Drives::forget_kept`], of keeper `only` if given: when a newer
    /// drive of the name registered its own keeper meanwhile (its entry
    /// replaced the old one with the supervisor), nothing is sent.
    pub(super) fn forget_kept_of(&self, name: &str, only: Option<Arc<DriveKeeper>>) {
        let k = {
            let mut by_name = self.kept.by_name.lock();
            match (&only, by_name.get(name)) {
                (Some(old), Some(now)) if !Arc::ptr_eq(old, now) => {
                    old.state.lock().forgotten = true;
                    return;
                }
                _ => {}
            }
            by_name.remove(name)
        };
        self.kept.adopted.lock().remove(name);
        let Some(k) = k.or(only) else {
            return;
        };
        let mut st = k.state.lock();
        st.forgotten = true;
        self.kept.sent.lock().remove(name);
        let _ = k.serving.forget(&format!("{METRICS_PREFIX}{name}"));
        if let Err(e) = k.serving.forget(&k.key) {
            tracing::error!(drive = %name, "the supervisor could not be told the drive is deleted: {e}");
        }
    }

    /// Whether drive `name` was adopted at this start with the memory the
    /// last serving process wrote (a ublk device it left may resume).
    pub fn adopted_at_start(&self, name: &str) -> bool {
        self.kept.adopted.lock().contains(name)
    }

    /// Adopts the drives a supervisor handed back (at start, before any
    /// declared drive); returns their names. A drive that cannot be
    /// adopted is logged and left with the supervisor.
    pub fn adopt_handed_back(self: &Arc<Self>) -> Vec<String> {
        let Some(serving) = serving::get() else {
            return Vec::new();
        };
        let mut names = Vec::new();
        for entry in serving.take_handed_back() {
            let key = entry.key.clone();
            match self.adopt(entry) {
                Ok(Some(name)) => {
                    self.kept.adopted.lock().insert(name.clone());
                    names.push(name)
                }
                Ok(None) => {}
                Err(e) => tracing::error!(
                    entry = %key,
                    "an entry kept across the restart cannot be used (it stays with the supervisor): {e}"
                ),
            }
        }
        for name in &names {
            if let Ok(d) = self.get(name) {
                self.seed_kept_metrics(&d);
            }
        }
        names
    }

    fn adopt(self: &Arc<Self>, entry: Entry) -> Result<Option<String>, KeptError> {
        let persistent = entry
            .key
            .strip_prefix(PERSISTENT_PREFIX)
            .or_else(|| entry.key.strip_prefix(PERSISTENT_COMPRESSED_PREFIX));
        if let Some(name) = persistent {
            self.kept.persistent.lock().insert(name.to_owned(), entry);
            return Ok(None);
        }
        if let Some(name) = entry.key.strip_prefix(METRICS_PREFIX) {
            let counts = serde_json::from_slice(&entry.blob)?;
            self.kept.metrics.lock().insert(name.to_owned(), counts);
            return Ok(None);
        }
        let compressed = entry.key.starts_with(COMPRESSED_PREFIX);
        if !entry.key.starts_with(KEY_PREFIX) && !compressed {
            return Ok(None);
        }
        let blob = Blob::parse(&entry.blob)?;
        let (spec, origin) = blob.spec()?;
        let mut fds = entry.fds.into_iter();
        let memfd = fds.next().ok_or(KeptError::NoMemfd)?;
        let (data, allocated) = match compressed {
            true => {
                let algo = spec.compress.ok_or(KeptError::NoCompression)?;
                let meta = fds.next().ok_or(KeptError::NoMemfd)?;
                let files = KeptFiles {
                    arena: memfd,
                    meta,
                    ledger: None,
                };
                let (limit, lock) = (spec.mem_limit_bytes, spec.lock_memory);
                let budget = self.budget().clone();
                let store =
                    CompressedStore::adopt(spec.size_bytes, files, algo, limit, budget, lock)?;
                let allocated = store.allocated_bytes();
                (DriveData::Compressed(Arc::new(store)), allocated)
            }
            false => {
                let kept = KeptMemory {
                    memfd,
                    ledger: fds.next(),
                };
                let mut opts = store_options(spec.mem_limit_bytes, spec.lock_memory);
                opts.shared_memory = true;
                let store = RamStore::adopt(spec.size_bytes, kept, opts, self.budget().clone())?;
                let allocated = store.allocated_bytes();
                (DriveData::Ram(Arc::new(store)), allocated)
            }
        };
        self.create_from(spec.clone(), Source::Kept(origin, data))?;
        tracing::info!(drive = %spec.name, size = spec.size_bytes, allocated_bytes = allocated, "drive kept across a restart of the serving process: served again with its data");
        Ok(Some(spec.name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_round_trip_and_other_versions_are_refused() {
        let spec = DriveSpec {
            name: "db".into(),
            size_bytes: 1 << 30,
            mem_limit_bytes: Some(1 << 20),
            read_only: true,
            overcommit: true,
            persist: None,
            access: AccessRules {
                identities: vec!["alice".into()],
                read_only_identities: vec!["bob".into()],
                networks: vec!["10.0.0.0/8".parse().unwrap()],
            },
            compress: None,
            lock_memory: false,
        };
        let origin = Origin::Config("/etc/ramd/ramd.toml".into());
        let b = Blob::of(&spec, &origin);
        let bytes = serde_json::to_vec(&b).unwrap();
        assert_eq!(Blob::parse(&bytes).unwrap().spec().unwrap(), (spec, origin));
        let mut other = b.clone();
        other.version = 2;
        let e = Blob::parse(&serde_json::to_vec(&other).unwrap()).unwrap_err();
        assert!(e.to_string().contains("version 2"), "{e}");
        assert!(Blob::parse(b"not json").is_err());
    }
}
