//! What a cache can sit in front of, chosen by a backing spec string:
//!
//! ```text
//!   nbd://HOST[:PORT]/EXPORT                 remote NBD export   (nbd_client)
//!   nbd+unix:///EXPORT?socket=PATH           local NBD export    (nbd_client)
//!   nbds://HOST[:PORT]/EXPORT?tls-certificates=DIR           the same over TLS
//!   nbds+unix:///EXPORT?socket=PATH&tls-certificates=DIR     (CA, client cert)
//!   /dev/sdb, /dev/loop3, ...                block device        (file.rs, O_DIRECT optional)
//!   /var/lib/big.img                         regular file        (file.rs)
//! ```
//!
//! Every backing is a [`Backend`], so the cache also runs over any other
//! backend (a RAM store, or the test double `sim::MemBacking` that can
//! fail on demand and simulate a crash that loses unflushed writes).

pub mod file;
pub mod nbd_client;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::{BackingErrorKind, CacheError};
use crate::block::backend::{check_range, Backend, Caps, Extent};
pub use file::FileBacking;
use nbd_client::{ClientError, ClientOptions, NbdClient, NbdUri};

/// What a plain backing (a file, a block device, the test memory) can do:
/// everything but extents (it reports all data) and CACHE.
pub(crate) const PLAIN_CAPS: Caps = Caps {
    can_trim: true,
    can_zero: true,
    can_fast_zero: false,
    can_fua: true,
    can_flush: true,
    can_multi_conn: true,
    can_extents: false,
    can_cache: false,
    direct_io: false,
    // What frontends split large writes by for a cache (its block size
    // is at most this, and divides it).
    piece_bytes: 64 * 1024,
};

/// The extents of a backing that does not track holes: one data extent
/// over the whole range, after checking it against `size`.
pub(crate) fn all_data(
    offset: u64,
    len: u64,
    size: u64,
) -> crate::block::backend::Result<Vec<Extent>> {
    check_range(offset, len, size)?;
    Ok(vec![Extent {
        len,
        hole: false,
        zero: false,
    }])
}

/// A parsed backing spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackingSpec {
    /// A remote or local NBD export.
    Nbd(NbdUri),
    /// A regular file or a block device.
    Path(PathBuf),
}

impl BackingSpec {
    pub fn parse(spec: &str) -> Result<BackingSpec, CacheError> {
        if spec.is_empty() {
            return Err(CacheError::Backing {
                spec: spec.into(),
                message: "empty: give a file, a block device or an NBD URI".into(),
                kind: BackingErrorKind::Invalid,
            });
        }
        if NbdUri::is_uri(spec) {
            return NbdUri::parse(spec)
                .map(BackingSpec::Nbd)
                .map_err(|e| CacheError::Backing {
                    spec: spec.into(),
                    message: e.to_string(),
                    kind: BackingErrorKind::Invalid,
                });
        }
        Ok(BackingSpec::Path(PathBuf::from(spec)))
    }
}

/// How to open a backing.
#[derive(Debug, Clone)]
pub struct BackingOptions {
    /// Open files and block devices with O_DIRECT (bypass the host's page
    /// cache: the RAM cache is the cache).
    pub direct_io: bool,
    /// Most connections to an NBD server that allows multi-conn.
    pub nbd_connections: usize,
    /// Limit for each NBD socket operation (a hung server gives EIO).
    pub nbd_timeout: Duration,
}

impl Default for BackingOptions {
    fn default() -> Self {
        BackingOptions {
            direct_io: false,
            nbd_connections: 4,
            nbd_timeout: Duration::from_secs(30),
        }
    }
}

/// Opens the backing `spec` names. The backing must be writable.
pub fn open_backing(spec: &str, opts: &BackingOptions) -> Result<Arc<dyn Backend>, CacheError> {
    let err = |message: String, kind| CacheError::Backing {
        spec: spec.into(),
        message,
        kind,
    };
    match BackingSpec::parse(spec)? {
        BackingSpec::Nbd(uri) => {
            let client = NbdClient::connect(
                &uri,
                ClientOptions {
                    connections: opts.nbd_connections,
                    timeout: opts.nbd_timeout,
                },
            )
            .map_err(|e| {
                let kind = match &e {
                    // The URI, the certificates or the server's TLS
                    // setup must change: trying again will not help.
                    ClientError::BadUri { .. }
                    | ClientError::Refused { .. }
                    | ClientError::TlsUnsupported { .. }
                    | ClientError::TlsRequired { .. }
                    | ClientError::CertificateNotTrusted { .. }
                    | ClientError::WrongHostName { .. }
                    | ClientError::ClientCertificateRefused { .. }
                    | ClientError::TlsFiles { .. } => BackingErrorKind::Invalid,
                    ClientError::Connect { .. }
                    | ClientError::Protocol { .. }
                    | ClientError::Tls { .. } => BackingErrorKind::Unreachable,
                };
                err(e.to_string(), kind)
            })?;
            if client.is_read_only() {
                return Err(err(
                    "the NBD export is read-only; a cache needs a writable backing".into(),
                    BackingErrorKind::Invalid,
                ));
            }
            Ok(Arc::new(client))
        }
        BackingSpec::Path(p) => Ok(Arc::new(FileBacking::open(&p, opts.direct_io).map_err(
            |e| {
                let errno = e
                    .get_ref()
                    .and_then(|i| i.downcast_ref::<file::OpenFailure>())
                    .and_then(|f| f.errno);
                let kind = match errno {
                    Some(libc::EBUSY) => BackingErrorKind::Busy,
                    Some(
                        libc::ENOENT
                        | libc::ENOTDIR
                        | libc::EACCES
                        | libc::EPERM
                        | libc::EISDIR
                        | libc::EROFS
                        | libc::EINVAL
                        | libc::ENXIO
                        | libc::ENODEV,
                    ) => BackingErrorKind::Invalid,
                    // Not a file or device, O_DIRECT misfit: our own checks.
                    None if e.kind() == std::io::ErrorKind::InvalidInput => {
                        BackingErrorKind::Invalid
                    }
                    _ => BackingErrorKind::Unreachable,
                };
                err(e.to_string(), kind)
            },
        )?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse() {
        assert!(matches!(
            BackingSpec::parse("nbd+unix:///x?socket=/s").unwrap(),
            BackingSpec::Nbd(_)
        ));
        assert_eq!(
            BackingSpec::parse("/dev/sdb").unwrap(),
            BackingSpec::Path("/dev/sdb".into())
        );
        assert!(matches!(
            BackingSpec::parse("nbds://h/x?tls-certificates=/etc/ramd/pki").unwrap(),
            BackingSpec::Nbd(NbdUri { tls: Some(_), .. })
        ));
        let e = BackingSpec::parse("nbds://h/x").unwrap_err().to_string();
        assert!(e.contains("tls-certificates=DIR"), "{e}");
        assert!(BackingSpec::parse("nbd://").is_err());
        assert!(BackingSpec::parse("").is_err());
    }

    #[test]
    fn missing_file_is_a_clear_error() {
        let e = open_backing("/nonexistent/ramd-test.img", &BackingOptions::default())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("/nonexistent/ramd-test.img"), "{e}");
        assert!(e.contains("No such file"), "{e}");
    }
}
