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

/// The host's memory as the pressure watcher last read it (docs/memory.md,
/// "Memory pressure").
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryPressure {
    /// True while memory is short: new drive pages get ENOSPC.
    pub short: bool,
    /// Times memory ran short since the daemon started.
    pub episodes: u64,
    /// New pages refused because memory was short.
    pub refused_allocations: u64,
    /// Cache memory (clean blocks, empty slots) given back to the host
    /// while memory was short.
    #[serde(default)]
    pub given_back_bytes: u64,
    /// The smaller of MemAvailable and the memory cgroup's room.
    pub available_bytes: u64,
    /// Short below this.
    pub min_available_bytes: u64,
    /// `full avg10` of /proc/pressure/memory (None: no PSI here).
    pub full_avg10_pct: Option<f64>,
    /// Short at or above this `full avg10`.
    pub max_full_avg10_pct: f64,
    /// `some avg10`.
    pub some_avg10_pct: Option<f64>,
    /// The daemon's memory cgroup limit, when it has one.
    pub cgroup_limit_bytes: Option<u64>,
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
    #[serde(default)]
    pub memory_pressure: MemoryPressure,
    /// Set when `ramd daemon --supervise` runs this process (the one
    /// `pid` names) under a supervisor (docs/restart.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supervisor: Option<Supervisor>,
}

/// The supervisor of the serving process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Supervisor {
    pub pid: u32,
    /// Whether it is still there (if not, a crash now loses RAM drives).
    pub alive: bool,
    /// How many times it restarted the serving process.
    pub restarts: u64,
    /// Why it last did: "signal 9", "exit 3"; absent before any restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_restart_reason: Option<String>,
}

/// `POST /v1/upgrade`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpgradeRequest {
    /// The new binary (absent: the path this ramd was started from, which
    /// a package upgrade has replaced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binary: Option<String>,
}

/// `POST /v1/upgrade` accepted: this process stops and `binary` takes
/// over (`GET /v1/health` then shows a new `pid`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Upgrading {
    pub binary: String,
    /// The serving process that stops now.
    pub pid: u32,
    /// Its version.
    pub version: String,
    /// The new binary's `--version` line.
    pub new_version: String,
}
