//! The sync engine: make a destination tree equal to a source tree, safely.
//!
//! Used three ways: RAM → disk (the periodic sync; `durable`), disk → RAM
//! (filling a fresh tmpfs at add and restore; not durable: it is RAM), and
//! stale RAM → a recovery copy.
//!
//! # Invariant (durable mode)
//!
//! At every instant, each path of the destination is either in its state
//! before this sync or in its state after it: a file is never truncated,
//! half written or missing while it exists in both, and a new directory
//! appears only with all of its content. Deletions happen last, so data
//! moved from `a/x` to `b/x` exists at least once at any time.
//!
//! # Steps
//!
//! ```text
//! 1 walk   compare src and dst entry by entry (type, size, mtime ns, mode,
//!          owner, xattrs, symlink target, hard-link structure); for each
//!          difference write the new version under a temporary name
//!          (".ramd-tmp.<pid>.<n>") next to its final name; a new directory is
//!          built whole under one temporary name; copies keep holes
//! 2 barrier  data of every temporary is durable (fsync each; syncfs once
//!          when more than PER_FILE_FSYNC_MAX files changed)
//! 3 rename every temporary over its final name (RENAME_EXCHANGE when a
//!          directory and a non-directory swap); fsync the directories
//! 4 delete entries gone from src: a directory is first renamed to
//!          ".ramd-del.<pid>.<n>" (it disappears at once), then removed
//! 5 attributes of directories whose content or attributes changed,
//!          deepest first (renames changed their mtimes); fsync them
//! ```
//!
//! A crash leaves at most some `.ramd-tmp.*` / `.ramd-del.*` entries, which
//! the next sync deletes (they are not in src) and which copies into RAM
//! skip. Such names are reserved: a source entry named like that is not
//! synced.
//!
//! # Entries written on disk behind the RAM copy
//!
//! A program that had the directory open before it went into RAM (its
//! working directory, a directory or file fd) keeps writing to the on-disk
//! copy. What it writes is in no RAM copy, and must not be lost.
//! [`sync_tree_known`] takes the [`Known`] set: the relative paths the
//! destination held when the directory went into RAM, then those each sync
//! left there, with a [`Fingerprint`] (inode, size, mtime) of each
//! non-directory as ramd left it. Then:
//!
//! - a destination-only entry is deleted only when it is known; an unknown
//!   one (created behind the RAM copy) is kept;
//! - a destination file about to be replaced that is unknown or whose
//!   fingerprint changed (written behind the RAM copy) first gets a second
//!   name, `<name>.ramd-conflict-<unix s>`, by a hard link: the source's
//!   version takes the name, the other version stays, and a program still
//!   writing through its fd keeps writing to it there; an unknown
//!   directory where the source has a non-directory is renamed there.
//!
//! Both are listed in [`SyncReport::conflicts`]; kept entries at every sync
//! until someone moves or deletes them (a conflict name is itself an
//! unknown entry). Internal names (`.ramd-tmp.*`, `.ramd-del.*`) are always
//! deleted. Without a `Known` set (fills, recovery copies) none of this
//! applies.
//!
//! # Files that change while being copied
//!
//! The source file is `fstat`ed before and after its copy; a change of size,
//! mtime or ctime means the copy may be torn: it is thrown away and retried
//! (`retries` times), then left for the next sync and listed in
//! [`SyncReport::changed_during_sync`] (the destination keeps the previous
//! version). Timestamps may be coarse (a jiffy on older kernels), so a file
//! whose ctime is within `hot_window` of the copy is also re-read and
//! compared by checksum before its copy is accepted.
//!
//! Limits: a program writing through a shared `mmap` does not update mtime
//! on tmpfs, so such writes are only noticed once something else changes the
//! file (as with rsync).

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::meta::{self, Kind, Meta, Xattrs};

/// Prefix of temporary names a sync writes before renaming into place.
pub const TMP_PREFIX: &str = ".ramd-tmp.";
/// Prefix of directories being deleted.
pub const DEL_PREFIX: &str = ".ramd-del.";

/// Up to this many changed files are fsynced one by one; past it, one
/// `syncfs` of the destination filesystem is cheaper (each fsync on ext4 is
/// a journal commit).
pub const PER_FILE_FSYNC_MAX: u64 = 64;

/// True for names the sync itself creates (never synced from a source).
pub fn is_internal_name(name: &OsStr) -> bool {
    let b = name.as_bytes();
    b.starts_with(TMP_PREFIX.as_bytes()) || b.starts_with(DEL_PREFIX.as_bytes())
}

/// What a non-directory looked like when ramd last left it in the
/// destination (inode, size, mtime): a different one was written by
/// someone else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint {
    pub ino: u64,
    pub size: u64,
    pub mtime: (i64, i64),
}

impl Fingerprint {
    /// The fingerprint of a non-directory (None for directories).
    pub fn of(m: &Meta) -> Option<Fingerprint> {
        (m.kind != Kind::Dir).then_some(Fingerprint {
            ino: m.dev_ino.1,
            size: m.size,
            mtime: m.mtime,
        })
    }

    const BYTES: usize = 32;

    fn encode(fp: Option<Fingerprint>, out: &mut Vec<u8>) {
        let f = fp.unwrap_or(Fingerprint {
            ino: u64::MAX,
            size: u64::MAX,
            mtime: (i64::MIN, i64::MIN),
        });
        out.extend_from_slice(&f.ino.to_le_bytes());
        out.extend_from_slice(&f.size.to_le_bytes());
        out.extend_from_slice(&f.mtime.0.to_le_bytes());
        out.extend_from_slice(&f.mtime.1.to_le_bytes());
    }

    fn decode(b: &[u8]) -> Option<Fingerprint> {
        let n = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        let f = Fingerprint {
            ino: n(0),
            size: n(1),
            mtime: (n(2) as i64, n(3) as i64),
        };
        (f.mtime.0 != i64::MIN).then_some(f)
    }
}

/// Relative paths a destination is known to hold because ramd put them
/// there (or they were there when the directory went into RAM), each with
/// the [`Fingerprint`] of what ramd left (None: a directory, or not
/// known). Keys are 64-bit FNV-1a hashes of the path bytes: a million
/// entries take about 50 MiB and collide with odds of 1 in 10^7.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Known(HashMap<u64, Option<Fingerprint>>);

impl Known {
    fn hash(rel: &Path) -> u64 {
        rel.as_os_str()
            .as_bytes()
            .iter()
            .fold(0xcbf2_9ce4_8422_2325, |h, b| {
                (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
            })
    }

    /// Adds a relative path and what is there (None: a directory, or
    /// unknown).
    pub fn insert(&mut self, rel: &Path, fp: Option<Fingerprint>) {
        self.0.insert(Self::hash(rel), fp);
    }

    /// True when `rel` is known.
    pub fn contains(&self, rel: &Path) -> bool {
        self.0.contains_key(&Self::hash(rel))
    }

    /// True when the destination entry `dm` at `rel` is not what ramd left
    /// there: `rel` is unknown, or its fingerprint differs.
    fn changed_behind(&self, rel: &Path, dm: &Meta) -> bool {
        match self.0.get(&Self::hash(rel)) {
            None => true,
            Some(None) => false,
            Some(Some(fp)) => Fingerprint::of(dm) != Some(*fp),
        }
    }

    /// How many paths are known.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when no path is known.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every entry below `root` (internal names left out), with
    /// fingerprints when `fingerprints` (else None: no change detection).
    pub fn of_tree(root: &Path, fingerprints: bool) -> io::Result<Known> {
        let mut k = Known::default();
        let mut stack = vec![PathBuf::new()];
        while let Some(rel) = stack.pop() {
            for ent in std::fs::read_dir(root.join(&rel))? {
                let ent = ent?;
                let name = ent.file_name();
                if is_internal_name(&name) {
                    continue;
                }
                let r = rel.join(&name);
                let fp = match fingerprints {
                    true => match Meta::lstat(&ent.path()) {
                        Ok(m) => Fingerprint::of(&m),
                        Err(e) if is_not_found(&e) => continue,
                        Err(e) => return Err(e),
                    },
                    false => None,
                };
                k.insert(&r, fp);
                if ent.file_type()?.is_dir() {
                    stack.push(r);
                }
            }
        }
        Ok(k)
    }

    /// Writes the set to `path` (little-endian records; runtime use only).
    pub fn save(&self, path: &Path) -> io::Result<()> {
        let mut bytes = Vec::with_capacity(self.0.len() * (8 + Fingerprint::BYTES));
        for (h, fp) in &self.0 {
            bytes.extend_from_slice(&h.to_le_bytes());
            Fingerprint::encode(*fp, &mut bytes);
        }
        std::fs::write(path, bytes)
    }

    /// Reads a set [`Known::save`] wrote.
    pub fn load(path: &Path) -> io::Result<Known> {
        let bytes = std::fs::read(path)?;
        let rec = 8 + Fingerprint::BYTES;
        if bytes.len() % rec != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "torn known-entries file",
            ));
        }
        Ok(Known(
            bytes
                .chunks_exact(rec)
                .map(|c| {
                    let h = u64::from_le_bytes(c[..8].try_into().expect("8 bytes"));
                    (h, Fingerprint::decode(&c[8..]))
                })
                .collect(),
        ))
    }
}

/// How a sync runs.
#[derive(Debug, Clone)]
pub struct SyncOptions {
    /// Make the destination durable (fsync / syncfs barriers between the
    /// steps). Off when the destination is RAM.
    pub durable: bool,
    /// How often a file that changes while being copied is tried again
    /// before it is left for the next sync.
    pub retries: u32,
    /// A file changed this recently is re-read and compared by checksum
    /// after its copy (timestamps can be too coarse to show a change).
    pub hot_window: Duration,
}

impl Default for SyncOptions {
    fn default() -> Self {
        SyncOptions {
            durable: true,
            retries: 3,
            hot_window: Duration::from_secs(1),
        }
    }
}

impl SyncOptions {
    /// Options for filling RAM (no durability barriers).
    pub fn to_ram() -> Self {
        SyncOptions {
            durable: false,
            ..SyncOptions::default()
        }
    }
}

/// What a sync did.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SyncReport {
    /// Entries of the source looked at.
    pub entries_scanned: u64,
    /// Entries found equal and left alone.
    pub unchanged: u64,
    /// Regular files copied.
    pub files_copied: u64,
    /// Data bytes written (holes excluded).
    pub bytes_copied: u64,
    /// Hard links made to share an inode like the source does.
    pub links_made: u64,
    /// Symlinks, fifos, sockets and device nodes created.
    pub specials_made: u64,
    /// Directories created.
    pub dirs_created: u64,
    /// Destination entries removed because the source no longer has them.
    pub entries_deleted: u64,
    /// Directories whose attributes were set.
    pub dir_attrs_set: u64,
    /// Extended attributes the destination filesystem refused (unsupported).
    pub xattrs_dropped: u64,
    /// Copies thrown away because the file changed during the copy.
    pub retries: u64,
    /// Files (relative paths) that kept changing: the destination keeps their
    /// previous version; the next sync tries again.
    pub changed_during_sync: Vec<PathBuf>,
    /// Destination-only entries (relative paths) that appeared there after
    /// the directory went into RAM (written by programs that had it open
    /// before): kept, not deleted. See the module docs.
    #[serde(default)]
    pub conflicts: Vec<PathBuf>,
    /// Wall time of the sync.
    pub duration_ms: u64,
}

impl SyncReport {
    /// True when every file was synced (none left for the next sync).
    pub fn complete(&self) -> bool {
        self.changed_during_sync.is_empty()
    }
}

/// Why a sync failed. The destination is still consistent per file: only
/// whole temporaries were renamed into place, and the ones not yet renamed
/// are removed.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// cannot read the source
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    /// cannot write the destination
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: io::Error },
    /// the destination filesystem is full
    #[error("no space left writing {path}: free space on its filesystem and sync again (files not yet replaced keep their previous version)")]
    NoSpace { path: PathBuf },
    /// a root is not a directory
    #[error("{path} is not a directory")]
    NotADirectory { path: PathBuf },
}

fn rd(path: &Path) -> impl FnOnce(io::Error) -> SyncError + '_ {
    move |source| SyncError::Read {
        path: path.to_path_buf(),
        source,
    }
}

fn wr(path: &Path) -> impl FnOnce(io::Error) -> SyncError + '_ {
    move |source| {
        if source.raw_os_error() == Some(libc::ENOSPC)
            || source.raw_os_error() == Some(libc::EDQUOT)
        {
            SyncError::NoSpace {
                path: path.to_path_buf(),
            }
        } else {
            SyncError::Write {
                path: path.to_path_buf(),
                source,
            }
        }
    }
}

fn is_not_found(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR))
}

/// Makes `dst` (an existing directory) equal to `src`. See the module docs.
pub fn sync_tree(src: &Path, dst: &Path, opts: &SyncOptions) -> Result<SyncReport, SyncError> {
    sync_tree_known(src, dst, opts, None).map(|(r, _)| r)
}

/// What a sync saw, for the next one's [`Known`].
#[derive(Debug, Default)]
pub struct Seen {
    /// The source's entries, with their fingerprints as listed (what a
    /// fill from disk found on disk).
    pub src: Known,
    /// The destination's entries that came from the source, with their
    /// fingerprints after the sync (what a sync to disk left there).
    pub dst: Known,
}

/// [`sync_tree`] that, given `known`, deletes a destination-only entry
/// only when it is known, and moves a destination file that is not what
/// ramd left there aside before replacing it (see the module docs). The
/// caller replaces `known` with [`Seen::dst`] after a success; after a
/// failure once renames began, `known` has been updated here with what
/// was put in place, so the next sync does not take ramd's own writes for
/// someone else's.
pub fn sync_tree_known(
    src: &Path,
    dst: &Path,
    opts: &SyncOptions,
    known: Option<&mut Known>,
) -> Result<(SyncReport, Seen), SyncError> {
    let start = Instant::now();
    let src_meta = Meta::lstat(src).map_err(rd(src))?;
    if src_meta.kind != Kind::Dir {
        return Err(SyncError::NotADirectory { path: src.into() });
    }
    let dst_meta = Meta::lstat(dst).map_err(rd(dst))?;
    if dst_meta.kind != Kind::Dir {
        return Err(SyncError::NotADirectory { path: dst.into() });
    }
    let mut e = Engine {
        opts,
        dst_root: dst.to_path_buf(),
        report: SyncReport::default(),
        temps: Vec::new(),
        renames: Vec::new(),
        deletes: Vec::new(),
        dir_attrs: Vec::new(),
        links: HashMap::new(),
        deferred_files: 0,
        seq: 0,
        known,
        seen: Seen::default(),
        pending_fp: Vec::new(),
    };
    let result = e.run(src, dst, &src_meta, &dst_meta);
    if result.is_err() {
        e.cleanup_temps();
        e.remember_what_was_placed();
    }
    result?;
    e.report.duration_ms = start.elapsed().as_millis() as u64;
    Ok((e.report, e.seen))
}

/// A temporary to rename over its final name.
struct Rename {
    from: PathBuf,
    to: PathBuf,
    /// The final name holds a directory and the new entry is not one, or
    /// the reverse: swap them atomically, then delete `from` (the old one).
    exchange: bool,
}

/// Where the copy of a hard-linked source inode lives during this sync.
struct LinkLeader {
    /// Path of the destination inode to link further names to (a temporary
    /// or a final name; valid until the renames).
    path: PathBuf,
    /// The destination inode when an unchanged one was kept: names already
    /// linked to it need nothing.
    kept_dev_ino: Option<(u64, u64)>,
}

struct Engine<'a> {
    opts: &'a SyncOptions,
    /// Destination root: its filesystem gets the `syncfs` barriers.
    dst_root: PathBuf,
    report: SyncReport,
    /// Temporaries not yet renamed, removed if the sync fails.
    temps: Vec<PathBuf>,
    /// Step 3 work.
    renames: Vec<Rename>,
    /// Step 4 work.
    deletes: Vec<PathBuf>,
    /// Step 5 work, deepest directories first.
    dir_attrs: Vec<(PathBuf, Meta, Xattrs)>,
    /// Source (dev, ino) of hard-linked files seen so far.
    links: HashMap<(u64, u64), LinkLeader>,
    /// Files written but not fsynced one by one (a `syncfs` covers them).
    deferred_files: u64,
    /// Counter for unique temporary names.
    seq: u64,
    /// Destination entries that came from the source (None: all of them).
    known: Option<&'a mut Known>,
    /// What this sync saw.
    seen: Seen,
    /// Non-directories whose destination fingerprint is read once they are
    /// in place (relative paths).
    pending_fp: Vec<PathBuf>,
}

/// Lists a directory: (name, lstat) sorted by name, internal names left out.
fn list_dir(dir: &Path) -> io::Result<Vec<(OsString, Meta)>> {
    let mut out = Vec::new();
    for ent in std::fs::read_dir(dir)? {
        let ent = ent?;
        let name = ent.file_name();
        match Meta::lstat(&dir.join(&name)) {
            Ok(m) => out.push((name, m)),
            // Deleted between readdir and lstat.
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(e),
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// `None` when the entry no longer exists (deleted since it was listed).
fn unless_vanished<T>(r: io::Result<T>) -> io::Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if is_not_found(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

fn fsync_path(path: &Path) -> io::Result<()> {
    File::open(path)?.sync_all()
}

impl Engine<'_> {
    fn temp_in(&mut self, dir: &Path, prefix: &str) -> PathBuf {
        self.seq += 1;
        dir.join(format!("{prefix}{}.{}", std::process::id(), self.seq))
    }

    fn run(&mut self, src: &Path, dst: &Path, sm: &Meta, dm: &Meta) -> Result<(), SyncError> {
        // Step 1.
        let changed_here = self.sync_dir(src, dst, Path::new(""))?;
        self.queue_dir_attrs(src, dst, sm, dm, changed_here)?;
        // Step 2.
        if self.deferred_files > 0 {
            self.syncfs()?;
        }
        // Step 3.
        let mut touched: Vec<PathBuf> = Vec::new();
        let renames = std::mem::take(&mut self.renames);
        self.temps.clear();
        for (i, r) in renames.iter().enumerate() {
            if let Err(e) = self.rename_into_place(r) {
                // Those not renamed yet are the temporaries to remove.
                self.temps = renames[i..].iter().map(|r| r.from.clone()).collect();
                return Err(e);
            }
            touched.push(parent_of(&r.to));
        }
        self.barrier_dirs(&mut touched)?;
        self.read_pending_fingerprints()?;
        // Step 4.
        for path in std::mem::take(&mut self.deletes) {
            self.delete(&path)?;
            touched.push(parent_of(&path));
        }
        self.barrier_dirs(&mut touched)?;
        // Step 5.
        for (path, m, x) in std::mem::take(&mut self.dir_attrs) {
            self.report.xattrs_dropped += meta::write_xattrs(&path, &x).map_err(wr(&path))?;
            meta::apply_attributes(&path, &m).map_err(wr(&path))?;
            self.report.dir_attrs_set += 1;
            touched.push(path);
        }
        self.barrier_dirs(&mut touched)
    }

    fn syncfs(&self) -> Result<(), SyncError> {
        if !self.opts.durable {
            return Ok(());
        }
        let f = File::open(&self.dst_root).map_err(wr(&self.dst_root))?;
        rustix::fs::syncfs(&f).map_err(|e| wr(&self.dst_root)(e.into()))
    }

    /// Makes the directory entries in `dirs` durable, then forgets them.
    fn barrier_dirs(&self, dirs: &mut Vec<PathBuf>) -> Result<(), SyncError> {
        dirs.sort();
        dirs.dedup();
        if self.opts.durable && !dirs.is_empty() {
            if dirs.len() as u64 > PER_FILE_FSYNC_MAX {
                self.syncfs()?;
            } else {
                for d in dirs.iter() {
                    fsync_path(d).map_err(wr(d))?;
                }
            }
        }
        dirs.clear();
        Ok(())
    }

    /// Compares one directory pair; returns true when entries directly in
    /// `dst` will change (its mtime must then be set again afterwards).
    fn sync_dir(&mut self, src: &Path, dst: &Path, rel: &Path) -> Result<bool, SyncError> {
        let src_entries = match list_dir(src) {
            Ok(v) => v,
            Err(e) if is_not_found(&e) && !rel.as_os_str().is_empty() => {
                // The directory went away while we walked: next sync.
                self.report.changed_during_sync.push(rel.to_path_buf());
                return Ok(false);
            }
            Err(e) => return Err(rd(src)(e)),
        };
        let mut dst_entries: BTreeMap<OsString, Meta> =
            list_dir(dst).map_err(rd(dst))?.into_iter().collect();
        let mut changed = false;
        for (name, sm) in src_entries {
            if is_internal_name(&name) {
                continue;
            }
            self.report.entries_scanned += 1;
            let (s, d, r) = (src.join(&name), dst.join(&name), rel.join(&name));
            self.seen.src.insert(&r, Fingerprint::of(&sm));
            let dm = dst_entries.remove(&name);
            match (sm.kind, dm) {
                (Kind::Dir, Some(dm)) if dm.kind == Kind::Dir => {
                    self.seen.dst.insert(&r, None);
                    let inner = self.sync_dir(&s, &d, &r)?;
                    self.queue_dir_attrs(&s, &d, &sm, &dm, inner)?;
                }
                (Kind::Dir, dm) => {
                    if let (Some(dm), Some(known)) = (&dm, self.known.as_deref()) {
                        if known.changed_behind(&r, dm) {
                            self.keep_aside(&d, &r, false)?;
                        }
                    }
                    let tmp = self.temp_in(dst, TMP_PREFIX);
                    std::fs::create_dir(&tmp).map_err(wr(&tmp))?;
                    self.temps.push(tmp.clone());
                    if self.fill_new_dir(&s, &tmp, &r, &sm)? {
                        self.report.dirs_created += 1;
                        self.seen.dst.insert(&r, None);
                        self.push_rename(tmp, d, dm.is_some());
                        changed = true;
                    } else {
                        std::fs::remove_dir_all(&tmp).map_err(wr(&tmp))?;
                        self.temps.retain(|t| !t.starts_with(&tmp));
                    }
                }
                (_, dm) => changed |= self.sync_nondir(&s, &d, &r, &sm, dm.as_ref())?,
            }
        }
        // What is left exists only in dst (including leftovers of a crash).
        for name in dst_entries.into_keys() {
            let r = rel.join(&name);
            if !is_internal_name(&name) && self.known.as_deref().is_some_and(|k| !k.contains(&r)) {
                // Appeared in dst after the directory went into RAM.
                self.report.conflicts.push(r);
                continue;
            }
            self.deletes.push(dst.join(name));
            changed = true;
        }
        Ok(changed)
    }

    fn push_rename(&mut self, from: PathBuf, to: PathBuf, exchange: bool) {
        if exchange {
            // After the swap the old entry sits at the temporary name.
            self.deletes.push(from.clone());
        }
        self.renames.push(Rename { from, to, exchange });
    }

    /// Queues setting a directory's attributes when they differ or when its
    /// entries change.
    fn queue_dir_attrs(
        &mut self,
        s: &Path,
        d: &Path,
        sm: &Meta,
        dm: &Meta,
        entries_change: bool,
    ) -> Result<(), SyncError> {
        let Some(sx) = unless_vanished(meta::read_xattrs(s)).map_err(rd(s))? else {
            // Gone since it was listed: the next sync removes it.
            return Ok(());
        };
        let same =
            !entries_change && sm.same_attributes(dm) && meta::read_xattrs(d).map_err(rd(d))? == sx;
        if !same {
            self.dir_attrs.push((d.to_path_buf(), sm.clone(), sx));
        }
        Ok(())
    }

    /// Fills `t` (a new, empty directory no one sees yet) with a copy of
    /// `s`. False when `s` disappeared meanwhile.
    fn fill_new_dir(&mut self, s: &Path, t: &Path, r: &Path, sm: &Meta) -> Result<bool, SyncError> {
        let entries = match list_dir(s) {
            Ok(v) => v,
            Err(e) if is_not_found(&e) => {
                self.report.changed_during_sync.push(r.to_path_buf());
                return Ok(false);
            }
            Err(e) => return Err(rd(s)(e)),
        };
        for (name, em) in entries {
            if is_internal_name(&name) {
                continue;
            }
            self.report.entries_scanned += 1;
            let (sp, tp, rp) = (s.join(&name), t.join(&name), r.join(&name));
            self.seen.src.insert(&rp, Fingerprint::of(&em));
            if em.kind == Kind::Dir {
                std::fs::create_dir(&tp).map_err(wr(&tp))?;
                if self.fill_new_dir(&sp, &tp, &rp, &em)? {
                    self.report.dirs_created += 1;
                    self.seen.dst.insert(&rp, None);
                } else {
                    std::fs::remove_dir_all(&tp).map_err(wr(&tp))?;
                }
                continue;
            }
            self.pending_fp.push(rp.clone());
            if self.link_follower(&em, &tp)? {
                continue;
            }
            self.create_copy(&sp, &tp, &rp, &em)?;
        }
        let Some(x) = unless_vanished(meta::read_xattrs(s)).map_err(rd(s))? else {
            self.report.changed_during_sync.push(r.to_path_buf());
            return Ok(false);
        };
        self.report.xattrs_dropped += meta::write_xattrs(t, &x).map_err(wr(t))?;
        meta::apply_attributes(t, sm).map_err(wr(t))?;
        Ok(true)
    }

    /// When `sm` is a further name of an inode already copied in this sync,
    /// links `at` to that copy and returns true.
    fn link_follower(&mut self, sm: &Meta, at: &Path) -> Result<bool, SyncError> {
        if sm.nlink < 2 {
            return Ok(false);
        }
        let Some(leader) = self.links.get(&sm.dev_ino) else {
            return Ok(false);
        };
        std::fs::hard_link(&leader.path, at).map_err(wr(at))?;
        self.report.links_made += 1;
        Ok(true)
    }

    /// One non-directory source entry against what dst has at that name.
    /// Returns true when the entry in dst will change.
    fn sync_nondir(
        &mut self,
        s: &Path,
        d: &Path,
        r: &Path,
        sm: &Meta,
        dm: Option<&Meta>,
    ) -> Result<bool, SyncError> {
        let mut dst_is_dir = dm.is_some_and(|m| m.kind == Kind::Dir);
        // Unchanged entries: what is there now; others: read once in place.
        if let Some(dm) = dm {
            self.seen.dst.insert(r, Fingerprint::of(dm));
        }
        self.pending_fp.push(r.to_path_buf());
        // A further name of a hard-linked inode seen earlier in this sync.
        if sm.nlink > 1 {
            if let Some(leader) = self.links.get(&sm.dev_ino) {
                if leader.kept_dev_ino.is_some() && leader.kept_dev_ino == dm.map(|m| m.dev_ino) {
                    self.report.unchanged += 1;
                    self.pending_fp.pop();
                    return Ok(false);
                }
                let leader_path = leader.path.clone();
                let tmp = self.temp_in(&parent_of(d), TMP_PREFIX);
                std::fs::hard_link(&leader_path, &tmp).map_err(wr(&tmp))?;
                self.temps.push(tmp.clone());
                self.report.links_made += 1;
                self.push_rename(tmp, d.to_path_buf(), dst_is_dir);
                return Ok(true);
            }
        }
        if let Some(dm) = dm {
            if self.unchanged(s, d, sm, dm)? {
                self.report.unchanged += 1;
                self.pending_fp.pop();
                if sm.nlink > 1 {
                    self.links.insert(
                        sm.dev_ino,
                        LinkLeader {
                            path: d.to_path_buf(),
                            kept_dev_ino: Some(dm.dev_ino),
                        },
                    );
                }
                return Ok(false);
            }
        }
        if let (Some(dm), Some(known)) = (dm, self.known.as_deref()) {
            if known.changed_behind(r, dm) {
                self.keep_aside(d, r, dst_is_dir)?;
                // A directory was moved aside: the name is free.
                dst_is_dir = false;
            }
        }
        let tmp = self.temp_in(&parent_of(d), TMP_PREFIX);
        if self.create_copy(s, &tmp, r, sm)? {
            self.push_rename(tmp, d.to_path_buf(), dst_is_dir);
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// The destination entry `d` is not what ramd left there (a program
    /// wrote it behind the RAM copy): gives it the name
    /// `<name>.ramd-conflict-<unix s>[-N]` before the source's version
    /// replaces it. A file gets it as a second name (hard link: a program
    /// still writing through an open fd keeps writing to it there); a
    /// directory (`is_dir`) is renamed there.
    fn keep_aside(&mut self, d: &Path, r: &Path, is_dir: bool) -> Result<(), SyncError> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let name = d.file_name().unwrap_or_default().to_string_lossy();
        let dir = parent_of(d);
        let mut n = 1;
        loop {
            let suffix = if n == 1 {
                String::new()
            } else {
                format!("-{n}")
            };
            let aside = dir.join(format!("{name}.ramd-conflict-{now}{suffix}"));
            let placed = if !is_dir {
                std::fs::hard_link(d, &aside)
            } else if aside.symlink_metadata().is_ok() {
                Err(io::ErrorKind::AlreadyExists.into())
            } else {
                std::fs::rename(d, &aside)
            };
            match placed {
                Ok(()) => {
                    self.report
                        .conflicts
                        .push(parent_of(r).join(aside.file_name().expect("a name")));
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < 100 => n += 1,
                Err(e) => return Err(wr(&aside)(e)),
            }
        }
    }

    /// After a failure: what the renames done so far put in place goes
    /// into `known` (best effort; the names not renamed yet still hold
    /// what was there, already kept aside when written behind the RAM
    /// copy).
    fn remember_what_was_placed(&mut self) {
        let Some(known) = self.known.as_deref_mut() else {
            return;
        };
        for (rel, fp) in self.seen.dst.0.drain() {
            known.0.insert(rel, fp);
        }
        for rel in &self.pending_fp {
            if let Ok(m) = Meta::lstat(&self.dst_root.join(rel)) {
                known.insert(rel, Fingerprint::of(&m));
            }
        }
    }

    /// Reads the destination fingerprints of the entries this sync put
    /// in place (or left, when their copy was skipped).
    fn read_pending_fingerprints(&mut self) -> Result<(), SyncError> {
        for rel in std::mem::take(&mut self.pending_fp) {
            let p = self.dst_root.join(&rel);
            match Meta::lstat(&p) {
                Ok(m) => self.seen.dst.insert(&rel, Fingerprint::of(&m)),
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(rd(&p)(e)),
            }
        }
        Ok(())
    }

    /// The cheap comparison (see [`meta`]). A source that vanished since
    /// it was listed counts as changed: the copy then finds it gone and
    /// leaves it for the next sync, as for any change during a sync.
    fn unchanged(&self, s: &Path, d: &Path, sm: &Meta, dm: &Meta) -> Result<bool, SyncError> {
        if !(sm.same_content(dm) && sm.same_attributes(dm)) {
            return Ok(false);
        }
        // A destination name linked elsewhere while the source's is not.
        if sm.nlink == 1 && dm.nlink != 1 {
            return Ok(false);
        }
        if sm.kind == Kind::Symlink {
            let Some(target) = unless_vanished(meta::read_link(s)).map_err(rd(s))? else {
                return Ok(false);
            };
            if target != meta::read_link(d).map_err(rd(d))? {
                return Ok(false);
            }
        }
        let Some(x) = unless_vanished(meta::read_xattrs(s)).map_err(rd(s))? else {
            return Ok(false);
        };
        Ok(x == meta::read_xattrs(d).map_err(rd(d))?)
    }

    /// Creates a copy of the non-directory `s` at `t` (a free name).
    /// False when `s` vanished or kept changing (left for the next sync).
    fn create_copy(&mut self, s: &Path, t: &Path, r: &Path, sm: &Meta) -> Result<bool, SyncError> {
        if sm.kind == Kind::File {
            return self.copy_file(s, t, r, sm);
        }
        let target = if sm.kind == Kind::Symlink {
            match meta::read_link(s) {
                Ok(t) => Some(t),
                Err(e) if is_not_found(&e) || e.raw_os_error() == Some(libc::EINVAL) => {
                    self.report.changed_during_sync.push(r.to_path_buf());
                    return Ok(false);
                }
                Err(e) => return Err(rd(s)(e)),
            }
        } else {
            None
        };
        let x = match meta::read_xattrs(s) {
            Ok(x) => x,
            Err(e) if is_not_found(&e) => {
                self.report.changed_during_sync.push(r.to_path_buf());
                return Ok(false);
            }
            Err(e) => return Err(rd(s)(e)),
        };
        meta::create_special(t, sm, target.as_deref()).map_err(wr(t))?;
        self.temps.push(t.to_path_buf());
        self.report.xattrs_dropped += meta::write_xattrs(t, &x).map_err(wr(t))?;
        meta::apply_attributes(t, sm).map_err(wr(t))?;
        self.report.specials_made += 1;
        Ok(true)
    }

    fn copy_file(
        &mut self,
        s: &Path,
        t: &Path,
        r: &Path,
        listed: &Meta,
    ) -> Result<bool, SyncError> {
        for attempt in 0..=self.opts.retries {
            let src = match File::options()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(s)
            {
                Ok(f) => f,
                Err(e) if is_not_found(&e) || e.raw_os_error() == Some(libc::ELOOP) => break,
                Err(e) => return Err(rd(s)(e)),
            };
            let before = Meta::fstat(&src).map_err(rd(s))?;
            if before.kind != Kind::File || (listed.nlink > 1 && before.dev_ino != listed.dev_ino) {
                break; // replaced by something else: next sync
            }
            let hot = is_recent(before.ctime, self.opts.hot_window);
            // By path: the file may be deleted since it was opened (then
            // it is a change for the next sync, not a failed one).
            let x = match meta::read_xattrs(s) {
                Ok(x) => x,
                Err(e) if is_not_found(&e) => break,
                Err(e) => return Err(rd(s)(e)),
            };
            let out = File::options()
                .write(true)
                .read(true)
                .create_new(true)
                .mode(0o600)
                .open(t)
                .map_err(wr(t))?;
            self.temps.push(t.to_path_buf());
            let (bytes, crc) = meta::copy_data(&src, &out, before.size).map_err(wr(t))?;
            let mut torn = Meta::fstat(&src).map_err(rd(s))?.changed_since(&before);
            if !torn && hot {
                torn = meta::checksum_data(&src, before.size).map_err(rd(s))? != crc
                    || Meta::fstat(&src).map_err(rd(s))?.changed_since(&before);
            }
            if torn {
                drop(out);
                std::fs::remove_file(t).map_err(wr(t))?;
                self.temps.pop();
                if attempt < self.opts.retries {
                    self.report.retries += 1;
                }
                continue;
            }
            self.report.xattrs_dropped += meta::write_xattrs(t, &x).map_err(wr(t))?;
            meta::apply_attributes(t, &before).map_err(wr(t))?;
            if self.opts.durable {
                if self.report.files_copied < PER_FILE_FSYNC_MAX {
                    out.sync_all().map_err(wr(t))?;
                } else {
                    self.deferred_files += 1;
                }
            }
            self.report.files_copied += 1;
            self.report.bytes_copied += bytes;
            if listed.nlink > 1 {
                self.links.insert(
                    listed.dev_ino,
                    LinkLeader {
                        path: t.to_path_buf(),
                        kept_dev_ino: None,
                    },
                );
            }
            return Ok(true);
        }
        self.report.changed_during_sync.push(r.to_path_buf());
        Ok(false)
    }

    fn rename_into_place(&self, r: &Rename) -> Result<(), SyncError> {
        if !r.exchange {
            return std::fs::rename(&r.from, &r.to).map_err(wr(&r.to));
        }
        match rustix::fs::renameat_with(
            rustix::fs::CWD,
            &r.from,
            rustix::fs::CWD,
            &r.to,
            rustix::fs::RenameFlags::EXCHANGE,
        ) {
            Ok(()) => Ok(()),
            Err(rustix::io::Errno::INVAL) => {
                // No RENAME_EXCHANGE here: move the old entry aside first
                // (the name is briefly absent), then rename the new one in,
                // then put the old one where the delete step expects it.
                let aside = r.from.with_extension("old");
                std::fs::rename(&r.to, &aside).map_err(wr(&r.to))?;
                std::fs::rename(&r.from, &r.to).map_err(wr(&r.to))?;
                std::fs::rename(&aside, &r.from).map_err(wr(&r.from))
            }
            Err(e) => Err(wr(&r.to)(e.into())),
        }
    }

    fn delete(&mut self, path: &Path) -> Result<(), SyncError> {
        let m = match Meta::lstat(path) {
            Ok(m) => m,
            Err(e) if is_not_found(&e) => return Ok(()),
            Err(e) => return Err(rd(path)(e)),
        };
        if m.kind == Kind::Dir {
            let is_tomb = path
                .file_name()
                .is_some_and(|n| n.as_bytes().starts_with(DEL_PREFIX.as_bytes()));
            let tomb = if is_tomb {
                path.to_path_buf()
            } else {
                let tomb = self.temp_in(&parent_of(path), DEL_PREFIX);
                std::fs::rename(path, &tomb).map_err(wr(path))?;
                tomb
            };
            std::fs::remove_dir_all(&tomb).map_err(wr(&tomb))?;
        } else {
            std::fs::remove_file(path).map_err(wr(path))?;
        }
        self.report.entries_deleted += 1;
        Ok(())
    }

    /// Removes every temporary not renamed yet (after a failure).
    fn cleanup_temps(&mut self) {
        for t in self.temps.drain(..).rev() {
            let _ = match std::fs::symlink_metadata(&t) {
                Ok(m) if m.is_dir() => std::fs::remove_dir_all(&t),
                Ok(_) => std::fs::remove_file(&t),
                Err(_) => Ok(()),
            };
        }
    }
}

fn parent_of(p: &Path) -> PathBuf {
    p.parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("/"))
}

/// True when `ctime` is within `window` of now (or in the future).
fn is_recent((sec, nsec): (i64, i64), window: Duration) -> bool {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let t = Duration::new(sec.max(0) as u64, nsec.clamp(0, 999_999_999) as u32);
    now.saturating_sub(t) <= window
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_names() {
        assert!(is_internal_name(OsStr::new(".ramd-tmp.1.2")));
        assert!(is_internal_name(OsStr::new(".ramd-del.1.2")));
        assert!(!is_internal_name(OsStr::new(".ramd")));
        assert!(!is_internal_name(OsStr::new("ramd-tmp.1")));
    }

    #[test]
    fn entries_written_behind_the_ram_copy_are_kept_as_conflicts() {
        let d = tempfile::tempdir().unwrap();
        let (src, dst) = (d.path().join("src"), d.path().join("dst"));
        for root in [&src, &dst] {
            std::fs::create_dir_all(root.join("sub")).unwrap();
            std::fs::write(root.join("both"), b"x").unwrap();
        }
        // Known entries RAM deleted, and entries written to dst behind it.
        std::fs::write(dst.join("deleted-in-ram"), b"old").unwrap();
        std::fs::create_dir_all(dst.join("gone-dir/inner")).unwrap();
        std::fs::write(dst.join("appeared"), b"new on disk").unwrap();
        std::fs::write(dst.join("sub/appeared-too"), b"new on disk").unwrap();
        std::fs::create_dir(dst.join("new-dir")).unwrap();
        std::fs::write(dst.join(".ramd-tmp.1.1"), b"leftover").unwrap();
        // The same name made on both sides, as different types.
        std::fs::create_dir(dst.join("x-dir-on-disk")).unwrap();
        std::fs::write(dst.join("x-dir-on-disk/inner"), b"disk").unwrap();
        std::fs::write(src.join("x-dir-on-disk"), b"ram file").unwrap();
        std::fs::write(dst.join("y-file-on-disk"), b"disk file").unwrap();
        std::fs::create_dir(src.join("y-file-on-disk")).unwrap();
        let mut known = Known::default();
        for p in ["sub", "deleted-in-ram", "gone-dir", "gone-dir/inner"] {
            known.insert(Path::new(p), None);
        }
        // "both" as ramd left it, then rewritten behind the RAM copy.
        let left = Meta::lstat(&dst.join("both")).unwrap();
        known.insert(Path::new("both"), Fingerprint::of(&left));
        std::fs::write(src.join("both"), b"ram").unwrap();
        std::thread::sleep(Duration::from_millis(10));
        std::fs::write(dst.join("both"), b"disk, later").unwrap();

        let opts = SyncOptions::to_ram();
        let (r, seen) = sync_tree_known(&src, &dst, &opts, Some(&mut known)).unwrap();
        let mut conflicts = r.conflicts.clone();
        conflicts.sort();
        assert_eq!(conflicts.len(), 6, "{conflicts:?}");
        let aside = |prefix: &str| {
            conflicts
                .iter()
                .find(|c| c.to_string_lossy().starts_with(prefix))
                .unwrap_or_else(|| panic!("no {prefix}* in {conflicts:?}"))
                .clone()
        };
        for kept in ["appeared", "new-dir", "sub/appeared-too"] {
            assert!(conflicts.contains(&PathBuf::from(kept)), "{conflicts:?}");
        }
        let both = aside("both.ramd-conflict-");
        assert_eq!(std::fs::read(dst.join("both")).unwrap(), b"ram");
        assert_eq!(std::fs::read(dst.join(&both)).unwrap(), b"disk, later");
        let x = aside("x-dir-on-disk.ramd-conflict-");
        assert_eq!(std::fs::read(dst.join(&x).join("inner")).unwrap(), b"disk");
        assert_eq!(
            std::fs::read(dst.join("x-dir-on-disk")).unwrap(),
            b"ram file"
        );
        let y = aside("y-file-on-disk.ramd-conflict-");
        assert_eq!(std::fs::read(dst.join(&y)).unwrap(), b"disk file");
        assert!(dst.join("y-file-on-disk").is_dir());
        // The 3 known entries, and the file swapped out for y-file-on-disk
        // (its inode lives on under the conflict name).
        assert_eq!(r.entries_deleted, 4, "{r:?}");
        assert!(!dst.join("deleted-in-ram").exists());
        assert!(!dst.join("gone-dir").exists());
        assert!(!dst.join(".ramd-tmp.1.1").exists());
        assert_eq!(std::fs::read(dst.join("appeared")).unwrap(), b"new on disk");
        let seen = seen.dst;
        assert!(seen.contains(Path::new("sub")) && !seen.contains(Path::new("appeared")));
        assert_eq!(seen.len(), 4);
        // What this sync left is known: the next one sees no new conflict.
        let both = Meta::lstat(&dst.join("both")).unwrap();
        assert!(!seen.changed_behind(Path::new("both"), &both));
        let (r, _) = sync_tree_known(&src, &dst, &opts, Some(&mut seen.clone())).unwrap();
        assert_eq!(r.conflicts.len(), 6, "only the kept entries: {r:?}");
        // Without a known set everything dst-only goes.
        let r = sync_tree(&src, &dst, &opts).unwrap();
        assert!(r.conflicts.is_empty() && !dst.join("appeared").exists());
        // Save and load.
        let f = d.path().join("known");
        seen.save(&f).unwrap();
        assert_eq!(Known::load(&f).unwrap(), seen);
    }

    #[test]
    fn recent() {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        assert!(is_recent((now.as_secs() as i64, 0), Duration::from_secs(2)));
        assert!(is_recent(
            (now.as_secs() as i64 + 100, 0),
            Duration::from_secs(1)
        ));
        assert!(!is_recent(
            (now.as_secs() as i64 - 100, 0),
            Duration::from_secs(1)
        ));
    }
}
