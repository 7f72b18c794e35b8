//! Caches' dirty data kept across a kill -9 of the serving process
//! (issue 31, docs/restart.md; the engine's side is `cache::keep`).
//!
//! Under a supervisor (or systemd's descriptor store) every cache keeps
//! its slots and the shadow of its dirty ones in memfds, registered as
//! `cache/NAME` with the backing they belong to, before the cache's
//! export is published. The next serving process does not adopt caches:
//! at start, before any cache opens, it writes every kept dirty range
//! back to the backing named in the entry and flushes it; the caches then
//! start cold over backings that hold every acknowledged write. When the
//! backing cannot take it (gone, refusing), the dirty data goes to a
//! rescue directory (`STATE_DIR/cache-rescue/NAME-UNIXTIME`, the format a
//! shutdown uses: `shutdown.rs`) and the log says so; only when even that
//! fails does the entry stay with the keeper, for the next start.
//!
//! Invariants: an entry is forgotten only after its data reached the
//! backing (flushed) or a rescue directory (synced); a deleted cache's
//! entry is forgotten with it (its close wrote the data back, or the
//! delete was told to drop it).

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

/// At start, before any cache opens: writes the dirty data every kept
/// cache left back to its backing (or to a rescue directory under
/// `rescue_root`), then forgets it (module docs).
pub fn write_back_kept(rescue_root: &Path) {
    let Some(serving) = serving::get() else {
        return;
    };
    for entry in serving.take_kept_caches() {
        write_back_one(serving, entry, rescue_root);
    }
}

fn write_back_one(serving: &Serving, entry: Entry, rescue_root: &Path) {
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
            return;
        }
    };
    let name = blob.name.clone();
    let mut fds = entry.fds.into_iter();
    let keep = match (fds.next(), fds.next()) {
        (Some(data), Some(shadow)) => CacheKeep::open(data, shadow),
        _ => Err(std::io::Error::other("its descriptors are missing")),
    };
    let keep = match keep {
        Ok(k) => k,
        Err(e) => {
            tracing::error!(cache = %name, "the memory cache '{name}' kept across the restart cannot be read ({e}): left with the keeper");
            return;
        }
    };
    let started = std::time::Instant::now();
    let written = open_backing(&blob.backing, &blob.options())
        .map_err(|e| e.to_string())
        .and_then(|b| write_back(&keep, &*b).map_err(|e| e.to_string()));
    match written {
        Ok(0) => {}
        Ok(n) => tracing::info!(
            cache = %name,
            "cache '{name}': {} of dirty data kept across the restart written back to {} and flushed in {:.2}s",
            format_size(n),
            blob.backing,
            started.elapsed().as_secs_f64()
        ),
        Err(error) => {
            if !rescue(&keep, &blob, rescue_root, &error) {
                return;
            }
        }
    }
    let _ = serving.forget(&key);
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
