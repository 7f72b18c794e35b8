//! `ramd daemon --supervise` (issue 31, docs/restart.md): the serving
//! process killed with SIGKILL while a client writes, again and again;
//! after each kill the supervisor starts it again with every RAM drive's
//! memory, and every write the client saw acknowledged reads back (a
//! write in flight at the kill may have landed or not: either is read
//! back, nothing else). Drives created through the API come back too;
//! deleted ones do not; settings changed at run time are kept; SIGTERM
//! stops everything; a killed supervisor leaves the serving process
//! serving, and health says the supervisor is gone.
//!
//! `RAMD_RESTART_CYCLES=N` sets the number of kills (3 by default; the
//! long mode, `RAMD_RESTART_CYCLES=200`, takes about 4 minutes).

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{pattern, signal, Daemon};
use ramd::block::backend::Backend;
use ramd::cache::backing::nbd_client::{ClientOptions, NbdClient, NbdUri};

const BLOCK: usize = 4096;
const BLOCKS: u64 = 2048; // 8 MiB of the 16 MiB drive

/// GET /v1/health, or None while nobody answers.
fn health(api: &Path) -> Option<serde_json::Value> {
    let mut s = std::os::unix::net::UnixStream::connect(api).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(b"GET /v1/health HTTP/1.1\r\nHost: ramd\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).ok()?;
    let body = resp.split_once("\r\n\r\n")?.1;
    serde_json::from_str(body).ok()
}

/// The serving process's pid, once it answers with a pid other than
/// `not` (within 30 s).
fn serving_pid(api: &Path, not: u64) -> (u64, serde_json::Value) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(h) = health(api) {
            let pid = h["pid"].as_u64().unwrap();
            if pid != not {
                return (pid, h);
            }
        }
        assert!(
            Instant::now() < deadline,
            "no serving process answered within 30 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `ramd daemon --supervise --drive DRIVE`.
fn supervised(drive: &str) -> Daemon {
    let args: Vec<String> = ["daemon", "--supervise", "--drive", drive]
        .iter()
        .map(|s| s.to_string())
        .collect();
    Daemon::launch(&args, &[])
}

fn client(uri: &str) -> NbdClient {
    let opts = ClientOptions {
        connections: 1,
        timeout: Duration::from_secs(10),
    };
    NbdClient::connect(&NbdUri::parse(uri).unwrap(), opts).unwrap()
}

/// A block's bytes for a write (unique per seed): random for a length
/// the seed picks, then a byte repeated, so a compressed drive holds
/// objects of every size and raw pages.
fn data(seed: u64) -> Vec<u8> {
    let mut d = common::random_bytes(BLOCK, seed);
    let random = (seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as usize % (BLOCK + 512);
    if random < BLOCK {
        d[random..].fill(seed as u8);
    }
    d
}

/// What the writer knows: each block's last acknowledged seed, the write
/// it had in flight when its connection broke, and every seed tried per
/// block (to say what a wrong block holds).
#[derive(Default)]
struct Acked {
    last: HashMap<u64, u64>,
    in_flight: Option<(u64, u64)>,
    tried: HashMap<u64, Vec<u64>>,
    /// Blocks a write in flight at a kill left torn (see `check`): their
    /// bytes as read then, until a later write is acknowledged there.
    torn: HashMap<u64, Vec<u8>>,
}

impl Acked {
    /// What block `b` must hold: its torn bytes, its last acknowledged
    /// write, or zeroes (never written).
    fn expected(&self, b: u64) -> Vec<u8> {
        match (self.torn.get(&b), self.last.get(&b)) {
            (Some(t), _) => t.clone(),
            (None, Some(&s)) => data(s),
            (None, None) => vec![0; BLOCK],
        }
    }

    fn merge(&mut self, other: Acked) {
        for b in other.last.keys() {
            self.torn.remove(b);
        }
        self.last.extend(other.last);
        self.in_flight = other.in_flight;
        for (b, v) in other.tried {
            self.tried.entry(b).or_default().extend(v);
        }
    }
}

/// A thread writing blocks (4 KiB, unique bytes per seed) until a write
/// fails or it is stopped, recording what was acknowledged; `acks` counts
/// them as they come, for waiting on.
struct Writer {
    stop: Arc<AtomicBool>,
    acks: Arc<AtomicUsize>,
    thread: std::thread::JoinHandle<Acked>,
}

impl Writer {
    fn start(uri: &str, cycle: u64) -> Writer {
        let (stop, acks) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(0)),
        );
        let (u, s, n) = (uri.to_owned(), stop.clone(), acks.clone());
        let thread = std::thread::spawn(move || {
            let mut acked = Acked::default();
            let c = client(&u);
            for i in 0.. {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let block = (i * 7919 + cycle * 31) % BLOCKS;
                let seed = cycle << 32 | i;
                acked.in_flight = Some((block, seed));
                acked.tried.entry(block).or_default().push(seed);
                if c.write(block * BLOCK as u64, &data(seed), false).is_err() {
                    break;
                }
                acked.in_flight = None;
                acked.last.insert(block, seed);
                n.fetch_add(1, Ordering::SeqCst);
            }
            acked
        });
        Writer { stop, acks, thread }
    }

    fn acks(&self) -> usize {
        self.acks.load(Ordering::SeqCst)
    }

    /// Stops it (if its connection is not cut already); what it saw, and
    /// how many writes were acknowledged.
    fn finish(self) -> (Acked, usize) {
        self.stop.store(true, Ordering::SeqCst);
        let n = self.acks();
        (self.thread.join().unwrap(), n)
    }
}

/// Every acknowledged block holds its last acknowledged write. The write
/// in flight at the kill was not acknowledged: its block may hold the old
/// bytes, the new ones, or (killed in the middle of the copy) some of
/// each, byte by byte; whatever it holds is what to expect there next.
fn check(uri: &str, acked: &mut Acked) {
    let c = client(uri);
    let mut buf = vec![0u8; BLOCK];
    let in_flight = acked.in_flight.take();
    if let Some((block, seed)) = in_flight {
        c.read(block * BLOCK as u64, &mut buf).unwrap();
        let (old, new) = (acked.expected(block), data(seed));
        let mixed = (0..BLOCK).all(|i| buf[i] == old[i] || buf[i] == new[i]);
        assert!(mixed, "block {block}, written when the process was killed, holds bytes of neither its old nor its new contents");
        if buf == new {
            acked.last.insert(block, seed);
            acked.torn.remove(&block);
        } else if buf != old {
            eprintln!("block {block}: the write in flight at the kill is torn (not acknowledged: allowed)");
            acked.torn.insert(block, buf.clone());
        }
    }
    for (&block, &seed) in &acked.last {
        c.read(block * BLOCK as u64, &mut buf).unwrap();
        if buf == acked.expected(block) {
            continue;
        }
        let tried = acked.tried.get(&block).cloned().unwrap_or_default();
        let holds = match tried.iter().find(|&&s| buf == data(s)) {
            Some(s) => format!("the write of seed {s:#x}"),
            None if buf.iter().all(|&b| b == 0) => "zeroes".into(),
            None => "bytes no write of this test made".into(),
        };
        panic!(
            "block {block}: its acknowledged write (seed {seed:#x}) is lost: it holds {holds}; in flight at the kill: {in_flight:x?}; seeds tried there: {:x?}",
            &tried[tried.len().saturating_sub(6)..]
        );
    }
}

#[test]
fn kill_9_of_the_serving_process_loses_no_acknowledged_write() {
    let mut d = supervised("db=16M");
    let api = d.api_socket().to_owned();
    let (pid, h) = serving_pid(&api, 0);
    assert_eq!(h["supervisor"]["pid"].as_u64(), Some(u64::from(d.pid())));
    assert_eq!(h["supervisor"]["restarts"].as_u64(), Some(0));
    // A drive made through the API, with an access rule, and one deleted.
    d.cli()
        .args(["create", "api1", "--size", "8M"])
        .output()
        .unwrap();
    d.cli()
        .args(["create", "gone", "--size", "8M"])
        .output()
        .unwrap();
    common::run(d.cli().args(["access", "api1", "--allow-network", "unix"])).ok();
    client(&d.uri("api1"))
        .write(4096, &data(77), false)
        .unwrap();
    let del = d.cli().args(["delete", "gone"]).output().unwrap();
    assert!(del.status.success());

    kill_loop(&api, &d.uri("db"), "db", pid);
    // The API drive came back with its data and its rule; the deleted one
    // did not.
    let mut buf = vec![0u8; BLOCK];
    client(&d.uri("api1")).read(4096, &mut buf).unwrap();
    assert_eq!(buf, data(77));
    let info = d.cli().args(["access", "api1"]).output().unwrap();
    assert!(String::from_utf8_lossy(&info.stdout).contains("unix"));
    let gone = d.cli().args(["info", "gone"]).output().unwrap();
    assert!(!gone.status.success(), "a deleted drive came back");
    // SIGTERM stops the serving process and the supervisor, exit 0.
    let status = d.terminate();
    assert!(status.success(), "supervisor exit: {status:?}\n{}", d.log());
}

#[test]
fn a_killed_supervisor_leaves_the_serving_process_serving() {
    let mut d = supervised("db=8M");
    let api = d.api_socket().to_owned();
    let (pid, _) = serving_pid(&api, 0);
    client(&d.uri("db"))
        .write(0, &pattern(BLOCK, 5), false)
        .unwrap();
    d.kill_hard();
    common::wait_until(
        "health saying the supervisor is gone",
        Duration::from_secs(20),
        || {
            let h = health(&api).expect("the serving process stopped answering");
            assert_eq!(h["pid"].as_u64(), Some(pid));
            h["supervisor"]["alive"] == false
        },
    );
    let mut buf = vec![0u8; BLOCK];
    client(&d.uri("db")).read(0, &mut buf).unwrap();
    assert_eq!(buf, pattern(BLOCK, 5));
    signal(pid as u32, libc::SIGTERM);
    common::wait_until(
        "the orphan stopping on SIGTERM",
        Duration::from_secs(20),
        || health(&api).is_none(),
    );
}

/// `ramd upgrade --binary BINARY`, which must succeed; its output.
fn upgrade_to(d: &Daemon, binary: &Path) -> common::Output {
    common::run(
        d.cli()
            .args(["upgrade", "--binary", binary.to_str().unwrap()]),
    )
    .ok()
}

/// `ramd upgrade`: under a writer, to a copy of this binary (every
/// acknowledged write there after, the restart counted as an upgrade);
/// to a "binary" that answers `--version` like ramd but fails at start,
/// which is rolled back to the previous binary with nothing lost and the
/// command exiting 1 with the reason; refused for a file that is not
/// ramd (422) and without a supervisor (409).
#[test]
fn ramd_upgrade_hands_over_and_rolls_back_a_binary_that_fails() {
    let d = supervised("db=16M");
    let api = d.api_socket().to_owned();
    let (pid, _) = serving_pid(&api, 0);
    // A copy of this very binary stands for the new version.
    let new = d.dir().join("ramd-new");
    std::fs::copy(env!("CARGO_BIN_EXE_ramd"), &new).unwrap();
    let uri = d.uri("db");
    let writer = Writer::start(&uri, 1);
    common::wait_until("acknowledged writes", Duration::from_secs(60), || {
        writer.acks() > 0
    });
    let out = upgrade_to(&d, &new);
    assert!(out.stdout.contains("upgraded: pid"));
    let (mut acked, n) = writer.finish();
    assert!(n > 0, "no write was acknowledged before the upgrade");
    let (pid2, h) = serving_pid(&api, pid);
    assert_eq!(
        h["supervisor"]["last_restart_reason"].as_str(),
        Some(format!("upgrade to {}", new.display()).as_str())
    );
    check(&uri, &mut acked);

    // A binary that says it is ramd but cannot take over.
    let bad = d.dir().join("ramd-broken");
    std::fs::write(
        &bad,
        "#!/bin/sh\n[ \"$1\" = --version ] && { echo 'ramd 99.0.0'; exit 0; }\necho 'cannot read this hand-over' >&2\nexit 3\n",
    )
    .unwrap();
    std::fs::set_permissions(&bad, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = d
        .cli()
        .args(["upgrade", "--binary", bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("failed before serving") && err.contains("exit 3"),
        "{err}"
    );
    let (_, h) = serving_pid(&api, pid2);
    assert!(h["supervisor"]["last_restart_reason"]
        .as_str()
        .unwrap()
        .contains("back on the previous binary"));
    check(&uri, &mut acked);

    // Not ramd at all: refused before anything stops.
    let out = d
        .cli()
        .args(["upgrade", "--binary", "/bin/true"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a ramd binary"));
}

#[test]
fn ramd_upgrade_refuses_an_unsupervised_daemon() {
    let d = Daemon::start(&["db=8M"]);
    let out = d.cli().args(["upgrade"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--supervise"), "{err}");
}

/// A drive grown inside its last 64 MiB segment (16 -> 40 MiB) comes back
/// at its new size with what was written past the old end.
#[test]
fn a_grown_drive_comes_back_grown_with_its_data() {
    let d = supervised("db=16M");
    let api = d.api_socket().to_owned();
    let (pid, _) = serving_pid(&api, 0);
    common::run(d.cli().args(["resize", "db", "40M"])).ok();
    client(&d.uri("db"))
        .write(30 << 20, &data(9), false)
        .unwrap();
    signal(pid as u32, libc::SIGKILL);
    serving_pid(&api, pid);
    let c = client(&d.uri("db"));
    assert_eq!(c.size(), 40 << 20, "the drive came back at another size");
    let mut buf = vec![0u8; BLOCK];
    c.read(30 << 20, &mut buf).unwrap();
    assert_eq!(buf, data(9), "the write past the old end is lost");
}

/// The kills of `RAMD_RESTART_CYCLES` (3 by default).
fn cycles() -> u64 {
    std::env::var("RAMD_RESTART_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
}

/// `cycles()` kills of serving process `pid` while a client writes to
/// drive `name` at `uri`: after each, the restart is counted with its
/// reason, the drive is ready again, and every acknowledged write reads
/// back. Returns what was acknowledged.
fn kill_loop(api: &Path, uri: &str, name: &str, mut pid: u64) -> Acked {
    let cycles = cycles();
    let mut acked = Acked::default();
    let mut total = 0;
    let mut serving_since = Instant::now();
    for cycle in 0..cycles {
        let writer = Writer::start(uri, cycle);
        // Writes acknowledged, and the process past the supervisor's one
        // second of serving (no crash-loop backoff; the time is what is
        // under test there), then a kill at a moment that differs between
        // cycles.
        let served_for = Duration::from_millis(1000 + (cycle * 37) % 200);
        common::wait_until("acknowledged writes", Duration::from_secs(60), || {
            writer.acks() > 0 && serving_since.elapsed() >= served_for
        });
        signal(pid as u32, libc::SIGKILL);
        let (a, n) = writer.finish();
        total += n;
        acked.merge(a);
        let (p, h) = serving_pid(api, pid);
        pid = p;
        assert_eq!(h["supervisor"]["restarts"].as_u64(), Some(cycle + 1));
        assert_eq!(h["supervisor"]["last_restart_reason"], "signal 9");
        wait_ready(api, name);
        serving_since = Instant::now();
        check(uri, &mut acked);
    }
    eprintln!(
        "{cycles} kills of {name}, {total} acknowledged writes, {} blocks checked",
        acked.last.len()
    );
    assert!(total > 0, "no write was acknowledged at all");
    acked
}

/// Drive (or cache) `name`'s state ("ready", "restoring", ...), or None
/// while nobody answers.
fn drive_state(api: &Path, name: &str) -> Option<String> {
    state_of(api, "drives", name).or_else(|| state_of(api, "caches", name))
}

fn state_of(api: &Path, what: &str, name: &str) -> Option<String> {
    let mut s = std::os::unix::net::UnixStream::connect(api).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let req = format!("GET /v1/{what}/{name} HTTP/1.1\r\nHost: ramd\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).ok()?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).ok()?;
    let v: serde_json::Value = serde_json::from_str(resp.split_once("\r\n\r\n")?.1).ok()?;
    v["state"].as_str().map(str::to_owned)
}

#[track_caller]
fn wait_ready(api: &Path, name: &str) {
    common::wait_until(
        &format!("drive {name} ready"),
        Duration::from_secs(60),
        || drive_state(api, name).as_deref() == Some("ready"),
    );
}

/// A persistent drive syncing every 50 ms (so kills land before, during
/// and after its syncs) across kill -9 of the serving process: after
/// each restart every acknowledged write reads back, though the state
/// directory lacks those since its last sync (the memory and its dirty
/// set are adopted, not restored from the directory). Then a clean stop
/// saves them, and a daemon *without* a supervisor, which has only the
/// directory, restores every one of them.
#[test]
fn a_persistent_drive_loses_no_acknowledged_write_across_kills() {
    persistent_kill_loop("");
}

/// The same for a persistent compressed drive: its arena, tables' shadow
/// and dirty ledger are kept (`store::compressed::keep`, `marks.rs`).
#[test]
fn a_persistent_compressed_drive_loses_no_acknowledged_write_across_kills() {
    persistent_kill_loop(",compress=lz4");
}

/// The persistent drives' kill loop, the drive with `extra` options.
fn persistent_kill_loop(extra: &str) {
    let drive = format!("pdb=16M,persist,durability=periodic,sync-interval=50ms{extra}");
    let args: Vec<String> = ["daemon", "--supervise", "--drive", &drive]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut d = Daemon::launch(&args, &[]);
    let api = d.api_socket().to_owned();
    let (pid, _) = serving_pid(&api, 0);
    wait_ready(&api, "pdb");
    let mut acked = kill_loop(&api, &d.uri("pdb"), "pdb", pid);
    let status = d.terminate();
    let log = d.log();
    assert!(status.success(), "supervisor exit: {status:?}\n{log}");
    assert!(
        log.contains("kept across a restart of the serving process: its memory adopted"),
        "the drive was not adopted:\n{log}"
    );
    // The directory alone, without a supervisor.
    let state = d.state_dir().to_string_lossy().into_owned();
    let drive = format!("pdb=16M,persist{extra}");
    let args: Vec<String> = ["daemon", "--drive", &drive, "--state-dir", &state]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let plain = Daemon::launch(&args, &[]);
    wait_ready(plain.api_socket(), "pdb");
    check(&plain.uri("pdb"), &mut acked);
}

/// A compressed drive (with its recompression worker) across kill -9:
/// its arena, page map and table shadow outlive the process and the next
/// one rebuilds the rest (`store::compressed::keep`); every acknowledged
/// write reads back after each kill.
#[test]
fn a_compressed_drive_loses_no_acknowledged_write_across_kills() {
    let mut d = supervised("cz=16M,compress=lz4+zstd");
    let api = d.api_socket().to_owned();
    let (pid, _) = serving_pid(&api, 0);
    kill_loop(&api, &d.uri("cz"), "cz", pid);
    let status = d.terminate();
    let log = d.log();
    assert!(status.success(), "supervisor exit: {status:?}\n{log}");
    assert!(
        log.contains(
            "drive kept across a restart of the serving process: served again with its data"
        ),
        "the drive was not adopted:\n{log}"
    );
}

/// A supervised daemon with one write-back cache, `wb`, over a 16 MiB
/// file whose writes stay dirty (no age or level write-back); the temp
/// dir holding the file, and its path.
fn write_back_cache() -> (Daemon, tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("backing.img");
    std::fs::File::create(&backing)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let cfg = dir.path().join("ramd.toml");
    let text = format!(
        "[[cache]]\nname = \"wb\"\nbacking = \"{}\"\nsize = \"8M\"\nmode = \"writeback\"\n\
         max_dirty_age = \"1h\"\ndirty_high = 100\ndirty_low = 90\n",
        backing.display()
    );
    std::fs::write(&cfg, text).unwrap();
    let args: Vec<String> = ["daemon", "--supervise", "--config", cfg.to_str().unwrap()]
        .iter()
        .map(|s| s.to_string())
        .collect();
    (Daemon::launch(&args, &[]), dir, backing)
}

/// A write-back cache over a file, its writes kept dirty (no age or
/// level write-back), across kill -9: the next serving process writes the
/// kept dirty data back to the file before the cache opens again
/// (`control::caches::kept`), so every acknowledged write reads back
/// through the (cold) cache.
#[test]
fn a_write_back_caches_dirty_data_survives_kills() {
    let (mut d, _dir, _) = write_back_cache();
    let api = d.api_socket().to_owned();
    let (pid, _) = serving_pid(&api, 0);
    wait_ready(&api, "wb");
    kill_loop(&api, &d.uri("wb"), "wb", pid);
    let status = d.terminate();
    let log = d.log();
    assert!(status.success(), "supervisor exit: {status:?}\n{log}");
    assert!(
        log.contains("of dirty data kept across the restart written back to"),
        "no kept dirty data was written back:\n{log}"
    );
}

/// Kills serving process `pid` with the supervisor stopped, runs
/// `meanwhile` in the gap, then lets the supervisor start the next one.
fn kill_with_the_supervisor_stopped<T>(d: &Daemon, pid: u64, meanwhile: impl FnOnce() -> T) -> T {
    signal(d.pid(), libc::SIGSTOP);
    signal(pid as u32, libc::SIGKILL);
    common::wait_until(
        "the serving process to die",
        Duration::from_secs(30),
        || dead(pid),
    );
    let out = meanwhile();
    signal(d.pid(), libc::SIGCONT);
    out
}

/// The same, moving `backing` away in the gap (returns where) and
/// running `meanwhile` then.
fn kill_with_the_backing_away(
    d: &Daemon,
    pid: u64,
    backing: &Path,
    meanwhile: impl FnOnce(),
) -> std::path::PathBuf {
    kill_with_the_supervisor_stopped(d, pid, || {
        let away = backing.with_file_name("away.img");
        std::fs::rename(backing, &away).unwrap();
        meanwhile();
        away
    })
}

/// Kept dirty data whose backing is gone when the next serving process
/// starts waits for it: the cache stays unavailable (nothing reads the
/// stale backing), and once the backing is back the reopener writes the
/// kept data back first, then opens the cache: every acknowledged write.
#[test]
fn a_caches_kept_data_waits_for_its_backing() {
    kept_data_waits_for_its_backing(None);
}

/// Kept dirty data waits for its backing, not only for its cache's name:
/// a cache renamed in the configuration while the serving process was
/// dead (same backing, gone for now) stays unavailable until the old
/// name's kept data is written back, then serves it; the old name's data
/// is not taken for an orphan's and rescued aside.
#[test]
fn a_renamed_cache_waits_for_the_kept_data_of_its_backing() {
    kept_data_waits_for_its_backing(Some("renamed"));
}

/// Writes to cache `wb`, kills the serving process with its backing moved
/// away (and the cache renamed in the configuration to `renamed`, when
/// given), checks the cache waits, brings the backing back, reads.
fn kept_data_waits_for_its_backing(renamed: Option<&str>) {
    let (d, dir, backing) = write_back_cache();
    let api = d.api_socket().to_owned();
    let (pid, _) = serving_pid(&api, 0);
    wait_ready(&api, "wb");
    let written = common::random_bytes(1 << 20, 41);
    client(&d.uri("wb"))
        .write(3 << 20, &written, false)
        .unwrap();
    let away = kill_with_the_backing_away(&d, pid, &backing, || {
        if let Some(new) = renamed {
            let cfg = dir.path().join("ramd.toml");
            let text = std::fs::read_to_string(&cfg).unwrap();
            let text = text.replace("name = \"wb\"", &format!("name = \"{new}\""));
            std::fs::write(&cfg, text).unwrap();
        }
    });
    let name = renamed.unwrap_or("wb");
    serving_pid(&api, pid);
    common::wait_until(
        "the cache to be unavailable",
        Duration::from_secs(30),
        || drive_state(&api, name).as_deref() == Some("unavailable"),
    );
    let info = d.cli().args(["cache", "info", name]).output().unwrap();
    let info = String::from_utf8_lossy(&info.stdout);
    assert!(
        info.contains("of cache 'wb' kept across the restart waits"),
        "{info}"
    );
    std::fs::rename(&away, &backing).unwrap();
    wait_ready(&api, name);
    let mut back = vec![0u8; 1 << 20];
    client(&d.uri(name)).read(3 << 20, &mut back).unwrap();
    assert!(back == written, "the kept write did not reach the backing");
    let log = d.log();
    assert!(log.contains("of dirty data kept across the restart written back to"));
    assert!(!log.contains("could NOT be written back"), "{log}");
}

/// A FUSE attachment (`ramd attach`) across kill -9 of the serving
/// process and `ramd upgrade`: its mount stays, a reader of the file
/// (direct I/O: every read reaches ramd) blocks through the gap and goes
/// on without an error (the next process resumes the kept session and the
/// kernel sends again what the dead one had read: FUSE_NOTIFY_RESEND),
/// every read matches what was written through the file.
#[test]
fn a_fuse_attachment_is_served_again_across_kills_and_an_upgrade() {
    use std::os::unix::fs::FileExt;
    if !common::require(&["fusermount3"]) || !Path::new("/dev/fuse").exists() {
        return;
    }
    let d = supervised("db=16M");
    let api = d.api_socket().to_owned();
    let (mut pid, _) = serving_pid(&api, 0);
    let mnt = d.dir().join("fuse");
    std::fs::create_dir_all(&mnt).unwrap();
    common::run(d.cli().args(["attach", "db", mnt.to_str().unwrap()])).ok();
    let file = mnt.join("db");
    let data = common::random_bytes(4 << 20, 31);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&file)
        .unwrap();
    f.write_all_at(&data, 0).unwrap();
    let new = d.dir().join("ramd-new");
    std::fs::copy(env!("CARGO_BIN_EXE_ramd"), &new).unwrap();
    for cycle in 0..cycles().min(20) + 1 {
        // A reader running through the gap.
        let (stop, reads, bad) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(std::sync::Mutex::new(None::<String>)),
        );
        let reader = {
            let (f, data) = (f.try_clone().unwrap(), data.clone());
            let (stop, reads, bad) = (stop.clone(), reads.clone(), bad.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 64 << 10];
                for i in 0u64.. {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let off = (i * 7919 * 4096) % (data.len() as u64 - buf.len() as u64);
                    let off = off / 4096 * 4096;
                    match f.read_at(&mut buf, off) {
                        Ok(n) if n == buf.len() && buf == data[off as usize..off as usize + n] => {}
                        other => {
                            *bad.lock().unwrap() = Some(format!("read at {off}: {other:?}"));
                            return;
                        }
                    }
                    reads.fetch_add(1, Ordering::SeqCst);
                }
            })
        };
        common::wait_until("reads through FUSE", Duration::from_secs(30), || {
            reads.load(Ordering::SeqCst) > 10
        });
        let upgrade = cycle == 0;
        if upgrade {
            upgrade_to(&d, &new);
        } else {
            signal(pid as u32, libc::SIGKILL);
        }
        pid = serving_pid(&api, pid).0;
        let before = reads.load(Ordering::SeqCst);
        common::wait_until(
            "reads through FUSE after the restart",
            Duration::from_secs(30),
            || reads.load(Ordering::SeqCst) > before + 10 || bad.lock().unwrap().is_some(),
        );
        stop.store(true, Ordering::SeqCst);
        reader.join().unwrap();
        let failed = bad.lock().unwrap().take();
        if let Some(e) = failed {
            panic!(
                "cycle {cycle} (upgrade: {upgrade}): a read through the FUSE file failed: {e}\n{}",
                d.log()
            );
        }
    }
    // Written through the file after the restarts: the drive has it.
    let tail = common::random_bytes(1 << 20, 32);
    f.write_all_at(&tail, 8 << 20).unwrap();
    let mut back = vec![0u8; 1 << 20];
    client(&d.uri("db")).read(8 << 20, &mut back).unwrap();
    assert!(
        back == tail,
        "a write through the resumed FUSE file did not reach the drive"
    );
    drop(f);
    common::run(d.cli().args(["detach", mnt.to_str().unwrap()])).ok();
    assert!(d
        .log()
        .contains("attachment kept across a restart of the serving process: served again"));
}

/// The inode of a file (a unix socket's).
fn inode(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).unwrap().ino()
}

/// Whether process `pid` has died (a zombie whose parent has not reaped
/// it yet counts as dead: its descriptors are closed).
fn dead(pid: u64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// Listening sockets are kept with the drives: while the serving process
/// is dead (its supervisor held stopped, so the gap lasts), connections
/// to the NBD and API sockets are not refused but wait, and the next
/// serving process answers them; the socket files are the same ones,
/// after a kill and after `ramd upgrade`.
#[test]
fn connections_made_while_the_serving_process_is_dead_wait_for_the_next_one() {
    let d = supervised("db=16M");
    let api = d.api_socket().to_owned();
    let (pid, _) = serving_pid(&api, 0);
    client(&d.uri("db")).write(0, &data(5), false).unwrap();
    let (nbd_ino, api_ino) = (inode(d.socket()), inode(&api));
    let (nbd, health_conn) = kill_with_the_supervisor_stopped(&d, pid, || {
        (
            std::os::unix::net::UnixStream::connect(d.socket()),
            std::os::unix::net::UnixStream::connect(&api),
        )
    });
    let mut nbd = nbd.expect("an NBD connection was refused while the serving process was dead");
    let mut h =
        health_conn.expect("an API connection was refused while the serving process was dead");
    nbd.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut greeting = [0u8; 8];
    nbd.read_exact(&mut greeting).unwrap();
    assert_eq!(&greeting, b"NBDMAGIC");
    h.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    h.write_all(b"GET /v1/health HTTP/1.1\r\nHost: ramd\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut resp = String::new();
    h.read_to_string(&mut resp).unwrap();
    let body: serde_json::Value =
        serde_json::from_str(resp.split_once("\r\n\r\n").unwrap().1).unwrap();
    assert_ne!(
        body["pid"].as_u64(),
        Some(pid),
        "answered by the dead process?"
    );
    assert_eq!(body["supervisor"]["restarts"].as_u64(), Some(1));
    assert_eq!((inode(d.socket()), inode(&api)), (nbd_ino, api_ino));
    // An upgrade (to the same binary) serves the same sockets too.
    common::run(d.cli().args(["upgrade"])).ok();
    assert_eq!((inode(d.socket()), inode(&api)), (nbd_ino, api_ino));
    let mut buf = vec![0u8; BLOCK];
    client(&d.uri("db")).read(0, &mut buf).unwrap();
    assert_eq!(buf, data(5));
}

/// Drive `name`'s counted writes and connections (GET .../stats).
fn counts(d: &Daemon, name: &str) -> (u64, u64) {
    let (code, body) = d.http("GET", &format!("/v1/drives/{name}/stats"), None);
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let t = &v["totals"];
    (
        t["ops"]["write"].as_u64().unwrap(),
        t["connections_opened"].as_u64().unwrap(),
    )
}

/// A drive's I/O counts survive the hand-over: exactly across `ramd
/// upgrade` (they are sent once more after the last request), and a kill
/// -9 after that never takes them back below what the upgrade handed on
/// (a kill loses at most the last second's counts).
#[test]
fn io_counts_survive_an_upgrade_and_a_kill() {
    let d = supervised("db=16M");
    let api = d.api_socket().to_owned();
    serving_pid(&api, 0);
    let c = client(&d.uri("db"));
    for i in 0..50 {
        c.write(i * BLOCK as u64, &data(i), false).unwrap();
    }
    drop(c);
    let before = counts(&d, "db");
    assert!(before.0 >= 50 && before.1 >= 1, "{before:?}");
    common::run(d.cli().args(["upgrade"])).ok();
    assert_eq!(
        counts(&d, "db"),
        before,
        "the counts changed across the upgrade"
    );
    let (pid, _) = serving_pid(&api, 0);
    signal(pid as u32, libc::SIGKILL);
    serving_pid(&api, pid);
    let after = counts(&d, "db");
    assert!(
        after.0 >= before.0 && after.1 >= before.1,
        "{after:?} < {before:?}"
    );
}

/// A serving process that cannot start (its NBD port is taken) ends the
/// supervisor with its error, though it had bound and registered other
/// listeners first: kept listeners (and counts) alone are no reason to
/// restart, which would loop forever.
#[test]
fn a_start_that_fails_after_binding_ends_the_supervisor() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let out = common::try_run(
        common::ramd().args([
            "daemon",
            "--supervise",
            "--no-config",
            "--runtime-dir",
            dir.path().to_str().unwrap(),
            "--state-dir",
            dir.path().join("state").to_str().unwrap(),
            "--nvme-listen",
            "127.0.0.1:0",
            "--nbd-listen",
            &format!("127.0.0.1:{port}"),
            "--drive",
            "db=16M",
        ]),
        Duration::from_secs(60),
    )
    .expect("the supervisor did not end");
    assert!(!out.status.success());
    assert!(
        out.stderr.contains(&format!("127.0.0.1:{port}")),
        "{}",
        out.stderr
    );
}
