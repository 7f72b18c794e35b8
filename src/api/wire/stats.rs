//! `GET /v1/stats` and `GET /v1/drives/{name}/stats`: I/O counters, rates
//! and latency per drive (and per cache).
//!
//! docs/openapi.yaml describes the same shapes.

use serde::{Deserialize, Serialize};

use super::caches::CacheInfo;
use super::drives::CompressionInfo;
use super::health::Budget;
use super::persistence::PersistStatusInfo;
use super::values::{StatsRates, StatsTotals};

/// `GET /v1/drives/{name}/stats`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DriveStats {
    pub name: String,
    pub size_bytes: u64,
    pub allocated_bytes: u64,
    pub mem_limit_bytes: Option<u64>,
    pub connections: u64,
    /// Null when metrics are off.
    pub totals: Option<StatsTotals>,
    /// Null when metrics are off or before the first full interval.
    pub rates: Option<StatsRates>,
    /// A ready persistent drive's persistence figures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persist: Option<PersistStatusInfo>,
    /// A compressed drive's memory figures (zram's `mm_stat`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<CompressionInfo>,
}

/// `GET /v1/stats`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatsReport {
    pub metrics_enabled: bool,
    pub memory_budget: Budget,
    pub drives: Vec<DriveStats>,
    /// RAM caches with their counters and request rates.
    #[serde(default)]
    pub caches: Vec<CacheInfo>,
}
