//! `PersistentDrive`: a RAM drive with a state directory, as a `Backend`.
//!
//! The data path is the RAM store's: reads and writes never touch the disk.
//! Durability comes from syncs (`Engine::sync`), run by
//! - the background scheduler every interval (`periodic`, `flush`);
//! - FLUSH and FUA writes (`flush` mode only): the reply waits until a sync
//!   whose cut came after the request arrived is durable. Concurrent
//!   flushes share one sync (group commit): a flush that finds such a sync
//!   already done returns at once;
//! - `sync()` (`ramd sync`) and `close()` (clean shutdown), in every mode.
//!
//! A FLUSH that cannot be made durable fails with EIO: never a false
//! acknowledgement. The drive keeps serving from RAM; the error shows in
//! the status and the scheduler retries.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::crypto::Key;
use super::durability::{Durability, SyncCause};
use super::engine::{Engine, SyncProgress, SyncReport};
use super::restore::{restore, RestoreOptions, RestoreProgress, RestoreReport};
use super::status::{PersistStatus, SyncState};
use super::storage::Storage;
use super::{now_unix_ms, Error, Result};
use crate::block::backend::{self, Backend, Caps, Extent};
use crate::store::{MemoryBudget, RamStore, StoreOptions, SyncStore, PAGE_BYTES};

/// How failed background syncs are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Quick retries after a failure before falling back to the interval.
    pub max_quick_retries: u32,
    /// Delay before the first retry; doubles each time.
    pub backoff_initial_ms: u64,
    /// Longest delay between quick retries.
    pub backoff_max_ms: u64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_quick_retries: 5,
            backoff_initial_ms: 500,
            backoff_max_ms: 30_000,
        }
    }
}

impl RetryPolicy {
    /// Delay before retry number `failures` (1-based), or None when quick
    /// retries are used up.
    pub fn delay_ms(&self, failures: u32) -> Option<u64> {
        if failures == 0 || failures > self.max_quick_retries {
            return None;
        }
        let shift = (failures - 1).min(30);
        Some(
            self.backoff_initial_ms
                .saturating_mul(1 << shift)
                .min(self.backoff_max_ms),
        )
    }
}

/// A persistent drive's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PersistConfig {
    /// The promise.
    pub durability: Durability,
    /// Time between background syncs (periodic and flush modes).
    pub sync_interval_ms: u64,
    /// A journal bigger than this is checkpointed after a flush-triggered
    /// sync (background and manual syncs always checkpoint).
    pub journal_max_bytes: u64,
    /// Retries of failed background syncs.
    pub retry: RetryPolicy,
}

impl Default for PersistConfig {
    fn default() -> Self {
        PersistConfig {
            durability: Durability::Periodic,
            sync_interval_ms: 60_000,
            journal_max_bytes: 64 << 20,
            retry: RetryPolicy::default(),
        }
    }
}

/// Status kept between syncs.
#[derive(Debug, Default)]
struct Tracking {
    syncing: bool,
    last_sync_unix_ms: Option<u64>,
    durable_as_of_unix_ms: Option<u64>,
    sync_durations: crate::metrics::Histogram,
    last_sync_duration: Option<Duration>,
    max_sync_duration: Duration,
    syncs_ok: u64,
    syncs_failed: u64,
    consecutive_failures: u32,
    quick_retries_left: bool,
    last_error: Option<String>,
    last_error_unix_ms: Option<u64>,
}

/// A RAM drive persisted to a state directory. See the module docs. `M`
/// is the RAM store: the raw one, or any other that offers the engine
/// its dirty set and cuts (`store::SyncStore`, e.g. a compressed store).
pub struct PersistentDrive<S: Storage, M: SyncStore = RamStore> {
    /// The data.
    store: M,
    /// The state directory; its lock also serialises syncs.
    engine: Mutex<Engine<S>>,
    /// Settings (changed rarely, read by the scheduler).
    config: Mutex<PersistConfig>,
    /// The durability mode, readable on the data path without a lock.
    durability: AtomicU8,
    /// Syncs started so far (each takes the next number).
    syncs_begun: AtomicU64,
    /// Number of the latest started sync that succeeded.
    last_ok_begun: AtomicU64,
    /// Status between syncs.
    tracking: Mutex<Tracking>,
    /// How long the restore at open took.
    restore_duration: Option<Duration>,
    /// Set by `close`: later syncs are refused.
    closed: AtomicBool,
    /// Engine figures published after each sync/checkpoint, so `status()`
    /// never waits for a running sync.
    published: Published,
    /// Progress of the running sync (for progress bars).
    sync_progress: SyncProgress,
}

#[derive(Debug, Default)]
struct Published {
    journal_bytes: AtomicU64,
    durable_gen: AtomicU64,
    bytes_written: AtomicU64,
    checkpoints: AtomicU64,
}

impl Published {
    fn update<S: Storage>(&self, e: &Engine<S>) {
        self.journal_bytes
            .store(e.journal_bytes(), Ordering::Relaxed);
        self.durable_gen.store(e.durable_gen(), Ordering::Relaxed);
        self.bytes_written
            .store(e.totals().bytes_written, Ordering::Relaxed);
        self.checkpoints
            .store(e.totals().checkpoints, Ordering::Relaxed);
    }
}

/// Persistence errors on the data path become EIO (never ENOSPC: a FLUSH
/// that failed for a full disk must not look like a full drive).
fn to_backend(e: Error) -> backend::Error {
    backend::Error::Io(std::io::Error::other(format!(
        "could not make the data durable: {e}"
    )))
}

impl<S: Storage> PersistentDrive<S> {
    /// Creates a new drive of `size_bytes` in `storage` (which must hold no
    /// drive), encrypted when `key` is given.
    pub fn create(
        storage: S,
        size_bytes: u64,
        key: Option<&Key>,
        config: PersistConfig,
        store_opts: StoreOptions,
        global_mem: Arc<MemoryBudget>,
    ) -> Result<PersistentDrive<S>> {
        let store = RamStore::with_options(size_bytes, store_opts, global_mem)?;
        PersistentDrive::create_with(storage, store, key, config)
    }

    /// Restores the drive in `storage`; see `restore.rs`. `progress` may be
    /// watched from another thread meanwhile.
    pub fn open(
        storage: S,
        key: Option<&Key>,
        opts: RestoreOptions,
        progress: &RestoreProgress,
        config: PersistConfig,
        store_opts: StoreOptions,
        global_mem: Arc<MemoryBudget>,
    ) -> Result<(PersistentDrive<S>, RestoreReport)> {
        let make = |size| RamStore::with_options(size, store_opts, global_mem);
        PersistentDrive::open_with(storage, key, opts, progress, config, make)
    }
}

impl<S: Storage, M: SyncStore> PersistentDrive<S, M> {
    fn assemble(
        store: M,
        engine: Engine<S>,
        config: PersistConfig,
        restore_duration: Option<Duration>,
    ) -> PersistentDrive<S, M> {
        let durable_ms = if engine.durable_gen() > 0 {
            Some(engine.meta().updated_unix_ms)
        } else {
            None
        };
        let published = Published::default();
        published.update(&engine);
        PersistentDrive {
            published,
            store,
            engine: Mutex::new(engine),
            durability: AtomicU8::new(config.durability.to_u8()),
            config: Mutex::new(config),
            syncs_begun: AtomicU64::new(0),
            last_ok_begun: AtomicU64::new(0),
            tracking: Mutex::new(Tracking {
                last_sync_unix_ms: durable_ms,
                durable_as_of_unix_ms: durable_ms,
                ..Tracking::default()
            }),
            restore_duration,
            closed: AtomicBool::new(false),
            sync_progress: SyncProgress::default(),
        }
    }

    /// Creates a new drive in `storage` (which must hold none) over the
    /// empty `store`, its size the store's, encrypted when `key` is given.
    pub fn create_with(
        storage: S,
        store: M,
        key: Option<&Key>,
        config: PersistConfig,
    ) -> Result<PersistentDrive<S, M>> {
        let engine = Engine::create(storage, store.size(), key)?;
        // Everything is on disk (nothing): start with a clean dirty set.
        store.clear_dirty();
        store.note_directory(engine.meta().uuid);
        Ok(PersistentDrive::assemble(store, engine, config, None))
    }

    /// Restores the drive in `storage` into a store `make_store` makes
    /// (called with the drive size); see `restore.rs`. `progress` may be
    /// watched from another thread meanwhile.
    pub fn open_with(
        storage: S,
        key: Option<&Key>,
        opts: RestoreOptions,
        progress: &RestoreProgress,
        config: PersistConfig,
        make_store: impl FnOnce(u64) -> backend::Result<M>,
    ) -> Result<(PersistentDrive<S, M>, RestoreReport)> {
        let (engine, store, report) = restore(storage, key, opts, progress, make_store)?;
        let drive = PersistentDrive::assemble(store, engine, config, Some(report.duration));
        Ok((drive, report))
    }

    /// Opens the drive in `storage` over `store`, memory a previous
    /// serving process kept with its dirty set (see `restore::adopt`):
    /// nothing is loaded, the dirty pages are saved by the next sync.
    pub fn adopt_with(
        storage: S,
        key: Option<&Key>,
        config: PersistConfig,
        store: M,
    ) -> Result<(PersistentDrive<S, M>, RestoreReport)> {
        let (engine, store, report) = super::restore::adopt(storage, key, store)?;
        let drive = PersistentDrive::assemble(store, engine, config, Some(report.duration));
        Ok((drive, report))
    }

    /// Gives the state directory back (after `close`; a drive dropped
    /// without `close` keeps only what its last sync saved).
    pub fn into_storage(self) -> S {
        self.engine.into_inner().into_storage()
    }

    /// The RAM store (for stats and direct access).
    pub fn store(&self) -> &M {
        &self.store
    }

    /// The settings.
    pub fn config(&self) -> PersistConfig {
        *self.config.lock()
    }

    /// The durability mode in force.
    pub fn durability(&self) -> Durability {
        Durability::from_u8(self.durability.load(Ordering::Acquire))
    }

    /// Changes the durability mode (takes effect for the next request).
    pub fn set_durability(&self, d: Durability) {
        self.config.lock().durability = d;
        self.durability.store(d.to_u8(), Ordering::Release);
    }

    /// Changes the background sync interval (the scheduler picks it up at
    /// its next wake-up; `SyncScheduler::wake` makes that now).
    pub fn set_sync_interval_ms(&self, ms: u64) {
        self.config.lock().sync_interval_ms = ms.max(1);
    }

    /// Saves everything now and waits until it is durable, then
    /// checkpoints (`ramd sync`). Works in every durability mode.
    pub fn sync(&self) -> Result<SyncReport> {
        self.sync_with(SyncCause::Manual)
    }

    /// Runs one sync (then a checkpoint when `cause` calls for one).
    pub fn sync_with(&self, cause: SyncCause) -> Result<SyncReport> {
        let mut engine = self.engine.lock();
        self.sync_locked(&mut engine, cause)
    }

    fn sync_locked(&self, engine: &mut Engine<S>, cause: SyncCause) -> Result<SyncReport> {
        if self.closed.load(Ordering::Acquire) && cause != SyncCause::Shutdown {
            return Err(Error::Invalid("the drive is closed".into()));
        }
        let n = self.syncs_begun.fetch_add(1, Ordering::SeqCst) + 1;
        self.tracking.lock().syncing = true;
        // Taken before the cut: every write acknowledged before this
        // moment is in the sync (so the status never claims too much).
        let cut_unix_ms = now_unix_ms();
        let r = engine.sync_with_progress(&self.store, &self.sync_progress);
        self.published.update(engine);
        let mut t = self.tracking.lock();
        t.syncing = false;
        match r {
            Ok(report) => {
                self.last_ok_begun.fetch_max(n, Ordering::SeqCst);
                t.syncs_ok += 1;
                t.consecutive_failures = 0;
                t.last_sync_unix_ms = Some(now_unix_ms());
                t.durable_as_of_unix_ms = Some(cut_unix_ms);
                t.last_sync_duration = Some(report.duration);
                t.sync_durations
                    .record_n(report.duration.as_nanos() as u64, 1);
                t.max_sync_duration = t.max_sync_duration.max(report.duration);
                t.last_error = None;
                drop(t);
                let journal_max = self.config.lock().journal_max_bytes;
                let checkpoint = cause != SyncCause::Flush || engine.journal_bytes() > journal_max;
                if checkpoint {
                    let c = engine.checkpoint();
                    self.published.update(engine);
                    if let Err(e) = c {
                        // The data is durable in the journal: the sync
                        // stands. The checkpoint is retried next time.
                        match e {
                            Error::CheckpointPostponed { .. } => tracing::warn!("{e}"),
                            _ => tracing::warn!("checkpoint failed (will retry): {e}"),
                        }
                        let mut t = self.tracking.lock();
                        t.last_error = Some(format!("checkpoint: {e}"));
                        t.last_error_unix_ms = Some(now_unix_ms());
                    }
                }
                Ok(report)
            }
            Err(e) => {
                t.syncs_failed += 1;
                t.consecutive_failures += 1;
                t.last_error = Some(e.to_string());
                t.last_error_unix_ms = Some(now_unix_ms());
                tracing::warn!("sync failed: {e}");
                Err(e)
            }
        }
    }

    /// Makes every write acknowledged before this call durable (group
    /// commit: a sync that started after this call and succeeded is enough).
    pub fn flush_durable(&self) -> Result<()> {
        let arrived = self.syncs_begun.load(Ordering::SeqCst);
        let mut engine = match self.engine.try_lock() {
            Some(e) => e,
            None => {
                // A sync is running: it must not run at low priority while
                // this FLUSH waits for it.
                self.sync_progress.boost.store(true, Ordering::Relaxed);
                self.engine.lock()
            }
        };
        if self.last_ok_begun.load(Ordering::SeqCst) > arrived {
            return Ok(());
        }
        self.sync_locked(&mut engine, SyncCause::Flush).map(drop)
    }

    /// Clean shutdown: saves everything and checkpoints, in every mode.
    /// Later syncs are refused. On error the state directory still holds
    /// the last durable state (and the error says why the rest is missing).
    pub fn close(&self) -> Result<SyncReport> {
        let mut engine = self.engine.lock();
        self.closed.store(true, Ordering::Release);
        let report = self.sync_locked(&mut engine, SyncCause::Shutdown)?;
        let c = engine.checkpoint();
        self.published.update(&engine);
        c?;
        Ok(report)
    }

    /// Grows or shrinks the drive; waits for a running sync. The next sync
    /// records the new size.
    pub fn resize(&self, size_bytes: u64) -> Result<()> {
        SyncStore::resize(&self.store, size_bytes)?;
        Ok(())
    }

    /// Records whether quick retries are still under way (the scheduler
    /// calls this so the status can say `retrying` or `failing`).
    pub(crate) fn note_retrying(&self, retrying: bool) {
        self.tracking.lock().quick_retries_left = retrying;
    }

    /// The current status.
    pub fn status(&self) -> PersistStatus {
        let p = &self.published;
        let cfg = self.config();
        let t = self.tracking.lock();
        let state = if t.syncing {
            SyncState::Syncing
        } else if t.consecutive_failures == 0 {
            SyncState::Idle
        } else if t.quick_retries_left {
            SyncState::Retrying
        } else {
            SyncState::Failing
        };
        PersistStatus {
            durability: self.durability(),
            sync_interval_ms: cfg.sync_interval_ms,
            state,
            last_sync_unix_ms: t.last_sync_unix_ms,
            durable_as_of_unix_ms: t.durable_as_of_unix_ms,
            sync_done_bytes: self.sync_progress.done_bytes.load(Ordering::Relaxed),
            sync_total_bytes: self.sync_progress.total_bytes.load(Ordering::Relaxed),
            sync_durations: t.sync_durations.clone(),
            durable_gen: p.durable_gen.load(Ordering::Relaxed),
            last_sync_duration: t.last_sync_duration,
            max_sync_duration: t.max_sync_duration,
            dirty_bytes: self.store.dirty_pages() * PAGE_BYTES,
            journal_bytes: p.journal_bytes.load(Ordering::Relaxed),
            snapshot_copy_bytes: self.store.cut_copy_bytes(),
            syncs_ok: t.syncs_ok,
            syncs_failed: t.syncs_failed,
            consecutive_failures: t.consecutive_failures,
            checkpoints: p.checkpoints.load(Ordering::Relaxed),
            bytes_written: p.bytes_written.load(Ordering::Relaxed),
            last_error: t.last_error.clone(),
            last_error_unix_ms: t.last_error_unix_ms,
            restore_duration: self.restore_duration,
        }
    }
}

/// Not a `Layer`, on purpose: the drive must see every write (FUA, the
/// durability promise, dirty tracking), and a `Layer` forwards what it
/// does not override straight to the store. As a plain `Backend`, a
/// method added later is served by `Backend`'s default, which goes through
/// this impl's own `write`/`read`: it can be slower, never wrong.
impl<S: Storage, M: SyncStore> Backend for PersistentDrive<S, M> {
    fn size(&self) -> u64 {
        self.store.size()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> backend::Result<()> {
        self.store.read(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> backend::Result<()> {
        self.store.write(offset, data, false)?;
        if fua && self.durability() == Durability::Flush {
            self.flush_durable().map_err(to_backend)?;
        }
        Ok(())
    }
    fn read_with(
        &self,
        offset: u64,
        len: usize,
        sink: &mut dyn FnMut(&[std::io::IoSlice<'_>]) -> std::io::Result<usize>,
    ) -> backend::Result<usize> {
        self.store.read_with(offset, len, sink)
    }
    fn write_zeroes(&self, offset: u64, len: u64, may_trim: bool) -> backend::Result<()> {
        self.store.write_zeroes(offset, len, may_trim)
    }
    fn trim(&self, offset: u64, len: u64) -> backend::Result<()> {
        self.store.trim(offset, len)
    }
    fn flush(&self) -> backend::Result<()> {
        if self.durability() == Durability::Flush {
            self.flush_durable().map_err(to_backend)?;
        }
        Ok(())
    }
    fn extents(&self, offset: u64, len: u64) -> backend::Result<Vec<Extent>> {
        self.store.extents(offset, len)
    }
    fn capabilities(&self) -> Caps {
        self.store.capabilities()
    }
}
