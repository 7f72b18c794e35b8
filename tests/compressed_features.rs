//! "Works with everything a plain drive does" (issue 19), checked on
//! compressed drives in a real daemon with real clients:
//!
//! - snapshots to a remote (a single-node Garage): a push of a compressed
//!   drive restores byte for byte; writes after the push began are not in
//!   it (the cut works the same over a compressed store); restored into a
//!   persistent drive, it comes back compressed with `--compress`;
//! - multi-conn (advertised; nbdcopy over 4 connections both ways), block
//!   status (`nbdinfo --map`: holes, zeroes and data where they were
//!   written), read-only (`ramd lock`: writes refused, reads served),
//!   resize (grow keeps the data, a shrink below it needs --force and gives
//!   the memory back);
//! - memory accounting: after a known corpus, the reported figures agree
//!   with each other and with the corpus, and the daemon's RSS
//!   (`/proc/PID/status` VmRSS) follows what the drive says it holds.
//!
//! A missing tool fails its test (see `common::require`); set
//! RAMD_SKIP_MISSING_TOOLS=1 to skip instead.

mod common;

use common::garage::{
    add_remote, assert_same, cli, creds_file, push, read_drive, serial, start_push, wait_job,
    write_drive, Garage,
};
use common::{
    random_bytes, require, run, tool, try_run, wait_until, word_salad, Daemon, WAIT_TIMEOUT,
};
use serde_json::Value;
use std::time::Duration;

const MIB: usize = 1 << 20;

/// `/v1/drives/NAME`.
#[track_caller]
fn drive(d: &Daemon, name: &str) -> Value {
    let (status, body) = d.http("GET", &format!("/v1/drives/{name}"), None);
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

fn u(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} missing in {v}"))
}

/// `len` bytes mixing text (compresses), random bytes (does not) and
/// zeroes, 1 MiB pieces in turn.
fn mixed(len: usize, seed: u64) -> Vec<u8> {
    let text = b"compressed drives keep more data in the same memory; ";
    let rnd = random_bytes(len, seed);
    let mut out = vec![0u8; len];
    for (i, piece) in out.chunks_mut(MIB).enumerate() {
        let at = i * MIB;
        match i % 3 {
            0 => piece
                .iter_mut()
                .enumerate()
                .for_each(|(j, b)| *b = text[(j + i) % text.len()]),
            1 => piece.copy_from_slice(&rnd[at..at + piece.len()]),
            _ => {}
        }
    }
    out
}

#[test]
fn snapshots_of_a_compressed_drive_push_and_restore() {
    let _serial = serial();
    if !require(&["nbdcopy"]) {
        return;
    }
    let Some(g) = Garage::start() else { return };
    let a = Daemon::launch(
        &[
            "daemon".into(),
            "--drive".into(),
            "z=48M,mem-limit=32M,compress=zstd".into(),
        ],
        &[],
    );
    let creds = creds_file(a.dir(), &g, None);
    add_remote(&a, &g, "g", &g.bucket, &creds);
    let data = mixed(48 * MIB, 7);
    write_drive(&a, "z", &data);
    let first = push(&a, &g, "z", "g");
    assert!(u(&first["push"], "bytes_uploaded") > 0, "{first}");

    // The push reads one point in time while the drive is rewritten.
    let job = start_push(&a, &g, "z", "g");
    write_drive(&a, "z", &mixed(48 * MIB, 8));
    let second = wait_job(&a, u(&job, "id"));
    assert_eq!(second["state"], "done", "{second}");
    let id = second["push"]["snapshot"].as_str().unwrap().to_owned();
    let id = id.split('/').nth(1).unwrap();

    // Restored as a new drive: byte for byte what it held at the cut.
    cli(
        &a,
        &g,
        &[
            "restore",
            "z",
            "--from",
            "g",
            "--snapshot",
            id,
            "--as",
            "copy",
        ],
    )
    .ok();
    assert_same(&read_drive(&a, "copy"), &data, "restored snapshot");
    // Restored compressed (`--compress`, with a limit below the size):
    // into RAM, and into a persistent drive (its drive.json keeps the
    // compression for later starts).
    let restore = |name: &str, extra: &[&str]| {
        let mut args = vec![
            "restore",
            "z",
            "--from",
            "g",
            "--snapshot",
            id,
            "--as",
            name,
        ];
        args.extend(extra);
        cli(&a, &g, &args)
    };
    restore("cz", &["--compress", "lz4+zstd", "--mem-limit", "40M"]).ok();
    let cz = drive(&a, "cz");
    assert_eq!(cz["compression"]["algorithm"], "lz4+zstd:3", "{cz}");
    assert_eq!(cz["mem_limit_bytes"], 40 * MIB as u64, "{cz}");
    assert_same(&read_drive(&a, "cz"), &data, "restored compressed");
    restore("pz", &["--persist", "--compress", "lz4"]).ok();
    wait_until("pz to be served", Duration::from_secs(60), || {
        drive(&a, "pz")["state"] == "ready"
    });
    let pz = drive(&a, "pz");
    assert_eq!(pz["compression"]["algorithm"], "lz4", "{pz}");
    assert!(pz["compression"]["ratio"].as_f64().unwrap() > 1.2, "{pz}");
    assert_same(
        &read_drive(&a, "pz"),
        &data,
        "restored persistent, compressed",
    );
    // A snapshot that does not fit its limit compressed: refused, and no
    // drive is left.
    let job = restore("small", &["--compress", "lz4", "--mem-limit", "8M"]).failed();
    assert!(job.stderr.contains("memory limit"), "{job}");
    let (status, _) = a.http("GET", "/v1/drives/small", None);
    assert_eq!(status, 404);
}

/// Extents `nbdinfo --map` reports: (offset, length, description).
fn map(uri: &str) -> Vec<(u64, u64, String)> {
    let out = run(tool("nbdinfo").args(["--map", uri])).ok();
    out.stdout
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[3..].join(" "),
            )
        })
        .collect()
}

/// The description of the extent holding `offset`.
fn kind_at(m: &[(u64, u64, String)], offset: u64) -> &str {
    m.iter()
        .find(|(o, l, _)| (*o..o + l).contains(&offset))
        .map(|(_, _, k)| k.as_str())
        .unwrap_or_else(|| panic!("no extent at {offset}: {m:?}"))
}

#[test]
fn multi_conn_block_status_read_only_and_resize_on_a_compressed_drive() {
    if !require(&["nbdcopy", "nbdinfo", "qemu-io"]) {
        return;
    }
    let d = Daemon::start(&["z=64M,mem-limit=32M,compress=lz4"]);
    let uri = d.uri("z");
    // Multi-conn: advertised, and four connections write and read it.
    let can = try_run(
        tool("nbdinfo").args(["--can", "multi-conn", &uri]),
        Duration::from_secs(30),
    )
    .unwrap();
    assert!(can.status.success(), "multi-conn not advertised: {can}");
    let data = mixed(32 * MIB, 3);
    let src = d.dir().join("in.img");
    std::fs::write(&src, &data).unwrap();
    run(tool("nbdcopy")
        .args(["-C", "4", "--flush"])
        .arg(&src)
        .arg(&uri))
    .ok();
    let back = d.dir().join("back.img");
    run(tool("nbdcopy").args(["-C", "4"]).arg(&uri).arg(&back)).ok();
    assert_same(
        &std::fs::read(&back).unwrap()[..data.len()],
        &data,
        "4 connections",
    );

    // Block status: data, zeroes written as zeroes, trimmed holes.
    run(tool("qemu-io")
        .args(["-f", "raw", "-c", "write -z 40M 1M", "-c", "discard 1M 1M"])
        .arg(&uri))
    .ok();
    let m = map(&uri);
    assert_eq!(kind_at(&m, 0), "data", "{m:?}");
    assert_eq!(kind_at(&m, MIB as u64), "hole,zero", "{m:?}");
    assert_eq!(kind_at(&m, 2 * MIB as u64), "hole,zero", "{m:?}"); // zeroes never written
    assert_eq!(kind_at(&m, 3 * MIB as u64), "data", "{m:?}");
    assert!(kind_at(&m, 40 * MIB as u64).contains("zero"), "{m:?}");
    assert_eq!(kind_at(&m, 60 * MIB as u64), "hole,zero", "{m:?}");

    // Read-only: writes refused, reads served; unlocked, writes again.
    run(d.cli().args(["lock", "z"])).ok();
    let w = try_run(
        tool("qemu-io").args(["-f", "raw", "-c", "write -P 7 0 4k", &uri]),
        Duration::from_secs(30),
    )
    .unwrap();
    assert!(
        !w.status.success() || w.stderr.contains("ermission") || w.stdout.contains("ermission"),
        "a write to a locked drive: {w}"
    );
    run(tool("qemu-io").args(["-f", "raw", "-r", "-c", "read -P 0 1M 1M", &uri])).ok();
    run(d.cli().args(["unlock", "z"])).ok();
    run(tool("qemu-io").args(["-f", "raw", "-c", "write -P 7 0 4k", &uri])).ok();

    // Resize: grow keeps the data; shrinking below it needs --force and
    // gives its memory back.
    run(d.cli().args(["resize", "z", "128M"])).ok();
    let info = run(tool("nbdinfo").args(["--size", &uri])).ok();
    assert_eq!(info.stdout.trim(), (128 * MIB).to_string());
    run(tool("qemu-io").args(["-f", "raw", "-c", "read -P 7 0 4k", &uri])).ok();
    let held = u(&drive(&d, "z")["compression"], "orig_data_bytes");
    let e = run(d.cli().args(["resize", "z", "16M"])).failed();
    assert!(e.stderr.contains("--force"), "{e}");
    run(d.cli().args(["resize", "z", "16M", "--force"])).ok();
    let after = u(&drive(&d, "z")["compression"], "orig_data_bytes");
    assert!(
        after <= 16 * MIB as u64 && after < held,
        "{held} -> {after}"
    );
    run(d.cli().args(["resize", "z", "64M"])).ok();
    let m = map(&uri);
    assert_eq!(kind_at(&m, 20 * MIB as u64), "hole,zero", "{m:?}");
}

/// A `kB` field of `/proc/PID/status`, in bytes.
fn status_kb(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = text.lines().find(|l| l.starts_with(field)).unwrap();
    let kb: u64 = line[field.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kb * 1024
}

#[test]
fn memory_accounting_matches_the_corpus_and_rss_follows_it() {
    if !require(&["nbdcopy"]) {
        return;
    }
    let d = Daemon::launch(
        &[
            "daemon".into(),
            "--no-default-drive".into(),
            "--drive".into(),
            "z=512M,mem-limit=256M,compress=lz4".into(),
        ],
        &[],
    );
    let pid = d.pid();
    let rss_before = status_kb(pid, "VmRSS:");
    // 240 MiB: 80 of text, 80 of random bytes, 80 of zeroes; plus 16 MiB
    // of one repeated word (same-filled pages).
    let mut data = mixed(240 * MIB, 11);
    data.extend(0x5a5a_5a5a_u32.to_le_bytes().repeat(4 * MIB));
    let pages = |f: &dyn Fn(&[u8]) -> bool| data.chunks(4096).filter(|p| f(p)).count() as u64;
    let nonzero = pages(&|p| p.iter().any(|&b| b != 0));
    let same = pages(&|p| p.iter().any(|&b| b != 0) && p[8..] == p[..4088]);
    write_drive(&d, "z", &data);
    let z = drive(&d, "z");
    let c = &z["compression"];
    // What the store says it holds agrees with itself...
    assert_eq!(
        u(c, "mem_used_bytes"),
        u(c, "slab_bytes") + u(c, "metadata_bytes")
    );
    assert_eq!(u(&z, "allocated_bytes"), u(c, "slab_bytes"));
    let pages_held = u(c, "same_pages") + u(c, "huge_pages") + u(c, "compressed_pages");
    assert_eq!(u(c, "orig_data_bytes"), pages_held * 4096, "{c}");
    assert!(u(c, "compr_data_bytes") <= u(c, "slab_bytes"), "{c}");
    // ...and with the corpus: every non-zero page is there (zero pages
    // may be holes or zero words), the random ones raw.
    assert!(
        pages_held >= nonzero && pages_held <= nonzero + (80 * MIB / 4096) as u64,
        "{c}"
    );
    assert!(u(c, "same_pages") >= same, "{c}");
    assert!(u(c, "huge_pages") >= (79 * MIB / 4096) as u64, "{c}");
    // The process holds what the drive says, within overhead: slabs are
    // the only large allocations in a daemon with one drive.
    let grew = status_kb(pid, "VmRSS:").saturating_sub(rss_before);
    let used = u(c, "mem_used_bytes");
    assert!(
        grew + 8 * MIB as u64 >= used && grew <= used + used / 10 + 32 * MIB as u64,
        "RSS grew {} MiB for {} MiB the drive holds: {c}",
        grew >> 20,
        used >> 20
    );
    // A trim gives it back to the OS, not only to the budget.
    run(tool("qemu-io")
        .args(["-f", "raw", "-c", "discard 0 512M"])
        .arg(d.uri("z")))
    .ok();
    let z = drive(&d, "z");
    assert_eq!(u(&z, "allocated_bytes"), 0, "{z}");
    // (Freed heap blocks are returned to the OS by the daemon's
    // once-a-second sampler.)
    let mut left = 0;
    wait_until("RSS to come down", WAIT_TIMEOUT, || {
        left = status_kb(pid, "VmRSS:").saturating_sub(rss_before);
        left <= 16 * MIB as u64
    });
}

#[test]
fn lz4_zstd_drives_recompress_idle_pages_in_the_background() {
    if !require(&["nbdcopy"]) {
        return;
    }
    let d = Daemon::start(&["z=32M,compress=lz4+zstd:3"]);
    let data = word_salad(16 * MIB, 5);
    write_drive(&d, "z", &data);
    let written = drive(&d, "z")["compression"].clone();
    assert_eq!(written["algorithm"], "lz4+zstd:3", "{written}");
    // Nobody touches the drive now: the worker tries every page once.
    let mut done = Value::Null;
    wait_until("idle pages recompressed", Duration::from_secs(120), || {
        done = drive(&d, "z")["compression"].clone();
        u(&done, "recompress_attempts") >= u(&written, "compressed_pages")
    });
    assert!(
        u(&done, "recompressed_pages") * 10 >= u(&written, "compressed_pages") * 9,
        "{done}"
    );
    assert!(
        u(&done, "compr_data_bytes") < u(&written, "compr_data_bytes") * 9 / 10
            && u(&done, "mem_used_bytes") < u(&written, "mem_used_bytes")
            && u(&done, "recompress_saved_bytes") > 0,
        "before {written}\nafter {done}"
    );
    assert_eq!(u(&done, "orig_data_bytes"), u(&written, "orig_data_bytes"));
    assert_same(&read_drive(&d, "z")[..data.len()], &data, "recompressed");
    // Overwritten pages go back to lz4 and read back as written.
    let new = word_salad(MIB, 6);
    write_drive(&d, "z", &new);
    let now = drive(&d, "z")["compression"].clone();
    assert!(
        u(&now, "recompressed_pages") + 200 <= u(&done, "recompressed_pages"),
        "{now}"
    );
    let back = read_drive(&d, "z");
    assert_same(&back[..MIB], &new, "overwritten");
    assert_same(&back[MIB..data.len()], &data[MIB..], "kept");
    // The figures are in `ramd info` and /metrics.
    let info = run(d.cli().args(["info", "z"])).ok();
    assert!(info.stdout.contains("recompress"), "{info}");
    let (status, metrics) = d.http("GET", "/metrics", None);
    assert_eq!(status, 200);
    assert!(
        metrics.contains("ramd_drive_recompressed_pages{drive=\"z\"}")
            && metrics.contains("ramd_drive_recompress_saved_bytes_total{drive=\"z\"}"),
        "{metrics}"
    );
}
