//! A RAM cache in front of a slower backing store (a file, a block device
//! or a remote NBD export), itself a [`Backend`] so the NBD server exports
//! it like any drive.
//!
//! ```text
//!   NBD client ─► nbd::conn ─► Cache (this module) ──misses / write-back──► backing
//!                                │                                       (backing::open:
//!                                ├ engine     slots, claims, the backing calls
//!                                ├ read       hits, misses, prefetch
//!                                ├ write      the three write modes
//!                                ├ discard    zero and trim     file, block
//!                                ├ index      block → slot, sharded         device, NBD)
//!                                ├ policy     S3-FIFO / LRU / FIFO (pure)
//!                                ├ writeback  dirty blocks → backing
//!                                ├ flusher    background thread: watermarks, age, retry
//!                                ├ seq        sequential-stream bypass
//!                                ├ health     backing failures and backoff
//!                                ├ stats      counters and the snapshot
//!                                └ prometheus /metrics families (pure)
//! ```
//!
//! # Modes
//!
//! - **write-through**: a write goes to the backing; cached blocks it
//!   touches are updated (locked across the backing write so cache and
//!   backing agree), wholly covered blocks are cached. Acknowledged after
//!   the backing write.
//! - **write-around**: a write goes to the backing and cached copies of
//!   what it touches are dropped; only reads fill the cache.
//! - **write-back**: a write goes to RAM and marks its blocks dirty (only
//!   512-byte units it covers in part and the cache lacks are read from the
//!   backing first). The flusher writes
//!   dirty blocks back between the high and low watermarks and when they
//!   get older than `max_dirty_age_ms`. FLUSH writes back every dirty block
//!   and then flushes the backing; a FUA write writes back the blocks it
//!   touched and flushes the backing, both before the reply: a filesystem
//!   on the cache is exactly as safe as on the bare disk.
//!
//! # Guarantees
//!
//! - Any byte offset and length works (512-byte and unaligned requests,
//!   requests straddling cached and uncached blocks).
//! - A failing backing costs only the requests that need it (EIO); cached
//!   data keeps being served; dirty data is never dropped (except by
//!   `close(force)`), and is retried with bounded backoff until the
//!   backing returns. [`Cache::stats`] shows the state.
//! - Sequential streams longer than `sequential_cutoff_bytes` bypass the
//!   cache so they do not flush the working set.
//! - Clean shutdown ([`Cache::close`]) writes back every dirty block and
//!   flushes the backing, or refuses (and keeps serving) when it cannot.

pub mod backing;
pub mod config;
mod discard;
mod engine;
mod flusher;
mod gate;
pub mod health;
mod index;
pub mod keep;
pub mod policy;
pub mod prometheus;
mod read;
mod reclaim;
pub mod seq;
pub mod stats;
mod write;
mod writeback;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::block::backend::{self, Backend, Caps, Extent};
use crate::store::MemoryBudget;
pub use backing::{open_backing, BackingOptions, BackingSpec};
pub use config::{CacheConfig, Mode};
use engine::Inner;
use flusher::Flusher;
pub use health::HealthSnapshot;
pub use policy::PolicyKind;
pub use stats::{CacheStats, Metric, MetricKind};

/// Errors of cache set-up and shutdown (the data path returns
/// [`backend::Error`] like every backend).
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// A setting is invalid.
    #[error("invalid cache configuration: {0}")]
    Config(String),
    /// The backing cannot be opened or used.
    #[error("cache backing {spec}: {message}")]
    Backing {
        spec: String,
        message: String,
        /// Why, for callers that answer differently (the API's status).
        kind: BackingErrorKind,
    },
    /// Dirty data could not be written back, so the cache was not closed.
    #[error("{dirty_bytes} bytes of dirty data could not be written back ({error}); the cache keeps them and retries: fix the backing, or force the delete to drop them")]
    DirtyData { dirty_bytes: u64, error: String },
    /// The OS refused a resource (memory map, thread).
    #[error("cannot set up the cache: {0}")]
    Setup(#[from] std::io::Error),
}

/// Why a backing could not be opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackingErrorKind {
    /// The spec itself is wrong: a malformed URI, a path that does not
    /// exist or is not a file or block device, a read-only or unknown
    /// export. Trying again will not help until the spec changes.
    Invalid,
    /// The backing exists but someone else holds it (a mounted block
    /// device, another cache over the same file).
    Busy,
    /// The backing could not be reached (connection refused, timeout,
    /// protocol failure) or failed an I/O call: it may work later.
    Unreachable,
}

/// RAM a cache over a backing of `backing_bytes` may hold for data: its
/// size in whole blocks, but never more blocks than the backing has.
pub fn capacity_bytes(cfg: &CacheConfig, backing_bytes: u64) -> u64 {
    let blocks = backing_bytes.div_ceil(cfg.block_bytes);
    cfg.slots().min(blocks.max(1)) * cfg.block_bytes
}

/// The most metadata a cache of this configuration can need, whatever its
/// backing (for a budget promised before the backing could be opened).
pub fn metadata_bytes_max(cfg: &CacheConfig) -> u64 {
    cfg.slots() * 128 + (index::FLAT_MAX_BLOCKS * 4).max(cfg.slots() * 48)
}

/// RAM a cache over a backing of `backing_bytes` needs besides the cached
/// data (an upper bound, for memory budgets): per slot its lock and state,
/// the policy's queues and the hit counter (~110 bytes, counted as 128);
/// the index (4 bytes per backing block when flat, committed as blocks are
/// touched; ~48 bytes per slot when sharded).
pub fn metadata_bytes(cfg: &CacheConfig, backing_bytes: u64) -> u64 {
    let blocks = backing_bytes.div_ceil(cfg.block_bytes);
    let slots = cfg.slots().min(blocks.max(1));
    let index = if blocks <= index::FLAT_MAX_BLOCKS {
        blocks * 4
    } else {
        slots * 48
    };
    slots * 128 + index
}

/// How long closing waits for requests already inside the cache.
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// What [`Cache::close`] did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CloseReport {
    /// Bytes written back during the close.
    pub written_back_bytes: u64,
    /// Dirty bytes dropped because the close was forced and the backing
    /// could not take them.
    pub dropped_dirty_bytes: u64,
}

/// A RAM cache over a backing store. Cheap to share (`Arc<Cache>`); every
/// method takes `&self`.
pub struct Cache {
    inner: Arc<Inner>,
    /// The background write-back / retry thread (None once closed).
    flusher: Mutex<Option<Flusher>>,
}

impl Cache {
    /// A cache over `backing`. The export's size is the backing's size now.
    /// Slot memory is charged to `budget` as slots are first used; when the
    /// budget runs out the cache stops growing and reuses slots instead.
    pub fn new(
        backing: Arc<dyn Backend>,
        cfg: CacheConfig,
        budget: Option<Arc<MemoryBudget>>,
    ) -> Result<Cache, CacheError> {
        cfg.validate()?;
        if backing.size() == 0 {
            return Err(CacheError::Config(
                "the backing is empty (size 0): nothing to cache".into(),
            ));
        }
        Cache::with_keep(backing, cfg, budget, false)
    }

    /// [`Cache::new`], with `kept` its slots and the shadow of its dirty
    /// ones in memfds that a supervisor can keep across a kill of this
    /// process (`keep.rs`; [`Cache::kept_fds`]).
    pub fn with_keep(
        backing: Arc<dyn Backend>,
        cfg: CacheConfig,
        budget: Option<Arc<MemoryBudget>>,
        kept: bool,
    ) -> Result<Cache, CacheError> {
        cfg.validate()?;
        if backing.size() == 0 {
            return Err(CacheError::Config(
                "the backing is empty (size 0): nothing to cache".into(),
            ));
        }
        let inner = Arc::new(Inner::new(backing, cfg, budget, kept)?);
        let flusher = Flusher::spawn(inner.clone())?;
        Ok(Cache {
            inner,
            flusher: Mutex::new(Some(flusher)),
        })
    }

    /// A kept cache's data and shadow memfds (None: not kept).
    pub fn kept_fds(&self) -> Option<[std::os::fd::BorrowedFd<'_>; 2]> {
        self.inner.keep.as_ref().map(|k| k.fds())
    }

    /// Opens `spec` (a file, a block device or an NBD URI, see
    /// [`BackingSpec`]) and puts a cache in front of it.
    pub fn open(
        spec: &str,
        cfg: CacheConfig,
        opts: &BackingOptions,
        budget: Option<Arc<MemoryBudget>>,
    ) -> Result<Cache, CacheError> {
        cfg.validate()?;
        let backing = open_backing(spec, opts)?;
        Cache::new(backing, cfg, budget)
    }

    pub fn config(&self) -> &CacheConfig {
        &self.inner.cfg
    }

    /// The store behind the cache.
    pub fn backing(&self) -> &Arc<dyn Backend> {
        &self.inner.backing
    }

    /// Cached data not yet written back.
    pub fn dirty_bytes(&self) -> u64 {
        self.inner.dirty_bytes()
    }

    /// The numbers `ramd stats` / `ramd info` / the API / metrics show.
    pub fn stats(&self) -> CacheStats {
        use stats::Ctr::*;
        let i = &self.inner;
        let c = &i.stats;
        CacheStats {
            mode: i.cfg.mode,
            policy: i.cfg.policy,
            block_bytes: i.bs,
            size_bytes: i.size,
            capacity_bytes: i.nslots as u64 * i.bs,
            resident_bytes: i.resident_bytes(),
            memory_bytes: i.memory_bytes(),
            dirty_bytes: i.dirty_bytes(),
            read_hits: c.get(ReadHits),
            read_misses: c.get(ReadMisses),
            write_hits: c.get(WriteHits),
            write_misses: c.get(WriteMisses),
            evictions: c.get(Evictions),
            invalidations: c.get(Invalidations),
            writeback_bytes: c.get(WritebackBytes),
            writeback_rate_bytes_per_s: i.writeback_rate.load(Ordering::Relaxed),
            writeback_lag_ms: match i.oldest_dirty_ms.load(Ordering::Relaxed) {
                _ if i.dirty_count.load(Ordering::Relaxed) == 0 => 0,
                u64::MAX => 0,
                oldest => i.now_ms().saturating_sub(oldest),
            },
            flusher_scans: i.flusher_scans.load(Ordering::Relaxed),
            bypassed_requests: c.get(BypassedRequests),
            bypassed_bytes: c.get(BypassedBytes),
            backing_read_bytes: c.get(BackingReadBytes),
            backing_write_bytes: c.get(BackingWriteBytes),
            given_back_bytes: c.get(GivenBackBytes),
            backing: i.health.snapshot(),
        }
    }

    /// Gives back up to `bytes` of RAM under host memory pressure: empty
    /// slots, then clean blocks the policy would evict next; never dirty
    /// data. Returns what was given back (see reclaim.rs).
    pub fn give_back(&self, bytes: u64) -> u64 {
        self.inner.give_back(bytes)
    }

    /// Writes back every dirty block and flushes the backing now (what
    /// `ramd sync NAME` does for a cache). Same as an NBD FLUSH.
    pub fn sync(&self) -> backend::Result<()> {
        self.inner.flush()
    }

    /// Shuts the cache down: stops the flusher, writes back every dirty
    /// block and flushes the backing. When that fails the cache is left
    /// running (the flusher keeps retrying) and `DirtyData` says how much is
    /// at stake, unless `force`, which drops the dirty data with a warning.
    /// After a successful close every request fails.
    pub fn close(&self, force: bool) -> Result<CloseReport, CacheError> {
        let mut fl = self.flusher.lock();
        if let Some(f) = fl.take() {
            f.stop();
        }
        let i = &self.inner;
        // No new request gets in; those inside finish first, so nothing they
        // write can miss the write-back below.
        if !i.gate.close(CLOSE_WAIT) {
            tracing::warn!(
                "closing the cache while requests are still running after {CLOSE_WAIT:?}"
            );
        }
        let mut report = CloseReport::default();
        let r = i.writeback_all().and_then(|n| {
            report.written_back_bytes = n;
            i.backing_flush()
        });
        if let Err(e) = r {
            let dirty_bytes = i.dirty_bytes();
            if force {
                report.dropped_dirty_bytes = i.drop_dirty();
                tracing::warn!(
                    "cache closed by force: {} dirty bytes dropped (backing: {e})",
                    report.dropped_dirty_bytes
                );
                return Ok(report);
            }
            if dirty_bytes > 0 {
                i.gate.reopen();
                *fl = Some(Flusher::spawn(i.clone())?);
                return Err(CacheError::DirtyData {
                    dirty_bytes,
                    error: e.to_string(),
                });
            }
            // Nothing dirty: only the final flush failed; nothing is lost.
            tracing::warn!("cache closed; the backing's final flush failed: {e}");
        }
        Ok(report)
    }

    /// Hands the dirty data to `f` as `(backing offset, bytes)` runs in
    /// ascending order, without writing anything back or changing any
    /// state: for saving what a dead backing cannot take (the daemon's
    /// rescue file). Returns the bytes handed over.
    pub fn save_dirty(
        &self,
        f: &mut dyn FnMut(u64, &[u8]) -> std::io::Result<()>,
    ) -> std::io::Result<u64> {
        self.inner.for_each_dirty(f)
    }

    /// Stops everything without writing anything back, as if the process
    /// were killed: dirty data is lost. For crash tests only.
    #[doc(hidden)]
    pub fn simulate_crash(&self) {
        if let Some(f) = self.flusher.lock().take() {
            f.stop();
        }
        self.inner.gate.close(CLOSE_WAIT);
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        if let Some(f) = self.flusher.get_mut().take() {
            f.stop();
        }
        let i = &self.inner;
        if i.gate.is_closed() || i.dirty_bytes() == 0 {
            return;
        }
        // Dropped without close(): still try not to lose anything.
        if let Err(e) = i.writeback_all().and_then(|_| i.backing_flush()) {
            tracing::error!(
                "cache dropped with {} dirty bytes that could not be written back: {e}",
                i.dirty_bytes()
            );
        }
    }
}

impl Backend for Cache {
    fn size(&self) -> u64 {
        self.inner.size
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> backend::Result<()> {
        self.inner.read(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> backend::Result<()> {
        self.inner.write(offset, data, fua)
    }
    fn write_zeroes(&self, offset: u64, len: u64, may_trim: bool) -> backend::Result<()> {
        self.inner.write_zeroes(offset, len, may_trim)
    }
    fn trim(&self, offset: u64, len: u64) -> backend::Result<()> {
        self.inner.trim(offset, len)
    }
    fn flush(&self) -> backend::Result<()> {
        self.inner.flush()
    }
    fn extents(&self, offset: u64, len: u64) -> backend::Result<Vec<Extent>> {
        // No allocation map through a cache: everything is data.
        backing::all_data(offset, len, self.inner.size)
    }
    fn capabilities(&self) -> Caps {
        // What a plain backing can do (one cache serves every connection,
        // and FLUSH writes back all of it: multi-conn), and CACHE.
        Caps {
            can_cache: true,
            ..backing::PLAIN_CAPS
        }
    }
    fn cache(&self, offset: u64, len: u64) -> backend::Result<()> {
        self.inner.prefetch(offset, len)
    }
}
