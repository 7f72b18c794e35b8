//! One benchmark from start to end (I/O): every target is checked before
//! anything is written, then prepared, then each test runs on each target
//! in turn (test by test, so a noisy minute hurts every target alike),
//! then everything is cleaned up and the report built.

use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant, SystemTime};

use super::engine::nbd::NbdJob;
use super::engine::uring::UringJob;
use super::engine::{files, psync, EngineError, Live, Until, Workload};
use super::latency::Recorder;
use super::prepare::{self, engine_error, Access, Prepared};
use super::profile::TestSpec;
use super::report;
use super::target::TargetSpec;
use super::{BenchError, Progress};
use crate::api::wire::bench::{BenchHost, BenchReport, BenchResult, BenchSkipped, REPORT_VERSION};

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// The profile's name (`custom` for tests chosen one by one).
    pub profile: String,
    pub tests: Vec<TestSpec>,
    /// Measured time of each test on each target.
    pub runtime: Duration,
    /// Bytes the block tests spread over (less where a target is smaller).
    pub working_set_bytes: u64,
    /// Write over data (a block device, a file or drive holding data, a cache).
    pub destructive: bool,
}

/// A job ready to run: its handle opened before the clock starts.
enum Handle {
    Nbd(NbdJob),
    Uring(Box<UringJob>, std::fs::File),
    Psync(std::fs::File),
    Files(std::path::PathBuf),
}

/// Runs the benchmark; `stop` (Ctrl-C) ends it early with
/// [`BenchError::Interrupted`], cleaned up.
pub fn run(
    opts: &Options,
    specs: &[TargetSpec],
    progress: &dyn Progress,
    stop: &AtomicBool,
) -> Result<BenchReport, BenchError> {
    if specs.is_empty() {
        return Err(BenchError::NoTargets);
    }
    let started_at = rfc3339(SystemTime::now());
    // Refusals first: nothing is written unless every target is accepted.
    for s in specs {
        match s {
            TargetSpec::Path(p) => {
                super::target::decide_path(p, prepare::facts(p)?, opts.destructive)?;
            }
            TargetSpec::Export(e) => {
                super::target::decide_export(e, opts.destructive, opts.working_set_bytes)?;
            }
        }
    }
    let mut prepared = Vec::with_capacity(specs.len());
    for s in specs {
        prepared.push(match s {
            TargetSpec::Export(e) => {
                prepare::export(e, opts.working_set_bytes, opts.destructive, progress)?
            }
            TargetSpec::Path(p) => {
                prepare::path(p, opts.working_set_bytes, opts.destructive, progress)?
            }
        });
        check_stop(stop)?;
    }
    let mut runs = Vec::new();
    let mut skipped = Vec::new();
    for t in &opts.tests {
        for (i, p) in prepared.iter().enumerate() {
            match report::applies(t, &p.info.kind) {
                Ok(()) => runs.push((*t, i)),
                Err(reason) => skipped.push(BenchSkipped {
                    target: p.info.name.clone(),
                    test: t.name.into(),
                    reason: reason.into(),
                }),
            }
        }
    }
    let mut results = Vec::with_capacity(runs.len());
    for (n, (t, i)) in runs.iter().enumerate() {
        let p = &prepared[*i];
        progress.started(n, runs.len(), t, &p.info.name);
        let (rec, elapsed) = measure(p, t, opts.runtime, progress, stop)?;
        check_stop(stop)?;
        let r = report::result(&p.info.name, t, &rec, elapsed);
        progress.finished(&r);
        results.push(r);
    }
    let targets: Vec<_> = prepared.iter().map(|p| p.info.clone()).collect();
    for p in prepared {
        for w in p.finish() {
            progress.warn(&w);
        }
    }
    Ok(build(opts, started_at, targets, results, skipped))
}

fn build(
    opts: &Options,
    started_at: String,
    targets: Vec<crate::api::wire::bench::BenchTarget>,
    results: Vec<BenchResult>,
    skipped: Vec<BenchSkipped>,
) -> BenchReport {
    let names: Vec<String> = targets.iter().map(|t| t.name.clone()).collect();
    BenchReport {
        version: REPORT_VERSION,
        tool: format!("ramd {}", env!("CARGO_PKG_VERSION")),
        profile: opts.profile.clone(),
        started_at,
        finished_at: rfc3339(SystemTime::now()),
        runtime_s: opts.runtime.as_secs_f64(),
        host: host(),
        comparisons: report::comparisons(&names, &results),
        targets,
        tests: opts.tests.iter().map(report::test_info).collect(),
        results,
        skipped,
    }
}

fn check_stop(stop: &AtomicBool) -> Result<(), BenchError> {
    if stop.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(BenchError::Interrupted);
    }
    Ok(())
}

/// Opens one handle per job (before the clock starts).
fn open_jobs(p: &Prepared, t: &TestSpec) -> Result<Vec<Handle>, BenchError> {
    let err = |what: &str| {
        let what = format!("{what} {} for {}", p.info.name, t.name);
        move |source| BenchError::Io { what, source }
    };
    (0..t.jobs)
        .map(|_| {
            Ok(match (&p.access, &p.files_dir) {
                (_, Some(dir)) if t.pattern == super::profile::Pattern::Files => {
                    Handle::Files(dir.clone())
                }
                (Access::Nbd(uri), _) => Handle::Nbd(NbdJob::open(uri)?),
                (Access::File { uring: true, .. }, _) => {
                    let ring = UringJob::new(t.iodepth).map_err(err("set up io_uring on"))?;
                    Handle::Uring(Box::new(ring), p.open_file().map_err(err("open"))?)
                }
                (Access::File { .. }, _) => Handle::Psync(p.open_file().map_err(err("open"))?),
            })
        })
        .collect()
}

/// Runs one test on one target: its jobs in parallel until the deadline;
/// what they recorded and the time it took.
fn measure(
    p: &Prepared,
    t: &TestSpec,
    runtime: Duration,
    progress: &dyn Progress,
    stop: &AtomicBool,
) -> Result<(Recorder, Duration), BenchError> {
    let handles = open_jobs(p, t)?;
    let lives: Vec<Live> = handles.iter().map(|_| Live::default()).collect();
    // The same offsets on every target: a test asks the same of each.
    let seed = t.name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let start = Instant::now();
    let until = Until {
        deadline: start + runtime,
        stop,
    };
    let outcomes = std::thread::scope(|s| {
        let threads: Vec<_> = handles
            .into_iter()
            .zip(&lives)
            .enumerate()
            .map(|(j, (h, live))| {
                let w = Workload::new(t, p.working_set_bytes(), j as u32);
                s.spawn(move || run_job(h, &w, seed, until, live))
            })
            .collect();
        while !threads.iter().all(|h| h.is_finished()) {
            progress.tick(
                start.elapsed().min(runtime),
                lives.iter().map(Live::get).sum(),
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        threads
            .into_iter()
            .map(|h| h.join().expect("a bench job panicked"))
            .collect::<Vec<_>>()
    });
    let elapsed = start.elapsed();
    let mut total = Recorder::default();
    for (rec, outcome) in outcomes {
        total.add(&rec);
        outcome.map_err(|e| engine_error(&p.info.name, t.name, e))?;
    }
    Ok((total, elapsed))
}

/// One job's thread.
fn run_job(
    h: Handle,
    w: &Workload,
    seed: u64,
    until: Until<'_>,
    live: &Live,
) -> (Recorder, Result<(), EngineError>) {
    let mut rec = Recorder::default();
    let outcome = match h {
        Handle::Nbd(mut j) => j.run(w, seed, until, live, &mut rec),
        Handle::Uring(mut ring, f) => ring.run(&f, w, seed, until, live, &mut rec),
        Handle::Psync(f) => psync::run(&f, w, seed, until, live, &mut rec),
        Handle::Files(dir) => files::run(&dir, w, seed, until, live, &mut rec),
    };
    (rec, outcome)
}

/// The machine: host name, CPUs, kernel release.
fn host() -> BenchHost {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
    };
    BenchHost {
        hostname: read("/proc/sys/kernel/hostname"),
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
        kernel: read("/proc/sys/kernel/osrelease"),
    }
}

/// RFC 3339 in UTC, to the second.
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}
