//! `ramd bench`: measure a drive against the disks it replaces.
//!
//! The one command-line file that imports the benchmark engine (`bench`,
//! a seam in scripts/arch_check.py, like `daemon.rs` for the server): the
//! load runs in this process. The daemon's API is used as by every other
//! command: to look the drive up (its NBD URI, size, whether it holds
//! data) and, afterwards, to keep the report for the dashboard
//! (`PUT /v1/bench/latest`).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use super::{output, print_json, CliError, JsonFlag};
use crate::api::client::{Client, Target};
use crate::api::wire::bench::{BenchLatest, BenchReport, BenchResult};
use crate::bench::{self, BenchError, ExportSpec, Kind, Profile, TargetSpec, TestSpec};

/// `ramd bench`'s arguments.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// A drive (or cache) of the daemon to measure: it must hold no data
    /// (or give --destructive); what the bench writes is trimmed afterwards.
    #[arg(value_parser = super::arg_name)]
    pub drive: Option<String>,

    /// Also measure this directory (a scratch file and directory inside,
    /// removed afterwards), file or block device (only with
    /// --destructive), and compare. Repeatable.
    #[arg(long, value_name = "PATH|DEVICE")]
    pub compare: Vec<PathBuf>,

    /// Which tests: quick (well under a minute), full (every test), db
    /// (small random I/O up to the OLTP job), build (small files, large
    /// sequential I/O).
    #[arg(long, value_enum, default_value_t = Profile::Quick)]
    pub profile: Profile,

    /// Run this test instead of a profile's; repeatable. One of
    /// randread-4k-qd1, randwrite-4k-qd1, randrw-4k-qd1, randread-4k-qd32,
    /// randwrite-4k-qd32, randrw-4k-qd32, oltp-4k-qd64x4, seqread-1m,
    /// seqwrite-1m, files-4k.
    #[arg(long = "test", value_name = "NAME", value_parser = arg_test)]
    pub tests: Vec<String>,

    /// How long each test runs on each target: 10s, 1500ms [default: the
    /// profile's: quick 3s, full 8s, db and build 10s].
    #[arg(long, value_name = "DURATION", value_parser = arg_runtime)]
    pub runtime: Option<Duration>,

    /// Bytes the block tests spread their I/O over on each target (less
    /// where a drive or device is smaller) [default: 256M for quick, else 1G].
    #[arg(long, value_name = "SIZE", value_parser = super::arg_size)]
    pub size: Option<String>,

    /// Write the plot here: FILE.svg (a self-contained SVG) or FILE.html
    /// (the SVG and a table of every figure).
    #[arg(long, value_name = "FILE.svg|FILE.html", value_parser = arg_plot)]
    pub plot: Option<PathBuf>,

    /// Allow writing over data: a block device, a file or drive that holds
    /// data, a cache (whose writes reach its backing).
    #[arg(long)]
    pub destructive: bool,

    /// Do not send the report to the daemon (by default a run that
    /// measured a drive or cache is kept for `GET /v1/bench/latest` and
    /// the dashboard).
    #[arg(long)]
    pub no_store: bool,

    #[command(flatten)]
    pub out: JsonFlag,
}

/// Why `ramd bench` failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchFailed {
    #[error(transparent)]
    Bench(#[from] BenchError),
    /// No drive and nothing to compare.
    #[error("nothing to measure: name a drive and what to compare it with, e.g. `ramd bench ram0 --compare /var/tmp`")]
    NoTargets,
    /// The drive's NBD socket cannot be reached from here.
    #[error("'{0}' has no NBD address ramd bench can reach from this host without TLS: run ramd bench on the daemon's host")]
    NoUri(String),
}

/// A value of `ramd bench`'s options that cannot be used (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum BenchArgError {
    #[error("no test '{name}': one of {list}")]
    UnknownTest { name: String, list: String },
    #[error("'{text}': {source} (e.g. 10s, 1500ms, 1m)")]
    Runtime {
        text: String,
        source: humantime::DurationError,
    },
    #[error("'{0}': give 100ms to 1h")]
    RuntimeRange(String),
    #[error("'{0}': the plot is FILE.svg or FILE.html")]
    Plot(String),
}

/// A `--test` name from the catalogue.
fn arg_test(text: &str) -> Result<String, BenchArgError> {
    match bench::profile::find(text) {
        Some(t) => Ok(t.name.to_owned()),
        None => Err(BenchArgError::UnknownTest {
            name: text.to_owned(),
            list: bench::profile::names().join(", "),
        }),
    }
}

/// A `--runtime` of 100ms to 1h.
fn arg_runtime(text: &str) -> Result<Duration, BenchArgError> {
    let d = humantime::parse_duration(text).map_err(|source| BenchArgError::Runtime {
        text: text.to_owned(),
        source,
    })?;
    if d < Duration::from_millis(100) || d > Duration::from_secs(3600) {
        return Err(BenchArgError::RuntimeRange(text.to_owned()));
    }
    Ok(d)
}

/// A `--plot` file ending in .svg or .html.
fn arg_plot(text: &str) -> Result<PathBuf, BenchArgError> {
    let p = PathBuf::from(text);
    match p.extension().and_then(|e| e.to_str()) {
        Some("svg" | "html" | "htm") => Ok(p),
        _ => Err(BenchArgError::Plot(text.to_owned())),
    }
}

/// Set by SIGINT (Ctrl-C), SIGTERM or SIGHUP while a benchmark runs: the
/// jobs stop, scratch data is removed, and the command ends with
/// "interrupted".
static STOP: AtomicBool = AtomicBool::new(false);

/// The signals that stop a benchmark with its cleanup (a closed terminal
/// and `kill` as well as Ctrl-C: a scratch file of a GiB left behind in
/// the user's directory is what this prevents).
const STOP_SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

extern "C" fn on_stop_signal(sig: libc::c_int) {
    if STOP.swap(true, Ordering::Relaxed) {
        // A second one: out now, as the signal would without this handler
        // (the user asked twice; the cleanup may be what hangs).
        // SAFETY: signal and raise are async-signal-safe.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }
}

/// Ctrl-C (and SIGTERM, SIGHUP) stops the benchmark instead of the
/// process, so the cleanup runs; a second one ends the process at once.
fn catch_stop_signals() {
    for sig in STOP_SIGNALS {
        // SAFETY: the handler only touches an atomic and calls
        // async-signal-safe functions; the sigaction struct is zeroed (an
        // empty mask, no flags) and lives for the call.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_stop_signal as *const () as usize;
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// `ramd bench`.
pub(crate) fn run(client: &Client, args: BenchArgs) -> Result<(), CliError> {
    let mut specs = Vec::new();
    if let Some(name) = &args.drive {
        specs.push(TargetSpec::Export(export_spec(client, name)?));
    }
    for p in &args.compare {
        specs.push(TargetSpec::Path(super::absolute(p)?));
    }
    if specs.is_empty() {
        return Err(BenchFailed::NoTargets.into());
    }
    // Before minutes of work, not after: the plot must have a place.
    if let Some(path) = &args.plot {
        check_plot_path(path)?;
    }
    let opts = options(&args);
    catch_stop_signals();
    let progress = Bar::new(opts.runtime, args.out.json);
    let result = bench::run(&opts, &specs, &progress, &STOP);
    progress.bar.finish_and_clear();
    let report = result.map_err(BenchFailed::from)?;
    let svg = bench::plot::svg(&report);
    if let Some(path) = &args.plot {
        write_plot(path, &report, &svg)?;
    }
    if args.drive.is_some() && !args.no_store {
        store(client, &report, svg);
    }
    if args.out.json {
        return print_json(&report);
    }
    print!("{}", table(&report));
    if let Some(path) = &args.plot {
        println!("plot: {}", path.display());
    }
    Ok(())
}

/// The options from the arguments (already checked by their parsers).
fn options(args: &BenchArgs) -> bench::Options {
    let tests: Vec<TestSpec> = if args.tests.is_empty() {
        args.profile.tests()
    } else {
        args.tests
            .iter()
            .filter_map(|t| bench::profile::find(t))
            .collect()
    };
    let working_set_bytes = args
        .size
        .as_deref()
        .and_then(|s| crate::size::parse(s).ok())
        .unwrap_or_else(|| args.profile.default_working_set_bytes());
    bench::Options {
        profile: if args.tests.is_empty() {
            args.profile.name().into()
        } else {
            "custom".into()
        },
        tests,
        runtime: args
            .runtime
            .unwrap_or_else(|| args.profile.default_runtime()),
        working_set_bytes,
        destructive: args.destructive,
    }
}

/// The drive (or cache) `name` as the benchmark needs it.
fn export_spec(client: &Client, name: &str) -> Result<ExportSpec, CliError> {
    let local = matches!(client.target(), Target::Unix(_));
    let reachable = |unix: &str, tcp: &[String]| -> Result<String, CliError> {
        if local {
            return Ok(unix.to_owned());
        }
        tcp.iter()
            .find(|u| u.starts_with("nbd://"))
            .cloned()
            .ok_or_else(|| BenchFailed::NoUri(name.to_owned()).into())
    };
    match client.drive(name) {
        Ok(d) => Ok(ExportSpec {
            name: d.name.clone(),
            kind: Kind::Drive,
            uri: reachable(&d.uri, &d.tcp_uris)?,
            size_bytes: d.size_bytes,
            mem_limit_bytes: d.mem_limit_bytes,
            allocated_bytes: d.allocated_bytes,
            read_only: d.read_only,
            backing: None,
        }),
        Err(e) if e.code() == Some("drive_not_found") => {
            let c = client.cache(name).map_err(|_| e)?;
            Ok(ExportSpec {
                name: c.name.clone(),
                kind: Kind::Cache,
                uri: reachable(&c.uri, &c.tcp_uris)?,
                size_bytes: c.size_bytes.unwrap_or(0),
                mem_limit_bytes: None,
                allocated_bytes: 0,
                read_only: false,
                backing: Some(c.backing.spec.clone()),
            })
        }
        Err(e) => Err(e.into()),
    }
}

/// Whether the plot can be written at `path`: its directory exists and
/// takes files (an existing file there must be writable).
fn check_plot_path(path: &Path) -> Result<(), CliError> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let refuse = |source: std::io::Error| CliError::Write {
        path: path.to_owned(),
        source,
    };
    if !dir.is_dir() {
        return Err(refuse(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!(
                "{} is not a directory; --plot needs an existing one",
                dir.display()
            ),
        )));
    }
    let target = if path.exists() { path } else { dir };
    rustix::fs::access(target, rustix::fs::Access::WRITE_OK).map_err(|e| refuse(e.into()))
}

fn write_plot(path: &Path, report: &BenchReport, svg: &str) -> Result<(), CliError> {
    let html = matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("html" | "htm")
    );
    let text = if html {
        bench::plot::html(report)
    } else {
        svg.to_owned()
    };
    std::fs::write(path, text).map_err(|source| CliError::Write {
        path: path.to_owned(),
        source,
    })
}

/// Sends the report to the daemon for the dashboard; a failure is a
/// warning (the figures are printed either way).
fn store(client: &Client, report: &BenchReport, svg: String) {
    let latest = BenchLatest {
        report: report.clone(),
        svg,
    };
    if let Err(e) = client.put_bench_latest(&latest) {
        eprintln!(
            "warning: the daemon did not keep the report ({e}); the figures below are complete"
        );
    }
}

/// The results, one row per test and target, with the first target's
/// IOPS against each other one's.
pub fn table(r: &BenchReport) -> String {
    let first = r
        .targets
        .first()
        .map(|t| t.name.clone())
        .unwrap_or_default();
    let others: Vec<&str> = r.targets.iter().skip(1).map(|t| t.name.as_str()).collect();
    let mut header = vec![
        "TEST", "TARGET", "IOPS", "MIB/S", "MEAN", "P50", "P99", "P99.9", "MAX",
    ];
    let vs: Vec<String> = others.iter().map(|o| format!("VS {o}")).collect();
    header.extend(vs.iter().map(String::as_str));
    let right: Vec<usize> = (2..header.len()).collect();
    let mut t = output::table(&header, &right);
    for x in &r.results {
        let mut row = cells(x);
        for o in &others {
            let c = r
                .comparisons
                .iter()
                .find(|c| c.test == x.test && c.baseline == *o && x.target == first);
            row.push(c.map_or_else(String::new, |c| format!("{:.1}x", c.iops_ratio)));
        }
        t.add_row(row);
    }
    let mut out = output::render(&t);
    for target in &r.targets {
        for note in &target.notes {
            out.push_str(&format!("note: {}: {note}\n", target.name));
        }
    }
    for s in &r.skipped {
        out.push_str(&format!(
            "skipped: {} on {}: {}\n",
            s.test, s.target, s.reason
        ));
    }
    out
}

fn cells(x: &BenchResult) -> Vec<String> {
    let l = &x.lat_us;
    vec![
        x.test.clone(),
        x.target.clone(),
        output::count_rate(x.iops),
        format!("{:.1}", x.mib_s),
        output::micros(Some(l.mean)),
        output::micros(Some(l.p50)),
        output::micros(Some(l.p99)),
        output::micros(Some(l.p99_9)),
        output::micros(Some(l.max)),
    ]
}

/// The progress bar on stderr (hidden when stderr is not a terminal, or
/// with --json).
struct Bar {
    bar: ProgressBar,
    /// Off a terminal: a line on stderr per phase and run instead of the
    /// bar (logs and CI see the progress of a long run).
    lines: bool,
    runtime_ms: u64,
    /// The run in progress and its label.
    current: parking_lot::Mutex<(u64, String)>,
}

impl Bar {
    fn new(runtime: Duration, quiet: bool) -> Bar {
        let terminal = std::io::stderr().is_terminal();
        let bar = if quiet || !terminal {
            ProgressBar::hidden()
        } else {
            ProgressBar::new_spinner()
        };
        bar.set_style(ProgressStyle::with_template("{spinner} {msg}").expect("a valid template"));
        bar.enable_steady_tick(Duration::from_millis(120));
        Bar {
            bar,
            lines: !terminal,
            runtime_ms: runtime.as_millis() as u64,
            current: parking_lot::Mutex::new((0, String::new())),
        }
    }
}

/// One progress line on stderr; a stderr that is gone costs the line,
/// not the run.
fn line(text: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{text}");
}

impl bench::Progress for Bar {
    fn phase(&self, text: &str) {
        if self.lines {
            line(format_args!("ramd bench: {text}"));
        }
        self.bar.set_message(text.to_owned());
    }

    fn started(&self, n: usize, runs: usize, test: &TestSpec, target: &str) {
        if n == 0 {
            self.bar.set_style(
                ProgressStyle::with_template("[{bar:30}] {percent:>3}% eta {eta:>4} {msg}")
                    .expect("a valid template")
                    .progress_chars("=> "),
            );
            self.bar.set_length(runs as u64 * self.runtime_ms);
        }
        let label = format!("{}/{runs} {} on {target}", n + 1, test.name);
        if self.lines {
            line(format_args!("ramd bench: run {label}"));
        }
        *self.current.lock() = (n as u64, label);
    }

    fn tick(&self, elapsed: Duration, ios: u64) {
        let (n, label) = self.current.lock().clone();
        let ms = elapsed.as_millis() as u64;
        self.bar
            .set_position(n * self.runtime_ms + ms.min(self.runtime_ms));
        let rate = if ms > 0 {
            ios as f64 * 1000.0 / ms as f64
        } else {
            0.0
        };
        self.bar
            .set_message(format!("{label}: {} IOPS", output::count_rate(rate)));
    }

    fn finished(&self, r: &BenchResult) {
        if self.lines {
            line(format_args!(
                "ramd bench: done {} on {}: {} IOPS, {:.1} MiB/s",
                r.test,
                r.target,
                output::count_rate(r.iops),
                r.mib_s
            ));
        }
        self.bar.println(format!(
            "{:18} {:24} {:>8} IOPS {:>9.1} MiB/s  p50 {:>7}  p99 {:>7}",
            r.test,
            r.target,
            output::count_rate(r.iops),
            r.mib_s,
            output::micros(Some(r.lat_us.p50)),
            output::micros(Some(r.lat_us.p99))
        ));
    }

    fn warn(&self, text: &str) {
        self.bar.suspend(|| eprintln!("warning: {text}"));
    }
}
