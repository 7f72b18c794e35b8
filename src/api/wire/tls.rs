//! `POST /v1/tls/reload`: the NBD server's certificates read again.
//!
//! docs/openapi.yaml describes the same shape.

use serde::{Deserialize, Serialize};

/// `POST /v1/tls/reload`: what new connections now use. Connections
/// already running keep the certificates they started with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsReloaded {
    /// The certificates directory read (`--tls-certificates`).
    pub certificates_dir: String,
    /// Whether clients must show a certificate: require, optional or off.
    pub client_certificates: String,
}
