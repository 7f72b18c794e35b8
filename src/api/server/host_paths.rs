//! Host paths and hosts named in requests (mountpoints, cache backings,
//! key and credentials files, NBD backing hosts): the one place that
//! checks them before a route uses them, by who asked.
//!
//! Invariants:
//! - Every path a route passes on is absolute. The daemon's working
//!   directory is not the client's, so a relative path would name another
//!   file than the one meant: 422 `relative_path`. (The `ramd` CLI makes
//!   every path absolute before it sends it.)
//! - A request's rights depend on where it came from. Over the unix
//!   socket, the peer is a local user whom the socket's permissions let
//!   in, and its uid decides (today's rights). Over TCP (the API and the
//!   dashboard) a bearer token is not a local shell: host paths only
//!   inside the directories of `[api] allowed_paths`, NBD backing hosts
//!   only those of `[api] allowed_backing_hosts` (default: none), 403
//!   `path_not_allowed` / `host_not_allowed` naming the setting otherwise.
//!   Paths are resolved (symbolic links and `..`) before the containment
//!   check, so a link inside an allowed directory cannot lead out of it.
//! - A cache's backing file or device belongs to the daemon's user or to
//!   the requesting unix peer, and is not reached through a symbolic link
//!   another user owns: a backing is read (and snapshotted) with the
//!   daemon's rights, so it must be one the caller could read anyway.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use axum::extract::connect_info::Connected;
use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::serve::IncomingStream;

use super::auth::Caller;
use super::error::ApiError;
use crate::cache::backing::nbd_client::Address;
use crate::cache::backing::BackingSpec;
use crate::control::config::ApiPolicy;

/// Who is calling, from the API socket (`SO_PEERCRED`).
#[derive(Debug, Clone, Copy)]
pub struct Peer {
    /// The caller's uid; None when the kernel did not say.
    pub uid: Option<u32>,
}

impl Connected<IncomingStream<'_, tokio::net::UnixListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, tokio::net::UnixListener>) -> Self {
        Peer {
            uid: stream.io().peer_cred().ok().map(|c| c.uid()),
        }
    }
}

/// Who sent a request: a peer of the unix socket (its uid, when the
/// kernel said), or a token holder over TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requester {
    Unix { uid: Option<u32> },
    Tcp,
}

impl<S: Send + Sync> FromRequestParts<S> for Requester {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        // The TCP routers authenticate every request and leave the token
        // here; the unix router never does.
        if parts.extensions.get::<Caller>().is_some() {
            return Ok(Requester::Tcp);
        }
        let uid = parts
            .extensions
            .get::<ConnectInfo<Peer>>()
            .and_then(|c| c.0.uid);
        Ok(Requester::Unix { uid })
    }
}

/// The path `text` given as `field`, when absolute.
pub(crate) fn absolute(field: &str, text: &str) -> Result<PathBuf, ApiError> {
    let path = PathBuf::from(text);
    if path.is_absolute() {
        return Ok(path);
    }
    Err(ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "relative_path",
        format!(
            "{field} '{text}' is a relative path, which the daemon cannot resolve as you meant (its working directory is not yours): give an absolute path"
        ),
    ))
}

/// The host path `text` given as `field`, if `who` may name it (see the
/// module invariants).
pub(crate) fn host_path(
    policy: &ApiPolicy,
    who: Requester,
    field: &str,
    text: &str,
) -> Result<PathBuf, ApiError> {
    let path = absolute(field, text)?;
    if who == Requester::Tcp {
        let real = crate::paths::resolve(&path);
        if !policy.allowed_paths.iter().any(|a| real.starts_with(a)) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "path_not_allowed",
                format!(
                    "{field} '{text}': a request over TCP may name host paths only inside the directories the operator allowed in the daemon's config ([api] allowed_paths, now {}); use the unix socket on the daemon's host, or ask the operator to allow a directory",
                    list(&policy.allowed_paths)
                ),
            ));
        }
    }
    Ok(path)
}

/// A cache backing, if `who` may name it: an NBD URI (over TCP only to
/// allowed hosts), or a file or device by absolute path that the daemon's
/// user or the unix peer owns. (A malformed one is left to the cache's own
/// parse, which says why.)
pub(crate) fn backing(policy: &ApiPolicy, who: Requester, text: &str) -> Result<(), ApiError> {
    match BackingSpec::parse(text) {
        Ok(BackingSpec::Path(_)) => {
            let path = host_path(policy, who, "backing", text)?;
            owned_by_caller(&path, who)
        }
        Ok(BackingSpec::Nbd(uri)) => {
            // The directory of the client's key is a host path too: over
            // TCP, another directory would let a token holder borrow a
            // local user's client certificate.
            let dir = uri.tls.as_ref().and_then(|t| t.certificates.as_ref());
            if let (Some(dir), Requester::Tcp) = (dir, who) {
                host_path(policy, who, "tls-certificates", &dir.display().to_string())?;
            }
            nbd_host(policy, who, &uri.address)
        }
        Err(_) => Ok(()),
    }
}

/// An NBD backing's address, if `who` may name it.
fn nbd_host(policy: &ApiPolicy, who: Requester, address: &Address) -> Result<(), ApiError> {
    match (address, who) {
            (Address::Unix { socket }, _) => {
                host_path(policy, who, "backing socket", &socket.display().to_string()).map(drop)
            }
            (Address::Tcp { host, .. }, Requester::Tcp)
                if !policy.allowed_backing_hosts.iter().any(|h| h == host) =>
            {
                Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "host_not_allowed",
                    format!(
                        "backing host '{host}': a request over TCP may name NBD backing hosts only from the daemon's config ([api] allowed_backing_hosts, now {}); use the unix socket on the daemon's host, or ask the operator to allow it",
                        if policy.allowed_backing_hosts.is_empty() {
                            "none".to_owned()
                        } else {
                            policy.allowed_backing_hosts.join(", ")
                        }
                    ),
                ))
            }
            _ => Ok(()),
    }
}

/// A backing at `path` (not followed through a symbolic link another user
/// owns) belongs to the daemon's user or to the unix peer. A path that
/// does not exist is left to the cache's own open, which says so.
fn owned_by_caller(path: &Path, who: Requester) -> Result<(), ApiError> {
    let daemon = rustix::process::geteuid().as_raw();
    let peer = match who {
        Requester::Unix { uid } => uid,
        Requester::Tcp => None,
    };
    let ok = |uid: u32| uid == daemon || Some(uid) == peer;
    let refuse = |what: &str, uid: u32| {
        ApiError::new(
            StatusCode::FORBIDDEN,
            "backing_not_owned",
            format!(
                "backing {}: {what} belongs to uid {uid}, neither the daemon's user (uid {daemon}) nor you{}: a cache reads its backing with the daemon's rights, so it must be a file or device you own",
                path.display(),
                peer.map_or_else(String::new, |p| format!(" (uid {p})"))
            ),
        )
    };
    let Ok(link) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    if link.file_type().is_symlink() && !ok(link.uid()) {
        return Err(refuse("the symbolic link", link.uid()));
    }
    match std::fs::metadata(path) {
        Ok(m) if !ok(m.uid()) => Err(refuse("the file", m.uid())),
        _ => Ok(()),
    }
}

/// A key file named in a request (drive encryption, snapshot restore),
/// if `who` may name it. Over the unix socket the route's own check
/// (absolute, else 422 `invalid_persistence`) decides.
pub(crate) fn key_file(
    policy: &ApiPolicy,
    who: Requester,
    text: Option<&str>,
) -> Result<(), ApiError> {
    match text {
        Some(k) if !k.is_empty() && who == Requester::Tcp => {
            host_path(policy, who, "key_file", k).map(drop)
        }
        _ => Ok(()),
    }
}

/// The allowed directories, for messages.
fn list(paths: &[PathBuf]) -> String {
    if paths.is_empty() {
        return "none".to_owned();
    }
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(paths: &[&Path], hosts: &[&str]) -> ApiPolicy {
        ApiPolicy {
            allowed_paths: paths.iter().map(|p| crate::paths::resolve(p)).collect(),
            allowed_backing_hosts: hosts.iter().map(|h| h.to_string()).collect(),
        }
    }

    const LOCAL: Requester = Requester::Unix { uid: Some(0) };

    #[test]
    fn relative_paths_are_refused_with_what_to_give() {
        let e = absolute("mountpoint", "mnt/x").unwrap_err();
        assert_eq!(
            (e.status, e.code),
            (StatusCode::UNPROCESSABLE_ENTITY, "relative_path")
        );
        assert!(e.message.contains("mountpoint 'mnt/x'"), "{}", e.message);
        assert!(e.message.contains("absolute path"), "{}", e.message);
        assert_eq!(absolute("f", "/a/b").unwrap(), PathBuf::from("/a/b"));
        let p = policy(&[], &[]);
        assert!(backing(&p, LOCAL, "disk.img").is_err());
        assert!(backing(&p, LOCAL, "./disk.img").is_err());
        assert!(backing(&p, LOCAL, "/nonexistent/disk.img").is_ok());
        for uri in ["nbd://h/e", "nbds://h:1/e", "nbd+unix:///e?socket=/s"] {
            assert!(backing(&p, LOCAL, uri).is_ok(), "{uri}");
        }
    }

    #[test]
    fn over_tcp_only_allowed_directories_and_hosts() {
        let dir = tempfile::tempdir().unwrap();
        let allowed = dir.path().join("allowed");
        std::fs::create_dir(&allowed).unwrap();
        // A link inside the allowed directory that leads out of it.
        std::os::unix::fs::symlink("/etc", allowed.join("out")).unwrap();
        let p = policy(&[&allowed], &["storage1"]);
        let inside = allowed.join("disk.img");
        assert!(host_path(&p, Requester::Tcp, "f", inside.to_str().unwrap()).is_ok());
        for bad in [
            "/etc/cron.d".to_owned(),
            format!("{}/out/shadow", allowed.display()),
            format!("{}/../x", allowed.display()),
        ] {
            let e = host_path(&p, Requester::Tcp, "mountpoint", &bad).unwrap_err();
            assert_eq!(
                (e.status, e.code),
                (StatusCode::FORBIDDEN, "path_not_allowed"),
                "{bad}"
            );
            assert!(e.message.contains("[api] allowed_paths"), "{}", e.message);
            // The same path is the unix peer's to name.
            assert!(host_path(&p, LOCAL, "mountpoint", &bad).is_ok());
        }
        let e = backing(&p, Requester::Tcp, "nbd://attacker:10809/x").unwrap_err();
        assert_eq!(e.code, "host_not_allowed");
        assert!(e.message.contains("allowed_backing_hosts"), "{}", e.message);
        assert!(backing(&p, Requester::Tcp, "nbd://storage1/x").is_ok());
        assert!(backing(&p, LOCAL, "nbd://attacker/x").is_ok());
        // A client key's directory outside the allowed ones, even to an
        // allowed host.
        let e = backing(
            &p,
            Requester::Tcp,
            "nbds://storage1/x?tls-certificates=/root/.pki/libnbd",
        )
        .unwrap_err();
        assert_eq!(e.code, "path_not_allowed");
        assert!(e.message.contains("tls-certificates"), "{}", e.message);
        let inside = format!("nbds://storage1/x?tls-certificates={}", allowed.display());
        assert!(backing(&p, Requester::Tcp, &inside).is_ok());
        assert!(backing(&p, LOCAL, "nbds://h/x?tls-certificates=/root/.pki/libnbd").is_ok());
        let e = backing(&p, Requester::Tcp, "/etc/shadow").unwrap_err();
        assert_eq!(e.code, "path_not_allowed");
        let e = backing(
            &policy(&[], &[]),
            Requester::Tcp,
            "nbd+unix:///e?socket=/run/x.sock",
        )
        .unwrap_err();
        assert_eq!(e.code, "path_not_allowed");
    }
}
