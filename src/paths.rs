//! Where runtime files live, resolved the same way by daemon and clients.
//!
//! Runtime dir: `$XDG_RUNTIME_DIR/ramd`, else `/run/ramd` for root, else
//! `/tmp/ramd-<uid>`.

use std::path::PathBuf;

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
