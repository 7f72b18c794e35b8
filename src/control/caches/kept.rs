//! Caches' dirty data kept across a kill -9 of the serving process
//! (issue 31, docs/restart.md; the engine's side is `cache::keep`).
//!
//! Under a supervisor (or systemd's descriptor store) every write-back
//! cache keeps its slots and the shadow of its dirty ones in memfds,
//! registered as `cache/NAME` with the backing they belong to, before the
//! cache's export is published. The next serving process does not adopt
//! caches: at start ([`Caches::take_kept`]) it writes every kept dirty
//! range back to the backing named in the entry and flushes it; the
//! caches then start cold over backings that hold every acknowledged
//! write.
//!
//! When the backing cannot take it yet (an NBD server still starting, a
//! disk not attached), the kept data waits, held by the keeper: the cache
//! of that name does not open (it is `unavailable`, and the reopener
//! retries with its backoff, the write-back first: `Caches::open`), so
//! nothing reads stale data from the backing or writes there before the
//! kept data lands; a cache over the same backing under another name (a
//! renamed one) waits for it too. Kept data of a cache nobody declares
//! any more and no cache's backing is (an API cache), or of a cache
//! deleted while its data waits, goes to a rescue directory (`STATE_DIR/cache-rescue/NAME-UNIXTIME`, the format a
//! shutdown uses: `shutdown.rs`) when its backing refuses it.
//!
//! Invariants: an entry is forgotten only after its data reached the
//! backing (flushed) or a rescue directory (synced); a cache opens only
//! when no kept data of its name or of its backing waits; a deleted
//! cache's entry is forgotten with it (its close wrote the data back, or the delete was
//! told to drop it).

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::shutdown::{apply_script_for, write_rescue_dir};
use super::{identify, CacheEntry, Caches};
use crate::block::backend::Backend;
use crate::cache::keep::CacheKeep;
use crate::cache::{open_backing, BackingOptions, Cache};
use crate::handover::serving::{self, Entry, Serving, CACHE_PREFIX};
use crate::size::format_size;

/// The blob's layout version.
const BLOB_VERSION: u32 = 1;

/// What a kept cache's entry says of its backing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Blob {
    version: u32,
    name: String,
    backing: String,
    direct_io: bool,
    nbd_connections: usize,
    nbd_timeout_ms: u64,
}

impl Blob {
    fn options(&self) -> BackingOptions {
        BackingOptions {
            direct_io: self.direct_io,
            nbd_connections: self.nbd_connections,
            nbd_timeout: Duration::from_millis(self.nbd_timeout_ms),
        }
    }
}

impl Caches {
    /// Registers a kept cache's memfds with the keeper (nothing without
    /// one); before the cache's export is published.
    pub(super) fn keep_cache(&self, entry: &CacheEntry, cache: &Cache) {
        let (Some(serving), Some(fds)) = (serving::get(), cache.kept_fds()) else {
            return;
        };
        let o = &entry.spec.options;
        let blob = Blob {
            version: BLOB_VERSION,
            name: entry.name.clone(),
            backing: entry.spec.backing.clone(),
            direct_io: o.direct_io,
            nbd_connections: o.nbd_connections,
            nbd_timeout_ms: o.nbd_timeout.as_millis() as u64,
        };
        let bytes = serde_json::to_vec(&blob).expect("a blob serializes");
        if let Err(e) = serving.put(&format!("{CACHE_PREFIX}{}", entry.name), &bytes, &fds) {
            tracing::error!(cache = %entry.name, "the keeper could not be told about the cache's memory (a kill would lose its dirty data): {e}");
        }
    }

    /// Forgets a cache's kept memory (deleted, or closed for good).
    pub(super) fn forget_kept_cache(&self, name: &str) {
        if let Some(serving) = serving::get() {
            let _ = serving.forget(&format!("{CACHE_PREFIX}{name}"));
        }
    }
}

/// Kept dirty data waiting for its backing (module docs).
pub struct Waiting {
    key: String,
    blob: Blob,
    /// The backing's identity (`identify`), taken once when read: the
    /// matching with caches happens under locks, without file system calls.
    backing_id: String,
    keep: CacheKeep,
}

/// Why a cache stays closed: its kept data waits for the backing.
#[derive(Debug, thiserror::Error)]
#[error("{bytes} of dirty data of cache '{of}' kept across the restart waits for this backing, which refuses it ({error}): the cache opens once it is written back")]
pub struct KeptWaits {
    of: String,
    bytes: String,
    error: String,
}

impl Caches {
    /// At start, before any cache opens: takes every cache's kept dirty
    /// data from the keeper and writes it back; what its backing refuses
    /// waits for the cache of its name (module docs).
    pub fn take_kept(&self, rescue_root: &Path) {
        let Some(serving) = serving::get() else {
            return;
        };
        *self.rescue_root.lock() = Some(rescue_root.to_owned());
        for entry in serving.take_kept(CACHE_PREFIX) {
            if let Some(w) = waiting(entry) {
                let name = w.blob.name.clone();
                if let Err(refused) = settle(serving, w) {
                    self.kept.lock().insert(name, refused.0);
                }
            }
        }
    }

    /// Before cache `name` opens over the backing `backing_id` identifies:
    /// writes back the kept data that waits for it, and that of any cache
    /// over the same backing (one renamed in the configuration, say), if
    /// any; an error (the cache stays closed) while the backing refuses.
    pub(super) fn write_back_waiting(&self, name: &str, backing_id: &str) -> Result<(), KeptWaits> {
        let Some(serving) = serving::get() else {
            return Ok(());
        };
        let _settling = self.settling.lock();
        let names = self.waiting_for(name, backing_id);
        for of in names {
            let Some(w) = self.kept.lock().remove(&of) else {
                continue;
            };
            if let Err(refused) = settle(serving, w) {
                let (w, error) = *refused;
                let bytes = format_size(w.keep.dirty_bytes());
                self.kept.lock().insert(of.clone(), w);
                return Err(KeptWaits { of, bytes, error });
            }
        }
        Ok(())
    }

    /// The names of kept data that waits for cache `name` or for the
    /// backing `backing_id`.
    pub(super) fn waiting_for(&self, name: &str, backing_id: &str) -> Vec<String> {
        self.kept
            .lock()
            .iter()
            .filter(|(n, w)| n.as_str() == name || w.backing_id == backing_id)
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Kept data no cache will write back (`which`): written back, or
    /// saved to a rescue directory under `rescue_root` when the backing
    /// refuses.
    pub fn settle_waiting(&self, rescue_root: &Path, which: Waiters) {
        let Some(serving) = serving::get() else {
            return;
        };
        let _settling = self.settling.lock();
        let names: Vec<String> = {
            let map = self.map.lock();
            let kept = self.kept.lock();
            let has_cache = |n: &String, w: &Waiting| {
                map.contains_key(n) || map.values().any(|e| e.backing_id == w.backing_id)
            };
            kept.iter()
                .filter(|(n, w)| match which {
                    Waiters::Orphans => !has_cache(n, w),
                    Waiters::All => true,
                })
                .map(|(n, _)| n.clone())
                .collect()
        };
        for name in names {
            let Some(w) = self.kept.lock().remove(&name) else {
                continue;
            };
            if let Err(refused) = settle(serving, w) {
                let (w, error) = *refused;
                if rescue(&w.keep, &w.blob, rescue_root, &error) {
                    let _ = serving.forget(&w.key);
                } else {
                    self.kept.lock().insert(name, w);
                }
            }
        }
    }
}

/// Which waiting kept data [`Caches::settle_waiting`] settles.
#[derive(Debug, Clone, Copy)]
pub enum Waiters {
    /// Of every name no cache has, over a backing no cache has (after
    /// the declared caches are made, and after a delete of a cache such
    /// data waited for).
    Orphans,
    /// All of it (a stop that is not an upgrade: the keeper ends too).
    All,
}

/// An entry as kept data; None (logged, left with the keeper) when this
/// build cannot read it.
fn waiting(entry: Entry) -> Option<Waiting> {
    let key = entry.key.clone();
    let blob: Blob = match serde_json::from_slice(&entry.blob) {
        Ok(b)
            if matches!(
                &b,
                Blob {
                    version: BLOB_VERSION,
                    ..
                }
            ) =>
        {
            b
        }
        _ => {
            tracing::error!(entry = %key, "a cache's kept memory this build cannot read: left with the keeper");
            return None;
        }
    };
    let mut fds = entry.fds.into_iter();
    let keep = match (fds.next(), fds.next()) {
        (Some(data), Some(shadow)) => CacheKeep::open(data, shadow),
        _ => Err(std::io::Error::other("its descriptors are missing")),
    };
    match keep {
        Ok(keep) => Some(Waiting {
            key,
            backing_id: identify(&blob.backing).1,
            blob,
            keep,
        }),
        Err(e) => {
            tracing::error!(cache = %blob.name, "the memory cache '{}' kept across the restart cannot be read ({e}): left with the keeper", blob.name);
            None
        }
    }
}

/// Writes kept data back to its backing, flushes it and forgets the
/// entry; gives the data back with the error when the backing refuses.
fn settle(serving: &Serving, w: Waiting) -> Result<(), Box<(Waiting, String)>> {
    let name = &w.blob.name;
    let started = std::time::Instant::now();
    let written = open_backing(&w.blob.backing, &w.blob.options())
        .map_err(|e| e.to_string())
        .and_then(|b| write_back(&w.keep, &*b).map_err(|e| e.to_string()));
    match written {
        Ok(n) => {
            if n > 0 {
                tracing::info!(
                    cache = %name,
                    "cache '{name}': {} of dirty data kept across the restart written back to {} and flushed in {:.2}s",
                    format_size(n),
                    w.blob.backing,
                    started.elapsed().as_secs_f64()
                );
            }
            let _ = serving.forget(&w.key);
            Ok(())
        }
        Err(e) => {
            tracing::error!(cache = %name, "cache '{name}': dirty data kept across the restart cannot be written back to {} yet ({e}); it waits, and the cache stays closed until it is written back", w.blob.backing);
            Err(Box::new((w, e)))
        }
    }
}

/// Writes every kept dirty run to `backing` and flushes it.
fn write_back(keep: &CacheKeep, backing: &dyn Backend) -> std::io::Result<u64> {
    let n = keep.for_each_dirty(&mut |offset, bytes| {
        backing
            .write(offset, bytes, false)
            .map_err(std::io::Error::other)
    })?;
    if n > 0 {
        backing.flush().map_err(std::io::Error::other)?;
    }
    Ok(n)
}

/// The backing refused the kept data: saves it to a rescue directory;
/// false when even that failed (the entry stays with the keeper).
fn rescue(keep: &CacheKeep, blob: &Blob, rescue_root: &Path, error: &str) -> bool {
    let name = &blob.name;
    let stamp = crate::control::ledger::now_unix_s();
    let dir = rescue_root.join(format!("{name}-{stamp}"));
    let apply = apply_script_for(name, &blob.backing, identify(&blob.backing).0);
    let size = keep.geometry().size_bytes;
    match write_rescue_dir(&dir, size, &apply, &mut |f| keep.for_each_dirty(f)) {
        Ok(saved) => {
            tracing::error!(
                cache = %name,
                "cache '{name}': {} of dirty data kept across the restart could NOT be written back to {} ({error}). \
                 It was SAVED to {}: once the backing works, run `sh {}/apply.sh` BEFORE anything else writes to it (docs/cache.md, \"Rescue files\")",
                format_size(saved),
                blob.backing,
                dir.display(),
                dir.display()
            );
            true
        }
        Err(e) => {
            tracing::error!(
                cache = %name,
                "cache '{name}': its dirty data kept across the restart could NOT be written back to {} ({error}) nor saved to {} ({e}): it stays with the keeper, for the next start",
                blob.backing,
                dir.display()
            );
            false
        }
    }
}
