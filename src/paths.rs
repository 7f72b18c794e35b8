//! Where runtime files live, resolved the same way by daemon and clients.
//!
//! Runtime dir: `$XDG_RUNTIME_DIR/ramd`, else `/run/ramd` for root, else
//! `/tmp/ramd-<uid>`. The API socket is `api.sock` and the NBD socket
//! `nbd.sock` in it. State: see [`state_dir`].

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
