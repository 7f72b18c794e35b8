//! File modes in the state directory: drive data is private to the
//! daemon's user.
//!
//! # Invariants
//!
//! - After [`secure_state_dir`] succeeds, the state directory, everything
//!   under `drives/` (each drive's directory, image, journal, meta,
//!   `drive.json`, temporary files), under `cache-rescue/` and `bench/`,
//!   and the snapshot lease owner id `snapshot-owner` are owned by
//!   the daemon's user, directories at most 0700 and files at most 0600.
//!   What was wider is narrowed (group and other bits cleared) with a WARN
//!   naming the path; something owned by another user refuses the start,
//!   as that user could read or change a drive behind the daemon's back.
//! - Files and directories the daemon creates later get those modes at
//!   creation (`persist::DirStorage`), whatever the umask.
//! - Symbolic links inside are left alone (never followed, never changed);
//!   the state directory itself may be one (an admin's choice of disk).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::paths::{create_private_dir, euid, DirError};

/// The state directory's parts whose modes are checked (others, such as
/// `dirs/`, belong to their own features; the 0700 state directory covers
/// them too).
const CHECKED: [&str; 4] = ["drives", "cache-rescue", "bench", "snapshot-owner"];

/// Why the state directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StateModeError {
    /// The state directory could not be created.
    #[error(transparent)]
    Dir(#[from] DirError),
    /// Another user owns a part of it.
    #[error("{path} is owned by uid {owner}, not by this daemon's user (uid {uid}): that user could read or change drive data behind ramd's back, so ramd does not start. Give it back (chown -R {uid} {path}) or move it out of the state directory")]
    Foreign { path: PathBuf, owner: u32, uid: u32 },
    /// A path could not be inspected or its mode changed.
    #[error("cannot {op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Creates the state directory (0700) when absent, then checks and
/// narrows the modes under it; see the module invariants. Returns the
/// paths whose mode was narrowed (each also logged).
pub fn secure_state_dir(state_dir: &Path) -> Result<Vec<PathBuf>, StateModeError> {
    create_private_dir(state_dir)?;
    let mut fixed = Vec::new();
    let meta = std::fs::metadata(state_dir).map_err(io("inspect", state_dir))?;
    fix_one(state_dir, &meta, &mut fixed)?;
    for part in CHECKED {
        fix_tree(&state_dir.join(part), &mut fixed)?;
    }
    Ok(fixed)
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StateModeError {
    let path = path.to_owned();
    move |source| StateModeError::Io { op, path, source }
}

/// `path` and, for a directory, everything below it; symlinks skipped.
fn fix_tree(path: &Path, fixed: &mut Vec<PathBuf>) -> Result<(), StateModeError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io("inspect", path)(e)),
    };
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    fix_one(path, &meta, fixed)?;
    if meta.is_dir() {
        for entry in std::fs::read_dir(path).map_err(io("list", path))? {
            let entry = entry.map_err(io("list", path))?;
            fix_tree(&entry.path(), fixed)?;
        }
    }
    Ok(())
}

/// Refuses another user's `path`; clears group and other bits of ours.
fn fix_one(
    path: &Path,
    meta: &std::fs::Metadata,
    fixed: &mut Vec<PathBuf>,
) -> Result<(), StateModeError> {
    let uid = euid();
    if meta.uid() != uid {
        return Err(StateModeError::Foreign {
            path: path.to_owned(),
            owner: meta.uid(),
            uid,
        });
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 == 0 {
        return Ok(());
    }
    let narrowed = mode & 0o700;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(narrowed))
        .map_err(io("set the mode of", path))?;
    tracing::warn!(
        "{} was open to other users (mode {mode:04o}); narrowed to {narrowed:04o}: drive data is private to the daemon's user",
        path.display()
    );
    fixed.push(path.to_owned());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn creates_a_private_state_dir_and_narrows_wide_modes() {
        let root = tempfile::tempdir().unwrap();
        let state = root.path().join("a/state");
        assert!(secure_state_dir(&state).unwrap().is_empty());
        assert_eq!(mode(&state), 0o700);
        assert_eq!(mode(&root.path().join("a")), 0o700);
        let drive = state.join("drives/db");
        std::fs::create_dir_all(&drive).unwrap();
        std::fs::write(drive.join("image"), b"secret").unwrap();
        let set = |p: &Path, m| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m));
        set(&state, 0o755).unwrap();
        set(&state.join("drives"), 0o755).unwrap();
        set(&drive, 0o750).unwrap();
        set(&drive.join("image"), 0o644).unwrap();
        // A symlink inside is neither followed nor changed.
        let outside = root.path().join("outside");
        std::fs::write(&outside, b"x").unwrap();
        set(&outside, 0o644).unwrap();
        std::os::unix::fs::symlink(&outside, drive.join("link")).unwrap();
        let fixed = secure_state_dir(&state).unwrap();
        assert_eq!(fixed.len(), 4, "{fixed:?}");
        assert_eq!(mode(&state), 0o700);
        assert_eq!(mode(&state.join("drives")), 0o700);
        assert_eq!(mode(&drive), 0o700);
        assert_eq!(mode(&drive.join("image")), 0o600);
        assert_eq!(mode(&outside), 0o644);
        assert!(secure_state_dir(&state).unwrap().is_empty());
    }

    #[test]
    fn another_users_drive_dir_is_refused() {
        if euid() != 0 {
            return; // chown needs root
        }
        let root = tempfile::tempdir().unwrap();
        let drive = root.path().join("drives/db");
        std::fs::create_dir_all(&drive).unwrap();
        std::os::unix::fs::chown(&drive, Some(65534), None).unwrap();
        let e = secure_state_dir(root.path()).unwrap_err();
        assert!(
            matches!(e, StateModeError::Foreign { owner: 65534, .. }),
            "{e}"
        );
        assert!(e.to_string().contains(&drive.display().to_string()), "{e}");
    }
}
