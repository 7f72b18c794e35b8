//! Metrics: counters move by exactly the I/O a test issued, /metrics parses
//! as Prometheus (OpenMetrics) text with Python's prometheus_client, and
//! turning recording off records nothing.

mod common;

use common::*;
use serde_json::Value;

fn totals(d: &Daemon, drive: &str) -> Value {
    let (s, body) = d.http("GET", &format!("/v1/drives/{drive}/stats"), None);
    assert_eq!(s, 200, "{body}");
    serde_json::from_str::<Value>(&body).unwrap()["totals"].clone()
}

fn delta(after: &Value, before: &Value, group: &str, key: &str) -> u64 {
    after[group][key].as_u64().unwrap() - before[group][key].as_u64().unwrap()
}

/// Exactly: 10 writes of 4 KiB, 5 reads of 8 KiB, 1 read past the end
/// (EINVAL), 3 flushes, 2 trims of 64 KiB, 1 zero of 4 KiB, 1 write of
/// 512 bytes at an odd offset, 2 block-status calls, and 2 writes and 2
/// reads of 1 MiB (which take the zero-copy paths).
const WORKLOAD: &str = r#"
import nbd, sys
h = nbd.NBD()
h.add_meta_context("base:allocation")
h.set_strict_mode(0)  # let the out-of-range read reach the server
h.connect_uri(sys.argv[1])
for i in range(10):
    h.pwrite(b"w" * 4096, i * 4096)
for i in range(5):
    h.pread(8192, i * 8192)
try:
    h.pread(4096, h.get_size() - 1)
    sys.exit("a read past the end succeeded")
except nbd.Error:
    pass
for i in range(3):
    h.flush()
h.trim(65536, 1 << 20)
h.trim(65536, 2 << 20)
h.zero(4096, 3 << 20)
h.pwrite(b"x" * 512, 12345)
for i in range(2):
    h.block_status(65536, 0, lambda *a: 0)
for i in range(2):
    h.pwrite(b"b" * (1 << 20), (1 + i) << 20)
    assert h.pread(1 << 20, (1 + i) << 20) == b"b" * (1 << 20)
h.shutdown()
"#;

#[test]
fn counters_move_by_exactly_the_io_issued() {
    if !require_python_module("nbd", "python3-libnbd") {
        return;
    }
    let d = Daemon::start(&["ram0=16M", "other=1M"]);
    let before = totals(&d, "ram0");
    let other_before = totals(&d, "other");
    python(WORKLOAD, &[&d.uri("ram0")]).ok();
    // A reply is counted once it is sent: the client may have it first.
    wait_until("the connection to end", WAIT_TIMEOUT, || {
        let (s, body) = d.http("GET", "/v1/drives/ram0/stats", None);
        s == 200 && serde_json::from_str::<Value>(&body).unwrap()["connections"] == 0
    });
    let after = totals(&d, "ram0");
    for (op, ops, bytes) in [
        ("write", 13, 10 * 4096 + 512 + (2 << 20)),
        ("read", 8, 5 * 8192 + (2 << 20)),
        ("flush", 3, 0),
        ("trim", 2, 2 * 65536),
        ("write_zeroes", 1, 4096),
        ("block_status", 2, 0),
        ("cache", 0, 0),
    ] {
        assert_eq!(delta(&after, &before, "ops", op), ops, "{op} ops: {after}");
        assert_eq!(
            delta(&after, &before, "bytes", op),
            bytes,
            "{op} bytes: {after}"
        );
    }
    assert_eq!(delta(&after, &before, "errors", "EINVAL"), 1, "{after}");
    let errors: u64 = after["errors"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(errors, 1, "{after}");
    assert_eq!(
        after["connections_opened"].as_u64().unwrap()
            - before["connections_opened"].as_u64().unwrap(),
        1
    );
    // Every timed request is in its histogram.
    let count = |v: &Value, op: &str| v["latency"][op]["count"].as_u64().unwrap();
    assert_eq!(count(&after, "read") - count(&before, "read"), 8);
    assert_eq!(count(&after, "write") - count(&before, "write"), 13);
    assert_eq!(count(&after, "flush") - count(&before, "flush"), 3);
    let p50 = after["latency"]["write"]["p50_us"].as_f64().unwrap();
    let p99 = after["latency"]["write"]["p99_us"].as_f64().unwrap();
    assert!(p50 > 0.0 && p99 >= p50, "{after}");
    // The other drive saw nothing.
    assert_eq!(totals(&d, "other"), other_before);

    // /metrics says the same.
    let (_, text) = d.http("GET", "/metrics", None);
    assert!(
        text.contains("ramd_drive_requests_total{drive=\"ram0\",op=\"write\"} 13\n"),
        "{text}"
    );
    assert!(
        text.contains("ramd_drive_io_bytes_total{drive=\"ram0\",op=\"read\"} 2138112\n"),
        "{text}"
    );
    assert!(
        text.contains("ramd_drive_errors_total{drive=\"ram0\",errno=\"EINVAL\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("ramd_drive_request_duration_seconds_count{drive=\"ram0\",op=\"flush\"} 3\n"),
        "{text}"
    );
}

/// Parses the file argv[1] with prometheus_client's OpenMetrics parser and prints
/// family name, type and sample count per family.
const PARSE: &str = r#"
import sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
for f in text_string_to_metric_families(open(sys.argv[1]).read()):
    print(f.name, f.type, len(f.samples))
"#;

#[test]
fn metrics_parse_as_prometheus_text() {
    if !require_python_module("prometheus_client", "python3-prometheus-client")
        || !require_python_module("nbd", "python3-libnbd")
    {
        return;
    }
    let d = Daemon::start(&["ram0=4M", "ro=1M,read-only,mem-limit=64K"]);
    python(WORKLOAD, &[&d.uri("ram0")]).ok();
    let (status, text) = d.http("GET", "/metrics", None);
    assert_eq!(status, 200);
    let file = d.dir().join("metrics.txt");
    std::fs::write(&file, &text).unwrap();
    let out = python(PARSE, &[file.to_str().unwrap()]).ok();
    let families: Vec<(String, String, usize)> = out
        .stdout
        .lines()
        .map(|l| {
            let mut p = l.split_whitespace();
            (
                p.next().unwrap().to_owned(),
                p.next().unwrap().to_owned(),
                p.next().unwrap().parse().unwrap(),
            )
        })
        .collect();
    for (name, ty) in [
        ("ramd_drive_requests", "counter"),
        ("ramd_drive_io_bytes", "counter"),
        ("ramd_drive_errors", "counter"),
        ("ramd_drive_request_duration_seconds", "histogram"),
        ("ramd_drive_allocated_bytes", "gauge"),
        ("ramd_drive_mem_limit_bytes", "gauge"),
        ("ramd_memory_budget_used_bytes", "gauge"),
        ("ramd_memory_budget_limit_bytes", "gauge"),
    ] {
        assert!(
            families
                .iter()
                .any(|(n, t, s)| n == name && t == ty && *s > 0),
            "no {ty} {name} in {families:?}\n{text}"
        );
    }
    assert!(
        text.contains("# TYPE ramd_nbd_connection_buffers_bytes gauge\n"),
        "no connection-buffer gauge in\n{text}"
    );
}

#[test]
fn metrics_off_records_nothing_but_memory() {
    if !require_python_module("nbd", "python3-libnbd") {
        return;
    }
    let d = Daemon::launch(
        &[
            "serve".into(),
            "--drive".into(),
            "ram0=4M".into(),
            "--metrics".into(),
            "off".into(),
        ],
        &[],
    );
    python(WORKLOAD, &[&d.uri("ram0")]).ok();
    let (_, body) = d.http("GET", "/v1/drives/ram0/stats", None);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["totals"], Value::Null, "{v}");
    assert!(v["allocated_bytes"].as_u64().unwrap() > 0, "{v}");
    let (_, text) = d.http("GET", "/metrics", None);
    assert!(
        text.contains("ramd_metrics_enabled 0") || text.contains("ramd_metrics_enabled{} 0"),
        "{text}"
    );
    assert!(!text.contains("ramd_drive_requests_total"), "{text}");
    let out = run(d.cli().arg("stats")).ok();
    assert!(out.stdout.contains("metrics are off"), "{out}");
}
