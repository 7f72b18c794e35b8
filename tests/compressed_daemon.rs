//! Compressed drives (`--compress`, `store::compressed`) in a real daemon,
//! driven by real clients: created by the CLI, the `--drive` flag and the
//! config file; qemu-img round trips of a mixed image; fio with crc32c
//! verification; ENOSPC once the compressed data fills the memory limit of
//! a drive larger than its limit; trims that give memory back; the
//! `compression` figures in the API and in /metrics agreeing; persistent
//! compressed drives across a restart and kill -9.
//!
//! A missing tool fails its test (see `common::require`); set
//! RAMD_SKIP_MISSING_TOOLS=1 to skip instead.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{random_bytes, require, run, tool, try_run, Daemon};
use serde_json::Value;

const MIB: usize = 1 << 20;

/// GET a drive's JSON from the API.
#[track_caller]
fn drive_json(d: &Daemon, name: &str) -> Value {
    let (status, body) = d.http("GET", &format!("/v1/drives/{name}"), None);
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// The `compression` object of `/v1/drives/NAME/stats`.
#[track_caller]
fn compression(d: &Daemon, name: &str) -> Value {
    let (status, body) = d.http("GET", &format!("/v1/drives/{name}/stats"), None);
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["compression"].clone()
}

fn u(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} missing in {v}"))
}

/// 48 MiB: 16 MiB of zeroes, 16 MiB of text, 8 MiB of random bytes, 8 MiB
/// of zeroes again.
fn mixed_image() -> Vec<u8> {
    let mut data = vec![0u8; 48 * MIB];
    let text = b"ramd keeps drives in memory; compressed drives keep more of them. ";
    for (i, b) in data[16 * MIB..32 * MIB].iter_mut().enumerate() {
        *b = text[i % text.len()];
    }
    data[32 * MIB..40 * MIB].copy_from_slice(&random_bytes(8 * MIB, 19));
    data
}

#[track_caller]
fn qemu_img_in_and_compare(d: &Daemon, drive: &str, src: &Path) {
    let uri = d.uri(drive);
    run(tool("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(src)
        .arg(&uri))
    .ok();
    run(tool("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(src)
        .arg(&uri))
    .ok();
}

/// The value of an unlabelled-but-for-`drive` series in /metrics.
fn metric(text: &str, name: &str, drive: &str) -> Option<f64> {
    let pat = format!("{name}{{drive=\"{drive}\"}} ");
    let line = text.lines().find(|l| l.starts_with(&pat))?;
    line[pat.len()..].trim().parse().ok()
}

#[test]
fn cli_compressed_drive_holds_more_than_its_limit_round_trips_and_reports() {
    if !require(&["qemu-img", "qemu-io"]) {
        return;
    }
    let d = Daemon::start(&[]);
    let out = run(d.cli().args([
        "create",
        "z",
        "--size",
        "64M",
        "--mem-limit",
        "16M",
        "--compress",
        "lz4",
    ]))
    .ok();
    assert!(out.stdout.contains("compressed lz4"), "{out}");
    let src = d.dir().join("mixed.img");
    std::fs::write(&src, mixed_image()).unwrap();
    qemu_img_in_and_compare(&d, "z", &src);

    // More logical data than the limit, held within it.
    let z = compression(&d, "z");
    assert_eq!(z["algorithm"], "lz4");
    let orig = u(&z, "orig_data_bytes");
    assert!(orig > 16 * MIB as u64, "holds {orig} bytes: {z}");
    assert!(u(&z, "slab_bytes") <= 16 * MIB as u64, "{z}");
    assert!(u(&z, "huge_pages") >= (8 * MIB / 4096) as u64, "{z}");
    let used = u(&z, "mem_used_bytes");
    assert_eq!(used, u(&z, "slab_bytes") + u(&z, "metadata_bytes"), "{z}");
    let ratio = z["ratio"].as_f64().unwrap();
    assert!((ratio - orig as f64 / used as f64).abs() < 1e-9, "{z}");
    assert!(ratio > 1.0, "{z}");
    // The drive view carries the same object, and the allocation is the
    // slabs (what the limit counts).
    let spec = common::openapi::Spec::load();
    let (status, body) = d.http("GET", "/v1/drives/z", None);
    spec.check("GET", "/v1/drives/{name}", status, &body);
    let (status, body) = d.http("GET", "/v1/drives/z/stats", None);
    spec.check("GET", "/v1/drives/{name}/stats", status, &body);
    let info = drive_json(&d, "z");
    assert_eq!(info["compression"]["orig_data_bytes"], z["orig_data_bytes"]);
    assert_eq!(u(&info, "allocated_bytes"), u(&z, "slab_bytes"));

    // /metrics agrees (nothing writes in between).
    let (status, text) = d.http("GET", "/metrics", None);
    assert_eq!(status, 200);
    let m = |n| metric(&text, n, "z").unwrap_or_else(|| panic!("{n} missing:\n{text}"));
    assert_eq!(m("ramd_drive_orig_data_bytes"), orig as f64);
    assert_eq!(m("ramd_drive_mem_used_bytes"), used as f64);
    assert!((m("ramd_drive_compression_ratio") - ratio).abs() < 1e-6);
    assert_eq!(m("ramd_drive_huge_pages"), u(&z, "huge_pages") as f64);
    assert_eq!(m("ramd_drive_same_pages"), u(&z, "same_pages") as f64);
    assert!(text.contains("ramd_drive_compaction_moves_total{drive=\"z\"}"));

    // `ramd info` and `ramd stats` show it.
    let info = run(d.cli().args(["info", "z"])).ok();
    assert!(info.stdout.contains("compression  lz4, ratio"), "{info}");
    let stats = run(d.cli().args(["stats", "z"])).ok();
    assert!(stats.stdout.contains("compressed drives"), "{stats}");
    let watch = run(d.cli().args(["stats", "z", "--watch", "--count", "2"])).ok();
    assert_eq!(watch.stdout.matches("x (").count(), 2, "{watch}");

    // A trim gives the memory back.
    run(tool("qemu-io")
        .args(["-f", "raw", "-c", "discard 0 64M"])
        .arg(d.uri("z")))
    .ok();
    let after = compression(&d, "z");
    assert_eq!(u(&after, "orig_data_bytes"), 0, "{after}");
    assert!(
        u(&after, "slab_bytes") < u(&z, "slab_bytes") / 4,
        "{z} -> {after}"
    );

    // Resize works on a compressed drive.
    run(d.cli().args(["resize", "z", "128M"])).ok();
    assert_eq!(u(&drive_json(&d, "z"), "size_bytes"), 128 << 20);

    // Compression with persistence (persistent_compressed_* below for
    // restarts); a bad algorithm is refused with the reason.
    let out = run(d.cli().args([
        "create",
        "p",
        "--size",
        "16M",
        "--compress",
        "zstd",
        "--persist",
    ]))
    .ok();
    assert!(
        out.stdout.contains("compressed zstd:3, persistent"),
        "{out}"
    );
    let e = run(d
        .cli()
        .args(["create", "q", "--size", "16M", "--compress", "gzip"]))
    .failed();
    assert!(e.stderr.contains("unknown compression"), "{e}");
}

#[test]
fn drive_flag_zstd_drive_gets_enospc_when_compressed_data_fills_the_limit() {
    if !require(&["qemu-img"]) {
        return;
    }
    let mut d = Daemon::start(&["big=64M,mem-limit=8M,compress=zstd"]);
    let info = drive_json(&d, "big");
    assert_eq!(info["compression"]["algorithm"], "zstd:3");
    // Text beyond the limit fits, compressed.
    let text = d.dir().join("text.img");
    let line = b"0123456789 the quick brown fox jumps over the lazy dog\n";
    std::fs::write(
        &text,
        line.iter()
            .cycle()
            .take(24 * MIB)
            .copied()
            .collect::<Vec<u8>>(),
    )
    .unwrap();
    qemu_img_in_and_compare(&d, "big", &text);
    let z = compression(&d, "big");
    assert!(u(&z, "orig_data_bytes") >= 24 * MIB as u64, "{z}");
    // Random data does not compress: ENOSPC past the limit, no dead
    // connection.
    let rnd = d.dir().join("random.img");
    std::fs::write(&rnd, random_bytes(16 * MIB, 5)).unwrap();
    let out = try_run(
        tool("qemu-img")
            .args(["convert", "-n", "-f", "raw", "-O", "raw"])
            .arg(&rnd)
            .arg(d.uri("big")),
        Duration::from_secs(120),
    )
    .expect("qemu-img ran");
    assert!(!out.status.success(), "qemu-img should fail: {out}");
    assert!(
        out.stderr.contains("No space left on device"),
        "qemu-img should report ENOSPC: {out}"
    );
    let z = compression(&d, "big");
    assert!(u(&z, "slab_bytes") <= 8 * MIB as u64, "{z}");
    assert!(d.is_running(), "ramd died:\n{}", d.log());
}

#[test]
fn fio_crc32c_verify_on_an_lz4_drive() {
    if !require(&["fio"]) {
        return;
    }
    let d = Daemon::start(&["z=64M,mem-limit=48M,compress=lz4"]);
    let out = run(tool("fio")
        .current_dir(d.dir())
        .args([
            "--ioengine=nbd",
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--name=randrw",
            "--rw=randrw",
            "--bs=4k",
            "--verify=crc32c",
            "--numjobs=2",
            "--iodepth=16",
            "--size=8M",
            "--offset_increment=8M",
            "--buffer_compress_percentage=50",
            "--refill_buffers",
        ])
        .arg(format!("--uri={}", d.uri("z"))))
    .ok();
    assert_eq!(out.stdout.matches("err= 0").count(), 2, "{out}");
    assert!(
        !out.stdout.contains("verify") && !out.stderr.contains("verify"),
        "{out}"
    );
    let z = compression(&d, "z");
    assert!(u(&z, "compressed_pages") > 0, "{z}");
}

#[test]
fn config_file_compressed_drive() {
    if !require(&["qemu-img"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("ramd.toml");
    std::fs::write(
        &config,
        "[[drive]]\nname = \"c\"\nsize = \"32M\"\nmem_limit = \"8M\"\ncompress = \"zstd:1\"\n",
    )
    .unwrap();
    let d = Daemon::launch(
        &[
            "serve".into(),
            "--config".into(),
            config.display().to_string(),
        ],
        &[],
    );
    let info = drive_json(&d, "c");
    assert_eq!(info["compression"]["algorithm"], "zstd:1");
    assert_eq!(u(&info, "mem_limit_bytes"), 8 << 20);
    let src = d.dir().join("mixed.img");
    let mut img = mixed_image();
    img.truncate(32 * MIB);
    std::fs::write(&src, img).unwrap();
    qemu_img_in_and_compare(&d, "c", &src);

    // A bad value names its line.
    std::fs::write(
        &config,
        "[[drive]]\nname = \"c\"\nsize = \"32M\"\ncompress = \"brotli\"\n",
    )
    .unwrap();
    // Refused at start, before any socket is made.
    let sock = dir.path().join("x.sock");
    let e = try_run(
        common::ramd()
            .args(["serve", "--config", &config.display().to_string()])
            .arg("--socket")
            .arg(&sock)
            .arg("--api-socket")
            .arg(dir.path().join("api.sock")),
        Duration::from_secs(30),
    )
    .expect("ramd ran");
    assert!(!e.status.success(), "{e}");
    assert!(e.stderr.contains("ramd.toml:4:"), "{e}");
    assert!(e.stderr.contains("unknown compression"), "{e}");
}

/// Loop device and mount on an attached file, torn down (best effort) on
/// drop so a failing test leaves nothing mounted.
struct Loop {
    dev: String,
    mnt: std::path::PathBuf,
    mounted: bool,
}

impl Loop {
    fn new(file: &Path, mnt: &Path) -> Loop {
        let out = run(tool("losetup").args(["-f", "--show"]).arg(file)).ok();
        Loop {
            dev: out.stdout.trim().to_owned(),
            mnt: mnt.to_owned(),
            mounted: false,
        }
    }
    fn mount(&mut self) {
        run(tool("mount").arg(&self.dev).arg(&self.mnt)).ok();
        self.mounted = true;
    }
    fn umount(&mut self) {
        run(tool("umount").arg(&self.mnt)).ok();
        self.mounted = false;
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        if self.mounted {
            let _ = try_run(tool("umount").arg("-l").arg(&self.mnt), TIMEOUT);
        }
        let _ = try_run(tool("losetup").args(["-d", &self.dev]), TIMEOUT);
    }
}

const TIMEOUT: Duration = Duration::from_secs(60);

/// ext4 through `ramd attach` + loop on a compressed drive larger than its
/// limit: files survive a remount and fsck, fstrim gives memory back.
#[test]
fn ext4_on_an_attached_compressed_drive() {
    if !require(&[
        "losetup",
        "mount",
        "umount",
        "mkfs.ext4",
        "e2fsck",
        "sha256sum",
        "fstrim",
        "fusermount3",
    ]) || !common::require_root_block_devices()
    {
        return;
    }
    let d = Daemon::start(&["z=256M,mem-limit=64M,compress=lz4"]);
    let (fuse, mnt) = (d.dir().join("fuse"), d.dir().join("mnt"));
    std::fs::create_dir_all(&fuse).unwrap();
    std::fs::create_dir_all(&mnt).unwrap();
    run(d.cli().arg("attach").arg("z").arg(&fuse)).ok();
    let mut lo = Loop::new(&fuse.join("z"), &mnt);
    run(tool("mkfs.ext4").args(["-q", "-F", &lo.dev])).ok();
    lo.mount();
    let text: Vec<u8> = b"a line of text that compresses well, again and again\n"
        .iter()
        .cycle()
        .take(96 * MIB)
        .copied()
        .collect();
    std::fs::write(mnt.join("text.txt"), &text).unwrap();
    std::fs::write(mnt.join("random.bin"), random_bytes(8 * MIB, 3)).unwrap();
    run(&mut tool("sync")).ok();
    let sums = |dir: &Path| {
        run(tool("sha256sum")
            .args(["text.txt", "random.bin"])
            .current_dir(dir))
        .ok()
        .stdout
    };
    let before = sums(&mnt);
    let z = compression(&d, "z");
    assert!(u(&z, "orig_data_bytes") > 64 * MIB as u64, "{z}");
    lo.umount();
    run(tool("e2fsck").args(["-f", "-n", &lo.dev])).ok();
    lo.mount();
    assert_eq!(sums(&mnt), before, "files changed across a remount");
    std::fs::remove_file(mnt.join("text.txt")).unwrap();
    // The freed blocks are trimmable once the journal commits them.
    run(&mut tool("sync")).ok();
    run(tool("fstrim").arg(&mnt)).ok();
    let after = compression(&d, "z");
    assert!(
        u(&after, "orig_data_bytes") < u(&z, "orig_data_bytes") / 2,
        "{z} -> {after}"
    );
    lo.umount();
    drop(lo);
    run(d.cli().arg("detach").arg(&fuse)).ok();
}

/// A mixed corpus of `mib` MiB, as the benchmark builds one:
/// real files (libraries and binaries from /usr/lib, docs from
/// /usr/share/doc) cut into pages, one page in eight zero, runs of a
/// same-filled word, and a fifth random.
fn corpus(mib: usize) -> Vec<u8> {
    let want = mib * MIB;
    let files_end = want / 5 * 4;
    let mut out = Vec::with_capacity(want);
    let mut stack = vec![
        std::path::PathBuf::from("/usr/share/doc"),
        std::path::PathBuf::from("/usr/lib/x86_64-linux-gnu"),
    ];
    'walk: while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut entries: Vec<_> = rd.flatten().map(|e| e.path()).collect();
        entries.sort();
        for p in entries {
            let Ok(meta) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            if meta.is_dir() {
                stack.push(p);
            } else if meta.is_file() {
                let Ok(bytes) = std::fs::read(&p) else {
                    continue;
                };
                for page in bytes.chunks(4096) {
                    match (out.len() / 4096) % 16 {
                        7 => out.resize(out.len() + 4096, 0),
                        11 => out.extend(0xdead_beef_u32.to_le_bytes().repeat(1024)),
                        _ => {}
                    }
                    out.extend_from_slice(page);
                    out.resize(out.len().next_multiple_of(4096), 0);
                    if out.len() >= files_end {
                        break 'walk;
                    }
                }
            }
        }
    }
    out.truncate(files_end);
    out.resize(files_end, 0);
    out.extend(random_bytes(want - files_end, 23));
    out
}

/// The drive's bytes, read back through nbdcopy (all connections).
fn read_back(d: &Daemon, name: &str, len: usize) -> Vec<u8> {
    let out = d.dir().join(format!("{name}.back"));
    run(tool("nbdcopy").arg(d.uri(name)).arg(&out)).ok();
    let mut bytes = std::fs::read(&out).unwrap();
    std::fs::remove_file(&out).unwrap();
    assert!(bytes[len..].iter().all(|&b| b == 0), "data past the corpus");
    bytes.truncate(len);
    bytes
}

/// Waits until the drive is ready after a start; its JSON.
#[track_caller]
fn ready(d: &Daemon, name: &str) -> Value {
    let mut v = Value::Null;
    common::wait_until("the drive to be restored", Duration::from_secs(120), || {
        let (status, body) = d.http("GET", &format!("/v1/drives/{name}"), None);
        if status != 200 {
            return false;
        }
        v = serde_json::from_str(&body).unwrap();
        v["state"] != "restoring"
    });
    assert_eq!(v["state"], "ready", "{v}\n{}", d.log());
    v
}

/// A persistent compressed drive (`--persist --compress`, durability
/// flush): a mixed corpus written with nbdcopy (multi-conn, FLUSH at the
/// end) comes back byte for byte and compressed after a clean restart and
/// after kill -9, with the same compression figures; its image on disk is
/// a raw image qemu-img reads.
#[test]
fn persistent_compressed_drive_survives_restart_and_kill9() {
    if !require(&["nbdcopy", "qemu-img", "qemu-io"]) {
        return;
    }
    let mut d = Daemon::launch(&["daemon".to_owned()], &[]);
    let out = run(d.cli().args([
        "create",
        "pz",
        "--size",
        "96M",
        "--mem-limit",
        "48M",
        "--compress",
        "zstd",
        "--persist",
        "--durability",
        "flush",
        "--sync-interval",
        "1h",
    ]))
    .ok();
    assert!(out.stdout.contains("compressed zstd:3"), "{out}");
    let data = corpus(64);
    let src = d.dir().join("corpus.img");
    std::fs::write(&src, &data).unwrap();
    run(tool("nbdcopy").arg("--flush").arg(&src).arg(d.uri("pz"))).ok();
    assert!(read_back(&d, "pz", data.len()) == data, "copy differs");
    let before = compression(&d, "pz");
    let logical = u(&before, "orig_data_bytes");
    // Every page that is not a hole: nbdcopy leaves zero pages out (holes),
    // the same-filled ones (1 in 16 of the files' part) are words.
    assert!(
        logical >= 60 * MIB as u64 && logical <= 64 * MIB as u64,
        "{before}"
    );
    assert!(
        u(&before, "same_pages") >= (48 * MIB / 4096 / 16) as u64,
        "{before}"
    );
    assert!(
        u(&before, "huge_pages") >= (12 * MIB / 4096) as u64,
        "{before}"
    );
    assert!(u(&before, "slab_bytes") < 48 * MIB as u64, "{before}");
    let ratio = before["ratio"].as_f64().unwrap();
    assert!(ratio > 1.2, "{before}");

    // A clean restart: restored from the state directory, compressed.
    d.terminate();
    let image = d.state_dir().join("drives/pz/image");
    run(tool("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&src)
        .arg(&image))
    .ok();
    d.restart();
    let v = ready(&d, "pz");
    assert_eq!(v["compression"]["algorithm"], "zstd:3", "{v}");
    let after = compression(&d, "pz");
    for key in [
        "orig_data_bytes",
        "compr_data_bytes",
        "same_pages",
        "huge_pages",
        "compressed_pages",
    ] {
        assert_eq!(after[key], before[key], "{key}: {before} -> {after}");
    }
    let info = run(d.cli().args(["info", "pz"])).ok();
    assert!(info.stdout.contains("compression  zstd:3, ratio"), "{info}");
    assert!(
        read_back(&d, "pz", data.len()) == data,
        "differs after restart"
    );

    // Writes acknowledged by a FLUSH survive kill -9.
    let mut want = data.clone();
    run(tool("qemu-io")
        .args(["-f", "raw", "-c", "write -P 0x5a 1M 3M", "-c", "flush"])
        .args(["-c", "write -z 8M 2M", "-c", "flush"])
        .arg(d.uri("pz")))
    .ok();
    want[MIB..4 * MIB].fill(0x5a);
    want[8 * MIB..10 * MIB].fill(0);
    d.kill_hard();
    d.restart();
    ready(&d, "pz");
    assert!(
        read_back(&d, "pz", data.len()) == want,
        "differs after kill -9"
    );
    let z = compression(&d, "pz");
    assert_eq!(z["algorithm"], "zstd:3");
    assert!(u(&z, "orig_data_bytes") <= logical + 3 * MIB as u64, "{z}");
    let info = run(d.cli().args(["info", "pz"])).ok();
    assert!(info.stdout.contains("compression  zstd:3, ratio"), "{info}");
}
