//! `/v1/bench/latest` and the report of `ramd bench --json`: one shape for
//! both, so what the command prints is what the daemon keeps and what the
//! dashboard shows.
//!
//! The report is written by the command line (`bench::report` builds it);
//! the daemon only checks it parses and stores it. Report objects accept
//! unknown fields, so an older daemon still takes a newer `ramd bench`'s
//! report (keeping the fields it knows); the request's own envelope
//! ([`BenchLatest`]) refuses them, as every request body does. Latencies are microseconds (`_us`), rates per
//! second, sizes bytes. docs/bench.md describes each figure and
//! docs/bench.schema.json is the JSON Schema of [`BenchReport`];
//! docs/openapi.yaml describes the envelope.

use serde::{Deserialize, Serialize};

/// The version of the report's shape ([`BenchReport::version`]).
pub const REPORT_VERSION: u32 = 1;

/// `PUT /v1/bench/latest` and `GET /v1/bench/latest`: the last report and
/// its plot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BenchLatest {
    pub report: BenchReport,
    /// The report's plot as a self-contained SVG document (no scripts, no
    /// external references).
    pub svg: String,
}

/// What `ramd bench --json` prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    /// [`REPORT_VERSION`].
    pub version: u32,
    /// `ramd <version>` that measured it.
    pub tool: String,
    /// `quick`, `full`, `db`, `build`, or `custom` (tests chosen with `--test`).
    pub profile: String,
    /// RFC 3339, UTC.
    pub started_at: String,
    /// RFC 3339, UTC.
    pub finished_at: String,
    /// Measured time of each test on each target (`--runtime`; there is
    /// no warm-up period: the working set is written before the tests).
    pub runtime_s: f64,
    pub host: BenchHost,
    pub targets: Vec<BenchTarget>,
    /// The tests that ran, in order.
    pub tests: Vec<BenchTest>,
    /// One per (target, test) that ran.
    pub results: Vec<BenchResult>,
    /// (target, test) pairs that did not run, and why.
    #[serde(default)]
    pub skipped: Vec<BenchSkipped>,
    /// The first target against each other one, per test (the table's
    /// ratio columns).
    #[serde(default)]
    pub comparisons: Vec<BenchComparison>,
}

/// The machine the figures come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchHost {
    pub hostname: String,
    pub cpus: u32,
    /// `uname -r`.
    pub kernel: String,
}

/// One thing measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchTarget {
    /// The drive's or cache's name, or the path as given.
    pub name: String,
    /// `drive`, `cache`, `file`, `directory` or `block-device`.
    pub kind: String,
    /// Where the I/O went: the NBD URI, the scratch file, the file or
    /// the device.
    pub path: String,
    /// `nbd` (over the daemon's socket), `io_uring` or `psync`.
    pub engine: String,
    /// Opened with O_DIRECT (false for NBD targets: there is no page
    /// cache between ramd bench and the drive).
    pub direct_io: bool,
    /// The kernel's page cache holds this target's data: reads may be
    /// served from memory whatever the device is.
    pub page_cache: bool,
    /// Bytes the block tests spread their I/O over.
    pub working_set_bytes: u64,
    /// Anything the reader must know to read the figures right.
    #[serde(default)]
    pub notes: Vec<String>,
}

/// One test of a profile (what fio calls a job).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchTest {
    /// e.g. `randread-4k-qd1`.
    pub name: String,
    pub description: String,
    /// `randread`, `randwrite`, `randrw`, `read`, `write` (fio's `rw`), or
    /// `files` (small files created, written, read and deleted).
    pub rw: String,
    /// Percent of reads in `randrw` (fio's `rwmixread`); 100 or 0 otherwise.
    pub read_pct: u32,
    /// Bytes per I/O (per file for `files`).
    pub block_bytes: u64,
    /// I/Os in flight per job.
    pub iodepth: u32,
    /// Jobs (threads, each with its own connection or file handle).
    pub jobs: u32,
}

/// The figures of one test on one target, with fio's conventions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchResult {
    pub target: String,
    pub test: String,
    /// Completed I/Os per second (file operations for `files`).
    pub iops: f64,
    /// MiB (2^20 bytes) per second.
    pub mib_s: f64,
    /// Completed I/Os.
    pub ios: u64,
    pub bytes: u64,
    /// The measured time the rates divide by.
    pub elapsed_s: f64,
    /// I/Os that failed (the test stops at the first).
    #[serde(default)]
    pub errors: u64,
    /// Submission to completion (fio's `lat`, not its `clat`), every I/O
    /// of the test.
    pub lat_us: BenchLatency,
    /// The reads alone (tests with reads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read: Option<BenchDirection>,
    /// The writes alone (tests with writes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write: Option<BenchDirection>,
    /// fio's percentile list (1, 5, 10, 20, ..., 99.99) as
    /// `[percentile, latency_us]` pairs.
    #[serde(default)]
    pub percentiles_us: Vec<[f64; 2]>,
    /// The latency histogram: `[bucket upper bound in us, count]` for
    /// every non-empty bucket, ascending (buckets at most 6.25% wide).
    #[serde(default)]
    pub histogram_us: Vec<[f64; 2]>,
}

/// Reads or writes of a mixed test.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchDirection {
    pub iops: f64,
    pub mib_s: f64,
    pub ios: u64,
    pub bytes: u64,
    pub lat_us: BenchLatency,
}

/// Latency summary in microseconds. Percentiles are the upper bound of
/// the histogram bucket holding the rank (never below the truth, at most
/// 6.25% above); mean and max are exact.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BenchLatency {
    pub mean: f64,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub p99_9: f64,
    pub max: f64,
}

/// A (target, test) that did not run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchSkipped {
    pub target: String,
    pub test: String,
    pub reason: String,
}

/// `target` against `baseline` on one test: above 1 means `target` did
/// more I/O per second (`iops_ratio`) or waited longer (the latency
/// ratios; below 1 is faster).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchComparison {
    pub test: String,
    pub target: String,
    pub baseline: String,
    pub iops_ratio: f64,
    pub mib_s_ratio: f64,
    pub lat_mean_ratio: f64,
    pub lat_p50_ratio: f64,
    pub lat_p99_ratio: f64,
}
