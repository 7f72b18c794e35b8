//! Getting a target ready (I/O): looking at a path, creating the scratch
//! file, opening with O_DIRECT where the filesystem allows it, writing
//! the working set once (so reads read data, as fio lays out its files),
//! and undoing all of it afterwards.
//!
//! Every decision of what may be written is `target`'s; this file only
//! carries it out. Cleanup is a guard ([`Prepared`]'s drop): scratch files
//! and directories are removed, a file the user named is cut back to the
//! length it had (an empty one emptied again, one overwritten with
//! `--destructive` no longer than before), a drive is trimmed (its memory
//! given back) whether the run finished, failed or was interrupted with
//! Ctrl-C.

use std::fs::{File, OpenOptions};
use std::io::Seek;
use std::num::NonZeroU64;
use std::os::unix::fs::{DirBuilderExt, FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::engine::{AlignedBuf, EngineError};
use super::target::{
    decide_export, decide_path, working_set, ExportSpec, Kind, PathFacts, PathPlan,
};
use super::{BenchError, Progress};
use crate::api::wire::bench::BenchTarget;
use crate::block::backend::Backend;
use crate::cache::backing::nbd_client::{ClientOptions, NbdClient, NbdUri};
use crate::size::format_size;

/// `statfs` f_type of ramfs (libc lacks it).
const RAMFS_MAGIC: libc::c_long = 0x8584_58f6;

/// The kernel's pseudo-filesystems (linux/magic.h): their files are
/// controls, not storage, and `target` refuses them.
const PSEUDO_FILESYSTEMS: [(libc::c_long, &str); 14] = [
    (0x9fa0, "procfs"),
    (0x6265_6572, "sysfs"),
    (0x0027_e0eb, "cgroupfs"),
    (0x6367_7270, "cgroup2fs"),
    (0x6462_6720, "debugfs"),
    (0x7472_6163, "tracefs"),
    (0x7363_6673, "securityfs"),
    (0x6265_6570, "configfs"),
    (0xcafe_4a11, "bpffs"),
    (0xde5e_81e4, "efivarfs"),
    (0x4249_4e4d, "binfmt_misc"),
    (0x6165_676c, "pstore"),
    (0x1cd1, "devpts"),
    (0x6573_5543, "fusectl"),
];

/// How the load generator reaches a target.
#[derive(Debug, Clone)]
pub enum Access {
    /// Over NBD, one connection per job.
    Nbd(NbdUri),
    /// A file or block device, opened per job with these flags.
    File {
        path: PathBuf,
        direct: bool,
        /// io_uring works here (else pread/pwrite).
        uring: bool,
    },
}

/// Something to undo at the end.
#[derive(Debug)]
enum Undo {
    RemoveFile(PathBuf),
    RemoveDir(PathBuf),
    /// Cut a file the user named back to the length it had.
    SetLen(PathBuf, u64),
    Trim {
        uri: NbdUri,
        len: u64,
    },
}

/// A target ready to measure.
#[derive(Debug)]
pub struct Prepared {
    /// What the report says about it.
    pub info: BenchTarget,
    pub access: Access,
    /// Where the file-level test creates its files (directories only).
    pub files_dir: Option<PathBuf>,
    /// A block device held open with O_EXCL for the whole run, so nobody
    /// mounts it meanwhile (the jobs open it without O_EXCL).
    _hold: Option<File>,
    undo: Vec<Undo>,
}

impl Prepared {
    pub fn working_set_bytes(&self) -> u64 {
        self.info.working_set_bytes
    }

    /// Opens the target for one job (files and devices).
    pub fn open_file(&self) -> std::io::Result<File> {
        let Access::File { path, direct, .. } = &self.access else {
            unreachable!("open_file is for file access");
        };
        open_rw(path, *direct, false, false)
    }

    /// Undoes what `prepare` did; every failure, as text for a warning.
    pub fn finish(mut self) -> Vec<String> {
        self.undo_all()
    }

    fn undo_all(&mut self) -> Vec<String> {
        let mut failed = Vec::new();
        for u in self.undo.drain(..).rev() {
            if let Err(e) = undo(&u) {
                failed.push(format!("cleanup of {}: {e}", self.info.name));
            }
        }
        failed
    }
}

impl Drop for Prepared {
    fn drop(&mut self) {
        for w in self.undo_all() {
            eprintln!("warning: {w}");
        }
    }
}

/// Why something could not be undone.
#[derive(Debug, thiserror::Error)]
pub enum UndoError {
    #[error("cannot {what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot reach the drive to trim it: {0}")]
    Connect(#[from] crate::cache::backing::nbd_client::ClientError),
    #[error("cannot trim the drive: {0}")]
    Trim(#[from] crate::block::backend::Error),
}

fn undo(u: &Undo) -> Result<(), UndoError> {
    let io = |what, path: &Path| {
        let path = path.to_owned();
        move |source| UndoError::Io { what, path, source }
    };
    match u {
        Undo::RemoveFile(p) => std::fs::remove_file(p).map_err(io("remove", p)),
        Undo::RemoveDir(p) => std::fs::remove_dir_all(p).map_err(io("remove", p)),
        Undo::SetLen(p, len) => OpenOptions::new()
            .write(true)
            .open(p)
            .and_then(|f| f.set_len(*len))
            .map_err(io("cut back", p)),
        Undo::Trim { uri, len } => {
            let c = NbdClient::connect(uri, ClientOptions::default())?;
            Ok(c.trim(0, *len)?)
        }
    }
}

fn io_err(what: String) -> impl FnOnce(std::io::Error) -> BenchError {
    move |source| BenchError::Io { what, source }
}

/// Prepares a drive or cache: checks what may be written, fills the
/// working set.
pub fn export(
    e: &ExportSpec,
    wanted: u64,
    destructive: bool,
    progress: &dyn Progress,
) -> Result<Prepared, BenchError> {
    let ws = decide_export(e, destructive, wanted)?;
    let uri = NbdUri::parse(&e.uri)?;
    let opts = ClientOptions {
        connections: 1,
        ..ClientOptions::default()
    };
    let client = NbdClient::connect(&uri, opts)?;
    let ws =
        ws.min(client.size() / super::target::WORKING_SET_ALIGN * super::target::WORKING_SET_ALIGN);
    let mut notes = vec!["measured over the daemon's NBD socket, one connection per job (fio --ioengine=nbd measures the same path)".to_owned()];
    if e.kind == Kind::Cache {
        notes.push(
            "a cache: writes reach its backing as its mode says; reads hit RAM once cached".into(),
        );
    }
    let mut p = Prepared {
        info: BenchTarget {
            name: e.name.clone(),
            kind: e.kind.name().into(),
            path: e.uri.clone(),
            engine: "nbd".into(),
            direct_io: false,
            page_cache: false,
            working_set_bytes: ws,
            notes,
        },
        access: Access::Nbd(uri.clone()),
        files_dir: None,
        _hold: None,
        undo: Vec::new(),
    };
    if e.kind == Kind::Drive {
        // From here on, whatever happens, the drive is trimmed: all of it
        // when it held nothing (the store may have committed zero pages
        // ahead of the sequential prefill, past the working set), else
        // what the bench overwrote.
        let len = if e.allocated_bytes == 0 {
            client.size()
        } else {
            ws
        };
        p.undo.push(Undo::Trim { uri, len });
    }
    progress.phase(&format!(
        "preparing {}: writing {}",
        e.name,
        format_size(ws)
    ));
    let buf = AlignedBuf::new(1 << 20, 0xf111);
    let mut at = 0;
    while at < ws {
        client
            .write(at, buf.as_slice(), false)
            .map_err(|source| BenchError::Prefill {
                target: e.name.clone(),
                source,
            })?;
        at += 1 << 20;
    }
    Ok(p)
}

/// What is at `path`.
pub fn facts(path: &Path) -> Result<PathFacts, BenchError> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let parent = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            if let Some(fs) = pseudo_filesystem(parent) {
                return Ok(PathFacts::Pseudo(fs));
            }
            return Ok(PathFacts::Missing);
        }
        Err(e) => return Err(io_err(format!("look at {}", path.display()))(e)),
    };
    if let Some(fs) = pseudo_filesystem(path) {
        return Ok(PathFacts::Pseudo(fs));
    }
    let t = meta.file_type();
    Ok(if t.is_file() {
        PathFacts::File { len: meta.len() }
    } else if t.is_dir() {
        PathFacts::Directory
    } else if t.is_block_device() {
        PathFacts::BlockDevice
    } else if t.is_char_device() {
        PathFacts::Other("character device")
    } else if t.is_fifo() {
        PathFacts::Other("FIFO")
    } else if t.is_socket() {
        PathFacts::Other("socket")
    } else {
        PathFacts::Other("special file")
    })
}

/// The pseudo-filesystem `path` is on, if it is on one (`statfs`
/// follows symlinks, as the rest of the bench does).
fn pseudo_filesystem(path: &Path) -> Option<&'static str> {
    let f_type = rustix::fs::statfs(path).ok()?.f_type;
    PSEUDO_FILESYSTEMS
        .iter()
        .find(|(magic, _)| *magic == f_type as libc::c_long)
        .map(|(_, name)| *name)
}

/// Prepares a file, directory or block device.
pub fn path(
    path: &Path,
    wanted: u64,
    destructive: bool,
    progress: &dyn Progress,
) -> Result<Prepared, BenchError> {
    let facts = facts(path)?;
    let plan = decide_path(path, facts, destructive)?;
    let name = path.display().to_string();
    let len = match facts {
        PathFacts::File { len } => len,
        _ => 0,
    };
    let (kind, file_path, mut undo) = match plan {
        PathPlan::EmptyFile | PathPlan::Overwrite => (
            Kind::File,
            path.to_owned(),
            vec![Undo::SetLen(path.to_owned(), len)],
        ),
        PathPlan::BlockDevice => (Kind::BlockDevice, path.to_owned(), vec![]),
        PathPlan::Directory => {
            let scratch = path.join(format!(".ramd-bench-{}.tmp", std::process::id()));
            (Kind::Directory, scratch, vec![])
        }
    };
    let create = plan == PathPlan::Directory;
    let (file, direct) = open_probing(&file_path, create, kind == Kind::BlockDevice)?;
    if create {
        undo.push(Undo::RemoveFile(file_path.clone()));
    }
    let mut p = Prepared {
        info: BenchTarget {
            name: name.clone(),
            kind: kind.name().into(),
            path: file_path.display().to_string(),
            engine: String::new(),
            direct_io: direct,
            page_cache: !direct,
            working_set_bytes: 0,
            notes: Vec::new(),
        },
        access: Access::File {
            path: file_path.clone(),
            direct,
            uring: false,
        },
        files_dir: None,
        _hold: None,
        undo,
    };
    if kind == Kind::Directory {
        let dir = path.join(format!(".ramd-bench-{}.d", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(io_err(format!("create {}", dir.display())))?;
        p.undo.push(Undo::RemoveDir(dir.clone()));
        p.files_dir = Some(dir);
    }
    let room = if kind == Kind::BlockDevice {
        let mut f = &file;
        f.seek(std::io::SeekFrom::End(0))
            .map_err(io_err(format!("size of {name}")))?
    } else {
        u64::MAX
    };
    let ws = working_set(&name, wanted, room)?;
    p.info.working_set_bytes = ws;
    describe(&mut p, &file_path);
    if kind == Kind::BlockDevice {
        p._hold = Some(file);
    } else {
        progress.phase(&format!("preparing {name}: writing {}", format_size(ws)));
        prefill(&file, ws, direct).map_err(io_err(format!(
            "write the working set of {name} ({})",
            file_path.display()
        )))?;
    }
    Ok(p)
}

/// Opens read-write with O_DIRECT, or without it where the filesystem
/// refuses it (EINVAL); `(file, direct)`.
fn open_probing(path: &Path, create: bool, exclusive: bool) -> Result<(File, bool), BenchError> {
    let what = || format!("open {}", path.display());
    match open_rw(path, true, create, exclusive) {
        Ok(f) => Ok((f, true)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            let f = open_rw(path, false, create, exclusive).map_err(io_err(what()))?;
            Ok((f, false))
        }
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Err(BenchError::Io {
            what: format!("{} is in use (mounted, or opened exclusively by another program): ramd bench does not write under a filesystem", path.display()),
            source: e,
        }),
        Err(e) => Err(io_err(what())(e)),
    }
}

/// `create`: a new file (O_EXCL: never one that appeared meanwhile),
/// mode 0600. `exclusive`: O_EXCL on a block device (refused while
/// mounted).
fn open_rw(path: &Path, direct: bool, create: bool, exclusive: bool) -> std::io::Result<File> {
    let mut flags = 0;
    if direct {
        flags |= libc::O_DIRECT;
    }
    if exclusive {
        flags |= libc::O_EXCL;
    }
    let mut o = OpenOptions::new();
    o.read(true).write(true).custom_flags(flags);
    if create {
        o.create_new(true).mode(0o600);
    }
    let f = o.open(path);
    if create && direct && matches!(&f, Err(e) if e.raw_os_error() == Some(libc::EINVAL)) {
        // The file was created before O_DIRECT was refused: remove it so
        // the retry without O_DIRECT can create it again.
        let _ = std::fs::remove_file(path);
    }
    f
}

/// The engine and the notes a reader needs: io_uring or not, O_DIRECT or
/// the page cache, tmpfs.
fn describe(p: &mut Prepared, path: &Path) {
    let uring = io_uring::IoUring::new(2);
    let Access::File {
        uring: u, direct, ..
    } = &mut p.access
    else {
        unreachable!("describe is for file access");
    };
    *u = uring.is_ok();
    let direct = *direct;
    p.info.engine = if *u { "io_uring" } else { "psync" }.into();
    if let Err(e) = uring {
        p.info.notes.push(format!("io_uring is not available ({e}): pread/pwrite, one I/O in flight per job, whatever the test's depth"));
    }
    let in_ram =
        rustix::fs::statfs(path).map(|s| s.f_type == libc::TMPFS_MAGIC || s.f_type == RAMFS_MAGIC);
    if matches!(in_ram, Ok(true)) {
        p.info.page_cache = true;
        p.info.notes.push(
            "tmpfs: the data lives in RAM (the page cache), there is no device behind it".into(),
        );
    }
    if !direct {
        p.info.notes.push("O_DIRECT is refused here: I/O goes through the page cache, so reads may be served from memory and writes return before they reach the device".into());
    }
    if p.files_dir.is_some() {
        p.info.notes.push("the file-level test goes through the page cache on every filesystem (no O_DIRECT, no fsync, as a build does)".into());
    }
}

/// Writes the working set once (random data, 1 MiB at a time), makes it
/// durable, and drops it from the page cache so the first reads do not
/// find it there.
fn prefill(file: &File, len: u64, direct: bool) -> std::io::Result<()> {
    let buf = AlignedBuf::new(1 << 20, 0xf111);
    let mut at = 0;
    while at < len {
        file.write_all_at(buf.as_slice(), at)?;
        at += 1 << 20;
    }
    file.sync_all()?;
    if !direct {
        rustix::fs::fadvise(file, 0, NonZeroU64::new(len), rustix::fs::Advice::DontNeed)?;
    }
    Ok(())
}

/// An engine error with the target and test it happened in.
pub fn engine_error(target: &str, test: &str, source: EngineError) -> BenchError {
    BenchError::Engine {
        target: target.to_owned(),
        test: test.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_own_files_are_pseudo() {
        // Only looked at (stat, statfs): nothing here is written.
        for (path, fs) in [
            ("/proc/self/comm", "procfs"),
            ("/proc/sysrq-trigger", "procfs"),
            ("/proc/no-such-ramd-file", "procfs"),
            ("/sys/kernel", "sysfs"),
        ] {
            assert_eq!(
                facts(Path::new(path)).unwrap(),
                PathFacts::Pseudo(fs),
                "{path}"
            );
        }
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(facts(dir.path()).unwrap(), PathFacts::Directory);
        assert_eq!(facts(&dir.path().join("new")).unwrap(), PathFacts::Missing);
    }

    #[test]
    fn named_files_get_their_length_back() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data.bin");
        std::fs::write(&data, b"precious data").unwrap();
        let empty = dir.path().join("empty.img");
        std::fs::write(&empty, b"").unwrap();
        let ws = super::super::target::MIN_WORKING_SET_BYTES;
        for (p, len) in [(&data, 13), (&empty, 0)] {
            let prepared = path(p, ws, true, &super::super::Quiet).unwrap();
            assert_eq!(std::fs::metadata(p).unwrap().len(), ws, "the working set");
            assert!(prepared.finish().is_empty());
            assert_eq!(std::fs::metadata(p).unwrap().len(), len, "{}", p.display());
        }
        // Dropped (Ctrl-C, a failed test) rather than finished: the same.
        drop(path(&data, ws, true, &super::super::Quiet).unwrap());
        assert_eq!(std::fs::metadata(&data).unwrap().len(), 13);
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 2, "no scratch file left");
    }
}
