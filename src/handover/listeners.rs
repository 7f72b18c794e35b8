//! Listening sockets kept across restarts of the serving process (issue
//! 31): under a supervisor, every listener the daemon binds (NBD unix and
//! TCP, NVMe/TCP, the API's unix socket and TCP addresses) is handed to
//! the supervisor under `listen/KIND/ADDRESS`, and the next serving process
//! takes it back instead of binding again. So the socket never closes: a
//! client connecting while the serving process is dead or being replaced
//! waits in the listen queue and is accepted by the next one (bound again,
//! it would be refused for the tens of milliseconds of the gap), and a
//! port is never left for another program to take.
//!
//! Invariants: a listener is registered right after it is bound, before
//! anyone is told to connect; one taken back is still listening
//! (`SO_ACCEPTCONN`), and a unix socket's file is still there (a refused
//! start removes the files it bound; then the socket is bound again).
//! Listeners nobody took back at start (the settings changed) are
//! forgotten by [`forget_unclaimed`], so the supervisor closes them. The
//! serving process leaves socket files in place when it stops for an
//! upgrade ([`keep_socket_files`]): the next one serves the same sockets.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use super::serving;

/// The key of a listener: `listen/KIND/ADDRESS`.
pub fn key(kind: &str, address: impl std::fmt::Display) -> String {
    format!("{}{kind}/{address}", serving::LISTENER_PREFIX)
}

/// The listener a previous serving process kept under `key` when there
/// is one (and `path`, for a unix socket, still names a socket file);
/// else what `bind` makes, registered with the supervisor (if any). When
/// the bind fails while listeners nobody took back yet are kept (the
/// settings moved an address: the old socket may hold the port), those
/// are closed and the bind tried again for up to 2 s.
pub fn kept_or_bind<L, E>(
    key: &str,
    path: Option<&Path>,
    mut bind: impl FnMut() -> Result<L, E>,
) -> Result<L, E>
where
    L: From<OwnedFd> + AsFd,
{
    let Some(s) = serving::get() else {
        return bind();
    };
    if let Some((fd, file)) = s.take_listener(key) {
        if usable(fd.as_fd(), path, &file) {
            tracing::debug!(listener = %key, "listening socket kept across the restart: serving it again");
            return Ok(L::from(fd));
        }
        tracing::warn!(listener = %key, "the listening socket kept across the restart is gone (its file was removed): binding again");
    }
    let l = match bind() {
        Ok(l) => l,
        Err(e) => {
            if s.unclaimed_listeners() == 0 {
                return Err(e);
            }
            forget_unclaimed();
            let mut last = e;
            let mut bound = None;
            for _ in 0..40 {
                // The supervisor closes its copies when it reads the
                // forgets: a moment.
                std::thread::sleep(std::time::Duration::from_millis(50));
                match bind() {
                    Ok(l) => {
                        bound = Some(l);
                        break;
                    }
                    Err(e) => last = e,
                }
            }
            bound.ok_or(last)?
        }
    };
    if let Err(e) = s.put(key, &path.map(file_id).unwrap_or_default(), &[l.as_fd()]) {
        tracing::error!(listener = %key, "the supervisor could not be told about the listening socket (a restart binds it again): {e}");
    }
    Ok(l)
}

/// Still listening, and for a unix socket its file still the one it was
/// bound to (`file`: its device and inode when it was kept), not a
/// socket someone else bound there since.
fn usable(fd: BorrowedFd<'_>, path: Option<&Path>, file: &[u8]) -> bool {
    let listening = rustix::net::sockopt::socket_acceptconn(fd).unwrap_or(false);
    listening && path.map_or(true, |p| file_id(p) == file)
}

/// A unix socket file's device and inode, as the blob it is kept with
/// (empty when it is not a socket).
fn file_id(path: &Path) -> Vec<u8> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => format!("{}:{}", m.dev(), m.ino()).into_bytes(),
        _ => Vec::new(),
    }
}

/// Tells the supervisor to close the listeners nobody took back at start.
pub fn forget_unclaimed() {
    let Some(s) = serving::get() else { return };
    for key in s.drain_listeners() {
        tracing::info!(listener = %key, "a listening socket kept across the restart is no longer configured: closed");
        let _ = s.forget(&key);
    }
}

/// True while this process stops for an upgrade: its socket files are
/// the next process's (module docs).
pub fn keep_socket_files() -> bool {
    serving::get().is_some_and(|s| s.upgrading())
}
