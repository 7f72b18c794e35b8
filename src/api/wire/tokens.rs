//! `/v1/tokens`: bearer tokens for the API over TCP (`--api-listen`).
//!
//! The secret is in [`CreatedToken`] only, once; the daemon keeps its
//! SHA-256 and nothing else. docs/openapi.yaml describes the same shapes.

use serde::{Deserialize, Serialize};

/// What a token may do over TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TokenRole {
    /// GET and HEAD only (lists, stats, `/metrics`).
    ReadOnly,
    /// Every route but token management (unix socket only).
    Admin,
}

impl TokenRole {
    /// The name as the API and the command line spell it.
    pub fn name(self) -> &'static str {
        match self {
            TokenRole::ReadOnly => "read-only",
            TokenRole::Admin => "admin",
        }
    }
}

/// `POST /v1/tokens`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    pub role: TokenRole,
    /// A name to list and revoke it by (the drive naming rule) [default:
    /// the token's id].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// How long it works: a duration (`30d`, `12h`) or `never` [default:
    /// never].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
}

/// A token as listed: never its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenInfo {
    pub name: String,
    /// The public part of the token (`ramd_<id>_...`).
    pub id: String,
    pub role: TokenRole,
    pub created_unix_s: u64,
    /// When it stops working (absent: never; dashboard links' tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_unix_s: Option<u64>,
}

/// `GET /v1/tokens`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenList {
    pub tokens: Vec<TokenInfo>,
}

/// `POST /v1/tokens` (201): the only answer that holds the secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreatedToken {
    pub name: String,
    pub id: String,
    pub role: TokenRole,
    pub created_unix_s: u64,
    /// When it stops working (absent: never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_unix_s: Option<u64>,
    /// `ramd_<id>_<secret>`: send it as `Authorization: Bearer ...`.
    pub token: String,
}

/// `DELETE /v1/tokens/{name}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenRevoked {
    pub name: String,
}
