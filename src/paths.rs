//! Where runtime files live, resolved the same way by daemon and clients.
//!
//! Runtime dir: `$XDG_RUNTIME_DIR/ramd`, else `/run/ramd` for root, else
//! `/tmp/ramd-<uid>`. The API socket is `api.sock` and the NBD socket
//! `nbd.sock` in it. State: see [`state_dir`].
//!
//! # Invariants
//!
//! - The runtime directory is the daemon's own before any socket or lock
//!   goes into it ([`ensure_runtime_dir`]): a real directory (no symlink),
//!   owned by the daemon's user, writable by nobody else, in a parent where
//!   nobody else can rename it. One made here is mode 0700, whatever the
//!   umask. Another user's `/tmp/ramd-UID` is refused, never reused.
//! - Directories created for private data are 0700 ([`create_private_dir`]).
//! - Private files are replaced whole and atomically, never visible to
//!   others nor half written ([`replace_private_file`]).
//! - A secret the daemon is given (a key file, a credentials file, a TLS
//!   private key, a config holding an S3 secret) is refused when its group
//!   or others may read it, with the `chmod` to run, as ssh does
//!   ([`check_secret_file`]). The refusal names the path and what to run,
//!   never the file's mode or size: it may reach a caller over TCP.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The runtime directory (sockets).
pub fn runtime_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("ramd");
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    if uid == 0 {
        PathBuf::from("/run/ramd")
    } else {
        PathBuf::from(format!("/tmp/ramd-{uid}"))
    }
}

/// The default NBD unix socket.
pub fn nbd_socket() -> PathBuf {
    runtime_dir().join("nbd.sock")
}

/// The default API unix socket (the REST API the CLI talks to).
pub fn api_socket() -> PathBuf {
    runtime_dir().join("api.sock")
}

/// The default state directory (persistent drives keep their data here):
/// `$XDG_STATE_HOME/ramd`, else `/var/lib/ramd` for root, else
/// `~/.local/state/ramd`.
pub fn state_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("ramd");
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    if unsafe { libc::getuid() } == 0 {
        return PathBuf::from("/var/lib/ramd");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".local/state/ramd")
}

/// Why a directory that holds the daemon's sockets (or its state) cannot be
/// used safely.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    /// Creating it (or a missing parent) failed.
    #[error("cannot create {path}: {source}")]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    /// It (or its parent) cannot be inspected or its mode changed.
    #[error("cannot {op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// A symbolic link where a real directory must be.
    #[error("{path} is a symbolic link, not a directory: someone else may control where it points. Remove it{hint}")]
    Symlink { path: PathBuf, hint: &'static str },
    /// Something else than a directory.
    #[error("{path} is not a directory. Remove it{hint}")]
    NotDir { path: PathBuf, hint: &'static str },
    /// Another user owns it.
    #[error("{path} is owned by uid {owner}, not by this daemon's user (uid {uid}): that user could move or replace what ramd keeps there. Remove it (as its owner or root){hint}")]
    Owner {
        path: PathBuf,
        owner: u32,
        uid: u32,
        hint: &'static str,
    },
    /// Other users may create, rename or remove entries in it.
    #[error("{path} is writable by {who} (mode {mode:04o}): they could move or replace what ramd keeps there. Run `chmod go-w {path}` or remove it{hint}")]
    Writable {
        path: PathBuf,
        who: &'static str,
        mode: u32,
        hint: &'static str,
    },
}

/// What [`DirError`]s about the runtime directory suggest besides removing it.
const RUNTIME_HINT: &str = ", or set XDG_RUNTIME_DIR (or --runtime-dir) to a directory of your own";

/// The daemon's effective uid.
pub fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// "group", "others" or "group and others" for the write bits in `mode`;
/// None when neither may write.
fn writers(mode: u32) -> Option<&'static str> {
    match (mode & 0o020 != 0, mode & 0o002 != 0) {
        (false, false) => None,
        (true, false) => Some("its group"),
        (false, true) => Some("other users"),
        (true, true) => Some("its group and other users"),
    }
}

/// Creates `dir` with mode 0700 (and missing parents with 0700) when it is
/// absent; Ok(true) when this call created it. The mode is set explicitly
/// afterwards, so the umask cannot change it.
pub fn create_private_dir(dir: &Path) -> Result<bool, DirError> {
    use std::os::unix::fs::DirBuilderExt;
    let create = |source| DirError::Create {
        path: dir.to_owned(),
        source,
    };
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        if !parent.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(create)?;
        }
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(
                |source| DirError::Io {
                    op: "set the mode of",
                    path: dir.to_owned(),
                    source,
                },
            )?;
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(create(e)),
    }
}

/// Makes sure the runtime directory is the daemon's own: created with
/// mode 0700 when absent; refused when it is a symbolic link, not a
/// directory, owned by another user, or writable by its group or others,
/// and when its parent lets others rename it (writable without the sticky
/// bit). An existing directory's read bits are left as the admin set them
/// (say 0750 for a group allowed to reach the NBD socket).
pub fn ensure_runtime_dir(dir: &Path) -> Result<(), DirError> {
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        if parent.exists() {
            check_parent(parent, RUNTIME_HINT)?;
        }
    }
    create_private_dir(dir)?;
    let meta = std::fs::symlink_metadata(dir).map_err(|source| DirError::Io {
        op: "inspect",
        path: dir.to_owned(),
        source,
    })?;
    let path = dir.to_owned();
    if meta.file_type().is_symlink() {
        return Err(DirError::Symlink {
            path,
            hint: RUNTIME_HINT,
        });
    }
    check_owned_dir(&path, &meta, false, RUNTIME_HINT)
}

/// For a socket's directory the user named (`--api-socket /some/dir/x`):
/// created 0700 when absent; otherwise it must belong to the daemon's user
/// or root, and others may write in it only when it has the sticky bit (as
/// /tmp: then nobody else can rename or remove our entries).
pub fn ensure_socket_dir(dir: &Path) -> Result<(), DirError> {
    if create_private_dir(dir)? {
        return Ok(());
    }
    let meta = std::fs::metadata(dir).map_err(|source| DirError::Io {
        op: "inspect",
        path: dir.to_owned(),
        source,
    })?;
    check_owned_dir(dir, &meta, true, "")
}

/// A parent of a private directory: nobody but its owner (us or root) may
/// rename entries in it, unless the sticky bit protects them.
fn check_parent(parent: &Path, hint: &'static str) -> Result<(), DirError> {
    let meta = std::fs::metadata(parent).map_err(|source| DirError::Io {
        op: "inspect",
        path: parent.to_owned(),
        source,
    })?;
    check_owned_dir(parent, &meta, true, hint)
}

/// The shared rules: a directory, owned by us (or root when `root_ok`),
/// not writable by group or others (unless sticky when `root_ok`).
fn check_owned_dir(
    path: &Path,
    meta: &std::fs::Metadata,
    root_ok: bool,
    hint: &'static str,
) -> Result<(), DirError> {
    use std::os::unix::fs::MetadataExt;
    let path = path.to_owned();
    if !meta.is_dir() {
        return Err(DirError::NotDir { path, hint });
    }
    let uid = euid();
    if meta.uid() != uid && !(root_ok && meta.uid() == 0) {
        return Err(DirError::Owner {
            path,
            owner: meta.uid(),
            uid,
            hint,
        });
    }
    let mode = meta.mode() & 0o7777;
    let sticky = mode & 0o1000 != 0;
    match writers(mode) {
        Some(who) if !(root_ok && sticky) => Err(DirError::Writable {
            path,
            who,
            mode,
            hint,
        }),
        _ => Ok(()),
    }
}

/// What a client's refusal of the runtime directory suggests.
const CLIENT_HINT: &str = " (as its owner or root), then start the daemon again; or name the daemon's socket yourself with --api-socket or RAMD_API_SOCKET";

/// For a client about to use the default runtime directory: as the
/// daemon checks it, it must be a real directory of this user (or root)
/// that nobody else may write in. A directory another user made first
/// (`/tmp/ramd-UID` is a guessable name) would let that user put a socket
/// there and impersonate the daemon to this client. Ok when it does not
/// exist (no daemon to talk to; the connection then says so).
pub fn check_client_runtime_dir(dir: &Path) -> Result<(), DirError> {
    use std::os::unix::fs::MetadataExt;
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(DirError::Io {
                op: "inspect",
                path: dir.to_owned(),
                source,
            })
        }
    };
    let path = dir.to_owned();
    if meta.file_type().is_symlink() {
        return Err(DirError::Symlink {
            path,
            hint: CLIENT_HINT,
        });
    }
    let uid = euid();
    if meta.uid() != uid && meta.uid() != 0 {
        return Err(DirError::Owner {
            path,
            owner: meta.uid(),
            uid,
            hint: CLIENT_HINT,
        });
    }
    let mode = meta.mode() & 0o7777;
    match writers(mode) {
        Some(who) => Err(DirError::Writable {
            path,
            who,
            mode,
            hint: CLIENT_HINT,
        }),
        None if !meta.is_dir() => Err(DirError::NotDir {
            path,
            hint: CLIENT_HINT,
        }),
        None => Ok(()),
    }
}

/// A secret file that its group or other users may read.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{what} {} may be read by {who}: a secret must be readable by its owner only; run `{fix}`", path.display())]
pub struct NotPrivate {
    /// What the file is, for the message ("key file").
    pub what: &'static str,
    pub path: PathBuf,
    /// "its group", "other users" or both.
    pub who: &'static str,
    /// The command that makes it private (`chmod 600 PATH`, after a
    /// `chown` when the daemon reads another user's file).
    pub fix: String,
}

/// Refuses the secret file `path` (metadata `meta`, followed through
/// links) when group or others may read it. The fix keeps it readable by
/// the daemon: `chmod 600 PATH`, or `chown UID PATH && chmod 600 PATH`
/// when the daemon is neither root nor the file's owner (it reads the
/// file through its group or others' bits, which `chmod 600` alone would
/// take away).
pub fn check_secret_file(
    what: &'static str,
    path: &Path,
    meta: &std::fs::Metadata,
) -> Result<(), NotPrivate> {
    use std::os::unix::fs::MetadataExt;
    let who = match (meta.mode() & 0o040 != 0, meta.mode() & 0o004 != 0) {
        (false, false) => return Ok(()),
        (true, false) => "its group",
        (false, true) => "other users",
        (true, true) => "its group and other users",
    };
    let shown = shell_word(&path.display().to_string());
    let uid = euid();
    let fix = if uid == 0 || meta.uid() == uid {
        format!("chmod 600 {shown}")
    } else {
        format!("chown {uid} {shown} && chmod 600 {shown}")
    };
    Err(NotPrivate {
        what,
        path: path.to_owned(),
        who,
        fix,
    })
}

/// `text` as one word for a shell: as is when it needs no quoting, else
/// in single quotes.
fn shell_word(text: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-+:@,=%".contains(c);
    if !text.is_empty() && text.chars().all(plain) {
        return text.to_owned();
    }
    format!("'{}'", text.replace('\'', "'\\''"))
}

/// `path` made absolute against the working directory, with `.`, `..`
/// and symbolic links resolved as far as the path exists: its longest
/// existing ancestor is canonicalized and the rest appended (mount tables,
/// URIs and containment checks need the real location). As it is when it
/// cannot be made absolute (an empty path, a working directory gone).
pub fn resolve(path: &Path) -> PathBuf {
    let Ok(abs) = std::path::absolute(path) else {
        return path.to_owned();
    };
    let mut base = abs.as_path();
    let mut rest = Vec::new();
    loop {
        if let Ok(real) = std::fs::canonicalize(base) {
            let mut out = real;
            for c in rest.iter().rev() {
                match c {
                    std::path::Component::ParentDir => {
                        out.pop();
                    }
                    std::path::Component::Normal(n) => out.push(n),
                    _ => {}
                }
            }
            return out;
        }
        match (base.parent(), base.components().next_back()) {
            (Some(parent), Some(last)) => {
                rest.push(last);
                base = parent;
            }
            _ => return abs,
        }
    }
}

/// The operating system's own trees: ramd never mounts over them nor
/// inside them (an attachment with `--force`, a directory in RAM), since
/// a mount there hides or replaces what the system runs on.
pub const SYSTEM_TREES: &[&str] = &[
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/root",
    "/sbin", "/sys", "/usr", "/var/lib",
];

/// The system tree (see [`SYSTEM_TREES`]) that the resolved `path` is or
/// lies in, if any.
pub fn system_tree(path: &Path) -> Option<&'static str> {
    let real = resolve(path);
    SYSTEM_TREES.iter().copied().find(|t| real.starts_with(t))
}

/// Why a private file could not be replaced: the step, and the path it
/// failed on.
#[derive(Debug, thiserror::Error)]
#[error("cannot {op} {}: {source}", path.display())]
pub struct ReplaceError {
    pub op: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// Replaces `path` with `bytes`: a new 0600 file `PATH.tmp` beside it
/// (whatever the umask; a stale one from a crash is removed first),
/// fsync, rename over `path`, fsync of the directory. A crash leaves the
/// old file or the new one, and nobody else can read either; a failure
/// (a full disk) leaves the old file and no temporary. Writers of one
/// path must take turns (they share the temporary name). The one helper
/// for ramd's small state files (drive settings, remotes, directories in
/// RAM, tokens, bench reports).
pub fn replace_private_file(path: &Path, bytes: &[u8]) -> Result<(), ReplaceError> {
    let fail = |op: &'static str, path: &Path| {
        let path = path.to_owned();
        move |source| ReplaceError { op, path, source }
    };
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    write_private_new(&tmp, bytes)
        .and_then(|()| std::fs::rename(&tmp, path).map_err(fail("rename into", path)))
        .inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })?;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(fail("fsync", dir))
}

/// Creates `tmp` (0600, which must not exist) holding `bytes`, synced.
fn write_private_new(tmp: &Path, bytes: &[u8]) -> Result<(), ReplaceError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let fail = |op: &'static str| {
        let path = tmp.to_owned();
        move |source| ReplaceError { op, path, source }
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(tmp)
        .map_err(fail("create"))?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(fail("chmod"))?;
    f.write_all(bytes).map_err(fail("write"))?;
    f.sync_all().map_err(fail("fsync"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn runtime_dir_is_created_0700_with_its_parents() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a/b/ramd");
        ensure_runtime_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&root.path().join("a/b")), 0o700);
        // Again: an existing directory of ours is fine.
        ensure_runtime_dir(&dir).unwrap();
    }

    #[test]
    fn runtime_dir_others_can_change_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("ramd");
        std::fs::create_dir(&dir).unwrap();
        let set = |m| std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(m)).unwrap();
        set(0o777);
        let e = ensure_runtime_dir(&dir).unwrap_err();
        assert!(matches!(e, DirError::Writable { .. }), "{e}");
        assert!(e.to_string().contains("XDG_RUNTIME_DIR"), "{e}");
        set(0o1777);
        assert!(
            ensure_runtime_dir(&dir).is_err(),
            "sticky is no excuse here"
        );
        set(0o750);
        ensure_runtime_dir(&dir).unwrap();
        let link = root.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        let e = ensure_runtime_dir(&link).unwrap_err();
        assert!(matches!(e, DirError::Symlink { .. }), "{e}");
        if euid() == 0 {
            std::os::unix::fs::chown(&dir, Some(65534), None).unwrap();
            let e = ensure_runtime_dir(&dir).unwrap_err();
            assert!(matches!(e, DirError::Owner { owner: 65534, .. }), "{e}");
        }
    }

    #[test]
    fn runtime_dir_in_a_parent_others_may_rename_in_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let parent = root.path().join("open");
        std::fs::create_dir(&parent).unwrap();
        std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = ensure_runtime_dir(&parent.join("ramd")).unwrap_err();
        assert!(matches!(e, DirError::Writable { .. }), "{e}");
        // With the sticky bit (as /tmp) nobody else can rename our entry.
        std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o1777)).unwrap();
        ensure_runtime_dir(&parent.join("ramd")).unwrap();
    }

    #[test]
    fn secret_files_others_may_read_are_refused_with_the_chmod_to_run() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("my key");
        std::fs::write(&f, b"x").unwrap();
        for (m, who) in [
            (0o640, "its group"),
            (0o604, "other users"),
            (0o644, "its group and other users"),
        ] {
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(m)).unwrap();
            let e = check_secret_file("key file", &f, &std::fs::metadata(&f).unwrap()).unwrap_err();
            assert_eq!(e.who, who);
            let msg = e.to_string();
            let quoted = format!("'{}'", f.display());
            assert!(msg.contains(&format!("chmod 600 {quoted}`")), "{msg}");
            assert!(
                msg.starts_with(&format!("key file {}", f.display())),
                "{msg}"
            );
            // Never the mode: the message may reach a caller over TCP.
            assert!(!msg.contains(&format!("{m:o}")), "{msg}");
        }
        for m in [0o600, 0o400, 0o700, 0o611] {
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(m)).unwrap();
            assert_eq!(
                check_secret_file("key file", &f, &std::fs::metadata(&f).unwrap()),
                Ok(())
            );
        }
        assert_eq!(shell_word("/etc/ramd/k.pem"), "/etc/ramd/k.pem");
        assert_eq!(shell_word("/a b/it's"), "'/a b/it'\\''s'");
    }

    #[test]
    fn private_files_are_replaced_whole_and_private() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.json");
        std::fs::write(dir.path().join("state.json.tmp"), b"a crash's leftover").unwrap();
        for text in [&b"first"[..], b"second, longer"] {
            replace_private_file(&p, text).unwrap();
            assert_eq!(std::fs::read(&p).unwrap(), text);
            let mode = std::fs::metadata(&p).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary file left");
        let e = replace_private_file(&dir.path().join("no/such/file"), b"x").unwrap_err();
        assert_eq!(e.op, "create");
    }
}
