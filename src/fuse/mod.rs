//! `ramd attach`: drives (and caches) exposed as files through FUSE, served inside the
//! daemon so I/O goes straight to the drive (no NBD hop) and the CLI
//! returns at once.
//!
//! ```text
//!  ramd attach ram0 /mnt/x ──API──► Attachments::attach
//!                                     ├ mount FUSE at /mnt/x (mount(2) as root,
//!                                     │ fusermount3 otherwise; no libfuse)
//!                                     └ threads "fuse-ram0-N", one per CPU, each on
//!                                       its own /dev/fuse clone: DriveFs serves /mnt/x/ram0
//!  losetup -f --show /mnt/x/ram0 ──► /dev/loopN ──► mkfs.ext4, mount
//! ```
//!
//! Detach unmounts first and only then forgets the attachment: an unmount
//! refused because a loop device (or a process) still uses the file is
//! reported as busy and changes nothing. Once unmounted, the kernel ends
//! the FUSE session and its threads return.
//!
//! # Invariants
//!
//! - Never over `/`; never over an existing mount point or a non-empty
//!   directory unless forced (`--force`, `force: true`): the attachment
//!   would hide what is there. The mountpoint rules are checked on the
//!   canonical path against `/proc/self/mountinfo`.
//! - ramd unmounts only what it mounted: the mount it made is recorded
//!   (mount id from mountinfo, device of the mounted root) and detach,
//!   forced deletes and shutdown unmount only when that very mount is the
//!   one the path leads to. Covered by another mount: refused. Already
//!   unmounted by someone else: the attachment is forgotten, nothing is
//!   unmounted.
//! - An attachment is listed (here and in its drive's `attachments`) from
//!   the moment its mount succeeded until it is unmounted.
//! - The `Attachments` mutex is never held while waiting on the kernel for
//!   anything but our own mount/unmount calls (which cannot depend on it).

mod fs;
pub mod metrics;
mod mount;
pub mod proto;
pub mod session;
mod uring;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;

use crate::control::drives::Drive;
use crate::dirsync::mountinfo::{self, Mount};
use crate::nbd::Export;
pub use fs::DriveFs;

/// A session's serving threads; each returns once the mount is gone.
type Threads = Vec<JoinHandle<io::Result<()>>>;

/// What can be attached: a drive or a cache, anything served as an export.
pub trait Attachable: Send + Sync {
    /// The name, which is also the file's name under the mountpoint.
    fn name(&self) -> &str;
    /// The export to serve through FUSE (None while it serves nothing, as
    /// a cache whose backing is not open).
    fn export(&self) -> Option<Arc<Export>>;
    /// Mountpoints where it is attached: kept by [`Attachments`], read by
    /// delete (refused while attached) and listings.
    fn attached_at(&self) -> &Mutex<Vec<PathBuf>>;
}

impl Attachable for Drive {
    fn name(&self) -> &str {
        &self.name
    }
    fn export(&self) -> Option<Arc<Export>> {
        Some(self.export.clone())
    }
    fn attached_at(&self) -> &Mutex<Vec<PathBuf>> {
        &self.attachments
    }
}

/// Why an attach or detach failed.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// The mountpoint is unusable.
    #[error(transparent)]
    BadMountpoint(#[from] BadMountpoint),
    /// Something is already attached there.
    #[error("drive '{}' is already attached at {}; run `ramd detach {}` first", .0.drive, .0.mountpoint.display(), .0.mountpoint.display())]
    AlreadyAttached(AttachmentInfo),
    /// No attachment has this id.
    #[error("no attachment {0} (see `ramd attach --list`)")]
    NotFound(u64),
    /// The unmount was refused: the file is in use, or something else is
    /// mounted over ours.
    #[error(transparent)]
    Busy(#[from] Busy),
    /// The kernel, fusermount3 or the system refused.
    #[error(transparent)]
    Failed(#[from] Failure),
}

/// Why a mountpoint cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum BadMountpoint {
    #[error("mountpoint {} must be an absolute path", .0.display())]
    NotAbsolute(PathBuf),
    #[error("mountpoint {}: {source}{}", .path.display(), if .source.kind() == io::ErrorKind::NotFound { "; create it first (mkdir -p)" } else { "" })]
    Unreachable { path: PathBuf, source: io::Error },
    #[error("mountpoint {} is not a directory", .0.display())]
    NotADirectory(PathBuf),
    #[error("{}: {source}", .path.display())]
    Unreadable { path: PathBuf, source: io::Error },
    #[error("refusing to attach over / (the root directory), even with force: pick an empty directory such as /mnt/NAME")]
    Root,
    #[error("refusing to attach at {} inside {tree}, which belongs to the operating system, even with force (a mount there hides what the system runs on): pick an empty directory such as /mnt/NAME", .path.display())]
    SystemTree { path: PathBuf, tree: &'static str },
    #[error("{} is already a mount point ({what}): the attachment would hide it; {FREE_HINT}", .path.display())]
    MountPoint { path: PathBuf, what: String },
    #[error("{} is not empty (it holds '{first}'): the attachment would hide its files; {FREE_HINT}", .path.display())]
    NotEmpty { path: PathBuf, first: String },
}

/// What to do about a mountpoint that is in use.
const FREE_HINT: &str = "pick an empty directory that is not a mount point (mkdir -p /mnt/NAME), \
                         or force it (--force, \"force\": true) to hide what is there until detach";

/// Why an unmount was refused.
#[derive(Debug, thiserror::Error)]
pub enum Busy {
    #[error("{} is busy: something still uses the drive's file. Unmount the filesystem on it and detach its loop device first (`losetup -j FILE` under {} shows the device; then umount it and losetup -d it)", .0.display(), .0.display())]
    InUse(PathBuf),
    #[error("something else is mounted over ramd's attachment at {} ({what}); ramd unmounts only its own mount: unmount that first (umount {})", .mountpoint.display(), .mountpoint.display())]
    Covered { mountpoint: PathBuf, what: String },
}

/// An operation the system refused.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    #[error("'{0}' is not serving now")]
    NotServing(String),
    #[error("cannot mount FUSE at {}: {source}{}", .mountpoint.display(), if is_root() { " (is /dev/fuse present?)" } else { " (is fusermount3 installed (apt-get install fuse3) and /dev/fuse usable?)" })]
    Mount {
        mountpoint: PathBuf,
        source: io::Error,
    },
    #[error("cannot start the FUSE thread: {0}")]
    Thread(#[source] io::Error),
    #[error(transparent)]
    Mountinfo(#[from] crate::dirsync::mountinfo::MountInfoError),
    #[error("mountpoint contains a NUL byte")]
    NulInPath,
    #[error("cannot unmount {}: {source}", .mountpoint.display())]
    Unmount {
        mountpoint: PathBuf,
        source: io::Error,
    },
    #[error("cannot run fusermount3: {0}")]
    Fusermount(#[source] io::Error),
    #[error("fusermount3 -u {} failed: {stderr}", .mountpoint.display())]
    FusermountFailed { mountpoint: PathBuf, stderr: String },
}

/// A live attachment as listings show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachmentInfo {
    pub id: u64,
    pub drive: String,
    pub mountpoint: PathBuf,
    /// The file to hand to losetup: `mountpoint/drive`.
    pub file: PathBuf,
    /// How the kernel's requests reach the drive.
    pub path: session::Path,
}

struct Attachment {
    info: AttachmentInfo,
    drive: Arc<dyn Attachable>,
    /// The mount we made (None when mountinfo did not show it right after
    /// mounting: it is then recognised by type, source and place).
    mount_id: Option<u64>,
    /// `st_dev` of the mounted root, seen through the mountpoint.
    dev: Option<u64>,
    /// The session's queue threads; each returns once the filesystem is
    /// unmounted.
    threads: Threads,
}

/// A session kept across a restart of the serving process (issue 31):
/// its `/dev/fuse` descriptors (every queue's: the kernel ends the
/// requests of a descriptor closed for good, not of one a keeper holds)
/// and how to recognise its mount.
pub struct KeptSession {
    pub fds: Vec<OwnedFd>,
    pub mount_id: Option<u64>,
    pub dev: Option<u64>,
}

/// Someone who keeps FUSE sessions beyond this process (a supervisor,
/// through `control::kept_attachments`). Attachments know nothing of it
/// but these calls.
pub trait SessionKeeper: Send + Sync {
    /// A new attachment's session, right after it is mounted.
    fn keep(&self, info: &AttachmentInfo, session: &KeptSession);
    /// The attachment at `mountpoint` (its mount `mount_id`) is gone
    /// (detached, unmounted).
    fn forget(&self, mountpoint: &Path, mount_id: Option<u64>);
}

/// Every attachment of the daemon.
#[derive(Default)]
pub struct Attachments {
    inner: Mutex<Inner>,
    /// Keeps the sessions across restarts, when set (once).
    keeper: std::sync::OnceLock<Arc<dyn SessionKeeper>>,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    by_id: BTreeMap<u64, Attachment>,
}

impl Inner {
    /// Refuses a mountpoint an attachment uses already.
    fn free_at(&self, mountpoint: &Path) -> Result<(), AttachError> {
        match self
            .by_id
            .values()
            .find(|a| a.info.mountpoint == mountpoint)
        {
            Some(a) => Err(AttachError::AlreadyAttached(a.info.clone())),
            None => Ok(()),
        }
    }

    /// Records a new attachment of `drive` at `mountpoint`, its mount's
    /// (id, device); returns its info.
    fn register(
        &mut self,
        drive: Arc<dyn Attachable>,
        mountpoint: &Path,
        path: session::Path,
        (mount_id, dev): (Option<u64>, Option<u64>),
        threads: Threads,
    ) -> AttachmentInfo {
        self.next_id += 1;
        let name = drive.name().to_owned();
        let info = AttachmentInfo {
            id: self.next_id,
            file: mountpoint.join(&name),
            drive: name,
            mountpoint: mountpoint.to_owned(),
            path,
        };
        drive.attached_at().lock().push(mountpoint.to_owned());
        let a = Attachment {
            info: info.clone(),
            drive,
            mount_id,
            dev,
            threads,
        };
        self.by_id.insert(info.id, a);
        info
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// True when `/etc/fuse.conf` lets users pass allow_root.
fn user_allow_other() -> bool {
    std::fs::read_to_string("/etc/fuse.conf")
        .map(|t| t.lines().any(|l| l.trim() == "user_allow_other"))
        .unwrap_or(false)
}

impl Attachments {
    pub fn new() -> Self {
        Self::default()
    }

    /// A fresh attachment id, for attachments kept elsewhere (ublk
    /// devices): ids are unique across both kinds.
    pub fn reserve_id(&self) -> u64 {
        let mut inner = self.inner.lock();
        inner.next_id += 1;
        inner.next_id
    }

    /// Every attachment, by id.
    pub fn list(&self) -> Vec<AttachmentInfo> {
        self.inner
            .lock()
            .by_id
            .values()
            .map(|a| a.info.clone())
            .collect()
    }

    /// Mounts `drive` at `mountpoint`: an existing, empty directory that
    /// is not a mount point, nor `/`; `force` allows a non-empty directory
    /// or a mount point (whose contents the attachment hides until detach).
    /// With a keeper set ([`Attachments::set_keeper`]), the session goes to
    /// it at once, for the next process ([`Attachments::resume`]).
    pub fn attach(
        &self,
        drive: Arc<dyn Attachable>,
        mountpoint: &Path,
        force: bool,
    ) -> Result<AttachmentInfo, AttachError> {
        let keeper = self.keeper.get();
        let (info, session) = self.attach_kept(drive, mountpoint, force, keeper.is_some())?;
        if let (Some(k), Some(s)) = (keeper, &session) {
            k.keep(&info, s);
        }
        Ok(info)
    }

    /// Sets who keeps the sessions (a second keeper is ignored).
    pub fn set_keeper(&self, keeper: Arc<dyn SessionKeeper>) {
        let _ = self.keeper.set(keeper);
    }

    /// Tells the keeper an attachment is gone.
    fn forget_kept(&self, a: &Attachment) {
        if let Some(k) = self.keeper.get() {
            k.forget(&a.info.mountpoint, a.mount_id);
        }
    }

    /// A kept session that will not be served again: its mount (if it is
    /// still ours, `mount_id`) is detached lazily, so nothing is left
    /// that answers ENOTCONN.
    pub fn drop_kept_mount(&self, drive: &str, mountpoint: &Path, mount_id: Option<u64>) {
        if kept_mount_there(drive, mountpoint, mount_id).unwrap_or(false) {
            let _ = unmount(mountpoint, true);
        }
    }

    /// [`Attachments::attach`]; with `keep`, also the session for a keeper
    /// ([`Attachments::resume`] in the next process).
    fn attach_kept(
        &self,
        drive: Arc<dyn Attachable>,
        mountpoint: &Path,
        force: bool,
        keep: bool,
    ) -> Result<(AttachmentInfo, Option<KeptSession>), AttachError> {
        let mountpoint = canonical_dir(mountpoint)?;
        let mut inner = self.inner.lock();
        inner.free_at(&mountpoint)?;
        check_free(&mountpoint, force)?;
        let export = drive
            .export()
            .ok_or_else(|| Failure::NotServing(drive.name().to_owned()))?;
        let mut fds = Vec::new();
        let kept = keep.then_some(&mut fds);
        let (threads, path) =
            mount_and_serve(DriveFs::new(export), &mountpoint, drive.name(), kept)?;
        let name = drive.name().to_owned();
        let source = source_of(&name);
        let mount_id = mountinfo::read().ok().and_then(|mounts| {
            mountinfo::top_mount_at(&mounts, &mountpoint)
                .filter(|m| is_ours(m, &source))
                .map(|m| m.mount_id)
        });
        // Served by the threads just started (which need no lock of ours).
        let dev = std::fs::metadata(&mountpoint).ok().map(|m| m.dev());
        let info = inner.register(drive, &mountpoint, path, (mount_id, dev), threads);
        tracing::info!(drive = %name, mountpoint = %mountpoint.display(), "attached");
        let session = keep.then_some(KeptSession { fds, mount_id, dev });
        Ok((info, session))
    }

    /// Serves again an attachment the last serving process made at
    /// `mountpoint` and a keeper kept: if its mount is still there, the
    /// kept session resumes (`session::resume`); otherwise it is refused
    /// (NotFound: nothing to serve).
    pub fn resume(
        &self,
        drive: Arc<dyn Attachable>,
        mountpoint: &Path,
        session: KeptSession,
    ) -> Result<AttachmentInfo, AttachError> {
        let export = drive
            .export()
            .ok_or_else(|| Failure::NotServing(drive.name().to_owned()))?;
        let name = drive.name().to_owned();
        if !kept_mount_there(&name, mountpoint, session.mount_id)? {
            return Err(AttachError::NotFound(0));
        }
        let mut inner = self.inner.lock();
        // Not attached again there meanwhile (over the kept one).
        inner.free_at(mountpoint)?;
        let (threads, path) = session::resume(Arc::new(DriveFs::new(export)), session.fds, &name)
            .map_err(Failure::Thread)?;
        let ids = (session.mount_id, session.dev);
        let info = inner.register(drive, mountpoint, path, ids, threads);
        tracing::info!(drive = %name, mountpoint = %mountpoint.display(), "attachment kept across a restart of the serving process: served again");
        Ok(info)
    }

    /// The attachment at `mountpoint` (canonicalized when it exists).
    pub fn find(&self, mountpoint: &Path) -> Option<AttachmentInfo> {
        let want = mountpoint
            .canonicalize()
            .unwrap_or_else(|_| mountpoint.to_owned());
        self.inner
            .lock()
            .by_id
            .values()
            .find(|a| a.info.mountpoint == want || a.info.mountpoint == mountpoint)
            .map(|a| a.info.clone())
    }

    /// Unmounts and forgets attachment `id`. A busy mount stays attached.
    pub fn detach(&self, id: u64) -> Result<AttachmentInfo, AttachError> {
        let mut inner = self.inner.lock();
        let Some(a) = inner.by_id.get(&id) else {
            return Err(AttachError::NotFound(id));
        };
        match mount_state(a)? {
            MountState::Ours => unmount(&a.info.mountpoint, false)?,
            MountState::Covered(what) => return Err(covered(a, &what)),
            MountState::Gone => tracing::warn!(
                drive = %a.info.drive,
                mountpoint = %a.info.mountpoint.display(),
                "was already unmounted (not by ramd); forgetting the attachment, unmounting nothing"
            ),
        }
        let mut a = inner.by_id.remove(&id).expect("present above");
        drop(inner);
        self.forget_kept(&a);
        finish(&mut a);
        tracing::info!(drive = %a.info.drive, mountpoint = %a.info.mountpoint.display(), "detached");
        Ok(a.info)
    }

    /// Detaches every attachment of `drive` (for a forced delete); stops at
    /// the first busy one.
    pub fn detach_drive(&self, drive: &str) -> Result<Vec<AttachmentInfo>, AttachError> {
        let ids: Vec<u64> = self
            .inner
            .lock()
            .by_id
            .values()
            .filter(|a| a.info.drive == drive)
            .map(|a| a.info.id)
            .collect();
        ids.into_iter().map(|id| self.detach(id)).collect()
    }

    /// At daemon exit: unmounts everything; a busy mount is detached lazily
    /// (it disappears from the namespace; I/O through a loop device still
    /// using it fails once the daemon has exited).
    ///
    /// With `leave_mounted` (an upgrade: the next process resumes them from
    /// what a keeper holds) nothing is unmounted.
    pub fn shutdown(&self, leave_mounted: bool) {
        let all: Vec<Attachment> = std::mem::take(&mut self.inner.lock().by_id)
            .into_values()
            .collect();
        if leave_mounted {
            // The threads answer nothing more and end with the process;
            // the keeper holds the sessions' descriptors, so the mounts
            // stay connected and the next process resumes them.
            session::freeze();
            return;
        }
        for mut a in all {
            let mp = a.info.mountpoint.clone();
            self.forget_kept(&a);
            match mount_state(&a) {
                Ok(MountState::Ours) => {}
                Ok(MountState::Gone) => {
                    finish(&mut a);
                    continue;
                }
                Ok(MountState::Covered(what)) => {
                    tracing::error!(drive = %a.info.drive, "{}; leaving it mounted", covered(&a, &what));
                    a.drive.attached_at().lock().retain(|p| p != &mp);
                    continue;
                }
                Err(e) => {
                    tracing::error!(drive = %a.info.drive, "{e}; leaving {} mounted", mp.display());
                    a.drive.attached_at().lock().retain(|p| p != &mp);
                    continue;
                }
            }
            match unmount(&mp, false) {
                Ok(()) => finish(&mut a),
                Err(e) => {
                    tracing::error!(
                        drive = %a.info.drive,
                        "{e}; detaching lazily: I/O through it fails from now on"
                    );
                    let _ = unmount(&mp, true);
                    a.drive.attached_at().lock().retain(|p| p != &mp);
                }
            }
        }
    }
}

/// Mounts at `mp` and starts the session's queue threads. Mounting
/// ourselves (mount(2) as root, fusermount3's descriptor otherwise) means
/// nothing but `unmount` here ever unmounts the path: a session that ends
/// cannot take down whatever is mounted there then (such as the mount an
/// attachment was forced over).
fn mount_and_serve(
    fs: DriveFs,
    mp: &Path,
    name: &str,
    kept: Option<&mut Vec<OwnedFd>>,
) -> Result<(Threads, session::Path), AttachError> {
    let failed = |source| Failure::Mount {
        mountpoint: mp.to_owned(),
        source,
    };
    let dev = mount::mount(mp, &source_of(name), is_root(), user_allow_other()).map_err(failed)?;
    match session::start(Arc::new(fs), dev, name, kept) {
        Ok(started) => Ok(started),
        Err(e) => {
            // The threads that started end with the mount.
            let _ = unmount(mp, true);
            Err(Failure::Thread(e).into())
        }
    }
}

/// Whether `drive`'s mount `mount_id` (any of its mounts, without one)
/// is at `mountpoint`.
fn kept_mount_there(
    drive: &str,
    mountpoint: &Path,
    mount_id: Option<u64>,
) -> Result<bool, AttachError> {
    let mounts = mountinfo::read().map_err(Failure::Mountinfo)?;
    Ok(mounts.iter().any(|m| {
        m.mount_point == mountpoint
            && is_ours(m, &source_of(drive))
            && mount_id.map_or(true, |id| id == m.mount_id)
    }))
}

/// The FUSE source (`fsname`) of `name`'s attachments.
fn source_of(name: &str) -> String {
    format!("ramd:{name}")
}

/// A FUSE mount of ours for the drive whose source is `source`.
fn is_ours(m: &Mount, source: &str) -> bool {
    m.fs_type.starts_with("fuse") && m.source == source
}

/// `mountpoint`, canonical: it must be an absolute path to a directory.
fn canonical_dir(mountpoint: &Path) -> Result<PathBuf, AttachError> {
    let path = || mountpoint.to_owned();
    if !mountpoint.is_absolute() {
        return Err(BadMountpoint::NotAbsolute(path()).into());
    }
    let meta = std::fs::metadata(mountpoint).map_err(|source| BadMountpoint::Unreachable {
        path: path(),
        source,
    })?;
    if !meta.is_dir() {
        return Err(BadMountpoint::NotADirectory(path()).into());
    }
    Ok(mountpoint
        .canonicalize()
        .map_err(|source| BadMountpoint::Unreadable {
            path: path(),
            source,
        })?)
}

/// Checks the canonical `mp` against the rules (see the module
/// invariants): not `/`; unless `force`, not a mount point and empty.
fn check_free(mp: &Path, force: bool) -> Result<(), AttachError> {
    let path = || mp.to_owned();
    let unreadable = |source| BadMountpoint::Unreadable {
        path: path(),
        source,
    };
    if mp.parent().is_none() {
        return Err(BadMountpoint::Root.into());
    }
    if let Some(tree) = crate::paths::system_tree(mp) {
        return Err(BadMountpoint::SystemTree { path: path(), tree }.into());
    }
    let meta = std::fs::metadata(mp).map_err(unreadable)?;
    if let Some(what) = mounted_at(mp, &meta)? {
        if !force {
            return Err(BadMountpoint::MountPoint { path: path(), what }.into());
        }
    }
    let mut entries = std::fs::read_dir(mp).map_err(unreadable)?;
    if let Some(first) = entries.next() {
        if !force {
            let first = first.map_or_else(
                |_| "?".into(),
                |e| e.file_name().to_string_lossy().into_owned(),
            );
            return Err(BadMountpoint::NotEmpty {
                path: path(),
                first,
            }
            .into());
        }
    }
    Ok(())
}

/// What is mounted at the canonical `mp`, if anything: from mountinfo,
/// else (a mount mountinfo cannot show) a device differing from the
/// parent's.
fn mounted_at(mp: &Path, meta: &std::fs::Metadata) -> Result<Option<String>, AttachError> {
    let mounts = mountinfo::read().map_err(Failure::Mountinfo)?;
    if let Some(m) = mountinfo::top_mount_at(&mounts, mp) {
        return Ok(Some(format!("{} from {}", m.fs_type, m.source)));
    }
    let parent_dev = mp
        .parent()
        .and_then(|p| std::fs::metadata(p).ok())
        .map(|m| m.dev());
    Ok(parent_dev
        .filter(|d| *d != meta.dev())
        .map(|_| "another filesystem".to_owned()))
}

/// Where an attachment's mount stands now.
enum MountState {
    /// Mounted, and the mountpoint leads to it: ours to unmount.
    Ours,
    /// Mounted, but something else is on top (described).
    Covered(String),
    /// Not mounted any more (someone unmounted it).
    Gone,
}

/// Finds the attachment's mount in mountinfo and checks that the path
/// leads to it.
fn mount_state(a: &Attachment) -> Result<MountState, AttachError> {
    let mp = &a.info.mountpoint;
    let source = source_of(&a.info.drive);
    let mounts = mountinfo::read().map_err(Failure::Mountinfo)?;
    let ours = mounts.iter().find(|m| {
        m.mount_point == *mp
            && is_ours(m, &source)
            && a.mount_id.map_or(true, |id| id == m.mount_id)
    });
    let Some(ours) = ours else {
        return Ok(MountState::Gone);
    };
    let top = mountinfo::top_mount_at(&mounts, mp).expect("ours is mounted there");
    if top.mount_id != ours.mount_id {
        return Ok(MountState::Covered(format!(
            "{} from {}",
            top.fs_type, top.source
        )));
    }
    // The path must lead to our root (it may not, say over a chroot).
    match (a.dev, std::fs::metadata(mp).map(|m| m.dev())) {
        (Some(want), Ok(dev)) if dev != want => Ok(MountState::Covered(
            "the path no longer leads to ramd's mount".into(),
        )),
        _ => Ok(MountState::Ours),
    }
}

/// The refusal for a mount of ours that something else covers.
fn covered(a: &Attachment, what: &str) -> AttachError {
    Busy::Covered {
        mountpoint: a.info.mountpoint.clone(),
        what: what.to_owned(),
    }
    .into()
}

/// After a successful unmount: the session ends; join it and unlist.
fn finish(a: &mut Attachment) {
    for t in a.threads.drain(..) {
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(drive = %a.info.drive, "FUSE session ended with: {e}"),
            Err(_) => tracing::error!(drive = %a.info.drive, "FUSE thread panicked"),
        }
    }
    a.drive
        .attached_at()
        .lock()
        .retain(|p| p != &a.info.mountpoint);
}

/// Unmounts a FUSE mount: umount2 as root, fusermount3 otherwise. `lazy`
/// detaches even when busy.
fn unmount(mountpoint: &Path, lazy: bool) -> Result<(), AttachError> {
    let busy = || AttachError::from(Busy::InUse(mountpoint.to_owned()));
    if is_root() {
        let c = CString::new(mountpoint.as_os_str().as_bytes()).map_err(|_| Failure::NulInPath)?;
        let flags = if lazy { libc::MNT_DETACH } else { 0 };
        // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
        if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EBUSY) => Err(busy()),
            _ => Err(Failure::Unmount {
                mountpoint: mountpoint.to_owned(),
                source: e,
            }
            .into()),
        };
    }
    let mut cmd = std::process::Command::new("fusermount3");
    cmd.arg("-u").arg("-q");
    if lazy {
        cmd.arg("-z");
    }
    let out = cmd
        .arg("--")
        .arg(mountpoint)
        .output()
        .map_err(Failure::Fusermount)?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("busy") {
        Err(busy())
    } else {
        Err(Failure::FusermountFailed {
            mountpoint: mountpoint.to_owned(),
            stderr: err.trim().to_owned(),
        }
        .into())
    }
}
