//! Units a user types: a duration needs a unit (`--max-dirty-age 10` was
//! taken as 10 ms), sizes take the `Gi`/`Mi` spellings of kubectl and
//! Docker, and a drive has a smallest size (`--size 3` was 3 bytes).

mod common;

use common::*;

#[test]
fn durations_need_a_unit_sizes_take_gi_and_drives_have_a_minimum() {
    let d = Daemon::launch(&["daemon".into(), "--no-default-drive".into()], &[]);
    let img = d.dir().join("backing.img");
    std::fs::write(&img, vec![0u8; 1 << 20]).unwrap();
    let out = run(d.cli().args([
        "cache",
        "create",
        "c",
        "--backing",
        img.to_str().unwrap(),
        "--size",
        "1M",
        "--mode",
        "writeback",
        "--max-dirty-age",
        "10",
    ]))
    .failed();
    assert!(
        out.stderr
            .contains("'10' has no time unit: write 10ms, 10s or 10m"),
        "{out}"
    );
    let out = run(d.cli().args(["create", "tiny", "--size", "3"])).failed();
    assert!(
        out.stderr.contains("at least 4 KiB (one page), not 3 B"),
        "{out}"
    );
    let (status, body) = d.http("POST", "/v1/drives", Some(r#"{"name": "tiny", "size": 3}"#));
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("at least 4 KiB"), "{body}");
    run(d
        .cli()
        .args(["create", "big", "--size", "4Gi", "--mem-limit", "512Mi"]))
    .ok();
    let (_, body) = d.http("GET", "/v1/drives/big", None);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["size_bytes"], 4u64 << 30, "{v}");
    assert_eq!(v["mem_limit_bytes"], 512u64 << 20, "{v}");
    // `ramd stats`: memory against the limit (not the size), and the
    // latency said to be the server's.
    let stats = run(d.cli().arg("stats")).ok().stdout;
    assert!(stats.contains("MEMORY USED/LIMIT"), "{stats}");
    assert!(stats.contains("0 B / 512 MiB"), "{stats}");
    assert!(stats.contains("latency: server-side"), "{stats}");
}
