//! What TLS a listener offers ([`TlsMode`]), whether clients must show a
//! certificate ([`ClientCerts`]), and the certificates themselves
//! ([`TlsSettings`]), loaded from a directory laid out like nbdkit's and
//! qemu's:
//!
//! ```text
//! DIR/ca-cert.pem      CA that signs client certificates (optional)
//! DIR/server-cert.pem  our certificate, then any intermediates
//! DIR/server-key.pem   its private key (PKCS#8, PKCS#1 or SEC1)
//! DIR/ca-crl.pem       revoked client certificates (optional)
//! ```
//!
//! `reload` builds a new rustls configuration from the directory and swaps
//! it in for connections accepted afterwards; sessions already running
//! keep the configuration they started with.
//!
//! Checks beyond rustls's own:
//! - The private key must be readable by its owner only (as ssh wants of
//!   its keys): refused with the `chmod` to run, at start and at reload.
//! - The server certificate's dates (`validity.rs`): one that is not valid
//!   now is logged as a warning at start (the daemon still starts: the
//!   operator may be about to replace it, and the NBD socket's plaintext
//!   clients are unaffected) and refused at reload, where the certificate
//!   in use is the better one to keep.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;

use super::validity::{self, OutOfDate, Time, Validity};

/// File names inside the certificates directory.
pub const CA_CERT: &str = "ca-cert.pem";
pub const SERVER_CERT: &str = "server-cert.pem";
pub const SERVER_KEY: &str = "server-key.pem";
pub const CA_CRL: &str = "ca-crl.pem";

/// How a listener treats TLS (the NBD spec's NOTLS, SELECTIVETLS with
/// every export open, and FORCEDTLS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// No TLS: NBD_OPT_STARTTLS is refused.
    Off,
    /// TLS when the client asks for it; plaintext clients are served too.
    On,
    /// TLS before anything else: every other option is refused with
    /// NBD_REP_ERR_TLS_REQD and no export is listed.
    Require,
}

impl fmt::Display for TlsMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TlsMode::Off => "off",
            TlsMode::On => "on",
            TlsMode::Require => "require",
        })
    }
}

/// A TLS mode that is none of off, on, require.
#[derive(Debug, thiserror::Error)]
#[error("unknown TLS mode '{0}': expected off, on or require")]
pub struct UnknownTlsMode(pub String);

impl FromStr for TlsMode {
    type Err = UnknownTlsMode;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "off" => Ok(TlsMode::Off),
            "on" => Ok(TlsMode::On),
            "require" => Ok(TlsMode::Require),
            other => Err(UnknownTlsMode(other.to_owned())),
        }
    }
}

/// Whether a client must present a certificate signed by `ca-cert.pem`.
///
/// The default (`TlsSettings::load` with `None`) is `Require` when the
/// directory has a CA and `Off` when it has none. A server that holds a CA
/// has been told whom to trust, and until per-export access rules exist a
/// client certificate is the only thing that tells one client from
/// another: anonymous TLS would encrypt the traffic of anyone who can
/// reach the port. This is qemu-nbd's default (`verify-peer=on`), stricter
/// than nbdkit's opt-in `--tls-verify-peer`; `Optional` gives nbdkit's
/// behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientCerts {
    /// Clients without a valid certificate are refused in the TLS handshake.
    Require,
    /// A certificate, when shown, must be valid; clients without one are
    /// served anonymously.
    Optional,
    /// Certificates are not asked for.
    Off,
}

/// Why TLS settings could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file of the certificates directory is missing or unreadable.
    #[error("cannot read {}: {source} (see docs/tls.md to make certificates)", path.display())]
    Read {
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    /// A PEM file held no certificate.
    #[error("{} holds no certificate", path.display())]
    NoCertificate { path: PathBuf },
    /// The private key is PEM but not one the TLS library can sign with
    /// (say an RSA key of an odd size).
    #[error("cannot use the private key {}: {why}", path.display())]
    UnusableKey { path: PathBuf, why: String },
    /// Client certificates were required with no CA to check them against.
    #[error("client certificates are required but {} is missing", path.display())]
    NoCa { path: PathBuf },
    /// Group or others may read the private key.
    #[error(transparent)]
    KeyNotPrivate(#[from] crate::paths::NotPrivate),
    /// The server certificate is not valid now (refused at reload).
    #[error("{}: {}", path.display(), out_of_date(*why, validity, *now))]
    OutOfDate {
        path: PathBuf,
        why: OutOfDate,
        validity: Validity,
        now: Time,
    },
    /// rustls refused the CA, key or certificate (say a key that does not
    /// match the certificate).
    #[error("invalid TLS certificates in {}: {source}", dir.display())]
    Rustls { dir: PathBuf, source: rustls::Error },
    /// The client verifier could not be built (a bad CA or CRL).
    #[error("cannot check client certificates with {}: {source}", dir.display())]
    Verifier {
        dir: PathBuf,
        source: rustls::server::VerifierBuilderError,
    },
}

/// Loaded certificates, swappable while the server runs.
pub struct TlsSettings {
    dir: PathBuf,
    /// What was asked for (None: the default, decided at each load by
    /// whether the directory has a CA).
    wanted: Option<ClientCerts>,
    /// The configuration new sessions start with: an `ArcSwap`, so a
    /// reload never blocks an accept and running sessions keep theirs.
    current: ArcSwap<Loaded>,
}

/// One load of the directory.
struct Loaded {
    config: Arc<rustls::ServerConfig>,
    client_certs: ClientCerts,
    /// The server certificate's dates; None when they could not be read
    /// (rustls took the certificate all the same).
    validity: Option<Validity>,
}

/// What an out-of-date certificate is, with its dates and what to do.
fn out_of_date(why: OutOfDate, v: &Validity, now: Time) -> String {
    let state = match why {
        OutOfDate::NotYetValid => format!("is not valid yet: it is valid from {}", v.not_before),
        OutOfDate::Expired => format!("has expired: it was valid until {}", v.not_after),
    };
    format!(
        "the certificate {state} (notBefore {}, notAfter {}; now {now}), so every client would refuse it: put a certificate valid now in its place (check the host's clock too)",
        v.not_before, v.not_after
    )
}

impl fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsSettings")
            .field("dir", &self.dir)
            .field("client_certs", &self.client_certs())
            .finish()
    }
}

impl TlsSettings {
    /// Loads the certificates in `dir`. `client_certs` None picks the
    /// default (see [`ClientCerts`]).
    pub fn load(dir: &Path, client_certs: Option<ClientCerts>) -> Result<Arc<Self>, TlsError> {
        let loaded = load(dir, client_certs)?;
        if let Err(e) = in_date(dir, &loaded, validity::now()) {
            tracing::warn!("TLS: {e}");
        }
        Ok(Arc::new(TlsSettings {
            dir: dir.to_owned(),
            wanted: client_certs,
            current: ArcSwap::from_pointee(loaded),
        }))
    }

    /// Reads the directory again and uses it for new connections; on
    /// error the certificates in use stay. Running sessions are untouched.
    pub fn reload(&self) -> Result<(), TlsError> {
        let loaded = load(&self.dir, self.wanted)?;
        in_date(&self.dir, &loaded, validity::now())?;
        self.current.store(Arc::new(loaded));
        tracing::info!(dir = %self.dir.display(), "TLS certificates reloaded");
        Ok(())
    }

    /// The configuration for a session starting now.
    pub fn config(&self) -> Arc<rustls::ServerConfig> {
        self.current.load().config.clone()
    }

    /// Whether clients must, may or need not show certificates.
    pub fn client_certs(&self) -> ClientCerts {
        self.current.load().client_certs
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Err when the server certificate of `loaded` is not valid at `now`.
fn in_date(dir: &Path, loaded: &Loaded, now: Time) -> Result<(), TlsError> {
    match loaded.validity {
        Some(v) => match v.check(now) {
            Some(why) => Err(TlsError::OutOfDate {
                path: dir.join(SERVER_CERT),
                why,
                validity: v,
                now,
            }),
            None => Ok(()),
        },
        None => Ok(()),
    }
}

/// rustls with the ring provider: TLS 1.3 and 1.2 (the NBD spec's must).
fn load(dir: &Path, wanted: Option<ClientCerts>) -> Result<Loaded, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certificates(&dir.join(SERVER_CERT))?;
    let validity = validity::of_certificate(&chain[0]);
    let key_path = dir.join(SERVER_KEY);
    // A missing key is the read's to report.
    if let Ok(meta) = std::fs::metadata(&key_path) {
        crate::paths::check_secret_file("TLS private key", &key_path, &meta)?;
    }
    let key = PrivateKeyDer::from_pem_file(&key_path).map_err(|source| TlsError::Read {
        path: key_path.clone(),
        source,
    })?;
    if let Some(why) = super::key::unusable(&key) {
        return Err(TlsError::UnusableKey {
            path: key_path,
            why,
        });
    }
    let ca_path = dir.join(CA_CERT);
    let has_ca = ca_path.exists();
    let client_certs = wanted.unwrap_or(if has_ca {
        ClientCerts::Require
    } else {
        ClientCerts::Off
    });
    let rustls_error = |source| TlsError::Rustls {
        dir: dir.to_owned(),
        source,
    };
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(rustls_error)?;
    let builder = match client_certs {
        ClientCerts::Off => builder.with_no_client_auth(),
        ClientCerts::Require | ClientCerts::Optional => {
            if !has_ca {
                return Err(TlsError::NoCa { path: ca_path });
            }
            let mut roots = RootCertStore::empty();
            for ca in certificates(&ca_path)? {
                roots.add(ca).map_err(rustls_error)?;
            }
            let mut verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .with_crls(revocations(dir)?);
            if client_certs == ClientCerts::Optional {
                verifier = verifier.allow_unauthenticated();
            }
            let verifier = verifier.build().map_err(|source| TlsError::Verifier {
                dir: dir.to_owned(),
                source,
            })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder.with_single_cert(chain, key).map_err(rustls_error)?;
    Ok(Loaded {
        config: Arc::new(config),
        client_certs,
        validity,
    })
}

/// Every certificate in a PEM file (at least one).
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let read = |source| TlsError::Read {
        path: path.to_owned(),
        source,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(read)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(read)?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// The CRLs of `ca-crl.pem`, none when the file does not exist.
fn revocations(dir: &Path) -> Result<Vec<CertificateRevocationListDer<'static>>, TlsError> {
    let path = dir.join(CA_CRL);
    if !path.exists() {
        return Ok(Vec::new());
    }
    let read = |source| TlsError::Read {
        path: path.clone(),
        source,
    };
    CertificateRevocationListDer::pem_file_iter(&path)
        .map_err(read)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(read)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print() {
        for m in [TlsMode::Off, TlsMode::On, TlsMode::Require] {
            assert_eq!(m.to_string().parse::<TlsMode>().unwrap(), m);
        }
        let e = "yes".parse::<TlsMode>().unwrap_err();
        assert!(e.to_string().contains("off, on or require"), "{e}");
    }

    #[test]
    fn a_missing_directory_says_which_file_and_where_to_look() {
        let dir = tempfile::tempdir().unwrap();
        let e = TlsSettings::load(dir.path(), None).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains(SERVER_CERT) && msg.contains("docs/tls.md"),
            "{msg}"
        );
    }
}
