//! A drive's state directory as a live object: create it, sync a RAM store's
//! snapshot into the journal, checkpoint the journal into the image.
//!
//! Invariants (see the module docs of `persist` for the whole sequence):
//! - The image and page table change only by replaying *committed* journal
//!   generations (`checkpoint`), so the durable state is always "image at
//!   `meta.image_gen`" plus "committed generations after it".
//! - The journal is emptied only after the image, the table and the meta
//!   naming the new `image_gen` are durable.
//! - Every attempt to write a generation takes a new number, so records of
//!   a failed attempt can never be mistaken for a later one's.
//! - A sync that fails before its commit is durable gives its pages back to
//!   the store's dirty set (the snapshot aborts), so nothing is lost; a
//!   checkpoint that fails leaves the journal as it was and is retried.

use std::time::{Duration, Instant};

use ring::rand::{SecureRandom, SystemRandom};

use super::crypto::{Cipher, Key};
use super::format::{
    encrypted_entry, plain_entry, Meta, RecordKind, KEY_CHECK_BYTES, META_BYTES, PAGE_BYTES,
};
use super::image::Image;
use super::journal::{read_payload, GenInfo, JournalWriter, MAX_RECORD_PAGES};
use super::names;
use super::storage::{Storage, StorageFile};
use super::{io_err, now_unix_ms, Error, Result};
use crate::store::{SyncCut, SyncStore};

/// What one sync did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// The generation written (0 when there was nothing to write).
    pub gen: u64,
    /// Pages with data saved.
    pub data_pages: u64,
    /// Pages saved as zero (trimmed or zeroed).
    pub zero_pages: u64,
    /// Bytes appended to the journal.
    pub journal_bytes: u64,
    /// Wall time of the sync (not counting a checkpoint).
    pub duration: Duration,
}

/// Progress of a running sync, readable from other threads (`ramd sync`'s
/// progress bar, the API). Both are 0 when no sync runs.
#[derive(Debug, Default)]
pub struct SyncProgress {
    /// Bytes of pages saved to the journal so far.
    pub done_bytes: std::sync::atomic::AtomicU64,
    /// Bytes dirty when the sync began (what it set out to save).
    pub total_bytes: std::sync::atomic::AtomicU64,
    /// Set by a FLUSH that waits for this sync: a background sync running
    /// at low CPU priority goes back to normal priority for the rest of it
    /// (no priority inversion).
    pub boost: std::sync::atomic::AtomicBool,
}

impl SyncProgress {
    fn start(&self, total: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        self.done_bytes.store(0, Relaxed);
        self.total_bytes.store(total, Relaxed);
        self.boost.store(false, Relaxed);
    }
    fn add(&self, bytes: u64) {
        self.done_bytes
            .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
    }
    fn end(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        self.done_bytes.store(0, Relaxed);
        self.total_bytes.store(0, Relaxed);
    }
}

/// The journal's share of a state disk that a checkpoint leaves free:
/// an eighth of the file system, between these bounds.
const JOURNAL_RESERVE_MIN_BYTES: u64 = 1 << 20;
const JOURNAL_RESERVE_MAX_BYTES: u64 = 64 << 20;

/// Whether a checkpoint may write `bytes` more to the image and still
/// leave the journal its reserve. A checkpoint moves data from the journal
/// into the image, so it needs room until the journal is emptied at its
/// end; on a nearly full disk it would take the room the next FLUSH needs
/// for its journal record, and every FLUSH would fail until the disk had
/// room for the whole checkpoint. So it stops short (`CheckpointPostponed`,
/// the journal keeps the data; image pages already written are rewritten
/// by the next attempt) while the journal still has its reserve.
fn room_for<S: Storage>(storage: &S, bytes: u64) -> Result<()> {
    let Some(space) = storage
        .space()
        .map_err(io_err("statvfs", storage.describe("")))?
    else {
        return Ok(());
    };
    let reserve =
        (space.total_bytes / 8).clamp(JOURNAL_RESERVE_MIN_BYTES, JOURNAL_RESERVE_MAX_BYTES);
    if space.free_bytes < bytes.saturating_add(reserve) {
        return Err(Error::CheckpointPostponed {
            free_bytes: space.free_bytes,
            reserve_bytes: reserve,
        });
    }
    Ok(())
}

/// What one checkpoint did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckpointReport {
    /// Generations moved from the journal into the image.
    pub gens: usize,
    /// Bytes written to the image and page table.
    pub bytes_written: u64,
    /// Wall time.
    pub duration: Duration,
}

/// Running totals an engine keeps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineTotals {
    /// Bytes written to the journal, image, table and meta since open.
    pub bytes_written: u64,
    /// Successful syncs that wrote a generation.
    pub gens_written: u64,
    /// Successful checkpoints.
    pub checkpoints: u64,
}

/// A drive's state directory.
pub struct Engine<S: Storage> {
    /// The directory.
    storage: S,
    /// The current metadata (as last written).
    meta: Meta,
    /// Image and page table.
    image: Image<S::File>,
    /// The journal.
    journal: JournalWriter<S::File>,
    /// Present when the drive is encrypted.
    cipher: Option<Cipher>,
    /// Committed generations not yet checkpointed, in order.
    pending: Vec<GenInfo>,
    /// Number for the next attempt to write a generation.
    next_gen: u64,
    /// Drive size as of the newest durable state.
    durable_size: u64,
    /// Reused buffer for reading records back.
    read_buf: Vec<u8>,
    /// Reused run buffers (no large allocations per sync).
    run: RunBuilder,
    /// Totals for the status.
    totals: EngineTotals,
}

/// Collects pages into runs and appends them as journal records.
struct RunBuilder {
    kind: RecordKind,
    first: u64,
    n: u32,
    data: Vec<u8>,
    entries: Vec<u8>,
    data_pages: u64,
    zero_pages: u64,
}

impl RunBuilder {
    fn new() -> RunBuilder {
        RunBuilder {
            kind: RecordKind::Zero,
            first: 0,
            n: 0,
            data: Vec::with_capacity(MAX_RECORD_PAGES as usize * PAGE_BYTES),
            entries: Vec::new(),
            data_pages: 0,
            zero_pages: 0,
        }
    }

    /// A builder with no buffers (a placeholder while the real one is out).
    fn empty() -> RunBuilder {
        RunBuilder {
            kind: RecordKind::Zero,
            first: 0,
            n: 0,
            data: Vec::new(),
            entries: Vec::new(),
            data_pages: 0,
            zero_pages: 0,
        }
    }

    /// Ready for a new sync (keeps the buffers).
    fn reset(&mut self) {
        self.n = 0;
        self.data.clear();
        self.entries.clear();
        self.data_pages = 0;
        self.zero_pages = 0;
    }

    fn flush<F: StorageFile>(&mut self, j: &mut JournalWriter<F>) -> std::io::Result<()> {
        if self.n > 0 {
            match self.kind {
                RecordKind::Pages => j.add_pages(self.first, &self.data, &self.entries)?,
                _ => j.add_zero(self.first, self.n)?,
            }
        }
        self.n = 0;
        self.data.clear();
        self.entries.clear();
        Ok(())
    }

    fn add<F: StorageFile>(
        &mut self,
        j: &mut JournalWriter<F>,
        cipher: Option<&Cipher>,
        page: u64,
        data: Option<&[u8]>,
    ) -> Result<()> {
        let kind = if data.is_some() {
            RecordKind::Pages
        } else {
            RecordKind::Zero
        };
        let contiguous = self.n > 0 && self.kind == kind && page == self.first + self.n as u64;
        let full = match kind {
            RecordKind::Pages => self.n >= MAX_RECORD_PAGES,
            // n_pages is a u32: a zero run covers at most 4 TiB.
            _ => self.n == u32::MAX,
        };
        if !contiguous || full {
            self.flush(j).map_err(io_err("write", "journal".into()))?;
            self.kind = kind;
            self.first = page;
        }
        self.n += 1;
        let Some(d) = data else {
            self.zero_pages += 1;
            return Ok(());
        };
        self.data_pages += 1;
        let at = self.data.len();
        self.data.extend_from_slice(d);
        match cipher {
            None => self.entries.extend_from_slice(&plain_entry(d)),
            Some(c) => {
                let (nonce, tag) = c.seal_page(page, &mut self.data[at..])?;
                self.entries
                    .extend_from_slice(&encrypted_entry(&nonce, &tag));
            }
        }
        Ok(())
    }
}

fn random_uuid() -> Result<[u8; 16]> {
    let mut u = [0u8; 16];
    SystemRandom::new()
        .fill(&mut u)
        .map_err(|_| super::crypto::CryptoError::Random)?;
    Ok(u)
}

/// Replaces the meta file atomically and durably.
pub(crate) fn write_meta<S: Storage>(storage: &S, meta: &Meta) -> Result<()> {
    let path = storage.describe(names::META_TMP);
    let tmp = storage
        .open(names::META_TMP, true)
        .map_err(io_err("create", path.clone()))?;
    tmp.set_len(0).map_err(io_err("truncate", path.clone()))?;
    tmp.write_at(&meta.encode(), 0)
        .map_err(io_err("write", path.clone()))?;
    tmp.sync_data().map_err(io_err("fdatasync", path))?;
    storage
        .rename(names::META_TMP, names::META)
        .map_err(io_err("rename", storage.describe(names::META)))?;
    storage
        .sync_dir()
        .map_err(io_err("fsync directory of", storage.describe(names::META)))
}

impl<S: Storage> Engine<S> {
    /// Creates a drive of `drive_size` bytes in an empty state directory,
    /// encrypted when `key` is given.
    pub fn create(storage: S, drive_size: u64, key: Option<&Key>) -> Result<Engine<S>> {
        let meta_path = storage.describe(names::META);
        if storage
            .exists(names::META)
            .map_err(io_err("stat", meta_path.clone()))?
        {
            return Err(Error::AlreadyExists(storage.describe("")));
        }
        let uuid = random_uuid()?;
        let cipher = key.map(|k| Cipher::new(k, uuid));
        let key_check = match &cipher {
            Some(c) => c.key_check()?,
            None => [0u8; KEY_CHECK_BYTES],
        };
        let now = now_unix_ms();
        let meta = Meta {
            drive_size,
            encrypted: cipher.is_some(),
            uuid,
            image_gen: 0,
            created_unix_ms: now,
            updated_unix_ms: now,
            key_check,
        };
        let open = |name: &str| -> Result<S::File> {
            let path = storage.describe(name);
            let f = storage
                .open(name, true)
                .map_err(io_err("create", path.clone()))?;
            f.set_len(0).map_err(io_err("truncate", path))?;
            Ok(f)
        };
        let image = Image {
            image: open(names::IMAGE)?,
            pages: open(names::PAGES)?,
            entry_bytes: meta.entry_bytes(),
            encrypted: meta.encrypted,
        };
        let journal = open(names::JOURNAL)?;
        image
            .set_size(drive_size)
            .map_err(io_err("size", storage.describe(names::IMAGE)))?;
        image
            .sync()
            .map_err(io_err("fdatasync", storage.describe(names::IMAGE)))?;
        journal
            .sync_data()
            .map_err(io_err("fdatasync", storage.describe(names::JOURNAL)))?;
        // The meta goes last: a directory without it holds no drive.
        write_meta(&storage, &meta)?;
        let journal = JournalWriter::new(journal, meta.drive_id(), meta.entry_bytes(), 0, 0);
        Ok(Engine {
            storage,
            durable_size: drive_size,
            meta,
            image,
            journal,
            cipher,
            pending: Vec::new(),
            next_gen: 1,
            read_buf: Vec::new(),
            run: RunBuilder::new(),
            totals: EngineTotals {
                bytes_written: META_BYTES as u64,
                ..EngineTotals::default()
            },
        })
    }

    /// Assembles an engine from an opened directory (used by restore).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn from_parts(
        storage: S,
        meta: Meta,
        image: Image<S::File>,
        journal: JournalWriter<S::File>,
        cipher: Option<Cipher>,
        pending: Vec<GenInfo>,
        next_gen: u64,
        durable_size: u64,
    ) -> Engine<S> {
        Engine {
            storage,
            meta,
            image,
            journal,
            cipher,
            pending,
            next_gen,
            durable_size,
            read_buf: Vec::new(),
            run: RunBuilder::new(),
            totals: EngineTotals::default(),
        }
    }

    /// The metadata as last written.
    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    /// The state directory.
    pub fn storage(&self) -> &S {
        &self.storage
    }

    /// Gives the state directory back.
    pub fn into_storage(self) -> S {
        self.storage
    }

    /// Bytes of committed journal not yet checkpointed.
    pub fn journal_bytes(&self) -> u64 {
        self.journal.committed_bytes()
    }

    /// Committed generations waiting for a checkpoint.
    pub fn pending_gens(&self) -> usize {
        self.pending.len()
    }

    /// The newest durable generation.
    pub fn durable_gen(&self) -> u64 {
        self.pending
            .last()
            .map(|g| g.gen)
            .unwrap_or(self.meta.image_gen)
    }

    /// Running totals.
    pub fn totals(&self) -> &EngineTotals {
        &self.totals
    }

    /// Saves a point-in-time snapshot of everything `store` changed since
    /// the last successful sync: returns once it is durable (committed in
    /// the journal). Writers keep running meanwhile. On failure nothing of
    /// this attempt counts and its pages stay dirty for the next one.
    pub fn sync<M: SyncStore>(&mut self, store: &M) -> Result<SyncReport> {
        self.sync_with_progress(store, &SyncProgress::default())
    }

    /// [`Engine::sync`], publishing its progress into `progress`.
    pub fn sync_with_progress<M: SyncStore>(
        &mut self,
        store: &M,
        progress: &SyncProgress,
    ) -> Result<SyncReport> {
        let started = Instant::now();
        progress.start(store.dirty_pages() * PAGE_BYTES as u64);
        let mut snap = store.cut();
        let size = snap.size_bytes();
        let min_size = snap.min_size_bytes();
        let size_pages = size.div_ceil(PAGE_BYTES as u64);
        let mut run = std::mem::replace(&mut self.run, RunBuilder::empty());
        run.reset();
        let mut begun = false;
        let jp = self.storage.describe(names::JOURNAL);
        let jpath = || jp.clone();
        let before = self.journal.committed_bytes();
        let result = (|| -> Result<Option<GenInfo>> {
            while let Some(chunk) = snap.next_chunk()? {
                if !begun {
                    self.journal
                        .begin(self.next_gen)
                        .map_err(io_err("truncate", jpath()))?;
                    self.next_gen += 1;
                    begun = true;
                }
                let mut pages = 0;
                for (page, data) in chunk.pages() {
                    pages += 1;
                    if page < size_pages {
                        run.add(&mut self.journal, self.cipher.as_ref(), page, data)?;
                    }
                }
                progress.add(pages * PAGE_BYTES as u64);
                if progress
                    .boost
                    .swap(false, std::sync::atomic::Ordering::Relaxed)
                {
                    super::priority::normal_thread_priority();
                }
            }
            if !begun {
                if size == self.durable_size && min_size >= size {
                    return Ok(None);
                }
                // Only the size changed: a generation of no records.
                self.journal
                    .begin(self.next_gen)
                    .map_err(io_err("truncate", jpath()))?;
                self.next_gen += 1;
            }
            run.flush(&mut self.journal)
                .map_err(io_err("write", jpath()))?;
            store.note_committing(self.next_gen - 1);
            let info = self
                .journal
                .commit(size, min_size)
                .map_err(io_err("write and fdatasync", jpath()))?;
            store.note_committed(info.gen);
            Ok(Some(info))
        })();
        progress.end();
        match result {
            Ok(info) => {
                snap.finish();
                let mut report = SyncReport {
                    data_pages: run.data_pages,
                    zero_pages: run.zero_pages,
                    ..SyncReport::default()
                };
                if let Some(info) = info {
                    report.gen = info.gen;
                    report.journal_bytes = self.journal.committed_bytes() - before;
                    self.totals.bytes_written += report.journal_bytes;
                    self.totals.gens_written += 1;
                    self.durable_size = info.drive_size;
                    self.pending.push(info);
                }
                report.duration = started.elapsed();
                self.run = run;
                Ok(report)
            }
            Err(e) => {
                self.run = run;
                // Abort: the snapshot gives every page back to the dirty set.
                self.journal.abort();
                drop(snap);
                Err(e)
            }
        }
    }

    /// Moves every committed generation from the journal into the image,
    /// then empties the journal. Idempotent; on failure nothing is lost and
    /// a later call does the whole work again.
    pub fn checkpoint(&mut self) -> Result<CheckpointReport> {
        let started = Instant::now();
        let mut report = CheckpointReport::default();
        if self.pending.is_empty() {
            return Ok(report);
        }
        let ipath = self.storage.describe(names::IMAGE);
        let jpath = self.storage.describe(names::JOURNAL);
        let eb = self.image.entry_bytes;
        for g in &self.pending {
            // A shrink since the previous generation zeroed the bytes beyond
            // it: cut them off before growing back.
            self.image
                .set_size(g.min_size.min(g.drive_size))
                .map_err(io_err("resize", ipath.clone()))?;
            self.image
                .set_size(g.drive_size)
                .map_err(io_err("resize", ipath.clone()))?;
            for rec in &g.records {
                match rec.kind {
                    RecordKind::Pages => {
                        let n = rec.n_pages as usize;
                        room_for(&self.storage, (n * (PAGE_BYTES + eb)) as u64)?;
                        read_payload(self.journal.file(), rec, &mut self.read_buf)
                            .map_err(io_err("read back", jpath.clone()))?;
                        let (data, rest) = self.read_buf.split_at(n * PAGE_BYTES);
                        self.image
                            .write_data(rec.first_page, g.drive_size, data, &rest[..n * eb])
                            .map_err(io_err("write", ipath.clone()))?;
                        report.bytes_written += (n * (PAGE_BYTES + eb)) as u64;
                    }
                    _ => {
                        self.image
                            .write_zero(rec.first_page, rec.n_pages as u64, g.drive_size)
                            .map_err(io_err("punch", ipath.clone()))?;
                        report.bytes_written += rec.n_pages as u64 * eb as u64;
                    }
                }
            }
        }
        self.image
            .sync()
            .map_err(io_err("fdatasync", ipath.clone()))?;
        let last = self.pending.last().expect("pending generations");
        let mut meta = self.meta.clone();
        meta.image_gen = last.gen;
        meta.drive_size = last.drive_size;
        meta.updated_unix_ms = now_unix_ms();
        write_meta(&self.storage, &meta)?;
        // The image holds everything the journal does from here on; if
        // emptying the journal fails, its records are stale (generations
        // at or below `image_gen`) and the next generation empties it first.
        self.meta = meta;
        report.gens = self.pending.len();
        report.bytes_written += META_BYTES as u64;
        self.pending.clear();
        self.totals.bytes_written += report.bytes_written;
        self.totals.checkpoints += 1;
        self.journal.reset().map_err(io_err("truncate", jpath))?;
        report.duration = started.elapsed();
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::backend::Backend;
    use crate::persist::journal::scan;
    use crate::sim::SimDisk;
    use crate::store::{MemoryBudget, RamStore, StoreOptions};
    use std::sync::Arc;

    #[test]
    fn adjacent_dirty_pages_coalesce_into_large_records() {
        let disk = SimDisk::new(1);
        let opts = StoreOptions {
            mem_limit_bytes: None,
            prefault: false,
            ..StoreOptions::default()
        };
        let store =
            RamStore::with_options(8 << 20, opts, Arc::new(MemoryBudget::new(u64::MAX))).unwrap();
        store.take_dirty();
        let mut engine = Engine::create(disk.clone(), 8 << 20, None).unwrap();
        // 3 MiB in one piece, a trimmed run, two lone pages.
        store.write(0, &vec![7u8; 3 << 20], false).unwrap();
        store.trim(4 << 20, 1 << 20).unwrap();
        store.write(6 << 20, &[1; 10], false).unwrap();
        store.write((7 << 20) + 8192, &[2; 10], false).unwrap();
        let r = engine.sync(&store).unwrap();
        assert_eq!((r.data_pages, r.zero_pages), (768 + 2, 256));
        let f = disk.open(names::JOURNAL, false).unwrap();
        let s = scan(&f, engine.meta().drive_id(), engine.meta().entry_bytes()).unwrap();
        let runs: Vec<(u64, u32)> = s.gens[0]
            .records
            .iter()
            .map(|r| (r.first_page, r.n_pages))
            .collect();
        // 768 pages as three 1 MiB records, one zero run, two single pages.
        assert_eq!(
            runs,
            vec![
                (0, 256),
                (256, 256),
                (512, 256),
                (1024, 256),
                (1536, 1),
                (1794, 1)
            ]
        );
        // Nothing changed: the next sync writes nothing.
        assert_eq!(engine.sync(&store).unwrap().gen, 0);
    }
}
