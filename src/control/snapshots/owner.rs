//! The daemon's lease owner id (`snapshot::lease`): kept in
//! `STATE_DIR/snapshot-owner` (mode 0600, 16 hex digits, made at the first
//! start), so that after a crash the restarted daemon recognises the
//! leases its killed pushes left on a remote and deletes them at once
//! instead of making prunes wait for them to go stale.
//!
//! One state directory is one daemon (the pid lock), so one id is one
//! live daemon. A copy of a state directory started elsewhere at the same
//! time would share it: delete the copy's file to give it its own.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;

use crate::snapshot::lease::LeaseOwner;

/// The file, under the state directory.
pub const OWNER_FILE: &str = "snapshot-owner";

/// Why the owner id could not be had.
#[derive(Debug, thiserror::Error)]
pub enum OwnerError {
    /// Reading or writing the file failed.
    #[error("cannot {what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// The file does not hold an id.
    #[error("{} does not hold a lease owner id ({source}): delete it and a new one is made at the next start", path.display())]
    Bad {
        path: std::path::PathBuf,
        source: crate::snapshot::lease::BadOwnerId,
    },
}

/// The owner of this state directory: read, or made and written (0600,
/// fsynced) when the file is missing.
pub fn load_or_create(state_dir: &Path) -> Result<Arc<LeaseOwner>, OwnerError> {
    let path = state_dir.join(OWNER_FILE);
    let io = |what, source| OwnerError::Io {
        what,
        path: path.clone(),
        source,
    };
    let id = match std::fs::read_to_string(&path) {
        Ok(text) => text.trim().to_owned(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = LeaseOwner::random_id();
            std::fs::create_dir_all(state_dir).map_err(|e| io("create", e))?;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(|e| io("create", e))?;
            f.write_all(format!("{id}\n").as_bytes())
                .and_then(|()| f.sync_all())
                .map_err(|e| io("write", e))?;
            id
        }
        Err(e) => return Err(io("read", e)),
    };
    LeaseOwner::new(&id)
        .map(Arc::new)
        .map_err(|source| OwnerError::Bad { path, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_id_is_made_once_and_kept_private() {
        let dir = tempfile::tempdir().unwrap();
        let a = load_or_create(dir.path()).unwrap();
        let b = load_or_create(dir.path()).unwrap();
        assert_eq!(a.id(), b.id());
        let mode = std::fs::metadata(dir.path().join(OWNER_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::write(dir.path().join(OWNER_FILE), "../etc").unwrap();
        let e = load_or_create(dir.path()).unwrap_err();
        assert!(e.to_string().contains("delete it"), "{e}");
    }
}
