//! Opening a state directory into a RAM store: verify, load, replay.
//!
//! Order, and why:
//! 1. meta: decoded and checked (magic, version, CRC); the key is checked
//!    against its key check before any page is read.
//! 2. journal: scanned and verified whole, *before* anything is loaded, so
//!    the pages the replay will overwrite are known (a crash during a
//!    checkpoint leaves exactly those pages with data and entry out of step).
//! 3. image: the page table says which pages hold data; only those are read,
//!    in runs of up to 8 MiB by two worker threads that `pread` each run
//!    straight into the drive's pages and verify (CRC-32C or AES-GCM) them
//!    in place: one copy, page cache to drive, and one thread's disk wait
//!    overlaps the other's verifying. Holes cost nothing. (A store that
//!    spends more CPU per page, a compressed one, asks for one thread per
//!    core: `SyncStore::load_threads`.)
//! 4. replay: the committed generations newer than the image, in order.
//! 5. only now, with everything verified and loaded, is the disk changed:
//!    the journal is checkpointed into the image and emptied (a torn tail
//!    goes with it).
//!
//! Any refusal (corrupt meta, image or journal; wrong key) happens before
//! step 5: the state directory is left exactly as it was.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::mpsc::sync_channel;
use std::time::{Duration, Instant};

use super::crypto::{Cipher, Key};
use super::engine::{write_meta, Engine};
use super::format::{decode_entry, Entry, Meta, RecordKind, META_BYTES, PAGE_BYTES};
use super::image::Image;
use super::journal::{read_payload, scan, GenInfo, JournalWriter, ScanEnd};
use super::storage::{Storage, StorageFile};
use super::{crc, io_err, names, Error, Result};
use crate::store::SyncStore;

/// Choices for a restore that found damage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RestoreOptions {
    /// Load despite damage: corrupt image pages are loaded as they are
    /// (zero when encrypted) and listed; a corrupt journal is replayed up to
    /// the damage.
    pub force: bool,
    /// Ignore the journal entirely (load the image as of its last
    /// checkpoint) and empty it.
    pub discard_journal: bool,
}

/// Restore phases, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestorePhase {
    /// Reading metadata, checking the key, scanning the journal.
    Verifying = 0,
    /// Loading the image.
    LoadingImage = 1,
    /// Replaying the journal.
    Replaying = 2,
    /// Checkpointing the replayed journal into the image.
    Checkpointing = 3,
    /// Finished.
    Done = 4,
}

/// Progress of a running restore, for a progress bar or the API: shared
/// between the restoring thread and whoever shows it.
#[derive(Debug, Default)]
pub struct RestoreProgress {
    phase: AtomicU8,
    done_bytes: AtomicU64,
    total_bytes: AtomicU64,
}

impl RestoreProgress {
    /// A fresh progress (phase `Verifying`, nothing done).
    pub fn new() -> RestoreProgress {
        RestoreProgress::default()
    }
    /// The current phase.
    pub fn phase(&self) -> RestorePhase {
        match self.phase.load(Ordering::Relaxed) {
            0 => RestorePhase::Verifying,
            1 => RestorePhase::LoadingImage,
            2 => RestorePhase::Replaying,
            3 => RestorePhase::Checkpointing,
            _ => RestorePhase::Done,
        }
    }
    /// Bytes loaded so far (image data and journal pages).
    pub fn done_bytes(&self) -> u64 {
        self.done_bytes.load(Ordering::Relaxed)
    }
    /// Bytes to load in all (known once verifying is over).
    pub fn total_bytes(&self) -> u64 {
        self.total_bytes.load(Ordering::Relaxed)
    }
    fn set_phase(&self, p: RestorePhase) {
        self.phase.store(p as u8, Ordering::Relaxed);
    }
    fn add(&self, bytes: u64) {
        self.done_bytes.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// A torn journal tail that was cut.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornTail {
    /// Where the damage was.
    pub damage_offset: u64,
    /// Bytes cut.
    pub bytes: u64,
    /// What was wrong.
    pub detail: String,
}

/// What a restore did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RestoreReport {
    /// Drive size after restore.
    pub drive_size: u64,
    /// Generation the image held.
    pub image_gen: u64,
    /// Generation the drive now holds (image plus replayed journal).
    pub restored_gen: u64,
    /// Bytes of data loaded from the image.
    pub image_data_bytes: u64,
    /// Generations replayed from the journal.
    pub journal_gens: usize,
    /// Pages replayed from the journal (data and zero).
    pub journal_pages: u64,
    /// A torn tail that was cut (reported, not an error).
    pub torn_tail: Option<TornTail>,
    /// Leftover records of an unfinished journal reset that were cut.
    pub stale_journal_bytes: u64,
    /// The journal was discarded on request.
    pub journal_discarded: bool,
    /// With `force`: journal damage that was skipped (offset, detail).
    pub forced_journal_damage: Option<(u64, String)>,
    /// With `force`: image pages that failed verification (first 1000).
    pub forced_bad_pages: Vec<u64>,
    /// With `force`: how many image pages failed verification.
    pub forced_bad_page_count: u64,
    /// The checkpoint after loading failed (the drive runs; the next sync
    /// retries it).
    pub checkpoint_error: Option<String>,
    /// Not restored but adopted (`adopt`): the memory a previous serving
    /// process kept, with this many pages not yet saved.
    pub kept_dirty_pages: Option<u64>,
    /// Wall time.
    pub duration: Duration,
}

/// Pages the journal replay will overwrite (or a size cut will drop): their
/// image contents need not verify.
struct Covered {
    bits: Vec<u64>,
    /// Pages at or beyond this are cut by a smaller size in the journal.
    cut_from: u64,
}

impl Covered {
    fn new(pages: u64, gens: &[GenInfo]) -> Covered {
        let mut c = Covered {
            bits: vec![0; pages.div_ceil(64) as usize],
            cut_from: u64::MAX,
        };
        for g in gens {
            c.cut_from = c
                .cut_from
                .min(g.min_size.min(g.drive_size).div_ceil(PAGE_BYTES as u64));
            for r in &g.records {
                let end = (r.first_page + r.n_pages as u64).min(pages);
                for p in r.first_page.min(end)..end {
                    c.bits[(p / 64) as usize] |= 1 << (p % 64);
                }
            }
        }
        c
    }
    fn has(&self, p: u64) -> bool {
        p >= self.cut_from
            || self
                .bits
                .get((p / 64) as usize)
                .is_some_and(|w| w & (1 << (p % 64)) != 0)
    }
}

/// Reads the meta file.
pub fn read_meta<S: Storage>(storage: &S) -> Result<Meta> {
    let path = storage.describe(names::META);
    if !storage
        .exists(names::META)
        .map_err(io_err("stat", path.clone()))?
    {
        return Err(Error::NotFound(storage.describe("")));
    }
    let f = storage
        .open(names::META, false)
        .map_err(io_err("open", path.clone()))?;
    let mut b = vec![0u8; META_BYTES];
    let n = f.read_at(&mut b, 0).map_err(io_err("read", path.clone()))?;
    Meta::decode(&b[..n]).map_err(|e| Error::CorruptMeta {
        path,
        detail: e.to_string(),
        raw_hint: "",
    })
}

/// Largest single read of the image.
const READ_RUN_BYTES: u64 = 8 << 20;

/// A state directory opened and verified up to its data: meta, key,
/// files, and the journal's committed generations (steps 1-2).
struct Opened<S: Storage> {
    storage: S,
    meta: Meta,
    cipher: Option<Cipher>,
    image: Image<S::File>,
    journal: S::File,
    jpath: String,
    gens: Vec<GenInfo>,
    committed_end: u64,
}

impl<S: Storage> Opened<S> {
    /// Steps 1 and 2 (see the module docs); changes nothing on disk.
    fn open(
        storage: S,
        key: Option<&Key>,
        opts: &RestoreOptions,
        report: &mut RestoreReport,
    ) -> Result<Opened<S>> {
        let meta = read_meta(&storage)?;
        let cipher = open_cipher(&meta, key, storage.describe(""))?;
        // A leftover of an interrupted meta update is harmless: the rename
        // is the commit point.
        let open = |name: &str| {
            storage
                .open(name, false)
                .map_err(io_err("open", storage.describe(name)))
        };
        let image = Image {
            image: open(names::IMAGE)?,
            pages: open(names::PAGES)?,
            entry_bytes: meta.entry_bytes(),
            encrypted: meta.encrypted,
        };
        let jpath = storage.describe(names::JOURNAL);
        let journal = storage
            .open(names::JOURNAL, true)
            .map_err(io_err("open", jpath.clone()))?;
        report.image_gen = meta.image_gen;
        let (gens, committed_end) = scan_journal(&journal, &meta, opts, &jpath, report)?;
        Ok(Opened {
            storage,
            meta,
            cipher,
            image,
            journal,
            jpath,
            gens,
            committed_end,
        })
    }

    /// The generation the journal's last committed generation (or the
    /// image) holds.
    fn newest_gen(&self) -> u64 {
        self.gens
            .last()
            .map_or(self.meta.image_gen, |g| g.gen.max(self.meta.image_gen))
    }

    /// Step 5: the engine over the directory, after forgetting discarded
    /// journal bytes, with the committed generations checkpointed (a
    /// failed checkpoint is noted in `report`; the next sync retries it).
    /// `durable_size` is the size the directory holds now.
    fn into_engine(mut self, report: &mut RestoreReport, durable_size: u64) -> Result<Engine<S>> {
        let (cend, flen) = journal_ends(
            &self.journal,
            &self.jpath,
            report.journal_discarded,
            self.committed_end,
        )?;
        let next_gen = report.restored_gen.max(self.meta.image_gen) + 1;
        if self.meta.drive_size != durable_size && self.gens.is_empty() {
            // Never happens (the size changes only through generations),
            // but keep meta honest if it did.
            self.meta.drive_size = durable_size;
            write_meta(&self.storage, &self.meta)?;
        }
        let writer = JournalWriter::new(
            self.journal,
            self.meta.drive_id(),
            self.meta.entry_bytes(),
            cend,
            flen,
        );
        let mut engine = Engine::from_parts(
            self.storage,
            self.meta,
            self.image,
            writer,
            self.cipher,
            self.gens,
            next_gen,
            durable_size,
        );
        if let Err(e) = engine.checkpoint() {
            report.checkpoint_error = Some(e.to_string());
        }
        Ok(engine)
    }
}

/// Opens the drive in `storage` into a new RAM store made by `make_store`
/// (called with the drive size), verifying everything; see the module docs.
pub fn restore<S: Storage, M: SyncStore>(
    storage: S,
    key: Option<&Key>,
    opts: RestoreOptions,
    progress: &RestoreProgress,
    make_store: impl FnOnce(u64) -> crate::block::backend::Result<M>,
) -> Result<(Engine<S>, M, RestoreReport)> {
    let started = Instant::now();
    progress.set_phase(RestorePhase::Verifying);
    let mut report = RestoreReport::default();
    let o = Opened::open(storage, key, &opts, &mut report)?;
    let covered = Covered::new(o.meta.pages(), &o.gens);
    let journal_bytes: u64 = o
        .gens
        .iter()
        .map(|g| g.data_pages * PAGE_BYTES as u64)
        .sum();

    // 3. The image.
    let store = make_store(o.meta.drive_size)?;
    let data_pages = count_data_pages(&o.storage, &o.image, &o.meta)?;
    progress.total_bytes.store(
        data_pages * PAGE_BYTES as u64 + journal_bytes,
        Ordering::Relaxed,
    );
    progress.set_phase(RestorePhase::LoadingImage);
    load_image(
        &o.storage,
        &o.image,
        &o.meta,
        o.cipher.as_ref(),
        &covered,
        opts.force,
        &store,
        progress,
        &mut report,
    )?;

    // 4. Replay.
    progress.set_phase(RestorePhase::Replaying);
    let replay = Replay {
        journal: &o.journal,
        jpath: &o.jpath,
        entry_bytes: o.meta.entry_bytes(),
        cipher: o.cipher.as_ref(),
        store: &store,
        progress,
    };
    for g in &o.gens {
        replay.generation(g, &mut report)?;
    }
    report.restored_gen = o.newest_gen();
    report.drive_size = store.size();
    // What was loaded is on disk: nothing is dirty.
    store.clear_dirty();
    store.note_directory(o.meta.uuid);
    store.note_committed(report.restored_gen);
    store.note_committing(report.restored_gen);
    // Pages loaded despite failing verification get rewritten (with fresh
    // checksums) by the first sync.
    rewrite_pages(&store, &report.forced_bad_pages);

    // 5. Change the disk: forget discarded/damaged journal bytes, then
    //    checkpoint what was replayed.
    progress.set_phase(RestorePhase::Checkpointing);
    let engine = o.into_engine(&mut report, store.size())?;
    progress.set_phase(RestorePhase::Done);
    report.duration = started.elapsed();
    Ok((engine, store, report))
}

/// Opens the drive in `storage` over `store`: its memory as a previous
/// serving process of this daemon left it (kept by a supervisor, issue
/// 31), newer than the directory, with a dirty set that names every page
/// the directory lacks (`store::ledger`). So nothing is loaded or
/// replayed: the meta, key and journal are verified as for a restore,
/// the committed generations checkpointed, and the next sync saves the
/// dirty pages. Refused, like a restore, for a damaged directory or a
/// wrong key (the caller then restores from disk or fails the drive).
pub fn adopt<S: Storage, M: SyncStore>(
    storage: S,
    key: Option<&Key>,
    store: M,
) -> Result<(Engine<S>, M, RestoreReport)> {
    let started = Instant::now();
    let mut report = RestoreReport::default();
    let o = Opened::open(storage, key, &RestoreOptions::default(), &mut report)?;
    report.restored_gen = o.newest_gen();
    // The memory noted the last generation it committed and the one it
    // was committing: the directory holds one of them (the second when
    // its commit landed before the kill). Anything else means the
    // directory moved on without this memory (another process wrote it):
    // the memory is stale. (Failed attempts consume numbers, so "the one
    // before the committing one" would not do.)
    let dir_gen = report.restored_gen;
    let (committed, committing) = store.kept_generations().unwrap_or((0, 0));
    let same_dir = store.kept_directory() == Some(o.meta.uuid);
    if !same_dir || (dir_gen != committed && dir_gen != committing) {
        return Err(Error::StaleKeptMemory {
            dir: o.storage.describe(""),
            dir_gen,
            mem_gen: committed,
        });
    }
    store.note_committed(dir_gen);
    store.note_committing(dir_gen);
    report.drive_size = store.size();
    report.kept_dirty_pages = Some(store.dirty_pages());
    let durable_size = o.gens.last().map_or(o.meta.drive_size, |g| g.drive_size);
    let engine = o.into_engine(&mut report, durable_size)?;
    report.duration = started.elapsed();
    Ok((engine, store, report))
}

/// Where the journal writer goes on: after the committed generations, or
/// from an empty journal when it was discarded (truncated and synced here,
/// so the discard is on disk before anything new is written).
fn journal_ends<F: StorageFile>(
    journal: &F,
    jpath: &str,
    discarded: bool,
    committed_end: u64,
) -> Result<(u64, u64)> {
    if discarded {
        journal
            .set_len(0)
            .map_err(io_err("truncate", jpath.to_owned()))?;
        journal
            .sync_data()
            .map_err(io_err("fdatasync", jpath.to_owned()))?;
        return Ok((0, 0));
    }
    let file_len = journal.len().map_err(io_err("stat", jpath.to_owned()))?;
    Ok((committed_end, file_len))
}

/// The cipher of an encrypted drive, checked against the key check in
/// `meta`; None for a plain drive. A key must be given exactly when the
/// drive is encrypted.
fn open_cipher(meta: &Meta, key: Option<&Key>, dir: String) -> Result<Option<Cipher>> {
    match (meta.encrypted, key) {
        (true, None) => Err(Error::KeyRequired(dir)),
        (false, Some(_)) => Err(Error::KeyNotExpected(dir)),
        (true, Some(k)) => {
            let c = Cipher::new(k, meta.uuid);
            if !c.verify_key_check(&meta.key_check) {
                return Err(Error::WrongKey(dir));
            }
            Ok(Some(c))
        }
        (false, None) => Ok(None),
    }
}

/// Reads the journal's committed generations and where they end, noting
/// in `report` what was found past them. Damage inside (not at the tail)
/// refuses the restore unless forced; with `discard_journal` nothing is
/// read.
fn scan_journal<F: StorageFile>(
    journal: &F,
    meta: &Meta,
    opts: &RestoreOptions,
    jpath: &str,
    report: &mut RestoreReport,
) -> Result<(Vec<GenInfo>, u64)> {
    if opts.discard_journal {
        report.journal_discarded = true;
        return Ok((Vec::new(), 0));
    }
    let s = scan(journal, meta.drive_id(), meta.entry_bytes())
        .map_err(io_err("read", jpath.to_owned()))?;
    match s.end {
        ScanEnd::Clean => {}
        ScanEnd::Stale { bytes } => report.stale_journal_bytes = bytes,
        ScanEnd::TornTail {
            damage_offset,
            bytes,
            detail,
        } => {
            report.torn_tail = Some(TornTail {
                damage_offset,
                bytes,
                detail,
            })
        }
        ScanEnd::Corrupt {
            damage_offset,
            detail,
            later_gen,
        } => {
            if !opts.force {
                return Err(Error::CorruptJournal {
                    path: jpath.to_owned(),
                    offset: damage_offset,
                    detail,
                    later_gen,
                });
            }
            report.forced_journal_damage = Some((damage_offset, detail));
        }
    }
    Ok((s.gens, s.committed_end))
}

/// Replays journal generations into the store, verifying every page.
struct Replay<'a, F, M> {
    journal: &'a F,
    jpath: &'a str,
    entry_bytes: usize,
    cipher: Option<&'a Cipher>,
    store: &'a M,
    progress: &'a RestoreProgress,
}

impl<F: StorageFile, M: SyncStore> Replay<'_, F, M> {
    /// One generation: its size changes, then its records in order.
    fn generation(&self, g: &GenInfo, report: &mut RestoreReport) -> Result<()> {
        self.store.resize(g.min_size.min(g.drive_size))?;
        self.store.resize(g.drive_size)?;
        let mut buf = Vec::new();
        for rec in &g.records {
            let first = rec.first_page * PAGE_BYTES as u64;
            let end = ((rec.first_page + rec.n_pages as u64) * PAGE_BYTES as u64).min(g.drive_size);
            report.journal_pages += rec.n_pages as u64;
            if first >= end {
                continue;
            }
            if rec.kind != RecordKind::Pages {
                self.store.trim(first, end - first)?;
                continue;
            }
            read_payload(self.journal, rec, &mut buf)
                .map_err(io_err("read", self.jpath.to_owned()))?;
            let data = self.verified(g, rec, &mut buf)?;
            let len = (end - first) as usize;
            self.store.write(first, &data[..len], false)?;
            self.progress.add(len as u64);
        }
        report.journal_gens += 1;
        Ok(())
    }

    /// The record's pages, each verified against its entry (and decrypted
    /// in place when encrypted). The record's checksum held, so a page that
    /// does not verify is a bug or a wrong key the key check missed: refuse.
    fn verified<'b>(
        &self,
        g: &GenInfo,
        rec: &super::journal::RecordLoc,
        buf: &'b mut [u8],
    ) -> Result<&'b [u8]> {
        let n = rec.n_pages as usize;
        let eb = self.entry_bytes;
        let (data, entries) = buf.split_at_mut(n * PAGE_BYTES);
        for i in 0..n {
            let page = rec.first_page + i as u64;
            let pd = &mut data[i * PAGE_BYTES..(i + 1) * PAGE_BYTES];
            if !verify_page(self.cipher, page, &entries[i * eb..(i + 1) * eb], pd) {
                return Err(Error::CorruptJournal {
                    path: self.jpath.to_owned(),
                    offset: rec.payload_offset,
                    detail: format!("page {page} does not verify against its entry"),
                    later_gen: g.gen,
                });
            }
        }
        Ok(data)
    }
}

/// Checks one page against its table entry (decrypting it in place when
/// encrypted). A hole entry never verifies data.
fn verify_page(cipher: Option<&Cipher>, page: u64, entry: &[u8], data: &mut [u8]) -> bool {
    match (decode_entry(entry), cipher) {
        (Ok(Entry::Plain { crc: c }), None) => crc(data) == c,
        (Ok(Entry::Encrypted { nonce, tag }), Some(ci)) => {
            ci.open_page(page, &nonce, &tag, data).is_ok()
        }
        _ => false,
    }
}

/// Marks pages dirty by writing their current contents back.
fn rewrite_pages<M: SyncStore>(store: &M, pages: &[u64]) {
    let mut buf = vec![0u8; PAGE_BYTES];
    for &p in pages {
        let off = p * PAGE_BYTES as u64;
        let len = (store.size().saturating_sub(off)).min(PAGE_BYTES as u64) as usize;
        if len > 0 && store.read(off, &mut buf[..len]).is_ok() {
            let _ = store.write(off, &buf[..len], false);
        }
    }
}

/// Pages per window of the page table read at a time (the table of a
/// 1 TiB drive is 2 GiB; it is never held whole).
const TABLE_WINDOW_PAGES: u64 = 1 << 20;

/// Entries of pages `[first, first+n)` (pages past the table's end read as
/// holes).
fn read_table_window<F: StorageFile>(
    pages: &F,
    eb: usize,
    first: u64,
    n: u64,
) -> std::io::Result<Vec<u8>> {
    let mut table = vec![0u8; n as usize * eb];
    let mut at = 0;
    while at < table.len() {
        let k = pages.read_at(&mut table[at..], first * eb as u64 + at as u64)?;
        if k == 0 {
            break;
        }
        at += k;
    }
    Ok(table)
}

/// Pages the table marks as holding data.
fn count_data_pages<S: Storage>(storage: &S, image: &Image<S::File>, meta: &Meta) -> Result<u64> {
    let eb = meta.entry_bytes();
    let mut count = 0;
    let mut first = 0;
    while first < meta.pages() {
        let n = TABLE_WINDOW_PAGES.min(meta.pages() - first);
        let t = read_table_window(&image.pages, eb, first, n)
            .map_err(io_err("read", storage.describe(names::PAGES)))?;
        count += t.chunks(eb).filter(|e| e.iter().any(|&b| b != 0)).count() as u64;
        first += n;
    }
    Ok(count)
}

/// A run of data pages to load: its first page, page count, and the pages'
/// table entries.
type Run = (u64, u64, Vec<u8>);

/// A page that failed verification: page number and why.
type BadPage = (u64, String);

/// What the load workers share.
struct LoadShared<'a, F, M> {
    image: &'a F,
    /// Bytes of the image file that belong to the drive.
    image_len: u64,
    /// Actual length of the image file, for messages.
    file_len: u64,
    drive_size: u64,
    eb: usize,
    cipher: Option<&'a Cipher>,
    covered: &'a Covered,
    force: bool,
    store: &'a M,
    progress: &'a RestoreProgress,
    /// Set when a worker met an error that ends the restore: the others stop.
    stop: std::sync::atomic::AtomicBool,
    /// Bytes of the image loaded into the drive.
    loaded_bytes: AtomicU64,
}

impl<F: StorageFile, M: SyncStore> LoadShared<'_, F, M> {
    /// Loads one run straight into the drive's memory: `pread` into the
    /// pages themselves (under their chunk locks, via `write_with`), then
    /// verifies (or decrypts) each page in place. No staging buffer, so
    /// the data is copied once, page cache to drive. Pages that fail are
    /// appended to `bad` (encrypted ones zeroed, as their bytes are
    /// meaningless); an uncovered one without `force` stops the restore.
    fn load_run(&self, run: &Run, bad: &mut Vec<BadPage>) -> std::io::Result<()> {
        let page = PAGE_BYTES as u64;
        let (first, n, entries) = (run.0, run.1, &run.2);
        let off = first * page;
        let end = ((first + n) * page).min(self.drive_size);
        // A last page cut by the drive's end is verified whole from a buffer.
        let whole_end = end / page * page;
        let mut pos = off;
        while pos < whole_end {
            let stored = self
                .store
                .load_with(pos, (whole_end - pos) as usize, &mut |dst| {
                    let got = self.read_full(dst, pos)?;
                    dst[got..].fill(0);
                    for (k, pd) in dst.chunks_mut(PAGE_BYTES).enumerate() {
                        let p = pos / page + k as u64;
                        let i = (p - first) as usize * self.eb;
                        let page_end = (k + 1) * PAGE_BYTES;
                        self.check(p, &entries[i..i + self.eb], pd, got < page_end, bad);
                    }
                    Ok(())
                });
            match stored {
                Ok(k) => pos += k as u64,
                Err(crate::block::backend::Error::Io(e)) => return Err(e),
                // Kept typed: `load_error` gives it back as `Error::Store`.
                Err(e) => return Err(std::io::Error::other(e)),
            }
            if self.stop.load(Ordering::Relaxed) {
                return Ok(());
            }
        }
        if whole_end < end {
            let mut pd = vec![0u8; PAGE_BYTES];
            let got = self.read_full(&mut pd, whole_end)?;
            let p = whole_end / page;
            let i = (p - first) as usize * self.eb;
            self.check(p, &entries[i..i + self.eb], &mut pd, got < PAGE_BYTES, bad);
            self.store
                .write(whole_end, &pd[..(end - whole_end) as usize], false)
                .map_err(std::io::Error::other)?;
        }
        self.progress.add(end - off);
        self.loaded_bytes.fetch_add(end - off, Ordering::Relaxed);
        Ok(())
    }

    /// Reads `buf.len()` bytes of the image at `offset`, fewer only where
    /// the file ends; returns how many.
    fn read_full(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        let len = (buf.len() as u64).min(self.image_len.saturating_sub(offset)) as usize;
        let mut got = 0;
        while got < len {
            match self
                .image
                .read_at(&mut buf[got..len], offset + got as u64)?
            {
                0 => break,
                k => got += k,
            }
        }
        Ok(got)
    }

    /// Verifies one page in place; records it in `bad` when it fails.
    fn check(&self, p: u64, entry: &[u8], pd: &mut [u8], short: bool, bad: &mut Vec<BadPage>) {
        if verify_page(self.cipher, p, entry, pd) {
            return;
        }
        let detail = if short {
            format!(
                "the image file ends at byte {}, before this page",
                self.file_len
            )
        } else if self.cipher.is_some() {
            "AES-GCM authentication failed (tampered or damaged)".to_string()
        } else {
            "CRC-32C mismatch (the page's bytes changed)".to_string()
        };
        if self.cipher.is_some() {
            pd.fill(0);
        }
        if !self.covered.has(p) {
            if !self.force {
                self.stop.store(true, Ordering::Relaxed);
            }
            bad.push((p, detail));
        }
    }
}

/// A load worker's error: the RAM store's own (a memory limit, the host
/// short of memory) as [`Error::Store`], so callers can tell it from a
/// failed read of `path`.
fn load_error(path: &str, e: std::io::Error) -> Error {
    match e.downcast::<crate::block::backend::Error>() {
        Ok(store) => Error::Store(store),
        Err(e) => io_err("read", path.to_owned())(e),
    }
}

/// Loads every data page of the image into `store`, verifying each. This
/// thread walks the page table window by window and hands runs of data
/// pages to the store's load threads (`SyncStore::load_threads`: two for a
/// raw drive, one reads while the other verifies) that read them straight
/// into the drive.
#[allow(clippy::too_many_arguments)]
fn load_image<S: Storage, M: SyncStore>(
    storage: &S,
    image: &Image<S::File>,
    meta: &Meta,
    cipher: Option<&Cipher>,
    covered: &Covered,
    force: bool,
    store: &M,
    progress: &RestoreProgress,
    report: &mut RestoreReport,
) -> Result<()> {
    let eb = meta.entry_bytes();
    let ipath = storage.describe(names::IMAGE);
    let tpath = storage.describe(names::PAGES);
    let pages = meta.pages();
    image.image.advise_sequential();
    image.pages.advise_sequential();
    let shared = LoadShared {
        image: &image.image,
        image_len: super::image::image_len(meta.drive_size, meta.encrypted),
        file_len: image.image.len().map_err(io_err("stat", ipath.clone()))?,
        drive_size: meta.drive_size,
        eb,
        cipher,
        covered,
        force,
        store,
        progress,
        stop: std::sync::atomic::AtomicBool::new(false),
        loaded_bytes: AtomicU64::new(0),
    };
    let workers_n = store.load_threads();
    let (tx, rx) = sync_channel::<Run>(2 * workers_n);
    let rx = std::sync::Mutex::new(rx);
    let (mut bad, first_error) = std::thread::scope(|sc| {
        let workers: Vec<_> = (0..workers_n)
            .map(|_| {
                let (shared, rx) = (&shared, &rx);
                sc.spawn(move || {
                    let mut bad = Vec::new();
                    loop {
                        let Ok(run) = rx.lock().expect("no panics under it").recv() else {
                            return (bad, None);
                        };
                        if shared.stop.load(Ordering::Relaxed) {
                            continue;
                        }
                        if let Err(e) = shared.load_run(&run, &mut bad) {
                            shared.stop.store(true, Ordering::Relaxed);
                            return (bad, Some(e));
                        }
                    }
                })
            })
            .collect();
        let walked = (|| -> std::io::Result<()> {
            let mut first_w = 0;
            while first_w < pages && !shared.stop.load(Ordering::Relaxed) {
                let wn = TABLE_WINDOW_PAGES.min(pages - first_w);
                let table = read_table_window(&image.pages, eb, first_w, wn)?;
                let is_data = |p: u64| {
                    let i = (p - first_w) as usize * eb;
                    table[i..i + eb].iter().any(|&b| b != 0)
                };
                let (mut p, end_w) = (first_w, first_w + wn);
                while p < end_w {
                    if !is_data(p) {
                        p += 1;
                        continue;
                    }
                    let first = p;
                    while p < end_w && p - first < READ_RUN_BYTES / PAGE_BYTES as u64 && is_data(p)
                    {
                        p += 1;
                    }
                    let i = (first - first_w) as usize * eb;
                    let entries = table[i..(p - first_w) as usize * eb].to_vec();
                    if tx.send((first, p - first, entries)).is_err() {
                        return Ok(());
                    }
                }
                first_w = end_w;
            }
            Ok(())
        })();
        drop(tx);
        let mut bad = Vec::new();
        let mut first_error = walked.err().map(|e| io_err("read", tpath.clone())(e));
        for w in workers {
            let (b, e) = w.join().expect("a load worker panicked");
            bad.extend(b);
            if first_error.is_none() {
                first_error = e.map(|e| load_error(&ipath, e));
            }
        }
        (bad, first_error)
    });
    bad.sort_unstable_by_key(|b| b.0);
    if let Some((page, detail)) = bad.first().filter(|_| !force) {
        return Err(Error::CorruptImage {
            path: ipath,
            page: *page,
            offset: page * PAGE_BYTES as u64,
            detail: detail.clone(),
        });
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    report.image_data_bytes = shared.loaded_bytes.load(Ordering::Relaxed);
    report.forced_bad_page_count = bad.len() as u64;
    report.forced_bad_pages = bad.iter().take(1000).map(|b| b.0).collect();
    Ok(())
}
