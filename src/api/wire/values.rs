//! Plain values that several API bodies carry (sizes, durations, request
//! counters and rates): the drive, cache and directory types all use them,
//! so they live apart from each of those.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A size in a request: a number of bytes or a human size ("4G").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SizeValue {
    Bytes(u64),
    Text(String),
}

impl SizeValue {
    /// The text to parse (bytes become their decimal form).
    pub fn as_text(&self) -> String {
        match self {
            SizeValue::Bytes(b) => b.to_string(),
            SizeValue::Text(t) => t.clone(),
        }
    }
}

/// A duration in a request: milliseconds or a human duration (`"60s"`,
/// `"500ms"`): sync intervals, cache timeouts, directory intervals.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum DurationValue {
    Millis(u64),
    Text(String),
}

impl DurationValue {
    /// The text to parse (milliseconds become `"NNNms"`).
    pub fn as_text(&self) -> String {
        match self {
            DurationValue::Millis(ms) => format!("{ms}ms"),
            DurationValue::Text(t) => t.clone(),
        }
    }
}

/// Latency quantiles in microseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub count: u64,
    pub mean_us: Option<f64>,
    pub p50_us: Option<f64>,
    pub p90_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub p999_us: Option<f64>,
}

/// Counters since the drive was created.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatsTotals {
    /// Requests by op: read, write, flush, trim, write_zeroes, cache,
    /// block_status.
    pub ops: BTreeMap<String, u64>,
    /// Bytes of successful requests by op.
    pub bytes: BTreeMap<String, u64>,
    /// Failed requests by errno name.
    pub errors: BTreeMap<String, u64>,
    pub connections_opened: u64,
    /// By op: read, write, flush.
    pub latency: BTreeMap<String, Latency>,
}

/// The last sampling interval (about one second).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatsRates {
    pub interval_s: f64,
    /// Requests per second, all ops.
    pub iops: f64,
    pub read_iops: f64,
    pub write_iops: f64,
    pub read_bytes_per_s: f64,
    pub write_bytes_per_s: f64,
    /// Latency of the interval's requests by op: read, write, flush.
    pub latency: BTreeMap<String, Latency>,
}
