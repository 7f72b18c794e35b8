//! NBD over TLS (the spec's NBD_OPT_STARTTLS upgrade), server side.
//!
//! - `settings`: the mode of a listener (off, on, require), whether client
//!   certificates are required, and the certificates, loaded from a
//!   directory laid out like nbdkit's and qemu's and reloadable while the
//!   server runs.
//! - `stream`: the TLS session over an accepted socket, a `Transport` like
//!   the socket itself, so the rest of the handshake and the transmission
//!   loop run over it unchanged.
//! - `identity`: the client's name (certificate CN or first SAN), pure DER
//!   walking.
//! - `validity`: a certificate's notBefore and notAfter (pure DER walking),
//!   so an expired or not-yet-valid server certificate is warned about at
//!   start and refused at reload.
//!
//! The handshake (`handshake.rs`) answers NBD_OPT_STARTTLS and, in
//! `require` mode, refuses everything else before TLS; the server
//! (`server.rs`) then runs the TLS handshake and hands the session back to
//! the option loop. Operators: docs/tls.md.
//!
//! Dependencies: `rustls` (ring provider, TLS 1.2 and 1.3) because the
//! issue asks for a maintained TLS stack and no crypto of our own; its
//! `pki_types::pem` reads the PEM files, so neither `rustls-pemfile`
//! (unmaintained) nor an X.509 crate is needed (the few certificate fields
//! read here, a name and two dates, are read by `identity` and `validity`).

mod identity;
pub mod key;
mod settings;
mod stream;
mod validity;

pub use settings::{
    ClientCerts, TlsError, TlsMode, TlsSettings, UnknownTlsMode, CA_CERT, CA_CRL, SERVER_CERT,
    SERVER_KEY,
};
pub use stream::{accept, TlsStream};
