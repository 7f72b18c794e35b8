//! Mounting: the RAM copy at PATH and the private views the daemon uses.
//!
//! Per managed directory the daemon keeps a runtime directory (on /run, so
//! it vanishes at reboot, like the mounts in it):
//!
//! ```text
//! <run>/dirs/<id>/
//!   disk/    private, non-recursive bind mount of the directory as it is on
//!            disk (what PATH shows when nothing is mounted on it): the sync
//!            target and the overlay's lower dir. Made by binding PATH's
//!            parent (non-recursive, so not whatever covers PATH) to parent/
//!            and binding parent/<name> from there.
//!   ram/     the tmpfs (source "ramd-dir:<id>", size=limit). tmpfs mode:
//!            its root is the RAM copy, bound onto PATH. overlay mode: it
//!            holds upper/ and work/.
//!   view/    overlay mode only: private bind of the overlay mounted at PATH,
//!            the sync source (not followed into anything mounted below PATH)
//!   handover a clean stop left the mounts to the next daemon (see recovery)
//!   known    with handover: the entries the on-disk copy holds from RAM
//!            (see sync::Known), so the next daemon keeps telling them from
//!            entries written to the disk copy behind the RAM copy
//! ```
//!
//! The on-disk copy itself stays where it always was: at PATH, under the
//! mount. After a crash or reboot, PATH simply shows it again; nothing has
//! to be moved back. Views are made private so that mounting on PATH (a
//! shared mount under systemd) does not propagate into them.

use std::io;
use std::path::{Path, PathBuf};

use rustix::mount::{MountFlags, MountPropagationFlags, UnmountFlags};

use super::mountinfo;

/// Mount source tag of our tmpfs and overlay mounts, followed by the id.
pub const SOURCE_PREFIX: &str = "ramd-dir:";

/// Mounting errors. Each names the mount point and what to do.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// a mount operation failed
    #[error("cannot {what} at {target}: {source}")]
    Failed {
        what: &'static str,
        target: PathBuf,
        source: io::Error,
    },
    /// the mount point is in use
    #[error("{target} is busy: processes have files open there (see `fuser -vm {target}`); close them and retry")]
    Busy { target: PathBuf },
    /// reading the mount table failed
    #[error(transparent)]
    MountInfo(#[from] mountinfo::MountInfoError),
}

/// How the RAM copy is mounted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MountMode {
    /// A tmpfs filled with a copy of the directory: reads and writes never
    /// touch the disk; needs RAM for the whole content.
    Tmpfs,
    /// overlayfs: the on-disk copy as lower dir, a tmpfs upper: adding is
    /// instant and RAM holds only what was written since.
    Overlay,
}

/// Paths of one directory's runtime files.
#[derive(Debug, Clone)]
pub struct Layout {
    /// `<run>/dirs/<id>`.
    pub base: PathBuf,
    /// The mount source tag (`ramd-dir:<id>`).
    pub tag: String,
}

impl Layout {
    /// The layout for `id` under `run_dirs` (`<run>/dirs`).
    pub fn new(run_dirs: &Path, id: &str) -> Layout {
        Layout {
            base: run_dirs.join(id),
            tag: format!("{SOURCE_PREFIX}{id}"),
        }
    }
    pub fn disk(&self) -> PathBuf {
        self.base.join("disk")
    }
    pub fn parent_view(&self) -> PathBuf {
        self.base.join("parent")
    }
    pub fn ram(&self) -> PathBuf {
        self.base.join("ram")
    }
    pub fn upper(&self) -> PathBuf {
        self.base.join("ram/upper")
    }
    pub fn work(&self) -> PathBuf {
        self.base.join("ram/work")
    }
    pub fn view(&self) -> PathBuf {
        self.base.join("view")
    }
    pub fn stale_view(&self) -> PathBuf {
        self.base.join("stale")
    }
    pub fn handover(&self) -> PathBuf {
        self.base.join("handover")
    }
    /// The known-entries set a handover leaves for the next daemon.
    pub fn known(&self) -> PathBuf {
        self.base.join("known")
    }
}

fn failed<'a>(
    what: &'static str,
    target: &'a Path,
) -> impl FnOnce(rustix::io::Errno) -> MountError + 'a {
    move |e| MountError::Failed {
        what,
        target: target.to_path_buf(),
        source: e.into(),
    }
}

/// Creates `dir` (and parents) with mode 0700 when missing.
pub fn ensure_dir(dir: &Path) -> Result<(), MountError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| MountError::Failed {
            what: "create directory",
            target: dir.to_path_buf(),
            source: e,
        })
}

/// Bind-mounts `src` (non-recursively) at `target` and makes it private.
pub fn bind_private(src: &Path, target: &Path) -> Result<(), MountError> {
    ensure_dir(target)?;
    rustix::mount::mount_bind(src, target).map_err(failed("bind-mount", target))?;
    if let Err(e) = rustix::mount::mount_change(target, MountPropagationFlags::PRIVATE) {
        let _ = rustix::mount::unmount(target, UnmountFlags::DETACH);
        return Err(failed("make private", target)(e));
    }
    Ok(())
}

/// Bind-mounts `src` at `target` keeping the default propagation (used for
/// PATH itself, which other mount namespaces should see).
pub fn bind(src: &Path, target: &Path) -> Result<(), MountError> {
    rustix::mount::mount_bind(src, target).map_err(failed("bind-mount", target))
}

/// Mounts a tmpfs tagged `tag` at `target`.
pub fn mount_tmpfs(
    target: &Path,
    tag: &str,
    size_limit_bytes: Option<u64>,
    root_mode: u32,
) -> Result<(), MountError> {
    ensure_dir(target)?;
    let mut opts = format!("mode={:o}", root_mode & 0o7777);
    if let Some(size) = size_limit_bytes {
        // tmpfs rounds up to pages; size=0 would mean unlimited.
        opts.push_str(&format!(",size={}", size.max(4096)));
    }
    let data = std::ffi::CString::new(opts).expect("no NUL in options");
    rustix::mount::mount(tag, target, "tmpfs", MountFlags::empty(), data.as_c_str())
        .map_err(failed("mount tmpfs", target))
}

/// Changes the size limit of the tmpfs at `target` (None: the kernel
/// default, half of RAM). The kernel refuses (EINVAL) a size below what the
/// tmpfs holds.
pub fn resize_tmpfs(target: &Path, size_limit_bytes: Option<u64>) -> Result<(), MountError> {
    let opts = match size_limit_bytes {
        Some(size) => format!("size={}", size.max(4096)),
        None => "size=50%".to_string(),
    };
    let data = std::ffi::CString::new(opts).expect("no NUL in options");
    // A plain remount: per-mount flags become the (empty) flags given,
    // which is how mount_tmpfs mounted it.
    rustix::mount::mount_remount(target, MountFlags::empty(), data.as_c_str())
        .map_err(failed("resize tmpfs", target))
}

/// Escapes a path for an overlayfs option value (`,` `:` `\` are special).
fn overlay_escape(p: &Path) -> String {
    let mut s = String::new();
    for c in p.to_string_lossy().chars() {
        if matches!(c, ',' | ':' | '\\') {
            s.push('\\');
        }
        s.push(c);
    }
    s
}

/// Mounts an overlay at `target`: `lower` read-only below, `upper` and
/// `work` (same filesystem) above. Redirects, metacopy and the inode index
/// are off: the lower dir is a plain directory we also write to. `xino=on`
/// makes inode numbers consistent across layers, so hard links made in RAM
/// to files from the disk show the same inode under every name (without it
/// the names of such a link report different inodes and a sync could not
/// see that they are linked).
pub fn mount_overlay(
    target: &Path,
    tag: &str,
    lower: &Path,
    upper: &Path,
    work: &Path,
) -> Result<(), MountError> {
    let opts = format!(
        "lowerdir={},upperdir={},workdir={},redirect_dir=off,index=off,metacopy=off,xino=on",
        overlay_escape(lower),
        overlay_escape(upper),
        overlay_escape(work)
    );
    let data = std::ffi::CString::new(opts).expect("no NUL in options");
    rustix::mount::mount(tag, target, "overlay", MountFlags::empty(), data.as_c_str())
        .map_err(failed("mount overlay", target))
}

/// Makes the mount at `target` read-only (this mount only). Fails with
/// [`MountError::Busy`] while files are open for writing through it.
pub fn remount_read_only(target: &Path) -> Result<(), MountError> {
    match rustix::mount::mount_remount(target, MountFlags::BIND | MountFlags::RDONLY, "") {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::BUSY) => Err(MountError::Busy {
            target: target.to_path_buf(),
        }),
        Err(e) => Err(failed("remount read-only", target)(e)),
    }
}

/// Makes the mount at `target` writable again (undoes [`remount_read_only`]).
pub fn remount_read_write(target: &Path) -> Result<(), MountError> {
    rustix::mount::mount_remount(target, MountFlags::BIND, "")
        .map_err(failed("remount read-write", target))
}

/// Unmounts the top mount at `target`; with `lazy`, detaches it even while
/// busy (it goes away when the last user closes its files).
pub fn unmount(target: &Path, lazy: bool) -> Result<(), MountError> {
    let flags = if lazy {
        UnmountFlags::DETACH
    } else {
        UnmountFlags::empty()
    };
    match rustix::mount::unmount(target, flags | UnmountFlags::NOFOLLOW) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::BUSY) => Err(MountError::Busy {
            target: target.to_path_buf(),
        }),
        Err(e) => Err(failed("unmount", target)(e)),
    }
}

/// Detaches every mount at or below `path` (deepest first). Used to clean
/// up our own runtime views; returns how many it detached.
pub fn detach_all_under(path: &Path) -> Result<usize, MountError> {
    let mounts = mountinfo::read()?;
    let under = mountinfo::mounts_under(&mounts, path);
    for m in &under {
        let _ = rustix::mount::unmount(
            &m.mount_point,
            UnmountFlags::DETACH | UnmountFlags::NOFOLLOW,
        );
    }
    Ok(under.len())
}

/// True when something is mounted exactly at `path`.
pub fn is_mount_point(path: &Path) -> Result<bool, MountError> {
    Ok(mountinfo::top_mount_at(&mountinfo::read()?, path).is_some())
}

/// The top mount at `path` when it carries `tag` (one of ours).
pub fn our_mount_at(path: &Path, tag: &str) -> Result<Option<mountinfo::Mount>, MountError> {
    let mounts = mountinfo::read()?;
    Ok(mountinfo::top_mount_at(&mounts, path)
        .filter(|m| m.source == tag)
        .cloned())
}

/// Makes `layout.disk()` a private view of the directory at `path` as it is
/// on disk, even when something is mounted on `path`. Returns the opened
/// directory (for the lock) once the view exists.
pub fn attach_disk_view(path: &Path, layout: &Layout) -> Result<std::fs::File, MountError> {
    let parent = path.parent().unwrap_or(Path::new("/"));
    let name = path.file_name().ok_or_else(|| MountError::Failed {
        what: "find the on-disk directory",
        target: path.to_path_buf(),
        source: io::Error::from(io::ErrorKind::InvalidInput),
    })?;
    let pv = layout.parent_view();
    bind_private(parent, &pv)?;
    let result = (|| {
        let under = pv.join(name);
        let dir = std::fs::File::open(&under).map_err(|e| MountError::Failed {
            what: "open the on-disk directory",
            target: path.to_path_buf(),
            source: e,
        })?;
        bind_private(&under, &layout.disk())?;
        Ok(dir)
    })();
    let _ = unmount(&pv, true);
    let _ = std::fs::remove_dir(&pv);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlay_escapes_specials() {
        assert_eq!(overlay_escape(Path::new("/a,b:c\\d")), "/a\\,b\\:c\\\\d");
    }

    #[test]
    fn layout_paths() {
        let l = Layout::new(Path::new("/run/ramd/dirs"), "cache-0a1b2c3d");
        assert_eq!(l.disk(), Path::new("/run/ramd/dirs/cache-0a1b2c3d/disk"));
        assert_eq!(l.tag, "ramd-dir:cache-0a1b2c3d");
        assert_eq!(
            l.upper(),
            Path::new("/run/ramd/dirs/cache-0a1b2c3d/ram/upper")
        );
    }
}
