//! `ramd bench`: the built-in benchmark, its load generators and plots.
//!
//! It answers what the seed articles answer with fio, ioping, dd and
//! iozone, in one command: how much faster is a RAM drive than the disk it
//! replaces, on this machine. It runs in the command's own process (the
//! daemon serves the drive; it does not generate the load).
//!
//! ```text
//!  cli::bench ──► run ──► target   what may be written (pure rules)
//!   (the seam)     │      prepare  scratch files, O_DIRECT probe, prefill,
//!                  │               cleanup guard                  (I/O)
//!                  │      engine   load generators: nbd, uring, psync,
//!                  │               files                          (I/O)
//!                  │      latency  histograms, fio's figures      (pure)
//!                  │      report   the report, ratios             (pure)
//!                  ▼
//!             BenchReport (api::wire::bench) ──► plot (SVG/HTML, pure)
//! ```
//!
//! - `profile`: the tests (fio jobs) and profiles.
//! - `rng`: offsets and data.
//!
//! Invariants:
//! - Nothing is written before every target is accepted (`target`'s
//!   rules: scratch files in directories, never a block device, a file
//!   holding data, a drive holding data or a cache without
//!   `--destructive`), and whatever was created is removed on every
//!   path out, Ctrl-C included.
//! - The same test draws the same offsets on every target.
//! - Figures follow fio's conventions (docs/bench.md), so a test can be
//!   checked against fio (tests/bench.rs does).
//!
//! Layers (scripts/arch_check.py): `bench` may import `api::wire` (the
//! report is the API's `BenchReport`), `metrics::histogram`, `nbd::proto`,
//! `cache::backing::nbd_client` (the NBD handshake, not a third client),
//! `block::backend` (the client's calls) and the pure helpers; `cli::bench`
//! is the one command-line file that imports `bench`.

pub mod engine;
pub mod latency;
pub mod plot;
pub mod prepare;
pub mod profile;
pub mod report;
pub mod rng;
pub mod run;
pub mod svg;
pub mod target;

use crate::api::wire::bench::BenchResult;
use crate::cache::backing::nbd_client::ClientError;
pub use profile::{Profile, TestSpec};
pub use run::{run, Options};
pub use target::{ExportSpec, Kind, Refusal, TargetSpec};

/// Why a benchmark failed or was refused.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Nothing to measure.
    #[error("nothing to measure: name a drive (ramd bench DRIVE) and/or --compare PATH")]
    NoTargets,
    /// A target ramd bench will not write to.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// A drive's or cache's NBD export could not be reached.
    #[error(transparent)]
    Nbd(#[from] ClientError),
    /// Preparing or cleaning up a file, directory or device failed.
    #[error("cannot {what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    /// Writing a drive's working set failed (its memory limit? the
    /// daemon's budget?).
    #[error("cannot write the working set of '{target}': {source} (a smaller --size may fit)")]
    Prefill {
        target: String,
        source: crate::block::backend::Error,
    },
    /// A test failed on a target.
    #[error("{test} on {target}: {source}")]
    Engine {
        target: String,
        test: String,
        source: engine::EngineError,
    },
    /// Ctrl-C.
    #[error("interrupted: scratch files removed, drives trimmed")]
    Interrupted,
}

/// What the benchmark tells whoever watches it (a progress bar). Every
/// method has an empty default.
pub trait Progress: Sync {
    /// A step before the tests (preparing a target).
    fn phase(&self, _text: &str) {}
    /// Test run `n` of `runs` begins.
    fn started(&self, _n: usize, _runs: usize, _test: &TestSpec, _target: &str) {}
    /// About ten times a second during a test: time into it, I/Os done.
    fn tick(&self, _elapsed: std::time::Duration, _ios: u64) {}
    /// A test run ended.
    fn finished(&self, _result: &BenchResult) {}
    /// Something the user should know that did not stop the run (a
    /// cleanup that failed).
    fn warn(&self, _text: &str) {}
}

/// A [`Progress`] that shows nothing.
pub struct Quiet;

impl Progress for Quiet {}
