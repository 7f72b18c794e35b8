//! Closing every cache when the daemon stops: dirty data is written back
//! first, and never lost silently.
//!
//! ```text
//!  SIGTERM ─► (NBD server and attachments already stopped: no new writes)
//!    per cache, in parallel:
//!      close(): write back every dirty block, flush the backing ── ok ──► done
//!        │ the backing fails
//!        ▼
//!      retry every second while the backing keeps failing, up to the
//!      cache's shutdown-timeout (default 2m; time spent making progress
//!      does not count, so a big healthy write-back always finishes)
//!        │ still failing
//!        ▼
//!      save the dirty data to a rescue directory (see below), log an
//!      ERROR naming it, drop the data from RAM; the daemon exits 1
//! ```
//!
//! A rescue directory `STATE_DIR/cache-rescue/NAME-UNIXTIME/` holds:
//!
//! ```text
//!  data.img   sparse, the backing's size: the dirty bytes at their offsets
//!  ranges     one "OFFSET LENGTH" line (bytes, decimal) per run of dirty data
//!  apply.sh   copies exactly those ranges onto the backing once it works
//!             (python3; nbdsh for an NBD backing), then flushes it
//! ```
//!
//! Only when even that fails (say, the state directory's disk is the dead
//! one) is data lost, and the log says so, with how much.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{BackingKind, CacheEntry, CacheState, Caches, Live};
use crate::cache::CacheError;
use crate::size::format_size;

/// How often a long write-back logs its progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// Pause between close attempts while the backing fails.
const RETRY_EVERY: Duration = Duration::from_secs(1);
/// Longest range line in `ranges` (adjacent runs are merged up to this).
const MAX_RANGE_BYTES: u64 = 16 << 20;

/// How one cache ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every dirty block reached the backing, which was flushed.
    Clean { written_back_bytes: u64 },
    /// The backing kept failing: the dirty data was saved to `dir`.
    Rescued {
        /// Bytes saved: the parts of dirty blocks the cache held.
        saved_bytes: u64,
        dir: PathBuf,
        error: String,
    },
    /// The backing kept failing and the rescue file could not be written:
    /// the dirty data is lost.
    Lost { dirty_bytes: u64, error: String },
    /// The cache never served (its backing was never opened): nothing held.
    NeverOpened,
}

impl Outcome {
    /// True when data did not reach the backing.
    pub fn failed(&self) -> bool {
        matches!(self, Outcome::Rescued { .. } | Outcome::Lost { .. })
    }
}

impl Caches {
    /// Closes every cache (see the module docs); blocks until each one is
    /// written back, rescued or given up on. Call after the NBD server
    /// and the attachments have stopped.
    pub fn shutdown(&self, rescue_root: &Path) -> Vec<(String, Outcome)> {
        self.stop_reopening();
        let entries = self.list();
        let mut work: Vec<(Arc<CacheEntry>, Live)> = Vec::new();
        let mut out = Vec::new();
        for e in entries {
            let live = {
                let mut st = e.state.lock();
                let live = match &*st {
                    CacheState::Ready(l) => Some(l.clone()),
                    _ => None,
                };
                *st = CacheState::Closing;
                live
            };
            match live {
                Some(l) => {
                    l.export.close();
                    self.ledger.withdraw(&e.claim);
                    work.push((e, l));
                }
                None => out.push((e.name.clone(), Outcome::NeverOpened)),
            }
        }
        std::thread::scope(|s| {
            let handles: Vec<_> = work
                .iter()
                .map(|(e, l)| s.spawn(move || close_one(e, l, rescue_root)))
                .collect();
            for ((e, _), h) in work.iter().zip(handles) {
                let outcome = h.join().unwrap_or_else(|_| Outcome::Lost {
                    dirty_bytes: 0,
                    error: "the closing thread panicked".into(),
                });
                out.push((e.name.clone(), outcome));
            }
        });
        for (e, _) in &work {
            self.forget(e);
        }
        out
    }
}

/// Closes one cache, retrying a failing backing up to its timeout.
fn close_one(entry: &CacheEntry, live: &Live, rescue_root: &Path) -> Outcome {
    let name = &entry.name;
    let cache = &live.cache;
    let timeout = Duration::from_millis(entry.spec.shutdown_timeout_ms);
    let before = cache.stats().writeback_bytes;
    let dirty = cache.dirty_bytes();
    if dirty > 0 {
        tracing::info!(
            cache = %name,
            "cache '{name}': writing back {} of dirty data to {} before exit",
            format_size(dirty),
            entry.spec.backing
        );
    }
    let started = Instant::now();
    let mut failing_since: Option<Instant> = None;
    loop {
        let done = AtomicBool::new(false);
        let result = std::thread::scope(|s| {
            s.spawn(|| log_progress(name, live, &done));
            let r = cache.close(false);
            done.store(true, Ordering::Relaxed);
            r
        });
        let error = match result {
            Ok(_) => {
                let written = cache.stats().writeback_bytes.saturating_sub(before);
                if written > 0 || dirty > 0 {
                    tracing::info!(
                        cache = %name,
                        "cache '{name}': {} written back and the backing flushed in {:.1}s",
                        format_size(written),
                        started.elapsed().as_secs_f64()
                    );
                }
                return Outcome::Clean {
                    written_back_bytes: written,
                };
            }
            Err(CacheError::DirtyData { error, .. }) => error,
            Err(e) => e.to_string(),
        };
        let since = *failing_since.get_or_insert_with(Instant::now);
        let left = timeout.saturating_sub(since.elapsed());
        if left.is_zero() {
            return give_up(entry, live, rescue_root, error);
        }
        tracing::warn!(
            cache = %name,
            "cache '{name}': the backing {} fails ({error}); {} of dirty data still in RAM, retrying for up to {:.0}s more",
            entry.spec.backing,
            format_size(cache.dirty_bytes()),
            left.as_secs_f64()
        );
        std::thread::sleep(left.min(RETRY_EVERY));
    }
}

/// Logs the dirty bytes left every few seconds until `done`.
fn log_progress(name: &str, live: &Live, done: &AtomicBool) {
    let mut last = Instant::now();
    while !done.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
        if last.elapsed() >= PROGRESS_EVERY && !done.load(Ordering::Relaxed) {
            tracing::info!(
                cache = %name,
                "cache '{name}': {} of dirty data left to write back",
                format_size(live.cache.dirty_bytes())
            );
            last = Instant::now();
        }
    }
}

/// The backing kept failing: save the dirty data, drop it from RAM, and
/// say so as loudly as we can.
fn give_up(entry: &CacheEntry, live: &Live, rescue_root: &Path, error: String) -> Outcome {
    let name = &entry.name;
    let dirty_bytes = live.cache.dirty_bytes();
    let stamp = crate::control::ledger::now_unix_s();
    let dir = rescue_root.join(format!("{name}-{stamp}"));
    let outcome = match write_rescue(entry, live, &dir) {
        Ok(saved) => {
            tracing::error!(
                cache = %name,
                "cache '{name}': {} of dirty data could NOT be written back to {} ({error}). \
                 It was SAVED to {}: once the backing works, run `sh {}/apply.sh` to copy it there \
                 (docs/cache.md, \"Rescue files\")",
                format_size(saved),
                entry.spec.backing,
                dir.display(),
                dir.display()
            );
            Outcome::Rescued {
                saved_bytes: saved,
                dir,
                error,
            }
        }
        Err(e) => {
            tracing::error!(
                cache = %name,
                "cache '{name}': {} of dirty data could NOT be written back to {} ({error}) and \
                 could not be saved to {} either ({e}): THAT DATA IS LOST",
                format_size(dirty_bytes),
                entry.spec.backing,
                dir.display()
            );
            Outcome::Lost {
                dirty_bytes,
                error: format!("{error}; saving to {}: {e}", dir.display()),
            }
        }
    };
    if let Err(e) = live.cache.close(true) {
        tracing::error!(cache = %name, "cache '{name}': forced close failed: {e}");
    }
    outcome
}

/// Writes `data.img`, `ranges` and `apply.sh` into `dir`; returns the
/// bytes saved.
fn write_rescue(entry: &CacheEntry, live: &Live, dir: &Path) -> std::io::Result<u64> {
    use crate::block::backend::Backend;
    let apply = apply_script_for(&entry.name, &entry.spec.backing, entry.backing_kind);
    write_rescue_dir(dir, live.cache.size(), &apply, &mut |f| {
        live.cache.save_dirty(f)
    })
}

/// Hands each dirty run (backing offset, bytes) to its argument; returns
/// the bytes handed.
pub(super) type SaveDirty<'a> =
    dyn FnMut(&mut dyn FnMut(u64, &[u8]) -> std::io::Result<()>) -> std::io::Result<u64> + 'a;

/// Writes `data.img` (`size` bytes, sparse), `ranges` and `apply` as
/// `apply.sh` into `dir`, the data from `save`; returns the bytes saved.
pub(super) fn write_rescue_dir(
    dir: &Path,
    size: u64,
    apply: &str,
    save: &mut SaveDirty<'_>,
) -> std::io::Result<u64> {
    crate::paths::create_private_dir(dir).map_err(std::io::Error::other)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    let img = create_private(&dir.join("data.img"))?;
    img.set_len(size)?;
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    let saved = save(&mut |offset, bytes| {
        img.write_all_at(bytes, offset)?;
        let len = bytes.len() as u64;
        match ranges.last_mut() {
            Some(r) if r.0 + r.1 == offset && r.1 + len <= MAX_RANGE_BYTES => r.1 += len,
            _ => ranges.push((offset, len)),
        }
        Ok(())
    })?;
    img.sync_all()?;
    let mut list = String::new();
    for (o, l) in &ranges {
        list.push_str(&format!("{o} {l}\n"));
    }
    write_synced(&dir.join("ranges"), list.as_bytes())?;
    write_synced(&dir.join("apply.sh"), apply.as_bytes())?;
    std::fs::set_permissions(dir.join("apply.sh"), std::fs::Permissions::from_mode(0o700))?;
    File::open(dir)?.sync_all()?;
    Ok(saved)
}

/// Creates (or truncates) `path` with mode 0600 whatever the umask: the
/// rescued data is as private as the drive's (see
/// `control::persistent::modes`).
fn create_private(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
}

fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = create_private(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Single-quotes a string for sh.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The script that copies the saved ranges onto cache `name`'s backing.
pub(super) fn apply_script_for(name: &str, backing: &str, kind: BackingKind) -> String {
    let backing = sh_quote(backing);
    let head = format!(
        "#!/bin/sh\n\
         # Written by ramd when cache '{name}' could not write its dirty data back\n\
         # to its backing (at shutdown, or kept across a restart). Copies every range listed in ./ranges from\n\
         # ./data.img onto the backing (same offsets), then flushes it. Run it once\n\
         # the backing works again, BEFORE anything else writes to it.\n\
         # Usage: sh apply.sh [BACKING]   (default: the cache's backing)\n\
         set -eu\n\
         cd \"$(dirname \"$0\")\"\n\
         target=${{1:-{backing}}}\n",
    );
    let body = match kind {
        BackingKind::Nbd => NBD_APPLY,
        BackingKind::File | BackingKind::BlockDevice => FILE_APPLY,
    };
    head + body
}

/// Copies the ranges onto an NBD backing (nbdsh from libnbd).
const NBD_APPLY: &str = r#"nbdsh -u "$target" -c '
with open("data.img", "rb") as f:
    for line in open("ranges"):
        off, n = map(int, line.split())
        f.seek(off)
        data = f.read(n)
        assert len(data) == n, "data.img is short"
        h.pwrite(data, off)
h.flush()
print("rescued data written back")
'
"#;

/// Copies the ranges onto a file or block device (python3), then fsyncs.
const FILE_APPLY: &str = r#"python3 - "$target" <<'EOF'
import os, sys
src = os.open("data.img", os.O_RDONLY)
dst = os.open(sys.argv[1], os.O_WRONLY)
for line in open("ranges"):
    off, n = map(int, line.split())
    data = os.pread(src, n, off)
    assert len(data) == n, "data.img is short"
    done = 0
    while done < n:
        done += os.pwrite(dst, data[done:], off + done)
os.fsync(dst)
print("rescued data written back")
EOF
"#;
