//! The web dashboard's API (`--http`, docs/dashboard.md): links with a
//! fresh token (`POST /v1/dashboard/links`, what `ramd dashboard` prints),
//! who the caller is (`GET /v1/whoami`, so the page knows which buttons to
//! offer), and the live event stream (`GET /v1/events`).
//!
//! docs/openapi.yaml describes the same shapes.

use serde::{Deserialize, Serialize};

use super::stats::StatsReport;
use super::tokens::TokenRole;

/// `POST /v1/dashboard/links` (unix socket only).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateDashboardLink {
    /// An admin token (create, resize, delete, sync, snapshot) instead of
    /// a read-only one.
    #[serde(default)]
    pub admin: bool,
    /// The host name to put in the URL [default: the address `--http`
    /// is bound to, or this machine's name when that is 0.0.0.0 or ::].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// How long the token works: a duration (`7d`, `12h`, `30m`) or
    /// `never` [default: 7d].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
}

/// `POST /v1/dashboard/links` (201): the only answer that holds the
/// link's one-time sign-in code, inside `url`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DashboardLink {
    /// `http(s)://HOST:PORT/signin#CODE`: opening it signs the browser in
    /// (a session cookie) once, within `sign_in_expires_unix_s`; the
    /// code leaves the address bar at once and never reaches the server
    /// in a request line.
    pub url: String,
    /// When the link's code stops working if unused (5 minutes).
    pub sign_in_expires_unix_s: u64,
    /// The dashboard without a token (`http(s)://HOST:PORT/`).
    pub base_url: String,
    /// The token's name (`ramd token list`, `ramd token revoke NAME`).
    pub token_name: String,
    pub role: TokenRole,
    /// When the token stops working (null: never).
    #[serde(default)]
    pub expires_unix_s: Option<u64>,
}

/// `POST /session` (the sign-in page): the code of a dashboard link.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignIn {
    pub code: String,
}

/// `GET /v1/whoami`: what the caller's credentials allow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Whoami {
    /// `unix_socket`, `bearer` (an Authorization header) or `cookie` (the
    /// dashboard's session).
    pub via: String,
    /// `admin` on the unix socket.
    pub role: TokenRole,
    /// The token's name (null on the unix socket).
    pub token_name: Option<String>,
    /// The token's public id (null on the unix socket).
    pub token_id: Option<String>,
    /// When the token stops working (null: never, or the unix socket).
    #[serde(default)]
    pub expires_unix_s: Option<u64>,
}

/// The data of each `stats` event of `GET /v1/events`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatsEvent {
    /// Counts events on this stream from 0 (also the event's `id`).
    pub seq: u64,
    /// The daemon's clock when the event was made (sync lags are
    /// measured against it, not the browser's clock).
    pub unix_ms: u64,
    /// What `GET /v1/stats` answers at that moment.
    pub stats: StatsReport,
}
