//! The daemon's RAM caches: the one place caches are created, synced and
//! deleted, at start-up (`[[cache]]` in the config) and at run time (API).
//!
//! ```text
//!  POST /v1/caches ─► Caches::create ─► claim the name (ledger; state Opening)
//!                                       open the backing (no lock held)
//!                                       promise its memory (ledger)
//!                                       Cache::new, Export ─► published (Ready)
//!  [[cache]] at start ─► create_at_start: same, but a backing that cannot be
//!                        opened leaves the cache Unavailable, retried by the
//!                        reopener thread (reopen.rs) until it comes up
//!  DELETE ─► write back while still serving ─► take the export out ─► close
//!  SIGTERM ─► shutdown.rs: every cache written back, bounded, loud on failure
//! ```
//!
//! # Invariants
//!
//! - A name is in the cache map iff the ledger holds a cache claim for it:
//!   names are unique across drives and caches (they share the NBD export
//!   namespace), which the ledger (`control::ledger`) keeps.
//! - A `Ready` cache's export is in the export table; no other state's is.
//! - Two caches never share a backing (same canonical path or NBD URI):
//!   their write-backs would overwrite each other.
//! - The memory a cache may use (its capacity plus metadata, see
//!   `cache::metadata_bytes`) is its ledger promise, so drives and caches
//!   never promise the same memory twice; it goes with the claim when the
//!   cache goes.
//! - Dirty data is never dropped except by `delete --force`: a delete
//!   first writes back while the cache still serves, and refuses (leaving
//!   everything as it was) when the backing cannot take the data.
//! - A cache's access rules are in the access table the drives share
//!   (`nbd::access`, keyed by export name, which the ledger keeps unique)
//!   from the moment its name is claimed until the claim is released: set
//!   before its export is published, so no client ever meets the cache
//!   without its rules, and cleared only by the claim's owner, so a name a
//!   drive holds never loses the drive's rules.
//! - Locks: the map mutex and each entry's state mutex are held only for
//!   short, non-blocking work (map before state, both before the ledger's);
//!   backing I/O, opening and closing happen with neither held.

pub mod error;
mod give_back;
pub mod kept;
mod reopen;
pub mod shutdown;
pub mod spec;

use std::collections::BTreeMap;
use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::access::{Closed, Servers};
use super::ledger::{
    self, now_unix_s, Claim, Kind, Ledger, LedgerError, NotFound, Origin, Promise,
};
use super::sampler::Sampler;
use crate::block::backend::Backend;
use crate::cache::{self, open_backing, BackingSpec, Cache, CacheError, CloseReport};
use crate::fuse::Attachable;
use crate::metrics::DriveMetrics;
use crate::nbd::access::{AccessChange, AccessRules, AccessTable};
use crate::nbd::{Export, ShutdownHandle};
use crate::size::format_size;
pub use spec::{CacheEntry as CacheConfigEntry, CacheSpec, CacheSpecError};

/// Why a cache operation was refused. The API maps each to a code and an
/// HTTP status; messages say what to do next.
#[derive(Debug, thiserror::Error)]
pub enum CachesError {
    /// The name, size, mode or an option is malformed.
    #[error(transparent)]
    Spec(#[from] CacheSpecError),
    /// Refused by the rules every kind shares: the name is taken (by a
    /// cache or a drive), no such cache, over the budget, or in use
    /// (connections, attachments).
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// The backing cannot be cached (see its kind).
    #[error(transparent)]
    Backing(#[from] error::BackingRefused),
    /// The cache is busy being created or deleted.
    #[error(transparent)]
    Busy(#[from] error::Busy),
    /// Dirty data could not be written back, so nothing was deleted.
    #[error(transparent)]
    DirtyData(#[from] error::DirtyData),
    /// A sync could not write back or flush the backing.
    #[error(transparent)]
    BackingFailed(#[from] error::BackingFailed),
    /// The cache's backing is not open (yet).
    #[error(transparent)]
    Unavailable(#[from] error::Unavailable),
    /// The OS refused a resource (memory map, thread).
    #[error(transparent)]
    Setup(#[from] error::Setup),
}

/// What a cache's backing is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackingKind {
    File,
    BlockDevice,
    Nbd,
}

impl BackingKind {
    pub fn name(self) -> &'static str {
        match self {
            BackingKind::File => "file",
            BackingKind::BlockDevice => "block-device",
            BackingKind::Nbd => "nbd",
        }
    }
}

/// A cache that serves: the engine and its export.
#[derive(Clone)]
pub struct Live {
    pub cache: Arc<Cache>,
    /// What NBD clients see (the cache plus the connection count).
    pub export: Arc<Export>,
    /// The export's request metrics; None when metrics are off.
    pub metrics: Option<Arc<DriveMetrics>>,
}

/// Why a cache is not serving, and when it is tried again.
#[derive(Debug, Clone)]
pub struct Outage {
    /// The last attempt's error.
    pub error: String,
    /// Attempts to open the backing so far.
    pub attempts: u32,
    /// When the reopener tries next.
    pub next_attempt: Instant,
}

/// Where a cache is in its life.
#[derive(Clone)]
pub enum CacheState {
    /// Being created: its backing is being opened.
    Opening,
    /// Serving.
    Ready(Live),
    /// Declared in the config but its backing could not be opened; the
    /// reopener retries with backoff.
    Unavailable(Outage),
    /// Being deleted or shut down.
    Closing,
}

impl CacheState {
    pub fn name(&self) -> &'static str {
        match self {
            CacheState::Opening => "opening",
            CacheState::Ready(_) => "ready",
            CacheState::Unavailable(_) => "unavailable",
            CacheState::Closing => "closing",
        }
    }
}

/// One cache.
pub struct CacheEntry {
    pub name: String,
    pub spec: CacheSpec,
    /// Its name in the ledger: origin and budget promise (see the module
    /// invariants).
    pub claim: Arc<Claim>,
    pub backing_kind: BackingKind,
    /// Identifies the backing (canonical path or normalised URI), so a
    /// second cache over the same disk is refused.
    backing_id: String,
    /// Seconds since the epoch at creation, for listings.
    pub created_unix_s: u64,
    state: Mutex<CacheState>,
    /// Mountpoints where it is attached through FUSE (kept by
    /// `fuse::Attachments`; a delete is refused while attached).
    pub attachments: Mutex<Vec<PathBuf>>,
    /// Its access rules now (the spec's until a `PATCH`); the access
    /// table holds the same (see the module invariants).
    pub access: Mutex<AccessRules>,
}

impl Attachable for CacheEntry {
    fn name(&self) -> &str {
        &self.name
    }
    fn export(&self) -> Option<Arc<Export>> {
        self.live().map(|l| l.export)
    }
    fn attached_at(&self) -> &Mutex<Vec<PathBuf>> {
        &self.attachments
    }
}

impl std::fmt::Debug for CacheEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheEntry")
            .field("name", &self.name)
            .field("backing", &self.spec.backing)
            .field("state", &self.state.lock().name())
            .finish_non_exhaustive()
    }
}

impl CacheEntry {
    /// The state now (a clone: no lock is kept).
    pub fn state(&self) -> CacheState {
        self.state.lock().clone()
    }

    /// The engine and export, when serving.
    pub fn live(&self) -> Option<Live> {
        match &*self.state.lock() {
            CacheState::Ready(l) => Some(l.clone()),
            _ => None,
        }
    }

    /// Budget promised for this cache.
    pub fn promised_bytes(&self) -> u64 {
        self.claim.promised_bytes()
    }

    /// Who asked for the cache.
    pub fn origin(&self) -> &Origin {
        &self.claim.origin
    }
}

/// What a delete did.
#[derive(Debug, Clone, Default)]
pub struct DeleteReport {
    /// NBD connections closed by a forced delete.
    pub closed_connections: usize,
    /// Dirty bytes written back before the cache went.
    pub written_back_bytes: u64,
    /// Dirty bytes dropped by a forced delete of a cache whose backing
    /// could not take them.
    pub dropped_dirty_bytes: u64,
}

/// What a sync did.
#[derive(Debug, Clone)]
pub struct SyncReport {
    /// Bytes written back to the backing during the sync.
    pub written_back_bytes: u64,
    /// Dirty bytes left (written since the sync began).
    pub dirty_bytes: u64,
    pub duration_ms: u64,
}

/// The daemon's caches.
pub struct Caches {
    /// Caches by name. Held only for short, non-blocking work.
    map: Mutex<BTreeMap<String, Arc<CacheEntry>>>,
    /// Names, budget promises and the export table, shared with the other
    /// kinds.
    ledger: Arc<Ledger>,
    /// Record per-request metrics for new caches' exports.
    metrics_enabled: bool,
    /// The servers its connections live in (set once they bind): forced
    /// deletes and access changes close connections there.
    servers: Servers,
    /// Rates of the last second per cache, for `ramd stats`.
    pub sampler: Sampler,
    /// Retries caches whose backing could not be opened at start.
    reopener: reopen::Reopener,
    /// The access rules of every export, shared with the drives and read
    /// by the NBD and NVMe/TCP servers at every decision.
    access: Arc<AccessTable>,
    /// Dirty data a killed serving process kept, waiting for its backing
    /// (`kept.rs`), by cache name.
    kept: Mutex<std::collections::HashMap<String, kept::Waiting>>,
    /// Where kept data no cache will take is rescued (`kept.rs`).
    rescue_root: Mutex<Option<PathBuf>>,
    /// Held while kept data is being written back (`kept.rs`), so a
    /// delete never forgets data a failed write-back is about to give back.
    settling: Mutex<()>,
}

/// No cache by this name.
fn not_found(name: &str) -> CachesError {
    LedgerError::from(NotFound {
        kind: Kind::Cache,
        name: name.to_owned(),
    })
    .into()
}

/// The kind and identity of a backing spec (the spec was validated).
fn identify(backing: &str) -> (BackingKind, String) {
    match BackingSpec::parse(backing) {
        Ok(BackingSpec::Nbd(uri)) => (BackingKind::Nbd, uri.to_string()),
        Ok(BackingSpec::Path(p)) => {
            let kind = match std::fs::metadata(&p) {
                Ok(m) if m.file_type().is_block_device() => BackingKind::BlockDevice,
                _ => BackingKind::File,
            };
            (kind, canonical(p).display().to_string())
        }
        Err(_) => (BackingKind::File, backing.to_owned()),
    }
}

/// `p` with every link resolved; for a file that is missing (moved away
/// for now) its directory resolved and its name kept, so that the same
/// file named two ways still matches.
fn canonical(p: std::path::PathBuf) -> std::path::PathBuf {
    if let Ok(c) = std::fs::canonicalize(&p) {
        return c;
    }
    match (p.parent(), p.file_name()) {
        (Some(dir), Some(name)) => match std::fs::canonicalize(match dir.as_os_str().is_empty() {
            true => std::path::Path::new("."),
            false => dir,
        }) {
            Ok(d) => d.join(name),
            Err(_) => p,
        },
        _ => p,
    }
}

fn backing_error(e: CacheError) -> CachesError {
    match e {
        CacheError::Backing {
            spec,
            message,
            kind,
        } => error::BackingRefused::Open {
            spec,
            message,
            kind,
        }
        .into(),
        CacheError::Config(reason) => {
            CachesError::Spec(spec::CacheOptionError::Engine { reason }.into())
        }
        other => CachesError::Setup(other.into()),
    }
}

impl Caches {
    /// `access` is the table the servers read (the drives' own).
    pub fn new(ledger: Arc<Ledger>, metrics_enabled: bool, access: Arc<AccessTable>) -> Self {
        Caches {
            map: Mutex::new(BTreeMap::new()),
            ledger,
            metrics_enabled,
            servers: Servers::default(),
            sampler: Sampler::new(),
            reopener: reopen::Reopener::default(),
            access,
            kept: Mutex::new(std::collections::HashMap::new()),
            rescue_root: Mutex::new(None),
            settling: Mutex::new(()),
        }
    }

    /// Lets forced deletes close NBD connections and access changes
    /// recheck NBD connections and NVMe/TCP controllers.
    pub fn set_servers(&self, nbd: ShutdownHandle, nvme: Option<Arc<crate::nvme::Target>>) {
        self.servers.set(nbd, nvme);
    }

    /// Every cache, by name.
    pub fn list(&self) -> Vec<Arc<CacheEntry>> {
        self.map.lock().values().cloned().collect()
    }

    pub fn get(&self, name: &str) -> Result<Arc<CacheEntry>, CachesError> {
        self.map
            .lock()
            .get(name)
            .cloned()
            .ok_or_else(|| not_found(name))
    }

    /// The cache `name` and its engine, when it serves.
    pub fn live(&self, name: &str) -> Result<(Arc<CacheEntry>, Live), CachesError> {
        let entry = self.get(name)?;
        let live = entry.live().ok_or_else(|| not_serving(&entry))?;
        Ok((entry, live))
    }

    /// Names in order, for messages.
    pub fn names(&self) -> Vec<String> {
        self.map.lock().keys().cloned().collect()
    }

    /// Samples every serving cache's request counters (once a second).
    pub fn sample(&self) {
        let items = self
            .list()
            .iter()
            .filter_map(|e| {
                let live = e.live()?;
                Some((e.name.clone(), live.metrics?.snapshot()))
            })
            .collect();
        self.sampler.tick_totals(items);
    }

    /// Creates a cache and serves it: nothing is left behind when it fails.
    pub fn create(&self, spec: CacheSpec, origin: Origin) -> Result<Arc<CacheEntry>, CachesError> {
        spec.validate()?;
        let entry = self.reserve(spec, origin)?;
        match self.open(&entry) {
            Ok(()) => Ok(entry),
            Err(e) => {
                self.forget(&entry);
                Err(e)
            }
        }
    }

    /// Creates a cache declared in the config. Like [`Caches::create`],
    /// except that a backing that cannot be opened (not there yet, server
    /// down) leaves the cache listed as unavailable, with its memory
    /// promised, and retried in the background: the daemon serves
    /// everything else meanwhile.
    pub fn create_at_start(
        self: &Arc<Self>,
        spec: CacheSpec,
        origin: Origin,
    ) -> Result<Arc<CacheEntry>, CachesError> {
        spec.validate()?;
        let entry = self.reserve(spec, origin)?;
        match self.open(&entry) {
            Ok(()) => Ok(entry),
            Err(CachesError::Backing(refused)) => {
                let message = refused.to_string();
                let max =
                    cache::metadata_bytes_max(&entry.spec.config) + entry.spec.config.cache_bytes;
                if let Err(e) = self.ledger.repromise(&entry.claim, &Promise::Bytes(max)) {
                    self.forget(&entry);
                    return Err(e.into());
                }
                tracing::error!(
                    cache = %entry.name,
                    "cache '{}' is UNAVAILABLE: {message}. The daemon serves everything else and retries this backing in the background (ramd cache info {} shows the state)",
                    entry.name,
                    entry.name
                );
                *entry.state.lock() = CacheState::Unavailable(Outage {
                    error: message,
                    attempts: 1,
                    next_attempt: Instant::now() + reopen::backoff(1),
                });
                self.reopener.start(self.clone());
                Ok(entry)
            }
            Err(e) => {
                self.forget(&entry);
                Err(e)
            }
        }
    }

    /// Takes the name (state Opening) after the checks that need no I/O.
    fn reserve(&self, spec: CacheSpec, origin: Origin) -> Result<Arc<CacheEntry>, CachesError> {
        let name = spec.name.clone();
        let (backing_kind, backing_id) = identify(&spec.backing);
        let mut map = self.map.lock();
        // Nothing promised until the backing's size is known.
        let claim = self
            .ledger
            .claim_guarded(Kind::Cache, &name, origin, &Promise::Bytes(0))?;
        if let Some(other) = map.values().find(|e| e.backing_id == backing_id) {
            return Err(error::BackingRefused::Shared {
                backing: spec.backing,
                other: other.name.clone(),
            }
            .into());
        }
        let rules = spec.access.clone();
        let entry = Arc::new(CacheEntry {
            name: name.clone(),
            spec,
            claim: claim.keep(),
            backing_kind,
            backing_id,
            created_unix_s: now_unix_s(),
            state: Mutex::new(CacheState::Opening),
            attachments: Mutex::new(Vec::new()),
            access: Mutex::new(rules.clone()),
        });
        // The claim makes the name ours: its rules go in before any export.
        self.access.set(&name, rules);
        map.insert(name, entry.clone());
        Ok(entry)
    }

    /// Removes an entry and gives its name back to the ledger, with its
    /// budget and export.
    fn forget(&self, entry: &Arc<CacheEntry>) {
        let removed = {
            let mut map = self.map.lock();
            let ours = map.get(&entry.name).is_some_and(|e| Arc::ptr_eq(e, entry));
            if ours {
                map.remove(&entry.name);
            }
            ours
        };
        if removed {
            // Kept data that waits for this cache (its entry with the
            // keeper *is* that data): nobody retries it now, so it is
            // written back or rescued, which forgets the entry. Otherwise
            // the engine's entry is forgotten here.
            let waits = {
                let _settling = self.settling.lock();
                if !self.kept.lock().contains_key(&entry.name) {
                    self.forget_kept_cache(&entry.name);
                }
                !self.waiting_for(&entry.name, &entry.backing_id).is_empty()
            };
            // Now nobody's (unless another cache has its backing).
            let root = self.rescue_root.lock().clone();
            if let (true, Some(root)) = (waits, root) {
                self.settle_waiting(&root, kept::Waiters::Orphans);
            }
        }
        // Still under the claim: nobody else's rules are dropped.
        self.access.set(&entry.name, AccessRules::default());
        self.ledger.release(&entry.claim);
    }

    /// Opens the backing and brings an Opening or Unavailable entry to
    /// Ready. On error the entry's state is left for the caller to settle.
    fn open(&self, entry: &Arc<CacheEntry>) -> Result<(), CachesError> {
        let spec = &entry.spec;
        // Kept dirty data of this cache lands before anything reads the
        // backing through it (`kept.rs`).
        self.write_back_waiting(&entry.name, &entry.backing_id)
            .map_err(error::BackingRefused::from)?;
        let backing = open_backing(&spec.backing, &spec.options).map_err(backing_error)?;
        let size = backing.size();
        if size == 0 {
            return Err(error::BackingRefused::Empty {
                backing: spec.backing.clone(),
            }
            .into());
        }
        let need =
            cache::capacity_bytes(&spec.config, size) + cache::metadata_bytes(&spec.config, size);
        // The budget and the state change together, so a delete racing
        // with a reopen cannot leave a promise behind.
        let mut state = entry.state.lock();
        if !matches!(*state, CacheState::Opening | CacheState::Unavailable(_)) {
            return Err(error::Busy::DeletedWhileOpening {
                name: entry.name.clone(),
            }
            .into());
        }
        self.ledger.repromise(&entry.claim, &Promise::Bytes(need))?;
        // In memfds a keeper holds, when there is one (`kept.rs`): only
        // write-back caches hold data the backing lacks.
        let kept =
            crate::handover::serving::get().is_some() && spec.config.mode == cache::Mode::WriteBack;
        let budget = Some(self.ledger.budget().clone());
        let cache = Arc::new(
            Cache::with_keep(backing, spec.config.clone(), budget, kept).map_err(backing_error)?,
        );
        self.keep_cache(entry, &cache);
        let metrics = self.metrics_enabled.then(|| Arc::new(DriveMetrics::new()));
        let export = self.export_for(entry, &cache, metrics.clone());
        if let Err(e) = self.ledger.publish(&entry.claim, export.clone()) {
            drop(state);
            let _ = cache.close(false);
            return Err(e.into());
        }
        *state = CacheState::Ready(Live {
            cache: cache.clone(),
            export,
            metrics,
        });
        drop(state);
        let st = cache.stats();
        tracing::info!(
            cache = %entry.name,
            mode = %spec.config.mode,
            size = %format_size(st.capacity_bytes),
            backing = %spec.backing,
            backing_size = %format_size(size),
            "cache created"
        );
        Ok(())
    }

    fn export_for(
        &self,
        entry: &CacheEntry,
        cache: &Arc<Cache>,
        metrics: Option<Arc<DriveMetrics>>,
    ) -> Arc<Export> {
        let desc = format!(
            "ramd {} cache of {} over {}",
            entry.spec.config.mode,
            format_size(cache.stats().capacity_bytes),
            entry.spec.backing
        );
        let mut export = Export::new(&entry.name, &desc, cache.clone() as Arc<dyn Backend>, false);
        if let Some(m) = metrics {
            export = export.with_metrics(m);
        }
        Arc::new(export)
    }

    /// Writes back every dirty block and flushes the backing (`ramd sync`).
    pub fn sync(&self, name: &str) -> Result<SyncReport, CachesError> {
        let entry = self.get(name)?;
        let live = entry.live().ok_or_else(|| not_serving(&entry))?;
        let before = live.cache.stats().writeback_bytes;
        let started = Instant::now();
        live.cache.sync().map_err(|source| error::BackingFailed {
            name: name.to_owned(),
            backing: entry.spec.backing.clone(),
            dirty_bytes: live.cache.dirty_bytes(),
            source,
        })?;
        let report = SyncReport {
            written_back_bytes: live.cache.stats().writeback_bytes.saturating_sub(before),
            dirty_bytes: live.cache.dirty_bytes(),
            duration_ms: started.elapsed().as_millis() as u64,
        };
        tracing::info!(
            cache = %name,
            written_back = %format_size(report.written_back_bytes),
            ms = report.duration_ms,
            "cache synced"
        );
        Ok(report)
    }

    /// Deletes a cache. Every dirty block is written back first (while the
    /// cache still serves, so a failure changes nothing and is reported
    /// with what is at stake). `force` closes open NBD connections and, when
    /// the backing cannot take the dirty data, drops it with a warning.
    pub fn delete(&self, name: &str, force: bool) -> Result<DeleteReport, CachesError> {
        let entry = self.get(name)?;
        let Some(live) = self.claim_for_delete(&entry, name)? else {
            return Ok(DeleteReport::default());
        };
        let attached = entry.attachments.lock().clone();
        ledger::check_delete(
            Kind::Cache,
            name,
            &attached,
            live.export.connections(),
            force,
        )?;
        let before = live.cache.stats().writeback_bytes;
        if !force {
            if let Err(e) = live.cache.sync() {
                return Err(error::DirtyData {
                    name: name.to_owned(),
                    backing: entry.spec.backing.clone(),
                    dirty_bytes: live.cache.dirty_bytes(),
                    error: e.to_string(),
                    serves_again: false,
                }
                .into());
            }
        }
        // Out of service: no new connections, open ones closed after their
        // pending requests (the cache waits for those inside).
        {
            let mut st = entry.state.lock();
            if !matches!(&*st, CacheState::Ready(l) if Arc::ptr_eq(&l.export, &live.export)) {
                return Err(error::Busy::Changed {
                    name: name.to_owned(),
                }
                .into());
            }
            *st = CacheState::Closing;
        }
        live.export.close();
        self.ledger.withdraw(&entry.claim);
        let closed = match self.servers.nbd() {
            Some(h) => h.close_export(&live.export),
            None => 0,
        };
        match live.cache.close(force) {
            Ok(CloseReport {
                dropped_dirty_bytes,
                ..
            }) => {
                self.forget(&entry);
                // The counter covers the sync above and the close's own
                // final write-back alike.
                let report = DeleteReport {
                    closed_connections: closed,
                    written_back_bytes: live.cache.stats().writeback_bytes.saturating_sub(before),
                    dropped_dirty_bytes,
                };
                if dropped_dirty_bytes > 0 {
                    tracing::warn!(
                        cache = %name,
                        dropped = %format_size(dropped_dirty_bytes),
                        "cache deleted by force: its dirty data was DROPPED (the backing {} could not take it)",
                        entry.spec.backing
                    );
                } else {
                    tracing::info!(
                        cache = %name,
                        written_back = %format_size(report.written_back_bytes),
                        closed_connections = closed,
                        "cache deleted"
                    );
                }
                Ok(report)
            }
            Err(e) => Err(self.serve_again(&entry, &live, e)),
        }
    }

    /// The live cache `name` to delete; None when it never opened (then
    /// it is deleted already: nothing to write back).
    fn claim_for_delete(
        &self,
        entry: &Arc<CacheEntry>,
        name: &str,
    ) -> Result<Option<Live>, CachesError> {
        let mut st = entry.state.lock();
        match &*st {
            CacheState::Opening => Err(error::Busy::Creating {
                name: name.to_owned(),
            }
            .into()),
            CacheState::Closing => Err(error::Busy::Deleting {
                name: name.to_owned(),
            }
            .into()),
            CacheState::Unavailable(_) => {
                // Never opened: nothing to write back.
                *st = CacheState::Closing;
                drop(st);
                self.forget(entry);
                tracing::info!(cache = %name, "unavailable cache deleted");
                Ok(None)
            }
            CacheState::Ready(l) => Ok(Some(l.clone())),
        }
    }

    /// The backing failed between a delete's sync and its close: serves
    /// again, keeps the data, and says so.
    fn serve_again(&self, entry: &Arc<CacheEntry>, live: &Live, e: CacheError) -> CachesError {
        let name = &entry.name;
        let export = self.export_for(entry, &live.cache, live.metrics.clone());
        // Only a table changed behind the ledger's back refuses (logged).
        let _ = self.ledger.publish(&entry.claim, export.clone());
        *entry.state.lock() = CacheState::Ready(Live {
            export,
            ..live.clone()
        });
        match e {
            CacheError::DirtyData { dirty_bytes, error } => error::DirtyData {
                name: name.clone(),
                backing: entry.spec.backing.clone(),
                dirty_bytes,
                error,
                serves_again: true,
            }
            .into(),
            other => CachesError::Setup(other.into()),
        }
    }

    /// Changes a cache's access rules: new connections see them at once,
    /// open ones the new rules no longer allow what they negotiated are
    /// closed after their pending requests (as for drives). Returns the
    /// cache and what closed (NBD connections, NVMe/TCP controllers).
    pub fn set_access(
        &self,
        name: &str,
        change: &AccessChange,
    ) -> Result<(Arc<CacheEntry>, Closed), CachesError> {
        let map = self.map.lock();
        let entry = map.get(name).cloned().ok_or_else(|| not_found(name))?;
        let rules = change.apply(&entry.access.lock());
        *entry.access.lock() = rules.clone();
        self.access.set(name, rules.clone());
        drop(map);
        let closed = self.servers.rules_changed(Kind::Cache, name, &rules);
        Ok((entry, closed))
    }

    /// Stops retrying unavailable caches (shutdown).
    pub fn stop_reopening(&self) {
        self.reopener.stop();
    }
}

/// Samples every cache's request counters once a second (rates for
/// `ramd stats`), until the runtime shuts down.
pub async fn sample_loop(caches: Arc<Caches>) {
    let mut tick = tokio::time::interval(super::sampler::INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let c = caches.clone();
        let _ = tokio::task::spawn_blocking(move || c.sample()).await;
    }
}

fn not_serving(entry: &CacheEntry) -> CachesError {
    let name = &entry.name;
    match entry.state() {
        CacheState::Unavailable(o) => error::Unavailable::NotOpened {
            name: name.clone(),
            backing: entry.spec.backing.clone(),
            error: o.error.clone(),
        }
        .into(),
        s => error::Unavailable::State {
            name: name.clone(),
            state: s.name(),
        }
        .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::ExportTable;
    use crate::cache::BackingErrorKind;
    use crate::control::drives::spec::DriveSpec;
    use crate::control::drives::Drives;
    use crate::store::MemoryBudget;
    use std::time::Duration;

    fn caches(budget: u64) -> (Arc<Caches>, Arc<Drives>) {
        let ledger = Arc::new(Ledger::new(
            Arc::new(ExportTable::new()),
            Arc::new(MemoryBudget::new(budget)),
        ));
        let drives = Arc::new(Drives::new(ledger.clone(), true));
        let access = drives.access_table();
        (Arc::new(Caches::new(ledger, true, access)), drives)
    }

    #[test]
    fn a_backing_is_the_same_however_named_even_while_it_is_missing() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, d.path().join("link")).unwrap();
        let (a, b) = (real.join("img"), d.path().join("link/img"));
        let id = |p: &std::path::Path| identify(p.to_str().unwrap()).1;
        // Missing (moved away for now): still one backing.
        assert_eq!(id(&a), id(&b));
        std::fs::write(&a, b"x").unwrap();
        assert_eq!(id(&a), id(&b));
        assert_eq!(id(&b), a.canonicalize().unwrap().display().to_string());
    }

    fn file(dir: &std::path::Path, name: &str, len: u64) -> String {
        let p = dir.join(name);
        std::fs::File::create(&p).unwrap().set_len(len).unwrap();
        p.display().to_string()
    }

    /// A plain RAM drive's spec.
    fn ram_spec(name: &str, size_bytes: u64) -> DriveSpec {
        DriveSpec {
            name: name.into(),
            size_bytes,
            mem_limit_bytes: None,
            read_only: false,
            overcommit: false,
            persist: None,
            access: Default::default(),
            compress: None,
            lock_memory: false,
        }
    }

    fn spec(name: &str, backing: &str, size: &str) -> CacheSpec {
        CacheSpec::new(name, backing, size, "writeback").unwrap()
    }

    #[test]
    fn access_rules_live_from_claim_to_release() {
        use crate::nbd::access::{Grant, Source};
        let dir = tempfile::tempdir().unwrap();
        let (c, r) = caches(1 << 30);
        let table = r.access_table();
        let a = file(dir.path(), "a.img", 8 << 20);
        let mut s = spec("a", &a, "1M");
        s.access.identities = vec!["alice".into()];
        c.create(s, Origin::Api).unwrap();
        let tcp = Source::Ip("10.0.0.1".parse().unwrap());
        assert_eq!(table.grant("a", Some("alice"), &tcp), Grant::ReadWrite);
        assert_eq!(table.grant("a", Some("bob"), &tcp), Grant::Denied);
        assert_eq!(table.grant("a", None, &Source::Unix), Grant::Denied);
        // A change: bob read-only besides alice; the entry shows it.
        let change = AccessChange {
            read_only_identities: Some(vec!["bob".into()]),
            ..Default::default()
        };
        let (e, closed) = c.set_access("a", &change).unwrap();
        assert_eq!(closed, Closed::default());
        assert_eq!(e.access.lock().identities, ["alice"]);
        assert_eq!(table.grant("a", Some("bob"), &tcp), Grant::ReadOnly);
        assert!(matches!(
            c.set_access("nope", &change),
            Err(CachesError::Ledger(LedgerError::NotFound(_)))
        ));
        // A refused create over a drive's name leaves the drive's rules.
        let mut d = ram_spec("d", 1 << 20);
        d.access.identities = vec!["carol".into()];
        r.create(&d, Origin::Api).unwrap();
        let b = file(dir.path(), "b.img", 8 << 20);
        c.create(spec("d", &b, "1M"), Origin::Api).unwrap_err();
        assert_eq!(table.grant("d", Some("bob"), &tcp), Grant::Denied);
        assert_eq!(table.grant("d", Some("carol"), &tcp), Grant::ReadWrite);
        // Deleted: the name is open again for whoever takes it next.
        c.delete("a", false).unwrap();
        assert!(table.rules("a").is_open());
    }

    #[test]
    fn create_sync_delete_and_the_budget() {
        let dir = tempfile::tempdir().unwrap();
        let (c, r) = caches(64 << 20);
        let b = file(dir.path(), "a.img", 32 << 20);
        let e = c.create(spec("a", &b, "4M"), Origin::Api).unwrap();
        let live = e.live().unwrap();
        assert!(c.ledger.export("a").is_some());
        // Capacity plus metadata is promised.
        let promised = e.promised_bytes();
        assert!(promised > 4 << 20 && promised < 5 << 20, "{promised}");
        assert_eq!(r.committed_bytes(), promised);
        live.cache.write(4096, &[7u8; 8192], false).unwrap();
        assert!(live.cache.dirty_bytes() > 0);
        let s = c.sync("a").unwrap();
        assert_eq!(s.written_back_bytes, 8192);
        assert_eq!(std::fs::read(&b).unwrap()[4096..12288], [7u8; 8192]);
        live.cache.write(0, &[9u8; 4096], false).unwrap();
        let d = c.delete("a", false).unwrap();
        assert_eq!(d.written_back_bytes, 4096);
        assert_eq!(std::fs::read(&b).unwrap()[..4096], [9u8; 4096]);
        assert!(c.ledger.export("a").is_none());
        assert!(matches!(
            c.get("a"),
            Err(CachesError::Ledger(LedgerError::NotFound(_)))
        ));
        assert_eq!(r.committed_bytes(), 0);
        // Over the budget, promised to drives and caches alike.
        r.create(&ram_spec("d", 40 << 20), Origin::Api).unwrap();
        let e = c.create(spec("b", &b, "30M"), Origin::Api).unwrap_err();
        assert!(
            matches!(e, CachesError::Ledger(LedgerError::OverBudget(_))),
            "{e}"
        );
        assert!(c.list().is_empty());
    }

    #[test]
    fn names_and_backings_are_taken_once() {
        let dir = tempfile::tempdir().unwrap();
        let (c, r) = caches(1 << 30);
        let a = file(dir.path(), "a.img", 8 << 20);
        let b = file(dir.path(), "b.img", 8 << 20);
        r.create(&ram_spec("ram0", 1 << 20), Origin::Api).unwrap();
        assert!(matches!(
            c.create(spec("ram0", &a, "1M"), Origin::Api),
            Err(CachesError::Ledger(LedgerError::Taken(_)))
        ));
        c.create(spec("x", &a, "1M"), Origin::Api).unwrap();
        assert!(matches!(
            c.create(spec("x", &b, "1M"), Origin::Api),
            Err(CachesError::Ledger(LedgerError::Taken(_)))
        ));
        // The same file under another spelling is the same backing.
        let again = format!("{}/./a.img", dir.path().display());
        let e = c.create(spec("y", &again, "1M"), Origin::Api).unwrap_err();
        assert!(
            matches!(&e, CachesError::Backing(b) if b.kind() == BackingErrorKind::Busy),
            "{e}"
        );
        // Concurrent creates of one name: exactly one wins.
        let files: Vec<String> = (0..4)
            .map(|i| file(dir.path(), &format!("c{i}.img"), 8 << 20))
            .collect();
        let won: usize = std::thread::scope(|s| {
            let hs: Vec<_> = files
                .iter()
                .map(|f| s.spawn(|| c.create(spec("race", f, "1M"), Origin::Api).is_ok()))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap() as usize).sum()
        });
        assert_eq!(won, 1);
        assert_eq!(c.names(), ["race", "x"]);
    }

    #[test]
    fn a_missing_backing_at_start_comes_up_when_it_appears() {
        let dir = tempfile::tempdir().unwrap();
        let (c, r) = caches(1 << 30);
        let path = dir.path().join("later.img").display().to_string();
        let e = c
            .create_at_start(spec("later", &path, "1M"), Origin::Api)
            .unwrap();
        let CacheState::Unavailable(o) = e.state() else {
            panic!("must be unavailable: {e:?}");
        };
        assert!(o.error.contains("No such file"), "{}", o.error);
        // Its memory is kept for it (the most it could need).
        assert!(r.committed_bytes() >= 1 << 20);
        assert!(matches!(c.sync("later"), Err(CachesError::Unavailable(_))));
        assert!(c.ledger.export("later").is_none());
        file(dir.path(), "later.img", 4 << 20);
        // Generous: a busy machine may delay the reopen thread.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while e.live().is_none() {
            assert!(std::time::Instant::now() < deadline, "never came up");
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(c.ledger.export("later").is_some());
        // Once open, the promise is the exact need.
        assert_eq!(r.committed_bytes(), e.promised_bytes());
        c.sync("later").unwrap();
        // An unavailable cache can be deleted (nothing to write back).
        let gone = dir.path().join("gone.img").display().to_string();
        c.create_at_start(spec("gone", &gone, "1M"), Origin::Api)
            .unwrap();
        c.delete("gone", false).unwrap();
        assert_eq!(r.committed_bytes(), e.promised_bytes());
        let out = c.shutdown(&dir.path().join("rescue"));
        assert_eq!(
            out,
            [(
                "later".to_string(),
                shutdown::Outcome::Clean {
                    written_back_bytes: 0
                }
            )]
        );
        assert_eq!(r.committed_bytes(), 0);
    }
}
