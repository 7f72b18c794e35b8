//! `ramd bench` end to end, with the real daemon and real clients: a drive
//! against a file on disk (the JSON report checked against
//! docs/bench.schema.json, figures that make sense together, a RAM drive
//! ahead of a file with O_DIRECT at QD1), the plots parsed by Python's XML
//! parser with one series per target in every chart, the report kept by
//! the daemon (`/v1/bench/latest`, checked against docs/openapi.yaml),
//! directories (scratch files only, removed; the file-level test),
//! refusals (a loop device without --destructive, a file or drive holding
//! data: nothing written; the kernel's own files even with it), Ctrl-C and
//! SIGTERM (everything cleaned up), and the
//! cross-check with fio on the same workloads.
//!
//! No timing is asserted by default: the relations between timings (a RAM
//! drive's 4 KiB QD1 read latency below a disk file's with O_DIRECT, and
//! agreement with fio within the factors docs/bench.md states) are printed,
//! and asserted only with RAMD_TIMING_ASSERTS=1, on an otherwise idle
//! machine: on a busy one (the rest of the suite, other work) they measure
//! the load as much as ramd bench.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::openapi::Spec;
use common::{python, require, run, tool, wait_until, Daemon};
use serde_json::Value;

/// Every object schema in `schema` closed (`additionalProperties: false`
/// where it says nothing): readers of the report must accept new fields,
/// but what ramd emits must be documented, field by field.
fn closed(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            if map.contains_key("properties") && !map.contains_key("additionalProperties") {
                map.insert("additionalProperties".into(), Value::Bool(false));
            }
            map.values_mut().for_each(closed);
        }
        Value::Array(items) => items.iter_mut().for_each(closed),
        _ => {}
    }
}

/// The report's JSON Schema (docs/bench.schema.json) applied to `report`,
/// with no field left undocumented.
#[track_caller]
fn check_schema(report: &Value) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/bench.schema.json");
    let mut schema: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    closed(&mut schema);
    let v = jsonschema::draft202012::new(&schema).expect("docs/bench.schema.json compiles");
    let errors: Vec<String> = v
        .iter_errors(report)
        .map(|e| format!("{e} at {}", e.instance_path))
        .collect();
    assert!(
        errors.is_empty(),
        "the report does not match docs/bench.schema.json:\n  {}",
        errors.join("\n  ")
    );
}

/// `ramd bench ARGS --json` against `d`: the report.
#[track_caller]
fn bench_json(d: &Daemon, args: &[&str]) -> Value {
    let out = run(d.cli().arg("bench").args(args).arg("--json")).ok();
    let report: Value = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("--json printed no JSON ({e}): {out}"));
    check_schema(&report);
    report
}

fn result<'a>(r: &'a Value, target: &str, test: &str) -> &'a Value {
    r["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["target"] == target && x["test"] == test)
        .unwrap_or_else(|| panic!("no result of {test} on {target}: {r}"))
}

/// Figures that must hold together in any result.
#[track_caller]
fn check_figures(r: &Value) {
    for x in r["results"].as_array().unwrap() {
        let what = format!("{} on {}", x["test"], x["target"]);
        let f = |k: &str| x[k].as_f64().unwrap();
        assert!(f("ios") > 0.0 && f("iops") > 0.0, "{what}: no I/O: {x}");
        assert_eq!(x["errors"], 0, "{what}: {x}");
        // fio's conventions: IOPS = ios / time, MiB/s = bytes / 2^20 / time.
        let secs = f("elapsed_s");
        assert!(
            (f("iops") - f("ios") / secs).abs() <= 0.01 * f("iops") + 1.0,
            "{what}: {x}"
        );
        assert!(
            (f("mib_s") - f("bytes") / 1048576.0 / secs).abs() <= 0.01 * f("mib_s") + 0.1,
            "{what}: {x}"
        );
        let l = &x["lat_us"];
        let lat = |k: &str| l[k].as_f64().unwrap();
        assert!(
            lat("p50") > 0.0 && lat("p50") <= lat("p95") && lat("p95") <= lat("p99"),
            "{what}: {l}"
        );
        assert!(
            lat("p99") <= lat("p99_9") && lat("p99_9") <= lat("max"),
            "{what}: {l}"
        );
        assert!(
            lat("mean") > 0.0 && lat("mean") <= lat("max"),
            "{what}: {l}"
        );
        let counted: f64 = x["histogram_us"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h[1].as_f64().unwrap())
            .sum();
        assert_eq!(counted, f("ios"), "{what}: the histogram counts every I/O");
    }
}

/// Python's XML parser on `path` (SVG or XHTML): per chart, the targets
/// of its series, as "CHART TEST: t1|t2" lines.
#[track_caller]
fn chart_series(path: &Path) -> Vec<String> {
    let script = r#"
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
svgs = [root] if root.tag.endswith('}svg') else [e for e in root.iter() if e.tag.endswith('}svg')]
assert len(svgs) == 1, 'one svg element, got %d' % len(svgs)
for chart in svgs[0].iter():
    if chart.get('class') != 'chart':
        continue
    names = sorted({g.get('data-target') for g in chart.iter() if g.get('class') == 'series'})
    print(chart.get('data-chart'), chart.get('data-test', '-') + ':', '|'.join(names))
"#;
    let out = python(script, &[path.to_str().unwrap()]).ok();
    out.stdout.lines().map(str::to_owned).collect()
}

/// The names of the targets with a result for each test, as
/// [`chart_series`] prints them.
fn expected_series(r: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let names = |test: Option<&str>| {
        let set: BTreeSet<&str> = r["results"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|x| test.map_or(true, |t| x["test"] == t))
            .map(|x| x["target"].as_str().unwrap())
            .collect();
        set.into_iter().collect::<Vec<_>>().join("|")
    };
    out.push(format!("iops -: {}", names(None)));
    for t in r["tests"].as_array().unwrap() {
        let t = t["name"].as_str().unwrap();
        out.push(format!("latency {t}: {}", names(Some(t))));
    }
    out
}

fn drive_allocated(d: &Daemon, name: &str) -> u64 {
    let (status, body) = d.http("GET", &format!("/v1/drives/{name}"), None);
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["allocated_bytes"].as_u64().unwrap()
}

/// Every entry under `dir` with its size, for before/after comparisons.
fn listing(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.path(), e.metadata().unwrap().len())
        })
        .collect();
    out.sort();
    out
}

/// A directory on the machine's disk (not tmpfs), so O_DIRECT works.
fn disk_dir(d: &Daemon, name: &str) -> PathBuf {
    let p = d.dir().join(name);
    std::fs::create_dir(&p).unwrap();
    p
}

#[test]
fn a_drive_against_a_file_on_disk_report_plot_and_stored_results() {
    let d = Daemon::start(&["fast=256M"]);
    let spec = Spec::load();
    let (status, v) = spec.call(&d, "GET", "/v1/bench/latest", "/v1/bench/latest", None);
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (404, Some("no_bench_results")),
        "{v}"
    );

    let dir = disk_dir(&d, "disk");
    std::fs::write(dir.join("keep.txt"), b"not the bench's").unwrap();
    // An empty file of the user's (a target must exist: a missing one is
    // refused): filled for the run, emptied again afterwards.
    let file = dir.join("scratch.img");
    std::fs::File::create(&file).unwrap();
    let before = listing(&dir);
    let svg = d.dir().join("plot.svg");
    let r = bench_json(
        &d,
        &[
            "fast",
            "--compare",
            file.to_str().unwrap(),
            "--test",
            "randread-4k-qd1",
            "--test",
            "randwrite-4k-qd1",
            "--test",
            "randrw-4k-qd32",
            "--test",
            "seqread-1m",
            "--test",
            "seqwrite-1m",
            "--runtime",
            "1s",
            "--size",
            "64M",
            "--plot",
            svg.to_str().unwrap(),
        ],
    );
    assert_eq!(r["profile"], "custom");
    assert_eq!(r["targets"][0]["kind"], "drive");
    assert_eq!(r["targets"][0]["engine"], "nbd");
    assert_eq!(r["targets"][1]["kind"], "file");
    assert_eq!(r["targets"][1]["engine"], "io_uring");
    assert_eq!(
        r["targets"][1]["direct_io"], true,
        "the test directory is on a disk filesystem: {r}"
    );
    assert_eq!(r["results"].as_array().unwrap().len(), 10);
    check_figures(&r);
    // The plausibility relation the issue names: RAM beats a disk file
    // with O_DIRECT on 4 KiB random reads at QD1 (by far more than any
    // noise on an idle machine; see [`timing`]).
    let ram = result(&r, "fast", "randread-4k-qd1");
    let disk = result(&r, file.to_str().unwrap(), "randread-4k-qd1");
    let p50 = |x: &Value| x["lat_us"]["p50"].as_f64().unwrap();
    timing(
        p50(ram) < p50(disk),
        &format!(
            "RAM drive p50 {} us below the O_DIRECT file's {} us",
            p50(ram),
            p50(disk)
        ),
    );
    let ratio = r["comparisons"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["test"] == "randread-4k-qd1")
        .unwrap();
    // The comparison is the two results' IOPS, whichever is ahead.
    let iops = |x: &Value| x["iops"].as_f64().unwrap();
    let want = iops(ram) / iops(disk);
    let got = ratio["iops_ratio"].as_f64().unwrap();
    // (Rounded to 3 decimals.)
    assert!(
        (got - want).abs() <= 0.01 * want + 0.001,
        "{ratio}: want {want}"
    );
    timing(got > 1.0, &format!("RAM drive IOPS ahead: {ratio}"));
    assert!(
        result(&r, "fast", "randrw-4k-qd32")["read"]["ios"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert!(
        result(&r, "fast", "randrw-4k-qd32")["write"]["ios"]
            .as_u64()
            .unwrap()
            > 0
    );

    // One series per target in every chart.
    assert_eq!(chart_series(&svg), expected_series(&r));
    // Nothing written outside the named file, which is gone again; the
    // drive is trimmed.
    assert_eq!(listing(&dir), before);
    assert_eq!(drive_allocated(&d, "fast"), 0);

    // The daemon keeps the report and the plot for the dashboard.
    let (status, latest) = spec.call(&d, "GET", "/v1/bench/latest", "/v1/bench/latest", None);
    assert_eq!(status, 200);
    assert_eq!(latest["report"], r);
    assert_eq!(
        latest["svg"].as_str().unwrap(),
        std::fs::read_to_string(&svg).unwrap()
    );
    let stored = d.state_dir().join("bench/latest.json");
    let mode = |p: &Path| {
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(p).unwrap().permissions())
            & 0o777
    };
    assert_eq!(mode(&stored), 0o600);
    assert_eq!(mode(stored.parent().unwrap()), 0o700);
}

#[test]
fn directories_get_scratch_files_only_and_the_file_level_test() {
    let d = Daemon::start(&["fast=128M"]);
    let dir = disk_dir(&d, "project");
    std::fs::write(dir.join("main.c"), b"int main(void) { return 0; }\n").unwrap();
    let before = listing(&dir);
    let html = d.dir().join("plot.html");
    let r = bench_json(
        &d,
        &[
            "fast",
            "--compare",
            dir.to_str().unwrap(),
            "--test",
            "randread-4k-qd1",
            "--test",
            "files-4k",
            "--runtime",
            "500ms",
            "--size",
            "32M",
            "--plot",
            html.to_str().unwrap(),
            "--no-store",
        ],
    );
    let name = dir.to_str().unwrap();
    assert_eq!(r["targets"][1]["kind"], "directory");
    assert!(
        r["targets"][1]["path"].as_str().unwrap().starts_with(name),
        "{r}"
    );
    check_figures(&r);
    let files = result(&r, name, "files-4k");
    assert!(files["read"]["ios"].as_u64() > Some(0) && files["write"]["ios"].as_u64() > Some(0));
    // The drive has no directory: skipped, and said why.
    let skipped = &r["skipped"][0];
    assert_eq!(
        (skipped["target"].as_str(), skipped["test"].as_str()),
        (Some("fast"), Some("files-4k"))
    );
    assert_eq!(chart_series(&html), expected_series(&r));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("<table>") && page.contains("files-4k"));
    assert_eq!(
        listing(&dir),
        before,
        "the directory holds exactly what it held"
    );
    // --no-store: the daemon kept nothing.
    assert_eq!(d.http("GET", "/v1/bench/latest", None).0, 404);
}

#[test]
fn refuses_to_write_over_data_without_destructive() {
    if !common::require_root_block_devices() || !require(&["losetup", "nbdsh"]) {
        return;
    }
    let d = Daemon::start(&["full=64M"]);
    let img = d.dir().join("dev.img");
    std::fs::write(&img, common::random_bytes(32 << 20, 7)).unwrap();
    let original = std::fs::read(&img).unwrap();
    let lo = common::block::Loop::attach(&img);
    let refused = |args: &[&str], why: &str| {
        let out = run(d.cli().arg("bench").args(args).args([
            "--test",
            "randwrite-4k-qd1",
            "--runtime",
            "200ms",
        ]))
        .failed();
        assert_eq!(out.code(), 1, "{out}");
        assert!(
            out.stderr.contains(why) && out.stderr.contains("--destructive"),
            "{out}"
        );
    };
    refused(&["--compare", &lo.dev], "is a block device");
    assert!(
        std::fs::read(&img).unwrap() == original,
        "the device was written"
    );

    // A file holding data, named directly.
    let data = d.dir().join("data.bin");
    std::fs::write(&data, b"precious").unwrap();
    refused(&["--compare", data.to_str().unwrap()], "holds 8 B of data");
    assert_eq!(std::fs::read(&data).unwrap(), b"precious");

    // A drive holding data; nothing is written before every target is
    // accepted, so the directory named beside it gets no scratch file.
    run(tool("nbdsh").args(["-u", &d.uri("full"), "-c", "h.pwrite(b'x' * 4096, 0)"])).ok();
    let dir = disk_dir(&d, "empty");
    refused(
        &["full", "--compare", dir.to_str().unwrap()],
        "drive 'full' holds 4 KiB",
    );
    assert_eq!(listing(&dir), vec![]);
    assert_eq!(drive_allocated(&d, "full"), 4096);

    // With --destructive the device is measured (and written).
    let r = bench_json(
        &d,
        &[
            "--compare",
            &lo.dev,
            "--destructive",
            "--test",
            "randwrite-4k-qd1",
            "--runtime",
            "300ms",
            "--size",
            "16M",
        ],
    );
    assert_eq!(r["targets"][0]["kind"], "block-device");
    assert_eq!(r["targets"][0]["direct_io"], true);
    drop(lo);
    assert!(
        std::fs::read(&img).unwrap() != original,
        "--destructive wrote the device"
    );

    // Usage errors exit 2 before anything runs.
    let out = run(d.cli().args(["bench", "full", "--plot", "x.png"])).failed();
    assert_eq!(out.code(), 2, "{out}");
    let out = run(d.cli().args(["bench", "full", "--test", "nope"])).failed();
    assert_eq!(out.code(), 2, "{out}");
    assert!(
        out.stderr.contains("randread-4k-qd1"),
        "the message lists the tests: {out}"
    );
    let out = run(d.cli().args(["bench"])).failed();
    assert!(out.stderr.contains("--compare"), "{out}");
}

#[test]
fn ctrl_c_cleans_up_scratch_files_and_trims_the_drive() {
    let d = Daemon::start(&["fast=128M"]);
    // Ctrl-C, and `kill` (SIGTERM): both stop it with its cleanup.
    for (i, sig) in [libc::SIGINT, libc::SIGTERM].into_iter().enumerate() {
        interrupted_run(&d, &format!("scratch{i}"), sig);
    }
}

/// A run against `fast` and a new directory `name`, stopped by `sig`
/// while it writes: everything is cleaned up.
fn interrupted_run(d: &Daemon, name: &str, sig: libc::c_int) {
    let dir = disk_dir(d, name);
    let mut child = common::KillOnDrop(
        d.cli()
            .args([
                "bench",
                "fast",
                "--compare",
                dir.to_str().unwrap(),
                "--test",
                "randwrite-4k-qd1",
            ])
            .args(["--runtime", "60s", "--size", "32M"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // Wait until it writes: the scratch file exists and the drive holds data.
    wait_until("the scratch file", Duration::from_secs(60), || {
        std::fs::read_dir(&dir).unwrap().count() == 2 && drive_allocated(d, "fast") > 0
    });
    std::thread::sleep(Duration::from_millis(300));
    common::signal(child.0.id(), sig);
    let status = common::wait_timeout(&mut child.0, Duration::from_secs(30))
        .expect("bench ends after Ctrl-C");
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.0.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    assert_eq!(
        listing(&dir),
        vec![],
        "the scratch file and directory are removed"
    );
    assert_eq!(drive_allocated(d, "fast"), 0, "the drive is trimmed");
}

/// The kernel's own files look like empty files and directories to
/// `stat` (/proc/sysrq-trigger is an "empty regular file"): refused, even
/// with --destructive. A file holding data that --destructive overwrites
/// is cut back to its length afterwards.
#[test]
fn refuses_the_kernels_files_and_gives_files_their_length_back() {
    let d = Daemon::start(&["fast=16M"]);
    // /proc/self/comm is this command's own name: harmless if written.
    for path in ["/proc/self/comm", "/proc/self", "/sys/kernel"] {
        let out = run(d
            .cli()
            .args(["bench", "--compare", path, "--destructive"])
            .args(["--test", "randwrite-4k-qd1", "--runtime", "200ms"]))
        .failed();
        assert_eq!(out.code(), 1, "{out}");
        assert!(out.stderr.contains("kernel's own filesystems"), "{out}");
    }
    let data = d.dir().join("data.bin");
    std::fs::write(&data, b"precious").unwrap();
    let r = bench_json(
        &d,
        &[
            "--compare",
            data.to_str().unwrap(),
            "--destructive",
            "--test",
            "randwrite-4k-qd1",
            "--runtime",
            "200ms",
            "--size",
            "16M",
        ],
    );
    check_figures(&r);
    assert_eq!(std::fs::metadata(&data).unwrap().len(), 8, "cut back");
}

/// fio's IOPS and p50 latency (us) for one job, from its JSON: `lat`
/// (submission to completion) percentiles, what ramd bench reports, not
/// fio's default `clat` ones.
fn fio_job(args: &[&str]) -> (f64, f64) {
    let out = run(tool("fio")
        .args([
            "--name=x",
            "--output-format=json",
            "--time_based",
            "--runtime=3",
            "--lat_percentiles=1",
        ])
        .args(args))
    .ok();
    // The nbd engine prints a line before the JSON.
    let json = &out.stdout[out.stdout.find('{').unwrap_or(0)..];
    let v: Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("fio JSON: {e}: {out}"));
    let read = &v["jobs"][0]["read"];
    let p50_ns = read["lat_ns"]["percentile"]["50.000000"]
        .as_f64()
        .unwrap_or_else(|| panic!("no lat percentiles in fio's JSON: {read}"));
    (read["iops"].as_f64().unwrap(), p50_ns / 1000.0)
}

/// Reads the daemon has served on `drive` (its own counters).
fn drive_reads(d: &Daemon, drive: &str) -> u64 {
    let (status, body) = d.http("GET", &format!("/v1/drives/{drive}/stats"), None);
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["totals"]["ops"]["read"].as_u64().unwrap()
}

/// Whether relations between timings are asserted (RAMD_TIMING_ASSERTS=1,
/// see the module docs); they are always printed.
fn timing_asserts() -> bool {
    std::env::var("RAMD_TIMING_ASSERTS").as_deref() == Ok("1")
}

/// A relation between timings: printed, and asserted with
/// RAMD_TIMING_ASSERTS=1.
#[track_caller]
fn timing(holds: bool, what: &str) {
    eprintln!(
        "timing: {what}: {}",
        if holds { "holds" } else { "does not hold" }
    );
    if timing_asserts() {
        assert!(holds, "{what}");
    }
}

/// `ours` within a factor of `tolerance` of `fio`'s (see [`timing`]).
#[track_caller]
fn within(what: &str, ours: f64, fio: f64, tolerance: f64) {
    timing(
        ours <= fio * tolerance && ours >= fio / tolerance,
        &format!(
            "cross-check {what}: ramd bench {ours:.1} vs fio {fio:.1} (ratio {:.2}), \
             stated factor {tolerance}",
            ours / fio
        ),
    );
}

/// The same job with fio and with ramd bench, one after the other, with
/// the tolerances docs/bench.md states ("Agreement with fio"): a file on
/// disk at QD32 (io_uring, O_DIRECT): IOPS within 2x; a drive at QD1 over
/// NBD: p50 latency within 2x (the same round trip) and IOPS at least
/// fio's / 1.5 (ramd bench's client is the leaner one: fio's nbd engine
/// spends more of its own time per I/O), with every I/O ramd bench
/// counts also counted by the daemon itself.
#[test]
fn agrees_with_fio_on_the_same_workload() {
    if !require(&["fio"]) {
        return;
    }
    let d = Daemon::start(&["fast=256M"]);
    let uri = format!("--uri={}", d.uri("fast"));
    // fio lays the drive out first (its reads would otherwise hit holes);
    // ramd bench then writes the same region (--destructive: the drive
    // holds fio's data) and reads it the same way.
    let fill = [
        "--name=fill",
        "--ioengine=nbd",
        &uri,
        "--rw=write",
        "--bs=1M",
        "--size=64M",
    ];
    run(tool("fio").args(fill)).ok();
    let job = [
        "--ioengine=nbd",
        &uri,
        "--rw=randread",
        "--bs=4k",
        "--iodepth=1",
        "--size=64M",
    ];
    let (fio_iops, fio_p50) = fio_job(&job);
    let before = drive_reads(&d, "fast");
    let r = bench_json(
        &d,
        &[
            "fast",
            "--destructive",
            "--test",
            "randread-4k-qd1",
            "--runtime",
            "3s",
            "--size",
            "64M",
            "--no-store",
        ],
    );
    let after = drive_reads(&d, "fast");
    let ours = result(&r, "fast", "randread-4k-qd1");
    within(
        "drive QD1 p50 us",
        ours["lat_us"]["p50"].as_f64().unwrap(),
        fio_p50,
        2.0,
    );
    let iops = ours["iops"].as_f64().unwrap();
    timing(
        iops >= fio_iops / 1.5,
        &format!(
            "cross-check drive QD1 IOPS: ramd bench {iops:.0}, fio {fio_iops:.0} (at least / 1.5)"
        ),
    );
    // ramd bench's reads are the only ones since fio's run ended.
    assert_eq!(
        after - before,
        ours["ios"].as_u64().unwrap(),
        "the daemon counted every read"
    );

    let file = d.dir().join("fio.img");
    let f = file.to_str().unwrap();
    let name = format!("--filename={f}");
    let job = [
        "--ioengine=io_uring",
        "--direct=1",
        &name,
        "--rw=randread",
        "--bs=4k",
        "--iodepth=32",
        "--size=64M",
    ];
    let (fio_iops, _) = fio_job(&job);
    let r = bench_json(
        &d,
        &[
            "--compare",
            f,
            "--destructive",
            "--test",
            "randread-4k-qd32",
            "--runtime",
            "3s",
            "--size",
            "64M",
        ],
    );
    assert_eq!(r["targets"][0]["direct_io"], true);
    within(
        "file QD32 IOPS",
        result(&r, f, "randread-4k-qd32")["iops"].as_f64().unwrap(),
        fio_iops,
        2.0,
    );
}

#[test]
fn the_daemon_refuses_a_plot_that_could_run_code() {
    let d = Daemon::start(&["fast=16M"]);
    let spec = Spec::load();
    let report = serde_json::json!({
        "version": 1, "tool": "t", "profile": "quick", "started_at": "2025-01-01T00:00:00Z",
        "finished_at": "2025-01-01T00:00:01Z", "runtime_s": 1.0,
        "host": {"hostname": "h", "cpus": 1, "kernel": "k"},
        "targets": [{"name": "fast", "kind": "drive", "path": "p", "engine": "nbd", "direct_io": false,
                     "page_cache": false, "working_set_bytes": 1, "notes": []}],
        "tests": [], "results": [], "skipped": [], "comparisons": []
    });
    let body = |svg: &str| serde_json::json!({"report": report, "svg": svg}).to_string();
    let put = |b: &str| spec.call(&d, "PUT", "/v1/bench/latest", "/v1/bench/latest", Some(b));
    let (status, v) = put(&body(
        r#"<svg xmlns="http://www.w3.org/2000/svg" onload="alert(1)"></svg>"#,
    ));
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (422, Some("invalid_bench_report")),
        "{v}"
    );
    let mut old = report.clone();
    old["version"] = 2.into();
    let (status, _) = put(&serde_json::json!({"report": old, "svg": "<svg></svg>"}).to_string());
    assert_eq!(status, 422);
    let (status, v) = put(&format!(
        "{{\"report\": {report}, \"svg\": \"<svg></svg>\", \"extra\": 1}}"
    ));
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (400, Some("unknown_field")),
        "{v}"
    );
    assert_eq!(
        d.http("GET", "/v1/bench/latest", None).0,
        404,
        "nothing was kept"
    );
    let (status, _) = put(&body(
        r#"<svg xmlns="http://www.w3.org/2000/svg"><rect width="1" height="1"/></svg>"#,
    ));
    assert_eq!(status, 200);
    assert_eq!(d.http("GET", "/v1/bench/latest", None).0, 200);
}

#[test]
fn the_report_example_in_docs_bench_md_is_a_report() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/bench.md");
    let text = std::fs::read_to_string(path).unwrap();
    let start = text.find("```json\n").expect("a json example") + 8;
    let end = start + text[start..].find("```").unwrap();
    let v: Value = serde_json::from_str(&text[start..end]).unwrap();
    check_schema(&v);
    let r: ramd::api::wire::bench::BenchReport = serde_json::from_value(v).unwrap();
    assert_eq!(r.version, ramd::api::wire::bench::REPORT_VERSION);
}

/// A cache as a target: refused without --destructive (its writes reach
/// its backing), measured with it over the daemon's socket.
#[test]
fn a_cache_is_measured_only_with_destructive() {
    let d = Daemon::start(&["x=16M"]);
    let backing = d.dir().join("backing.img");
    std::fs::write(&backing, common::random_bytes(32 << 20, 9)).unwrap();
    run(d
        .cli()
        .args([
            "cache",
            "create",
            "c",
            "--size",
            "16M",
            "--mode",
            "writethrough",
            "--backing",
        ])
        .arg(&backing))
    .ok();
    let out = run(d.cli().args([
        "bench",
        "c",
        "--test",
        "randread-4k-qd1",
        "--runtime",
        "200ms",
    ]))
    .failed();
    assert!(out.stderr.contains("--destructive"), "{out}");
    let r = bench_json(
        &d,
        &[
            "c",
            "--destructive",
            "--test",
            "randrw-4k-qd32",
            "--runtime",
            "300ms",
            "--size",
            "16M",
        ],
    );
    assert_eq!(r["targets"][0]["kind"], "cache", "{r}");
    assert_eq!(r["targets"][0]["engine"], "nbd", "{r}");
    check_figures(&r);
}
