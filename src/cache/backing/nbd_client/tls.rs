//! The client side of NBD over TLS: the rustls configuration an
//! `nbds://` URI asks for, built once per [`super::NbdClient`] and shared by
//! its connections (so reconnections resume the TLS session), and the
//! TLS handshake over a socket that has just had NBD_OPT_STARTTLS acked.
//!
//! Certificates come from the `tls-certificates` directory in the layout
//! libnbd, nbdkit and qemu share:
//!
//! ```text
//! DIR/ca-cert.pem       the CA that signed the server's certificate
//! DIR/client-cert.pem   our certificate, for servers that verify peers (mTLS)
//! DIR/client-key.pem    its private key (PKCS#8, PKCS#1 or SEC1)
//! ```
//!
//! Whom we trust: only `ca-cert.pem`. There are no system roots because
//! neither `rustls-native-certs` nor `webpki-roots` is a dependency, and
//! an NBD server's certificate is nearly always from a private CA anyway.
//! The server's name is checked against the URI's host (or
//! `tls-hostname`); over a unix socket without `tls-hostname` only the
//! chain is checked, as libnbd does (it has no host name to check there).
//! `tls-verify-peer=false` checks nothing but the handshake signatures and
//! is logged as a warning each time a client is made (a cache opening its
//! backing), not at each reconnection.
//!
//! Dependencies: rustls (ring provider), already used by the server side;
//! `rustls::pki_types::pem` reads the PEM files.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConnection, DigitallySignedStruct, RootCertStore};

use super::uri::TlsParams;
use super::ClientError;

/// File names inside the `tls-certificates` directory (libnbd's).
pub const CA_CERT: &str = "ca-cert.pem";
pub const CLIENT_CERT: &str = "client-cert.pem";
pub const CLIENT_KEY: &str = "client-key.pem";

/// The name sent as SNI over a unix socket without `tls-hostname`.
const UNIX_SERVER_NAME: &str = "localhost";

/// Why the certificates directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CertFileError {
    /// A file is missing or not PEM.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    /// A PEM file held no certificate.
    #[error("{} holds no certificate", path.display())]
    NoCertificate { path: PathBuf },
    /// The private key is PEM but not one the TLS library can sign with.
    #[error("cannot use the private key {}: {why}", path.display())]
    UnusableKey { path: PathBuf, why: String },
    /// Group or others may read the client's private key.
    #[error(transparent)]
    KeyNotPrivate(#[from] crate::paths::NotPrivate),
    /// A client certificate without its key, or the other way round.
    #[error("{} is missing (beside {beside})", path.display())]
    HalfPair { path: PathBuf, beside: &'static str },
    /// rustls refused a certificate or key (say a key that does not match
    /// the certificate).
    #[error("{what}: {source}")]
    Rustls {
        what: &'static str,
        source: rustls::Error,
    },
    /// The CA cannot check server certificates.
    #[error("{}: {source}", path.display())]
    Verifier {
        path: PathBuf,
        source: rustls::client::VerifierBuilderError,
    },
    /// The name to check is not a DNS name or an IP address.
    #[error("'{0}' is not a valid TLS server name (set tls-hostname=NAME)")]
    ServerName(String),
}

/// What every connection of one client needs for TLS.
#[derive(Debug, Clone)]
pub struct TlsClient {
    config: Arc<rustls::ClientConfig>,
    server_name: ServerName<'static>,
    /// For messages: the name checked ("" when none is), the CA file, and
    /// whether we show a client certificate.
    pub(super) checked_name: String,
    pub(super) ca: Option<PathBuf>,
    pub(super) sends_certificate: bool,
}

impl TlsClient {
    /// Loads the certificates `params` names and builds the configuration.
    pub fn new(params: &TlsParams, target: &str) -> Result<TlsClient, ClientError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let dir = params.certificates.as_deref();
        let files_error = |source: CertFileError| ClientError::TlsFiles {
            dir: dir.map(Path::to_path_buf).unwrap_or_default(),
            source,
        };
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|source| {
                files_error(CertFileError::Rustls {
                    what: "protocol versions",
                    source,
                })
            })?;
        let ca = match (params.verify_peer, dir) {
            (true, Some(dir)) => Some(dir.join(CA_CERT)),
            _ => None,
        };
        let verifier: Arc<dyn ServerCertVerifier> = match &ca {
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                for cert in certificates(ca).map_err(files_error)? {
                    roots.add(cert).map_err(|source| {
                        files_error(CertFileError::Rustls {
                            what: CA_CERT,
                            source,
                        })
                    })?;
                }
                let inner =
                    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                        .build()
                        .map_err(|source| {
                            files_error(CertFileError::Verifier {
                                path: ca.clone(),
                                source,
                            })
                        })?;
                Arc::new(Verifier {
                    inner,
                    check_name: params.hostname.is_some(),
                })
            }
            None => {
                tracing::warn!(
                    target = target,
                    "tls-verify-peer=false: the NBD server's certificate is not checked, so anyone on the path can pose as it; use tls-certificates=DIR with its CA instead"
                );
                Arc::new(NoVerification(provider))
            }
        };
        let builder = builder
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let pair = dir.map(client_pair).transpose().map_err(files_error)?;
        let sends_certificate = matches!(pair, Some(Some(_)));
        let config = match pair.flatten() {
            Some((chain, key)) => builder
                .with_client_auth_cert(chain, key)
                .map_err(|source| {
                    files_error(CertFileError::Rustls {
                        what: "client-cert.pem and client-key.pem",
                        source,
                    })
                })?,
            None => builder.with_no_client_auth(),
        };
        let name = params.hostname.as_deref().unwrap_or(UNIX_SERVER_NAME);
        let server_name = ServerName::try_from(name.to_owned())
            .map_err(|_| files_error(CertFileError::ServerName(name.to_owned())))?;
        Ok(TlsClient {
            config: Arc::new(config),
            server_name,
            checked_name: params.hostname.clone().unwrap_or_default(),
            ca,
            sends_certificate,
        })
    }

    /// Runs the TLS handshake on `sock` (NBD_OPT_STARTTLS has been acked).
    /// A TLS error comes back as an `io::Error` holding the
    /// `rustls::Error` (see [`rustls_error`]).
    pub fn handshake<S: io::Read + io::Write>(
        &self,
        mut sock: S,
    ) -> io::Result<rustls::StreamOwned<ClientConnection, S>> {
        let mut conn = ClientConnection::new(self.config.clone(), self.server_name.clone())
            .map_err(io::Error::other)?;
        while conn.is_handshaking() {
            conn.complete_io(&mut sock)?;
        }
        Ok(rustls::StreamOwned::new(conn, sock))
    }
}

/// The rustls error inside an I/O error from a TLS stream, if any.
pub fn rustls_error(e: &io::Error) -> Option<&rustls::Error> {
    e.get_ref()?.downcast_ref::<rustls::Error>()
}

/// Says which of our typed errors a TLS failure is.
pub fn classify(e: rustls::Error, tls: &TlsClient, target: &str) -> ClientError {
    use rustls::AlertDescription as A;
    let target = target.to_owned();
    match e {
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => ClientError::WrongHostName {
            target,
            name: tls.checked_name.clone(),
            why: e.to_string(),
        },
        rustls::Error::InvalidCertificate(_) => ClientError::CertificateNotTrusted {
            target,
            ca: tls.ca.clone().unwrap_or_default(),
            why: e.to_string(),
        },
        rustls::Error::AlertReceived(
            A::CertificateRequired
            | A::BadCertificate
            | A::UnknownCA
            | A::CertificateUnknown
            | A::CertificateExpired
            | A::CertificateRevoked
            | A::UnsupportedCertificate
            | A::AccessDenied,
        ) => ClientError::ClientCertificateRefused {
            target,
            why: client_cert_why(tls, &e.to_string()),
        },
        source => ClientError::Tls { target, source },
    }
}

/// Why the server may have refused us, with what we sent.
pub fn client_cert_why(tls: &TlsClient, what: &str) -> String {
    if tls.sends_certificate {
        format!("{what}; we sent {CLIENT_CERT}")
    } else {
        format!("{what}; we sent no client certificate")
    }
}

/// Every certificate in a PEM file (at least one).
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, CertFileError> {
    let read = |source| CertFileError::Read {
        path: path.to_owned(),
        source,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(read)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(read)?;
    if certs.is_empty() {
        return Err(CertFileError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

type ClientPair = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

/// `client-cert.pem` and `client-key.pem`, None when neither exists.
fn client_pair(dir: &Path) -> Result<Option<ClientPair>, CertFileError> {
    let (cert, key) = (dir.join(CLIENT_CERT), dir.join(CLIENT_KEY));
    match (cert.exists(), key.exists()) {
        (false, false) => Ok(None),
        (true, true) => {
            let chain = certificates(&cert)?;
            if let Ok(meta) = std::fs::metadata(&key) {
                crate::paths::check_secret_file("TLS private key", &key, &meta)?;
            }
            let der = PrivateKeyDer::from_pem_file(&key).map_err(|source| CertFileError::Read {
                path: key.clone(),
                source,
            })?;
            if let Some(why) = crate::nbd::tls::key::unusable(&der) {
                return Err(CertFileError::UnusableKey { path: key, why });
            }
            Ok(Some((chain, der)))
        }
        (true, false) => Err(CertFileError::HalfPair {
            path: key,
            beside: CLIENT_CERT,
        }),
        (false, true) => Err(CertFileError::HalfPair {
            path: cert,
            beside: CLIENT_KEY,
        }),
    }
}

/// webpki's checks, with the name check skipped when there is no name to
/// check (a unix socket without `tls-hostname`). webpki checks the chain
/// before the name, so a name error means the chain is good.
#[derive(Debug)]
struct Verifier {
    inner: Arc<WebPkiServerVerifier>,
    check_name: bool,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.check_name => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// `tls-verify-peer=false`: any certificate, but the handshake signatures
/// are still checked (the session is still encrypted to whoever holds the
/// key of the certificate shown).
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(dir: &Path) -> TlsParams {
        TlsParams {
            certificates: Some(dir.to_owned()),
            verify_peer: true,
            hostname: Some("localhost".into()),
        }
    }

    #[test]
    fn a_missing_ca_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let e = TlsClient::new(&params(dir.path()), "h:1")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("ca-cert.pem") && e.contains("cannot read"),
            "{e}"
        );
    }

    #[test]
    fn half_a_client_pair_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(CLIENT_KEY), "x").unwrap();
        let p = TlsParams {
            verify_peer: false,
            ..params(dir.path())
        };
        let e = TlsClient::new(&p, "h:1").unwrap_err().to_string();
        assert!(e.contains("client-cert.pem is missing"), "{e}");
    }

    #[test]
    fn no_verification_needs_no_files() {
        let p = TlsParams {
            certificates: None,
            verify_peer: false,
            hostname: None,
        };
        let t = TlsClient::new(&p, "h:1").unwrap();
        assert!(!t.sends_certificate && t.ca.is_none());
    }
}
