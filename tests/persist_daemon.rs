//! Persistent drives in the real daemon, with real clients and real
//! crashes: kill -9 while a client writes with FLUSH (`flush` mode) or
//! without (`periodic` mode), checked against the client's own log of what
//! was acknowledged; ext4 over attach + loop through a kill -9; SIGTERM
//! with unsynced data; corrupt meta / image / journal; a full disk;
//! encryption; and the CLI / API surface.
//!
//! Every block the crash tests write describes itself (cycle, sequence
//! number, block index, repeated over the whole 4 KiB), and the block each
//! write goes to is a pure function of (cycle, sequence), so the checker can
//! tell exactly which prefix of the write history the drive holds, and
//! that it holds one (never a mix, never a torn block). Seeds are printed;
//! `RAMD_KILL_SEED=N` replays a run.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use serde_json::Value;

const BLOCK: usize = 4096;
const RECORD: usize = 32;
const MAGIC: &[u8; 8] = b"RAMDSEQ1";

/// The writer: sequence-numbered blocks, FLUSH every `flush_every` writes
/// (0: never, then it logs ack times instead), until the daemon dies or 60 s
/// pass. Log lines: `C` connected, `F n` a FLUSH acknowledged after n
/// writes, `T n ms` n writes acknowledged by Unix time ms, `I n` n writes
/// issued in all.
const WRITER: &str = r#"
import nbd, sys, time
uri, cycle, nblocks, flush_every, logpath = sys.argv[1:6]
cycle = int(cycle); nblocks = int(nblocks); flush_every = int(flush_every)
M = (1 << 64) - 1
def block(n):
    z = (cycle * 0x2545F4914F6CDD1D + (n + 1) * 0x9E3779B97F4A7C15) & M
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
    return (z ^ (z >> 31)) % nblocks
log = open(logpath, 'w', buffering=1)
h = nbd.NBD()
h.connect_uri(uri)
log.write("C\n")
n = 0
deadline = time.time() + 60
try:
    while time.time() < deadline:
        b = block(n)
        rec = b"RAMDSEQ1" + cycle.to_bytes(8, 'little') + (n + 1).to_bytes(8, 'little') + b.to_bytes(8, 'little')
        n += 1
        h.pwrite(rec * 128, b * 4096)
        if flush_every and n % flush_every == 0:
            h.flush()
            log.write("F %d\n" % n)
        elif not flush_every and n % 16 == 0:
            log.write("T %d %d\n" % (n, int(time.time() * 1000)))
except Exception as e:
    log.write("E %s\n" % str(e).replace("\n", " "))
log.write("I %d\n" % n)
log.close()
"#;

/// Same function as the writer's `block`.
fn block_of(cycle: u64, n: u64, nblocks: u64) -> u64 {
    let mut z = cycle
        .wrapping_mul(0x2545_F491_4F6C_DD1D)
        .wrapping_add((n + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) % nblocks
}

/// What a block holds: (cycle, sequence number); (0, 0) never written.
type Cell = (u64, u64);

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Parses a drive image into cells; panics on a torn or foreign block.
fn cells(image: &[u8], context: &str) -> Vec<Cell> {
    image
        .chunks(BLOCK)
        .enumerate()
        .map(|(i, b)| {
            if b.iter().all(|&x| x == 0) {
                return (0, 0);
            }
            let rec = &b[..RECORD];
            assert!(
                b.chunks(RECORD).all(|r| r == rec) && &rec[..8] == MAGIC,
                "{context}: block {i} is torn or foreign (a mix of two writes)"
            );
            assert_eq!(
                u64_at(rec, 24),
                i as u64,
                "{context}: block {i} holds another block's write"
            );
            (u64_at(rec, 8), u64_at(rec, 16))
        })
        .collect()
}

/// The writer's log.
#[derive(Debug, Default)]
struct WriterLog {
    connected: bool,
    /// Writes covered by the last acknowledged FLUSH.
    flushed: u64,
    /// (writes acknowledged, by this Unix time in ms).
    acked_by: Vec<(u64, u64)>,
    /// Writes issued (None when the writer never got that far).
    issued: Option<u64>,
    error: Option<String>,
}

fn read_log(path: &Path) -> WriterLog {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut log = WriterLog::default();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        match f.next() {
            Some("C") => log.connected = true,
            Some("F") => log.flushed = f.next().unwrap().parse().unwrap(),
            Some("T") => {
                let n = f.next().unwrap().parse().unwrap();
                let ms = f.next().unwrap().parse().unwrap();
                log.acked_by.push((n, ms));
            }
            Some("I") => log.issued = Some(f.next().unwrap().parse().unwrap()),
            Some("E") => log.error = Some(line[2..].to_owned()),
            _ => {}
        }
    }
    log
}

/// Checks that `now` is the state after exactly the first t writes of
/// `cycle` over `base`, for one t in [lower, upper]; returns t.
fn check_prefix(
    base: &[Cell],
    now: &[Cell],
    cycle: u64,
    lower: u64,
    upper: u64,
    context: &str,
) -> u64 {
    let n = base.len() as u64;
    // The newest write of this cycle present fixes t (every later write
    // would have left a higher sequence number somewhere).
    let t = now
        .iter()
        .filter(|c| c.0 == cycle)
        .map(|c| c.1)
        .max()
        .unwrap_or(0);
    let mut expect = base.to_vec();
    for w in 0..t {
        expect[block_of(cycle, w, n) as usize] = (cycle, w + 1);
    }
    for (b, (e, got)) in expect.iter().zip(now).enumerate() {
        assert_eq!(
            e, got,
            "{context}: block {b} holds {got:?} but the state after the first {t} writes has {e:?}: not one point in time"
        );
    }
    assert!(
        t >= lower,
        "{context}: the drive holds the first {t} writes, but {lower} were acknowledged as durable"
    );
    assert!(
        t <= upper,
        "{context}: the drive holds {t} writes, more than the {upper} issued"
    );
    t
}

/// A small deterministic generator for kill delays.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo)
    }
}

fn seed() -> u64 {
    common::seed_from_env("RAMD_KILL_SEED", "kill")
}

/// GET /v1/drives/NAME as JSON.
fn drive(d: &Daemon, name: &str) -> Value {
    let (s, body) = d.http("GET", &format!("/v1/drives/{name}"), None);
    assert_eq!(s, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Waits until the drive is no longer restoring; returns it.
#[track_caller]
fn settled(d: &Daemon, name: &str) -> Value {
    let mut v = Value::Null;
    wait_until(
        &format!("drive {name} to finish restoring"),
        DAEMON_TIMEOUT,
        || {
            v = drive(d, name);
            v["state"] != "restoring"
        },
    );
    v
}

/// Waits until the drive is ready; panics with its error otherwise.
#[track_caller]
fn ready(d: &Daemon, name: &str) -> Value {
    let v = settled(d, name);
    assert_eq!(v["state"], "ready", "{v}");
    v
}

/// The whole drive, through nbdcopy.
fn image(d: &Daemon, name: &str) -> Vec<u8> {
    let out = d.dir().join(format!("{name}.copy"));
    run(tool("nbdcopy").arg(d.uri(name)).arg(&out)).ok();
    let bytes = std::fs::read(&out).unwrap();
    std::fs::remove_file(&out).unwrap();
    bytes
}

fn drive_flag(spec: &str) -> Vec<String> {
    vec!["daemon".into(), "--drive".into(), spec.into()]
}

/// Runs the writer against `name` in cycles, killing the daemon at a
/// random moment in each, and checks every restart.
fn kill_cycles(
    name: &str,
    spec: &str,
    cycles: u64,
    flush_every: u64,
    delay_ms: (u64, u64),
) -> Vec<u64> {
    let nblocks = 512u64;
    let mut d = Daemon::launch(&drive_flag(spec), &[]);
    let mut rng = Rng(seed());
    let mut base: Vec<Cell> = vec![(0, 0); nblocks as usize];
    let mut lowers = Vec::new();
    for cycle in 1..=cycles {
        ready(&d, name);
        let log_path = d.dir().join(format!("writer-{cycle}.log"));
        let mut writer = KillOnDrop(
            tool("/usr/bin/python3")
                .arg("-c")
                .arg(WRITER)
                .arg(d.uri(name))
                .arg(cycle.to_string())
                .arg(nblocks.to_string())
                .arg(flush_every.to_string())
                .arg(&log_path)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::inherit())
                .spawn()
                .expect("start the writer"),
        );
        // The newest durable point the daemon reports.
        let durable_as_of = || {
            drive(&d, name)["persist"]["status"]["durable_as_of_unix_ms"]
                .as_u64()
                .unwrap_or(0)
        };
        // Every cycle has something to check: the kill comes a random
        // moment after the first acknowledged FLUSH, or after the first
        // sync that covers acknowledged writes (counted from the writer's
        // start, a busy machine could kill it before either).
        wait_until("the writer's first durable writes", TOOL_TIMEOUT, || {
            let log = read_log(&log_path);
            if let Some(e) = &log.error {
                panic!("cycle {cycle}: the writer failed: {e}");
            }
            if flush_every > 0 {
                log.flushed > 0
            } else {
                let as_of = durable_as_of();
                log.acked_by.iter().any(|&(_, ms)| ms < as_of)
            }
        });
        std::thread::sleep(Duration::from_millis(rng.range(delay_ms.0, delay_ms.1)));
        // The newest durable point the daemon reported before the crash.
        let as_of = durable_as_of();
        d.kill9();
        let status = wait_timeout(&mut writer.0, TOOL_TIMEOUT).expect("the writer stops");
        assert!(status.success(), "writer failed: {status}");
        let log = read_log(&log_path);
        let issued = log
            .issued
            .unwrap_or_else(|| panic!("cycle {cycle}: the writer did not finish its log: {log:?}"));
        let lower = if flush_every > 0 {
            log.flushed
        } else {
            log.acked_by
                .iter()
                .filter(|(_, ms)| *ms < as_of)
                .map(|(n, _)| *n)
                .max()
                .unwrap_or(0)
        };
        d.restart();
        let v = ready(&d, name);
        let now = cells(&image(&d, name), &format!("cycle {cycle}"));
        let t = check_prefix(
            &base,
            &now,
            cycle,
            lower,
            issued,
            &format!(
                "cycle {cycle} ({name}, {log:?}, restore: {})",
                v["persist"]["restore"]
            ),
        );
        eprintln!("cycle {cycle}: {issued} writes issued, {lower} durable, {t} restored");
        lowers.push(lower);
        base = now;
    }
    lowers
}

#[test]
fn flush_drive_keeps_every_flushed_write_across_kill9() {
    if !require(&["nbdcopy"]) || !require_python_module("nbd", "python3-libnbd") {
        return;
    }
    let lowers = kill_cycles(
        "f",
        "f=2M,persist,durability=flush,sync-interval=1h",
        16,
        8,
        (20, 400),
    );
    assert!(
        lowers.iter().filter(|&&l| l > 0).count() >= 8,
        "too few cycles had acknowledged flushes to check: {lowers:?}"
    );
}

#[test]
fn periodic_drive_is_one_point_in_time_no_older_than_its_last_sync() {
    if !require(&["nbdcopy"]) || !require_python_module("nbd", "python3-libnbd") {
        return;
    }
    let lowers = kill_cycles(
        "p",
        "p=2M,persist,durability=periodic,sync-interval=100ms",
        16,
        0,
        (150, 700),
    );
    assert!(
        lowers.iter().filter(|&&l| l > 0).count() >= 8,
        "too few cycles had a completed sync to check: {lowers:?}"
    );
}

/// The same crash cycles over compressed drives: every flushed write of
/// an lz4 drive, one point in time of a periodic zstd drive.
#[test]
fn compressed_flush_drive_keeps_every_flushed_write_across_kill9() {
    if !require(&["nbdcopy"]) || !require_python_module("nbd", "python3-libnbd") {
        return;
    }
    let lowers = kill_cycles(
        "fz",
        "fz=2M,compress=lz4,persist,durability=flush,sync-interval=1h",
        12,
        8,
        (20, 400),
    );
    assert!(
        lowers.iter().filter(|&&l| l > 0).count() >= 6,
        "too few cycles had acknowledged flushes to check: {lowers:?}"
    );
}

#[test]
fn compressed_periodic_drive_is_one_point_in_time() {
    if !require(&["nbdcopy"]) || !require_python_module("nbd", "python3-libnbd") {
        return;
    }
    let lowers = kill_cycles(
        "pz",
        "pz=2M,compress=zstd,persist,durability=periodic,sync-interval=100ms",
        12,
        0,
        (150, 700),
    );
    assert!(
        lowers.iter().filter(|&&l| l > 0).count() >= 6,
        "too few cycles had a completed sync to check: {lowers:?}"
    );
}

/// nbdsh snippets.
fn nbd_write(uri: &str, offset: u64, data_seed: u64, len: usize, flush: bool) {
    let script = r#"
import nbd, sys
uri, off, seed, n, fl = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
h = nbd.NBD(); h.connect_uri(uri)
buf = pattern(n, seed)
h.pwrite(buf, off)
if fl:
    h.flush()
h.shutdown()
"#;
    python(
        &format!("{PATTERN_PY}{script}"),
        &[
            uri,
            &offset.to_string(),
            &data_seed.to_string(),
            &len.to_string(),
            if flush { "1" } else { "0" },
        ],
    )
    .ok();
}

#[test]
fn sigterm_saves_unsynced_data_of_a_periodic_drive() {
    if !require(&["nbdcopy"]) || !require_python_module("nbd", "python3-libnbd") {
        return;
    }
    let mut d = Daemon::launch(
        &drive_flag("t=4M,persist,durability=periodic,sync-interval=1h"),
        &[],
    );
    ready(&d, "t");
    nbd_write(&d.uri("t"), 8192, 5, 300_000, false);
    let v = drive(&d, "t");
    assert!(
        v["persist"]["status"]["dirty_bytes"].as_u64().unwrap() >= 300_000,
        "nothing dirty? {v}"
    );
    assert!(d.terminate().success());
    assert!(d.log().contains("saved to"), "{}", d.log());
    d.restart();
    ready(&d, "t");
    let img = image(&d, "t");
    assert_eq!(&img[8192..8192 + 300_000], &pattern(300_000, 5)[..]);
    assert!(img[..8192].iter().all(|&b| b == 0));
}

/// Flips one byte of a file.
fn flip(path: &Path, at: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).unwrap();
    b[0] ^= 0x5a;
    f.write_all_at(&b, at).unwrap();
}

#[test]
fn corrupt_state_fails_precisely_and_restore_decides() {
    if !require(&["nbdcopy", "nbdinfo"]) || !require_python_module("nbd", "python3-libnbd") {
        return;
    }
    let args: Vec<String> = [
        "daemon",
        "--drive",
        "ram0=1M",
        "--drive",
        "ok=1M,persist",
        "--drive",
        "m=1M,persist,sync-interval=1h",
        "--drive",
        "i=1M,persist,sync-interval=1h",
        "--drive",
        "j=1M,persist,durability=flush,sync-interval=1h",
    ]
    .map(String::from)
    .to_vec();
    let mut d = Daemon::launch(&args, &[]);
    for n in ["ok", "m", "i", "j"] {
        ready(&d, n);
    }
    // m, i: data checkpointed into the image by a manual sync.
    for n in ["ok", "m", "i"] {
        nbd_write(&d.uri(n), 0, 1, 65536, false);
        run(d.cli().args(["sync", n])).ok();
    }
    // j: the image holds pattern 1; two flushed generations in the journal.
    nbd_write(&d.uri("j"), 0, 1, 65536, false);
    run(d.cli().args(["sync", "j"])).ok();
    nbd_write(&d.uri("j"), 65536, 2, 8192, true);
    nbd_write(&d.uri("j"), 131072, 3, 8192, true);
    assert!(
        drive(&d, "j")["persist"]["status"]["journal_bytes"]
            .as_u64()
            .unwrap()
            > 0,
        "the journal should hold the flushed generations"
    );
    d.kill9();
    let state = d.state_dir().join("drives");
    flip(&state.join("m/meta"), 20);
    flip(&state.join("i/image"), 4096 * 3 + 17);
    // Inside the first generation's first record (its payload).
    flip(&state.join("j/journal"), 512 + 100);
    let before: Vec<Vec<u8>> = ["m/meta", "i/image", "j/journal"]
        .iter()
        .map(|f| std::fs::read(state.join(f)).unwrap())
        .collect();
    d.restart();

    for (name, want) in [
        ("m", "metadata"),
        ("i", "is corrupt at page 3 (byte offset 12288)"),
        ("j", "journal"),
    ] {
        let v = settled(&d, name);
        assert_eq!(v["state"], "failed", "{v}");
        let e = v["error"].as_str().unwrap();
        assert!(e.contains(want), "{name}: want {want:?} in {e}");
        assert!(e.contains("Nothing was changed on disk"), "{e}");
        // NBD clients are refused with the reason.
        let out = run(tool("nbdinfo").env("LIBNBD_DEBUG", "1").arg(d.uri(name))).failed();
        assert!(out.stderr.contains("failed to restore"), "{out}");
        // The CLI shows it, and what to do next.
        let out = run(d.cli().args(["info", name])).ok();
        assert!(out.stdout.contains("ramd restore"), "{out}");
        let out = run(d.cli().args(["list"])).ok();
        assert!(out.stdout.contains("FAILED"), "{out}");
    }
    // Nothing on disk was touched; the other drives are served.
    let after: Vec<Vec<u8>> = ["m/meta", "i/image", "j/journal"]
        .iter()
        .map(|f| std::fs::read(state.join(f)).unwrap())
        .collect();
    assert!(
        before == after,
        "a failed restore changed the state directory"
    );
    run(tool("nbdinfo").arg(d.uri("ram0"))).ok();
    ready(&d, "ok");
    assert_eq!(&image(&d, "ok")[..65536], &pattern(65536, 1)[..]);
    let (s, body) = d.http("POST", "/v1/drives/j/sync", None);
    assert_eq!(s, 409, "{body}");
    assert!(body.contains("drive_not_ready"), "{body}");

    // --discard-journal: the image alone.
    let out = run(d.cli().args(["restore", "j", "--discard-journal"])).ok();
    assert!(out.stdout.contains("j is ready"), "{out}");
    let img = image(&d, "j");
    assert_eq!(&img[..65536], &pattern(65536, 1)[..]);
    assert!(img[65536..].iter().all(|&b| b == 0));
    // --force: the bad page as it is, the rest intact.
    let out = run(d.cli().args(["restore", "i", "--force"])).ok();
    assert!(out.stdout.contains("failed verification"), "{out}");
    let img = image(&d, "i");
    let mut want = pattern(65536, 1);
    want[4096 * 3 + 17] ^= 0x5a;
    assert_eq!(&img[..65536], &want[..]);
    // A corrupt meta stays failed (nothing to load), with the same error.
    let out = run(d.cli().args(["restore", "m", "--force"])).failed();
    assert!(out.stderr.contains("metadata"), "{out}");
    // Deleting it removes the damaged directory.
    let out = run(d.cli().args(["delete", "m"])).ok();
    assert!(out.stderr.contains("was removed"), "{out}");
    assert!(!state.join("m").exists());
}

/// A tmpfs mounted for the test, unmounted on drop.
struct Tmpfs(PathBuf);
impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap();
        run(tool("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={size}"))
            .arg("tmpfs")
            .arg(at))
        .ok();
        Tmpfs(at.to_owned())
    }
}
impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = try_run(tool("umount").arg("-l").arg(&self.0), TOOL_TIMEOUT);
    }
}

#[test]
fn disk_full_keeps_serving_fails_flush_with_eio_and_recovers() {
    if !require_root_block_devices()
        || !require(&["nbdcopy", "mount"])
        || !require_python_module("nbd", "python3-libnbd")
    {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let state = root.path().join("state");
    let _fs = Tmpfs::mount(&state, "32M");
    let mut d = Daemon::launch(
        &[
            "daemon",
            "--state-dir",
            state.to_str().unwrap(),
            "--drive",
            "full=16M,persist,durability=flush,sync-interval=1h",
        ]
        .map(String::from),
        &[],
    );
    ready(&d, "full");
    // Leave 4 MiB free, then write 8 MiB and FLUSH.
    let filler = state.join("filler");
    std::fs::write(&filler, vec![1u8; 28 << 20]).unwrap();
    let script = PATTERN_PY.to_owned()
        + r#"
import nbd, sys, errno
h = nbd.NBD(); h.connect_uri(sys.argv[1])
buf = pattern(8 << 20, 1)
h.pwrite(buf, 0)
try:
    h.flush()
    print("flush ok")
except nbd.Error as e:
    print("flush failed:", e.errnum == errno.EIO, e.errno)
# The drive still serves from RAM.
print("read back", h.pread(8 << 20, 0) == buf)
"#;
    let out = python(&script, &[&d.uri("full")]).ok();
    assert!(out.stdout.contains("flush failed: True EIO"), "{out}");
    assert!(out.stdout.contains("read back True"), "{out}");
    let v = drive(&d, "full");
    let st = &v["persist"]["status"];
    let e = st["last_error"].as_str().unwrap_or_default();
    assert!(e.contains("No space left on device"), "{v}");
    assert!(st["syncs_failed"].as_u64().unwrap() >= 1, "{v}");
    let out = run(d.cli().args(["info", "full"])).ok();
    assert!(out.stdout.contains("No space left on device"), "{out}");
    let metrics = run(d.cli().args(["stats"])).ok().stdout;
    assert!(metrics.contains("persistence:"), "{metrics}");
    let (_, text) = d.http("GET", "/metrics", None);
    let line = text
        .lines()
        .find(|l| l.starts_with("ramd_drive_sync_errors_total{drive=\"full\"}"))
        .unwrap_or_else(|| panic!("no sync error counter in\n{text}"));
    assert_ne!(line.split_whitespace().last(), Some("0"), "{line}");
    // Space again: the next sync saves everything.
    std::fs::remove_file(&filler).unwrap();
    let out = run(d.cli().args(["sync", "full"])).ok();
    assert!(out.stdout.contains("synced full"), "{out}");
    let v = drive(&d, "full");
    assert_eq!(v["persist"]["status"]["last_error"], Value::Null, "{v}");
    assert_eq!(v["persist"]["status"]["dirty_bytes"], 0, "{v}");
    d.kill9();
    d.restart();
    ready(&d, "full");
    assert_eq!(&image(&d, "full")[..8 << 20], &pattern(8 << 20, 1)[..]);
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn encrypted_drive_round_trip_and_a_wrong_key_is_refused_clearly() {
    if !require(&["nbdcopy", "nbdinfo"]) || !require_python_module("nbd", "python3-libnbd") {
        return;
    }
    let mut d = Daemon::launch(&["daemon".into(), "--no-default-drive".into()], &[]);
    let key = random_bytes(32, 77);
    let key_path = d.dir().join("enc.key");
    std::fs::write(&key_path, &key).unwrap();
    // Key files are private (a key others may read is refused).
    std::fs::set_permissions(
        &key_path,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let out = run(d
        .cli()
        .args([
            "create",
            "enc",
            "--size",
            "4M",
            "--persist",
            "--encrypt",
            "--key-file",
        ])
        .arg(&key_path))
    .ok();
    assert!(out.stdout.contains("encrypted"), "{out}");
    nbd_write(&d.uri("enc"), 4096, 9, 100_000, true);
    assert!(d.terminate().success());
    // Ciphertext on disk.
    let img = std::fs::read(d.state_dir().join("drives/enc/image")).unwrap();
    let plain = pattern(100_000, 9);
    assert!(
        !img.windows(64).any(|w| w == &plain[..64]),
        "plaintext in the encrypted image"
    );
    d.restart();
    let v = ready(&d, "enc");
    assert_eq!(v["persist"]["encrypted"], true);
    assert_eq!(&image(&d, "enc")[4096..4096 + 100_000], &plain[..]);

    // Another key: refused, clearly, nothing loaded.
    std::fs::write(&key_path, random_bytes(32, 78)).unwrap();
    assert!(d.terminate().success());
    d.restart();
    let v = settled(&d, "enc");
    assert_eq!(v["state"], "failed", "{v}");
    assert!(v["error"].as_str().unwrap().contains("wrong key"), "{v}");
    let out = run(tool("nbdinfo").env("LIBNBD_DEBUG", "1").arg(d.uri("enc"))).failed();
    assert!(out.stderr.contains("wrong key"), "{out}");
    // The right key again, through `ramd restore --key-file`.
    let right = d.dir().join("right.key");
    std::fs::write(&right, hex(&key)).unwrap();
    std::fs::set_permissions(&right, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let out = run(d.cli().args(["restore", "enc", "--key-file"]).arg(&right)).ok();
    assert!(out.stdout.contains("enc is ready"), "{out}");
    assert_eq!(&image(&d, "enc")[4096..4096 + 100_000], &plain[..]);
    // Keys never reach the log.
    let log = d.log();
    assert!(!log.contains(&hex(&key)), "the key is in the log");
    assert!(
        !log.contains(&hex(&random_bytes(32, 78))),
        "the key is in the log"
    );
}

/// ext4 over attach + loop, torn down even when the test fails.
struct Ext4Stack {
    fuse: PathBuf,
    data: PathBuf,
    dev: Option<String>,
    mounted: bool,
}

impl Ext4Stack {
    fn up(d: &Daemon, name: &str, fuse: &Path, data: &Path, mkfs: bool) -> Ext4Stack {
        std::fs::create_dir_all(fuse).unwrap();
        std::fs::create_dir_all(data).unwrap();
        run(d.cli().arg("attach").arg(name).arg(fuse)).ok();
        let mut s = Ext4Stack {
            fuse: fuse.to_owned(),
            data: data.to_owned(),
            dev: None,
            mounted: false,
        };
        let out = run(tool("losetup").args(["-f", "--show"]).arg(fuse.join(name))).ok();
        s.dev = Some(out.stdout.trim().to_owned());
        if mkfs {
            run(tool("mkfs.ext4").args(["-q", "-F"]).arg(s.dev())).ok();
        }
        run(tool("mount").arg(s.dev()).arg(data)).ok();
        s.mounted = true;
        s
    }
    fn dev(&self) -> &str {
        self.dev.as_deref().unwrap()
    }
    /// Lazy teardown: works with a dead daemon behind the FUSE file.
    fn tear_down(&mut self) {
        if self.mounted {
            let _ = try_run(tool("umount").arg("-l").arg(&self.data), TOOL_TIMEOUT);
            self.mounted = false;
        }
        if let Some(dev) = self.dev.take() {
            let _ = try_run(tool("losetup").arg("-d").arg(&dev), TOOL_TIMEOUT);
        }
        let _ = try_run(tool("umount").arg("-l").arg(&self.fuse), TOOL_TIMEOUT);
    }
}

impl Drop for Ext4Stack {
    fn drop(&mut self) {
        self.tear_down();
    }
}

#[test]
fn ext4_on_a_flush_drive_survives_kill9_with_every_fsynced_file() {
    if !require_root_block_devices()
        || !require(&["losetup", "mkfs.ext4", "e2fsck", "mount", "umount"])
    {
        return;
    }
    use std::io::Write;
    let mut d = Daemon::launch(
        &drive_flag("fs=64M,persist,durability=flush,sync-interval=1h"),
        &[],
    );
    ready(&d, "fs");
    let fuse = d.dir().join("fuse");
    let data = d.dir().join("data");
    let mut stack = Ext4Stack::up(&d, "fs", &fuse, &data, true);
    let mut files = Vec::new();
    for i in 0..24u64 {
        let bytes = random_bytes(4096 + (i as usize * 37_001) % 400_000, i + 1);
        let path = data.join(format!("f{i}"));
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&bytes).unwrap();
        f.sync_all().unwrap();
        files.push((path, bytes));
    }
    std::fs::File::open(&data).unwrap().sync_all().unwrap();
    // Unsynced writes after the last fsync may or may not survive.
    std::fs::write(data.join("unsynced"), random_bytes(200_000, 999)).unwrap();
    d.kill9();
    stack.tear_down();
    d.restart();
    ready(&d, "fs");
    let mut stack = Ext4Stack::up(&d, "fs", &fuse, &data, false);
    for (path, bytes) in &files {
        let got = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(got == *bytes, "{} differs after the crash", path.display());
    }
    run(tool("umount").arg(&data)).ok();
    stack.mounted = false;
    let out = run(tool("e2fsck").args(["-f", "-n"]).arg(stack.dev()));
    assert_eq!(out.code(), 0, "e2fsck found problems: {out}");
    stack.tear_down();
}

fn cli_ok(d: &Daemon, args: &[&str]) -> Output {
    run(d.cli().args(args)).ok()
}

#[test]
fn cli_and_api_for_persistent_drives() {
    if !require_python_module("nbd", "python3-libnbd") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("ramd.toml");
    std::fs::write(
        &cfg,
        "[[drive]]\nname = \"cfg\"\nsize = \"2M\"\npersist = true\ndurability = \"flush\"\nsync_interval = \"10s\"\n",
    )
    .unwrap();
    let mut d = Daemon::launch(
        &[
            "daemon".into(),
            "--config".into(),
            cfg.display().to_string(),
            "--drive".into(),
            "ram0=1M".into(),
        ],
        &[],
    );
    // Usage errors: exit 2, nothing created.
    for args in [
        &["create", "x", "--size", "1M", "--durability", "flush"][..],
        &["create", "x", "--size", "1M", "--sync-interval", "1s"],
        &["create", "x", "--size", "1M", "--persist", "--encrypt"],
        &[
            "create",
            "x",
            "--size",
            "1M",
            "--persist",
            "--key-file",
            "/k",
        ],
        &["create", "x"],
        &["restore", "x", "--force", "--discard-journal"],
    ] {
        let out = run(d.cli().args(args));
        assert_eq!(out.code(), 2, "{out}");
    }
    // Refusals from the daemon: exit 1 with the reason.
    for (args, want) in [
        (&["create", "x", "--persist"][..], "missing field `size`"),
        (
            &[
                "create",
                "x",
                "--size",
                "1M",
                "--persist",
                "--durability",
                "fast",
            ],
            "unknown durability 'fast'",
        ),
        (
            &[
                "create",
                "x",
                "--size",
                "1M",
                "--persist",
                "--sync-interval",
                "5ms",
            ],
            "shorter than the minimum",
        ),
        (&["sync", "ram0"], "not persistent"),
        (&["sync", "nope"], "no drive named"),
        (&["restore", "ram0"], "not persistent"),
        (&["delete", "ram0", "--keep-data"], "not persistent"),
    ] {
        let out = run(d.cli().args(args)).failed();
        assert_eq!(out.code(), 1, "{out}");
        assert!(out.stderr.contains(want), "want {want:?}: {out}");
    }

    // A new persistent drive.
    let out = cli_ok(
        &d,
        &[
            "create",
            "p",
            "--size",
            "8M",
            "--persist",
            "--durability",
            "flush",
            "--sync-interval",
            "10s",
        ],
    );
    assert!(
        out.stdout.contains("persistent: flush, sync every 10s"),
        "{out}"
    );
    assert!(out.stdout.contains("state directory:"), "{out}");
    let state = d.state_dir().join("drives/p");
    assert!(state.join("meta").exists() && state.join("drive.json").exists());
    let out = run(d.cli().args(["restore", "p"])).failed();
    assert!(out.stderr.contains("is ready"), "{out}");
    let v: Value = serde_json::from_str(&cli_ok(&d, &["info", "p", "--json"]).stdout).unwrap();
    assert_eq!(v["kind"], "persistent");
    assert_eq!(v["persist"]["durability"], "flush");
    assert_eq!(v["persist"]["sync_interval_ms"], 10_000);
    assert_eq!(v["persist"]["flush_is_noop"], false);
    assert_eq!(v["persist"]["status"]["sync_state"], "idle");
    let info = cli_ok(&d, &["info", "p"]).stdout;
    for want in [
        "durability",
        "an acknowledged FLUSH/FUA",
        "sync interval",
        "10s",
        "last sync",
        "dirty",
        "journal",
        "state dir",
    ] {
        assert!(info.contains(want), "want {want:?} in\n{info}");
    }
    // Sync: prints what it saved; --json the API's answer.
    nbd_write(&d.uri("p"), 0, 3, 65536, false);
    let out = cli_ok(&d, &["sync", "p"]);
    assert!(out.stdout.contains("synced p: 64 KiB changed"), "{out}");
    let v: Value = serde_json::from_str(&cli_ok(&d, &["sync", "p", "--json"]).stdout).unwrap();
    assert_eq!(v["generation"], 0, "nothing changed: {v}");
    // Mode none: FLUSH is a no-op, and info says so.
    cli_ok(
        &d,
        &[
            "create",
            "n",
            "--size",
            "1M",
            "--persist",
            "--durability",
            "none",
        ],
    );
    let info = cli_ok(&d, &["info", "n"]).stdout;
    assert!(info.contains("FLUSH is a no-op"), "{info}");
    // list, stats.
    let list = cli_ok(&d, &["list"]).stdout;
    assert!(
        list.contains("rw/flush") && list.contains("rw/none"),
        "{list}"
    );
    let stats = cli_ok(&d, &["stats"]).stdout;
    assert!(
        stats.contains("persistence:") && stats.contains("SYNCS OK/FAIL"),
        "{stats}"
    );
    let (_, text) = d.http("GET", "/metrics", None);
    for want in [
        "ramd_drive_state{drive=\"p\",state=\"ready\"} 1",
        "ramd_drive_sync_duration_seconds_count{drive=\"p\"}",
        "ramd_drive_dirty_bytes{drive=\"p\"}",
        "ramd_drive_journal_bytes{drive=\"p\"}",
        "ramd_drive_sync_written_bytes_total{drive=\"p\"}",
    ] {
        assert!(text.contains(want), "want {want:?} in /metrics");
    }
    // PATCH durability and interval.
    let (s, body) = d.http(
        "PATCH",
        "/v1/drives/p",
        Some(r#"{"durability":"periodic","sync_interval":"2s"}"#),
    );
    assert_eq!(s, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["persist"]["durability"], "periodic");
    assert_eq!(v["persist"]["sync_interval_ms"], 2000);
    let (s, body) = d.http(
        "PATCH",
        "/v1/drives/ram0",
        Some(r#"{"durability":"flush"}"#),
    );
    assert_eq!(s, 409, "{body}");
    // Resize and lock work, and are kept.
    cli_ok(&d, &["resize", "p", "16M"]);
    cli_ok(&d, &["lock", "p"]);
    // delete --keep-data saves and keeps; create --persist restores.
    let out = cli_ok(&d, &["delete", "p", "--keep-data"]);
    assert!(out.stdout.contains("saved p's data in"), "{out}");
    assert!(state.join("meta").exists());
    let out = cli_ok(&d, &["create", "p", "--persist"]);
    assert!(
        out.stderr.contains("already holds drive 'p': restoring it"),
        "{out}"
    );
    assert!(out.stdout.contains("p is ready: restored"), "{out}");
    let v = drive(&d, "p");
    assert_eq!(v["size_bytes"], 16u64 << 20, "{v}");
    assert_eq!(v["persist"]["durability"], "periodic", "settings kept: {v}");
    assert_eq!(v["persist"]["restore"]["phase"], "done", "{v}");
    // Deleting without --keep-data removes the data, with a warning.
    let out = cli_ok(&d, &["delete", "p"]);
    assert!(out.stderr.contains("warning: p's saved data in"), "{out}");
    assert!(!state.exists());

    // Config-declared and API-created drives come back after a restart.
    ready(&d, "cfg");
    nbd_write(&d.uri("cfg"), 4096, 4, 4096, true);
    nbd_write(&d.uri("n"), 0, 6, 4096, false);
    assert!(d.terminate().success());
    d.restart();
    let v = ready(&d, "cfg");
    assert_eq!(v["origin"], "config");
    assert_eq!(v["persist"]["durability"], "flush");
    let v = ready(&d, "n");
    assert_eq!(v["origin"], "api");
    assert_eq!(v["persist"]["durability"], "none");
    let check = PATTERN_PY.to_owned()
        + r#"
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
print(h.pread(4096, int(sys.argv[2])) == pattern(4096, int(sys.argv[3])))
"#;
    assert!(python(&check, &[&d.uri("cfg"), "4096", "4"])
        .ok()
        .stdout
        .contains("True"));
    assert!(
        python(&check, &[&d.uri("n"), "0", "6"])
            .ok()
            .stdout
            .contains("True"),
        "mode none is saved at shutdown"
    );
    // The restore is in the drive's JSON and the log.
    d.wait_log("the restore", |l| l.contains("restored"));
}

#[test]
fn ready_is_sent_to_systemd_only_once_every_drive_is_restored() {
    if !require(&["nbdcopy"]) {
        return;
    }
    use std::os::unix::net::UnixDatagram;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(DAEMON_TIMEOUT)).unwrap();
    let wait_ready = || loop {
        let mut buf = [0u8; 4096];
        let n = sock.recv(&mut buf).expect("READY=1 within the timeout");
        let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
        if msg.lines().any(|l| l == "READY=1") {
            return;
        }
    };
    let mut d = Daemon::launch(
        &drive_flag("big=64M,persist"),
        &[("NOTIFY_SOCKET", path.to_str().unwrap())],
    );
    wait_ready();
    let data = dir.path().join("data");
    std::fs::write(&data, random_bytes(48 << 20, 5)).unwrap();
    run(tool("nbdcopy").arg(&data).arg(d.uri("big"))).ok();
    assert!(d.terminate().success());
    d.restart();
    wait_ready();
    // By READY=1 the restore is over, whatever the order of the sockets.
    let v = drive(&d, "big");
    assert_eq!(v["state"], "ready", "READY=1 before the restore ended: {v}");
    assert_eq!(v["persist"]["restore"]["phase"], "done", "{v}");
    let img = image(&d, "big");
    assert!(img[..48 << 20] == random_bytes(48 << 20, 5)[..]);
}

/// Every path under `root` (itself included) with its permission bits;
/// symlinks are not followed.
fn modes_under(root: &Path) -> Vec<(PathBuf, u32)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = Vec::new();
    let mut todo = vec![root.to_owned()];
    while let Some(p) = todo.pop() {
        let m = std::fs::symlink_metadata(&p).unwrap();
        if m.is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                todo.push(e.unwrap().path());
            }
        }
        if !m.file_type().is_symlink() {
            out.push((p, m.permissions().mode() & 0o7777));
        }
    }
    out
}

/// The paths whose mode lets anyone but the owner in.
fn open_to_others(root: &Path) -> Vec<(PathBuf, u32)> {
    modes_under(root)
        .into_iter()
        .filter(|(_, m)| m & 0o077 != 0)
        .collect()
}

#[test]
fn state_dir_is_private_wide_modes_are_narrowed_and_another_users_is_refused() {
    if !require(&["nbdcopy"]) || !require_python_module("nbd", "python3-libnbd") {
        return;
    }
    let spec = "p=4M,persist,durability=periodic,sync-interval=1h";
    let mut d = Daemon::launch(&drive_flag(spec), &[]);
    ready(&d, "p");
    nbd_write(&d.uri("p"), 0, 7, 100_000, false);
    run(d.cli().args(["sync", "p"])).ok();
    let state = d.state_dir();
    let drive_dir = state.join("drives/p");
    // New: directories 0700, files 0600 (the test runs with umask 022).
    let all = modes_under(&state);
    let files = all.iter().filter(|(p, _)| p.is_file()).count();
    assert!(files >= 3, "image, meta, drive.json...: {all:?}");
    assert_eq!(open_to_others(&state), vec![], "{all:?}");
    assert!(d.terminate().success());

    // As an older ramd (or a umask 022) left them: readable by everyone.
    use std::os::unix::fs::PermissionsExt;
    for (p, _) in modes_under(&state) {
        let m = if p.is_dir() { 0o755 } else { 0o644 };
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(m)).unwrap();
    }
    d.restart();
    ready(&d, "p");
    assert_eq!(open_to_others(&state), vec![]);
    let wants: Vec<String> = [&state, &drive_dir, &drive_dir.join("drive.json")]
        .iter()
        .map(|p| format!("{} was open to other users (mode 0", p.display()))
        .collect();
    let log = d.wait_log("the warnings about open modes", |l| {
        wants.iter().all(|w| l.contains(w))
    });
    assert!(log.contains("WARN"), "{log}");
    assert_eq!(&image(&d, "p")[..100_000], &pattern(100_000, 7)[..]);
    assert!(d.terminate().success());

    // Another user's drive directory: the daemon does not start.
    std::os::unix::fs::chown(&drive_dir, Some(65534), None).unwrap();
    let out = run(ramd()
        .args(["daemon", "--no-config", "--drive", spec, "--socket"])
        .arg(d.socket())
        .arg("--api-socket")
        .arg(d.api_socket())
        .arg("--state-dir")
        .arg(&state))
    .failed();
    assert_eq!(out.code(), 1, "{out}");
    let want = format!("{} is owned by uid 65534", drive_dir.display());
    assert!(out.stderr.contains(&want), "want {want:?} in {out}");
    assert!(out.stderr.contains("chown -R"), "{out}");
    std::os::unix::fs::chown(&drive_dir, Some(0), None).unwrap();
}
