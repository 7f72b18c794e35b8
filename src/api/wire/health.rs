//! `GET /v1/health`: the daemon itself (version, uptime, memory budget).
//!
//! docs/openapi.yaml describes the same shapes.

use serde::{Deserialize, Serialize};

/// The daemon memory budget.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budget {
    pub limit_bytes: u64,
    /// Memory all drives hold now.
    pub used_bytes: u64,
    /// Memory promised to drives (their sizes or limits, plus metadata).
    pub committed_bytes: u64,
}

/// `GET /v1/health`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Health {
    /// "ok".
    pub status: String,
    pub version: String,
    pub pid: u32,
    pub uptime_s: f64,
    pub started_unix_s: u64,
    pub api_socket: String,
    pub nbd_socket: String,
    pub nbd_tcp: Vec<String>,
    pub state_dir: String,
    pub config_file: Option<String>,
    pub metrics_enabled: bool,
    pub drives: u64,
    pub memory_budget: Budget,
}
