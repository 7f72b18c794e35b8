//! RAM caches in the real daemon: `ramd cache create|list|info|sync|delete`,
//! `ramd sync`, `/v1/caches` (every answer checked against
//! docs/openapi.yaml), `[[cache]]` in the config, and the failure paths,
//! over every kind of backing (a file, a loop device, nbdkit's memory
//! plugin over NBD) and every mode, with real clients (libnbd's Python
//! binding, qemu-io, qemu-img, nbdfuse + losetup + ext4).
//!
//! Every test checks what the backing itself holds, read by a route that
//! does not go through the cache.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::block::{FuseLoop, Loop, Mounted};
use common::nbdkit::Nbdkit;
use common::openapi::Spec;
use common::*;
use serde_json::{json, Value};

const MIB: u64 = 1 << 20;
const MODES: [&str; 3] = ["writethrough", "writearound", "writeback"];

/// A daemon with an empty config, its state dir in its temp dir, and the
/// spec every API answer is checked against.
struct Env {
    d: Daemon,
    spec: Spec,
    /// The state dir, unless the test gave its own.
    _state: Option<tempfile::TempDir>,
}

impl Env {
    #[track_caller]
    fn start(extra: &[&str]) -> Env {
        let mut args: Vec<String> = vec!["daemon".into(), "--no-default-drive".into()];
        let mut state = None;
        if !extra.contains(&"--state-dir") {
            let dir = tempfile::Builder::new()
                .prefix("ramd-cache-state-")
                .tempdir()
                .unwrap();
            args.push("--state-dir".into());
            args.push(dir.path().display().to_string());
            state = Some(dir);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        Env {
            d: Daemon::launch(&args, &[]),
            spec: Spec::load(),
            _state: state,
        }
    }

    /// One API call, checked against the spec: (status, JSON).
    #[track_caller]
    fn call(&self, method: &str, template: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let text = body.map(|b| b.to_string());
        self.spec
            .call(&self.d, method, template, path, text.as_deref())
    }

    /// Like `call`, asserting the status and, for errors, the code and a
    /// message worth reading.
    #[track_caller]
    fn expect(
        &self,
        method: &str,
        template: &str,
        path: &str,
        body: Option<&Value>,
        status: u16,
        code: Option<&str>,
    ) -> Value {
        let (s, v) = self.call(method, template, path, body);
        assert_eq!(s, status, "{method} {path} {body:?}: {v}");
        if let Some(code) = code {
            assert_eq!(v["error"]["code"], code, "{method} {path} {body:?}: {v}");
            assert!(
                v["error"]["message"].as_str().unwrap().len() > 20,
                "a useless message: {v}"
            );
        }
        v
    }

    /// `GET /v1/caches/{name}`.
    #[track_caller]
    fn info(&self, name: &str) -> Value {
        self.expect(
            "GET",
            "/v1/caches/{name}",
            &format!("/v1/caches/{name}"),
            None,
            200,
            None,
        )
    }

    /// `ramd ARGS...` against this daemon.
    #[track_caller]
    fn ramd(&self, args: &[&str]) -> Output {
        run(self.d.cli().args(args))
    }
}

/// Writes `data` at `offset` through libnbd (no flush: in write-back mode
/// the data stays dirty in the cache).
#[track_caller]
fn nbd_write(uri: &str, offset: u64, data: &[u8]) {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), data).unwrap();
    python(
        "import nbd,sys\nh=nbd.NBD()\nh.connect_uri(sys.argv[1])\n\
         h.pwrite(open(sys.argv[2],'rb').read(), int(sys.argv[3]))\nh.shutdown()\n",
        &[uri, f.path().to_str().unwrap(), &offset.to_string()],
    )
    .ok();
}

/// Reads `len` bytes at `offset` through libnbd.
#[track_caller]
fn nbd_read(uri: &str, offset: u64, len: u64) -> Vec<u8> {
    let f = tempfile::NamedTempFile::new().unwrap();
    python(
        "import nbd,sys\nh=nbd.NBD()\nh.connect_uri(sys.argv[1])\n\
         off,n=int(sys.argv[3]),int(sys.argv[4])\nout=open(sys.argv[2],'wb')\n\
         while n>0:\n  k=min(n,1<<24)\n  out.write(h.pread(k,off))\n  off+=k\n  n-=k\n\
         out.close()\nh.shutdown()\n",
        &[
            uri,
            f.path().to_str().unwrap(),
            &offset.to_string(),
            &len.to_string(),
        ],
    )
    .ok();
    std::fs::read(f.path()).unwrap()
}

/// A read that must fail: the error libnbd reports.
#[track_caller]
fn nbd_read_error(uri: &str, offset: u64, len: u64) -> String {
    let out = python(
        "import nbd,sys\nh=nbd.NBD()\nh.connect_uri(sys.argv[1])\n\
         try:\n  h.pread(int(sys.argv[3]),int(sys.argv[2]))\n  print('READ OK')\n\
         except nbd.Error as e:\n  print('ERROR', e.errnum, e.string)\n",
        &[uri, &offset.to_string(), &len.to_string()],
    )
    .ok();
    assert!(out.stdout.starts_with("ERROR"), "the read must fail: {out}");
    out.stdout
}

/// Requests of every shape: aligned, 512-byte units, unaligned ones that
/// straddle blocks, and a piece at the very end.
fn writes(size: u64) -> Vec<(u64, usize)> {
    vec![
        (0, 4096),
        (10 * 4096 + 512, 1024),
        (1_000_003, 70_001),
        (3 * MIB - 100, 300),
        (size - 777, 777),
    ]
}

/// Creates a cache NAME over BACKING in MODE with the CLI, writes and reads
/// through it, checks the backing at each step (`read_backing` reads it
/// around the cache), syncs, writes again and deletes (which must write
/// back). Write-back is held back (1h, 100%) so dirty data is visible.
#[track_caller]
fn cli_round_trip(
    e: &Env,
    name: &str,
    backing: &str,
    mode: &str,
    read_backing: &dyn Fn() -> Vec<u8>,
    extra: &[&str],
) {
    let mut oracle = read_backing();
    let size = oracle.len() as u64;
    let mut args = vec![
        "cache",
        "create",
        name,
        "--backing",
        backing,
        "--size",
        "2M",
        "--mode",
        mode,
        "--max-dirty-age",
        "1h",
        "--dirty-high",
        "100",
        "--dirty-low",
        "90",
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = e.ramd(&args).ok();
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["state"], "ready", "{v}");
    assert_eq!(v["size_bytes"], size, "{v}");
    assert_eq!(v["settings"]["mode"], mode, "{v}");
    let uri = e.d.uri(name);
    // New data each round (the rounds share their backing).
    let seed = name.bytes().map(u64::from).sum::<u64>() * 1000;
    for (i, (off, len)) in writes(size).into_iter().enumerate() {
        let data = random_bytes(len, seed + i as u64);
        nbd_write(&uri, off, &data);
        oracle[off as usize..off as usize + len].copy_from_slice(&data);
    }
    let on_disk = read_backing();
    if mode == "writeback" {
        assert!(
            on_disk != oracle,
            "{name}: write-back data reached the backing early"
        );
    } else {
        assert!(
            on_disk == oracle,
            "{name}: {mode} must write the backing at once"
        );
    }
    assert!(nbd_read(&uri, 0, size) == oracle, "{name}: reads differ");
    // (That one request was long enough to bypass the cache: these fill it
    // and then hit.)
    for _ in 0..2 {
        let again = nbd_read(&uri, 1_000_003, 70_001);
        assert!(again[..] == oracle[1_000_003..1_070_004]);
    }
    // The human views.
    let list = e.ramd(&["cache", "list"]).ok().stdout;
    assert!(list.contains(name) && list.contains(mode), "{list}");
    let info = e.ramd(&["cache", "info", name]).ok().stdout;
    assert!(
        info.contains("healthy") && info.contains("hit ratio"),
        "{info}"
    );
    let stats = e.ramd(&["stats", name]).ok().stdout;
    assert!(stats.contains(name) && stats.contains("HIT R/W"), "{stats}");
    let v: Value =
        serde_json::from_str(&e.ramd(&["cache", "info", name, "--json"]).ok().stdout).unwrap();
    let s = &v["stats"];
    assert!(s["read_hits"].as_u64().unwrap() > 0, "{v}");
    assert!(
        s["write_hits"].as_u64().unwrap() + s["write_misses"].as_u64().unwrap() > 0,
        "{v}"
    );
    if mode == "writeback" {
        assert!(s["dirty_bytes"].as_u64().unwrap() > 0, "{v}");
    }
    // ramd sync: durable on return.
    let out = e.ramd(&["sync", name]).ok();
    assert!(out.stdout.contains("synced cache"), "{out}");
    assert!(
        read_backing() == oracle,
        "{name}: backing differs after sync"
    );
    // More writes, then delete: written back first.
    let data = random_bytes(10_000, seed + 77);
    nbd_write(&uri, 12_345, &data);
    oracle[12_345..22_345].copy_from_slice(&data);
    let out = e.ramd(&["cache", "delete", name]).ok();
    assert!(out.stdout.contains("deleted cache"), "{out}");
    if mode == "writeback" {
        assert!(out.stdout.contains("wrote back"), "{out}");
    }
    assert!(
        read_backing() == oracle,
        "{name}: backing differs after delete"
    );
    let out = e.ramd(&["cache", "info", name]).failed();
    assert!(out.stderr.contains("no cache named"), "{out}");
}

#[test]
fn api_round_trip_every_mode_over_a_file() {
    if !require_python_module("nbd", "python3-libnbd") {
        return;
    }
    let e = Env::start(&["--mem-budget", "256M"]);
    for (i, mode) in MODES.iter().enumerate() {
        let file = e.d.dir().join(format!("{mode}.img"));
        let mut oracle = random_bytes((8 * MIB) as usize, i as u64);
        std::fs::write(&file, &oracle).unwrap();
        let name = format!("c-{mode}");
        let body = json!({
            "name": name, "backing": file, "size": "2M", "mode": mode,
            "block_size": "4K", "policy": "s3fifo", "sequential_cutoff": 0,
            "dirty_high": 100, "dirty_low": "90%", "max_dirty_age": "1h",
            "retry_initial": 50, "retry_max": "1s", "writeback_max_io": "256K",
            "shutdown_timeout": "10s",
        });
        let v = e.expect("POST", "/v1/caches", "/v1/caches", Some(&body), 201, None);
        assert_eq!(v["kind"], "cache");
        assert_eq!(v["state"], "ready");
        assert_eq!(v["origin"], "api");
        assert_eq!(v["size_bytes"], 8 * MIB);
        assert_eq!(v["backing"]["kind"], "file");
        assert_eq!(v["backing"]["state"], "healthy");
        assert_eq!(v["settings"]["mode"], *mode);
        assert_eq!(v["settings"]["writeback_max_io_bytes"], 256 << 10);
        assert_eq!(v["stats"]["capacity_bytes"], 2 * MIB);
        assert!(v["promised_bytes"].as_u64().unwrap() > 2 * MIB, "{v}");
        let uri = e.d.uri(&name);
        for (k, (off, len)) in writes(8 * MIB).into_iter().enumerate() {
            let data = random_bytes(len, 100 * i as u64 + k as u64);
            nbd_write(&uri, off, &data);
            oracle[off as usize..off as usize + len].copy_from_slice(&data);
        }
        assert!(nbd_read(&uri, 0, 8 * MIB) == oracle, "{mode}: reads differ");
        let on_disk = std::fs::read(&file).unwrap();
        let v = e.info(&name);
        if *mode == "writeback" {
            assert!(on_disk != oracle, "{mode}: written back too early");
            assert!(v["stats"]["dirty_bytes"].as_u64().unwrap() > 0, "{v}");
        } else {
            assert!(
                on_disk == oracle,
                "{mode}: the backing must have every write"
            );
            assert_eq!(v["stats"]["dirty_bytes"], 0, "{v}");
        }
        let s = e.expect(
            "POST",
            "/v1/caches/{name}/sync",
            &format!("/v1/caches/{name}/sync"),
            None,
            200,
            None,
        );
        if *mode == "writeback" {
            assert!(s["written_back_bytes"].as_u64().unwrap() > 0, "{s}");
        }
        assert!(
            std::fs::read(&file).unwrap() == oracle,
            "{mode}: after sync"
        );
        assert_eq!(e.info(&name)["stats"]["dirty_bytes"], 0);
    }
    // Every cache shows in /v1/stats and /metrics.
    let v = e.expect("GET", "/v1/stats", "/v1/stats", None, 200, None);
    let names: Vec<&str> = v["caches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["c-writearound", "c-writeback", "c-writethrough"]);
    let (_, metrics) = e.d.http("GET", "/metrics", None);
    // Python's OpenMetrics parser reads it all.
    if require_python_module("prometheus_client", "python3-prometheus-client") {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), &metrics).unwrap();
        let out = python(
            "import sys\nfrom prometheus_client.openmetrics.parser import text_string_to_metric_families\n\
             n=sum(1 for f in text_string_to_metric_families(open(sys.argv[1]).read()) if f.name.startswith('ramd_cache'))\n\
             print(n)\n",
            &[f.path().to_str().unwrap()],
        )
        .ok();
        assert!(out.stdout.trim().parse::<u32>().unwrap() > 25, "{out}");
    }
    for want in [
        "ramd_caches 3\n",
        "ramd_cache_up{cache=\"c-writeback\"} 1\n",
        "ramd_cache_read_hits_total{cache=\"c-writeback\"}",
        "ramd_cache_dirty_bytes{cache=\"c-writeback\"} 0\n",
        "ramd_cache_backing_failing{cache=\"c-writeback\"} 0\n",
        "ramd_cache_requests_total{cache=\"c-writeback\",op=\"write\"}",
        "ramd_cache_writeback_bytes_total{cache=\"c-writeback\"}",
    ] {
        assert!(metrics.contains(want), "missing {want:?} in\n{metrics}");
    }
    // Delete writes back what is dirty.
    let file = e.d.dir().join("writeback.img");
    let mut oracle = std::fs::read(&file).unwrap();
    let data = random_bytes(300_000, 9);
    nbd_write(&e.d.uri("c-writeback"), 4_000_000, &data);
    oracle[4_000_000..4_300_000].copy_from_slice(&data);
    let v = e.expect(
        "DELETE",
        "/v1/caches/{name}",
        "/v1/caches/c-writeback",
        None,
        200,
        None,
    );
    assert!(v["written_back_bytes"].as_u64().unwrap() >= 300_000, "{v}");
    assert_eq!(v["dropped_dirty_bytes"], 0);
    assert!(std::fs::read(&file).unwrap() == oracle);
    // The budget promised to it is given back.
    let h = e.expect("GET", "/v1/health", "/v1/health", None, 200, None);
    let committed = h["memory_budget"]["committed_bytes"].as_u64().unwrap();
    assert!(committed < 2 * (3 * MIB), "{h}");
}

#[test]
fn api_errors_have_the_right_status_and_code() {
    if !require_python_module("nbd", "python3-libnbd") {
        return;
    }
    let e = Env::start(&["--mem-budget", "64M", "--drive", "ram0=1M"]);
    let dir = e.d.dir().to_owned();
    let file = dir.join("a.img");
    std::fs::File::create(&file)
        .unwrap()
        .set_len(512 * MIB)
        .unwrap();
    let base = |name: &str, backing: &Path| json!({"name": name, "backing": backing, "size": "4M", "mode": "writeback"});
    let post = |body: &Value, status: u16, code: &str| {
        e.expect(
            "POST",
            "/v1/caches",
            "/v1/caches",
            Some(body),
            status,
            Some(code),
        )
    };
    let mut b = base("x", &file);
    b["turbo"] = json!(true);
    post(&b, 400, "unknown_field");
    post(&base("X y", &file), 422, "invalid_name");
    let mut b = base("x", &file);
    b["size"] = json!("12Q");
    post(&b, 422, "invalid_size");
    let mut b = base("x", &file);
    b["mode"] = json!("fastest");
    let v = post(&b, 422, "invalid_cache_option");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("writeback"));
    let mut b = base("x", &file);
    b["block_size"] = json!("3K");
    post(&b, 422, "invalid_cache_option");
    let mut b = base("x", &file);
    b["dirty_low"] = json!(60);
    post(&b, 422, "invalid_cache_option");
    let v = post(
        &base("x", Path::new("/nonexistent/disk.img")),
        422,
        "bad_backing",
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("No such file"),
        "{v}"
    );
    post(&base("x", &dir), 422, "bad_backing");
    post(&base("x", Path::new("nbd://")), 422, "bad_backing");
    let mut b = base("x", &file);
    b["backing"] = json!(format!("nbd+unix:///x?socket={}/none.sock", dir.display()));
    let v = post(&b, 502, "backing_unreachable");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("none.sock"),
        "{v}"
    );
    // Names are shared with drives; a backing is cached once.
    let v = post(&base("ram0", &file), 409, "cache_exists");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("drive"),
        "{v}"
    );
    e.expect(
        "POST",
        "/v1/caches",
        "/v1/caches",
        Some(&base("a", &file)),
        201,
        None,
    );
    post(&base("a", &dir.join("other.img")), 409, "cache_exists");
    let v = post(&base("b", &file), 409, "backing_busy");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("'a'"),
        "{v}"
    );
    // A drive cannot take a cache's name either.
    let (s, _) = e.call(
        "POST",
        "/v1/drives",
        "/v1/drives",
        Some(&json!({"name": "a", "size": "1M"})),
    );
    assert_eq!(s, 409);
    // Over the budget (64M, of which the first cache holds ~4M).
    let big = dir.join("big.img");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(512 * MIB)
        .unwrap();
    let mut b = base("big", &big);
    b["size"] = json!("128M");
    let v = post(&b, 507, "over_budget");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("cache 'big'"),
        "{v}"
    );
    // Unknown caches.
    for (m, t, p) in [
        ("GET", "/v1/caches/{name}", "/v1/caches/nope"),
        ("DELETE", "/v1/caches/{name}", "/v1/caches/nope"),
        ("POST", "/v1/caches/{name}/sync", "/v1/caches/nope/sync"),
    ] {
        e.expect(m, t, p, None, 404, Some("cache_not_found"));
    }
    e.expect(
        "DELETE",
        "/v1/caches/{name}",
        "/v1/caches/a?turbo=1",
        None,
        400,
        Some("unknown_field"),
    );
    // An open connection: refused unless forced.
    let mut holder = KillOnDrop(
        tool("/usr/bin/python3")
            .arg("-c")
            .arg("import nbd,sys,time\nh=nbd.NBD()\nh.connect_uri(sys.argv[1])\nprint('connected',flush=True)\ntime.sleep(60)\n")
            .arg(e.d.uri("a"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.0.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "connected");
    wait_until("the connection to count", WAIT_TIMEOUT, || {
        e.info("a")["connections"] == 1
    });
    let v = e.expect(
        "DELETE",
        "/v1/caches/{name}",
        "/v1/caches/a",
        None,
        409,
        Some("cache_busy"),
    );
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("1 open NBD connection"));
    let v = e.expect(
        "DELETE",
        "/v1/caches/{name}",
        "/v1/caches/a?force=true",
        None,
        200,
        None,
    );
    assert_eq!(v["closed_connections"], 1);
    let v = e.expect("GET", "/v1/caches", "/v1/caches", None, 200, None);
    assert_eq!(v["caches"], json!([]));
}

#[test]
fn cli_round_trip_every_mode_over_a_loop_device() {
    if !require(&["losetup"])
        || !require_root_block_devices()
        || !require_python_module("nbd", "python3-libnbd")
    {
        return;
    }
    let e = Env::start(&[]);
    let file = e.d.dir().join("disk.img");
    std::fs::write(&file, random_bytes((8 * MIB) as usize, 5)).unwrap();
    let lo = Loop::attach(&file);
    let dev = lo.dev.clone();
    let read = || std::fs::read(&dev).unwrap();
    for mode in MODES {
        cli_round_trip(&e, &format!("lo-{mode}"), &lo.dev, mode, &read, &[]);
    }
    // O_DIRECT on the device.
    cli_round_trip(&e, "lo-direct", &lo.dev, "writeback", &read, &["--direct"]);
}

#[test]
fn cli_round_trip_every_mode_over_nbdkit_memory() {
    if !require(&["nbdkit"]) || !require_python_module("nbd", "python3-libnbd") {
        return;
    }
    let e = Env::start(&[]);
    for mode in MODES {
        let kit = Nbdkit::start(&["memory", "8M"]);
        let uri = kit.uri();
        nbd_write(&uri, 0, &random_bytes((8 * MIB) as usize, 11));
        let read = || nbd_read(&uri, 0, 8 * MIB);
        cli_round_trip(&e, &format!("kit-{mode}"), &uri, mode, &read, &[]);
    }
}

#[test]
fn a_failing_backing_gives_eio_keeps_serving_and_shows_in_info() {
    if !require(&["nbdkit"]) || !require_python_module("nbd", "python3-libnbd") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trigger = dir.path().join("fail-now");
    let kit = Nbdkit::failing_memory("16M", &trigger);
    let e = Env::start(&[]);
    e.ramd(&[
        "cache",
        "create",
        "flaky",
        "--backing",
        &kit.uri(),
        "--size",
        "4M",
        "--mode",
        "writeback",
        "--max-dirty-age",
        "1h",
        "--retry-initial",
        "50ms",
        "--retry-max",
        "500ms",
        "--shutdown-timeout",
        "2s",
    ])
    .ok();
    let uri = e.d.uri("flaky");
    let mut oracle = vec![0u8; (16 * MIB) as usize];
    let hot = random_bytes(300_000, 1);
    nbd_write(&uri, 1_000_000, &hot);
    oracle[1_000_000..1_300_000].copy_from_slice(&hot);
    // A cached clean block too.
    assert!(nbd_read(&uri, 8 * MIB, 4096) == oracle[8 << 20..(8 << 20) + 4096]);

    std::fs::write(&trigger, b"").unwrap();
    // Data that is not cached needs the backing: EIO.
    let err = nbd_read_error(&uri, 12 * MIB, 4096);
    assert!(err.contains("Input/output") || err.contains(" 5 "), "{err}");
    // Cached data, dirty or clean, is still served.
    assert!(nbd_read(&uri, 1_000_000, 300_000) == hot);
    assert!(nbd_read(&uri, 8 * MIB, 4096) == oracle[8 << 20..(8 << 20) + 4096]);
    // Whole 512-byte units still land in RAM.
    nbd_write(&uri, 2 * MIB, &[0xab; 8192]);
    oracle[2 << 20..(2 << 20) + 8192].fill(0xab);
    // The state, in the CLI, the API and /metrics.
    let v = e.info("flaky");
    let b = &v["backing"];
    assert_eq!(b["state"], "failing", "{v}");
    assert!(b["read_errors"].as_u64().unwrap() > 0, "{v}");
    assert!(
        b["last_error"].as_str().unwrap().contains("Input/output"),
        "{v}"
    );
    assert!(
        v["stats"]["dirty_bytes"].as_u64().unwrap() >= 300_000,
        "{v}"
    );
    let info = e.ramd(&["cache", "info", "flaky"]).ok().stdout;
    assert!(
        info.contains("FAILING") && info.contains("next retry"),
        "{info}"
    );
    assert!(info.contains("Input/output"), "{info}");
    // `ramd info NAME` shows a cache too (the issue's spelling).
    let info = e.ramd(&["info", "flaky"]).ok().stdout;
    assert!(info.contains("FAILING") && info.contains("state"), "{info}");
    let list = e.ramd(&["cache", "list"]).ok().stdout;
    assert!(list.contains("(failing)"), "{list}");
    let (_, metrics) = e.d.http("GET", "/metrics", None);
    assert!(
        metrics.contains("ramd_cache_backing_failing{cache=\"flaky\"} 1\n"),
        "{metrics}"
    );
    let stats = e.ramd(&["stats"]).ok().stdout;
    assert!(stats.contains("failing"), "{stats}");
    // Sync and delete refuse, say what is at stake, and change nothing.
    let out = e.ramd(&["sync", "flaky"]).failed();
    assert_eq!(out.code(), 1);
    assert!(out.stderr.contains("stays in RAM"), "{out}");
    let out = e.ramd(&["cache", "delete", "flaky"]).failed();
    assert!(
        out.stderr.contains("dirty data") && out.stderr.contains("--force"),
        "{out}"
    );
    assert_eq!(e.info("flaky")["state"], "ready");
    assert!(nbd_read(&uri, 1_000_000, 300_000) == hot);
    // The flusher retries with backoff...
    wait_until("write-back retries", Duration::from_secs(30), || {
        e.info("flaky")["backing"]["retries"].as_u64().unwrap() >= 2
    });
    // ...and once the backing is back, everything is written back unasked.
    std::fs::remove_file(&trigger).unwrap();
    wait_until(
        "the dirty data to reach the recovered backing",
        Duration::from_secs(30),
        || {
            let v = e.info("flaky");
            v["backing"]["state"] == "healthy" && v["stats"]["dirty_bytes"] == 0
        },
    );
    assert!(
        nbd_read(&kit.uri(), 0, 16 * MIB) == oracle,
        "backing differs"
    );
    // Dirty again, backing dead again: only --force deletes, with a warning.
    nbd_write(&uri, 5 * MIB, &[7u8; 65536]);
    std::fs::write(&trigger, b"").unwrap();
    e.ramd(&["cache", "delete", "flaky"]).failed();
    let out = e.ramd(&["cache", "delete", "flaky", "--force"]).ok();
    assert!(out.stderr.contains("DROPPED"), "{out}");
    assert!(out.stdout.contains("deleted cache flaky"), "{out}");
}

fn write_config(dir: &Path, text: &str) -> PathBuf {
    let p = dir.join("ramd.toml");
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn config_caches_come_up_and_a_clean_stop_writes_everything_back() {
    if !require(&["nbdkit"]) || !require_python_module("nbd", "python3-libnbd") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("disk.img");
    let mut oracle = random_bytes((8 * MIB) as usize, 3);
    std::fs::write(&file, &oracle).unwrap();
    // An NBD server that is not up yet when the daemon starts.
    let later = tempfile::Builder::new()
        .prefix("ramd-later-")
        .tempdir()
        .unwrap();
    let later_sock = later.path().join("nbdkit.sock");
    let cfg = write_config(
        dir.path(),
        &format!(
            r#"[daemon]
mem_budget = "256M"

[[drive]]
name = "ram0"
size = "1M"

[[cache]]
name = "db"
backing = "{}"
size = "2M"
mode = "writeback"
block_size = "8K"
max_dirty_age = "1h"
dirty_high = 100
dirty_low = 90

[[cache]]
name = "remote"
backing = "nbd+unix:///?socket={}"
size = "1M"
mode = "writethrough"
"#,
            file.display(),
            later_sock.display()
        ),
    );
    let mut e = Env::start(&["--config", cfg.to_str().unwrap()]);
    let v = e.info("db");
    assert_eq!(v["state"], "ready", "{v}");
    assert_eq!(v["origin"], "config");
    assert_eq!(v["settings"]["block_bytes"], 8192);
    let v = e.info("remote");
    assert_eq!(v["state"], "unavailable", "{v}");
    assert_eq!(v["backing"]["state"], "unavailable");
    assert!(v["backing"]["open_attempts"].as_u64().unwrap() >= 1, "{v}");
    assert!(
        v["backing"]["last_error"]
            .as_str()
            .unwrap()
            .contains("nbdkit.sock"),
        "{v}"
    );
    let info = e.ramd(&["cache", "info", "remote"]).ok().stdout;
    assert!(info.contains("UNAVAILABLE"), "{info}");
    let out = e.ramd(&["sync", "remote"]).failed();
    assert!(out.stderr.contains("unavailable"), "{out}");
    // The daemon serves everything else meanwhile.
    let data = random_bytes(100_000, 8);
    nbd_write(&e.d.uri("db"), 333_333, &data);
    oracle[333_333..433_333].copy_from_slice(&data);
    nbd_write(&e.d.uri("ram0"), 0, &[1u8; 4096]);
    // The server comes up: so does the cache, by itself.
    let _kit = Nbdkit::start_at(later, &later_sock, &["memory", "4M"]);
    wait_until(
        "the unavailable cache to come up",
        Duration::from_secs(60),
        || e.info("remote")["state"] == "ready",
    );
    nbd_write(&e.d.uri("remote"), 4096, &[9u8; 4096]);
    let out = e.ramd(&["cache", "delete", "db"]).ok();
    assert!(out.stderr.contains("declared in"), "{out}");
    assert!(std::fs::read(&file).unwrap() == oracle);
    // Not gone for good: the config brings it back at the next start. Dirty
    // data in it at a clean stop is written back first.
    assert!(e.d.terminate().success());
    let e = Env::start(&["--config", cfg.to_str().unwrap()]);
    assert_eq!(e.info("db")["state"], "ready");
    let data = random_bytes(200_000, 9);
    nbd_write(&e.d.uri("db"), 5_000_000, &data);
    oracle[5_000_000..5_200_000].copy_from_slice(&data);
    assert!(std::fs::read(&file).unwrap() != oracle);
    let mut e = e;
    let status = e.d.terminate();
    assert!(status.success(), "{status}; log:\n{}", e.d.log());
    let log = e.d.log();
    assert!(
        log.contains("before exit") && log.contains("written back"),
        "{log}"
    );
    assert!(
        std::fs::read(&file).unwrap() == oracle,
        "not written back at stop"
    );
}

#[test]
fn a_bad_cache_in_the_config_stops_the_start_with_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let base =
        "[[cache]]\nname = \"db\"\nbacking = \"/dev/null\"\nsize = \"64M\"\nmode = \"writeback\"\n";
    for (extra, want) in [
        (
            "policy = \"mru\"\n",
            ":6:10: policy=mru: unknown eviction policy",
        ),
        ("dirty_low = 70\n", ":2:8: cache 'db': dirty watermarks"),
        ("sise = 1\n", ":6:1: unknown field `sise`"),
    ] {
        let cfg = write_config(dir.path(), &format!("{base}{extra}"));
        let out = run(ramd()
            .args(["daemon", "--config"])
            .arg(&cfg)
            .arg("--api-socket")
            .arg(dir.path().join("api.sock"))
            .arg("--socket")
            .arg(dir.path().join("nbd.sock")))
        .failed();
        assert_eq!(out.code(), 1, "{out}");
        assert!(
            out.stderr.contains(&format!("ramd.toml{want}")),
            "want {want:?}: {out}"
        );
    }
}

#[test]
fn a_stop_with_a_dead_backing_saves_a_rescue_file_that_restores_the_data() {
    if !require(&["nbdkit", "nbdsh"]) || !require_python_module("nbd", "python3-libnbd") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trigger = dir.path().join("fail-now");
    let kit = Nbdkit::failing_memory("16M", &trigger);
    let state = dir.path().join("state");
    let mut e = Env::start(&["--state-dir", state.to_str().unwrap()]);
    e.ramd(&[
        "cache",
        "create",
        "doomed",
        "--backing",
        &kit.uri(),
        "--size",
        "4M",
        "--mode",
        "writeback",
        "--max-dirty-age",
        "1h",
        "--shutdown-timeout",
        "2s",
    ])
    .ok();
    let uri = e.d.uri("doomed");
    let mut oracle = vec![0u8; (16 * MIB) as usize];
    for (i, (off, len)) in writes(16 * MIB).into_iter().enumerate() {
        let data = random_bytes(len, 50 + i as u64);
        nbd_write(&uri, off, &data);
        oracle[off as usize..off as usize + len].copy_from_slice(&data);
    }
    std::fs::write(&trigger, b"").unwrap();
    let status = e.d.terminate();
    let log = e.d.log();
    assert_eq!(
        status.code(),
        Some(1),
        "the stop must fail loudly; log:\n{log}"
    );
    assert!(
        log.contains("could NOT be written back") && log.contains("SAVED"),
        "{log}"
    );
    let rescue: Vec<PathBuf> = std::fs::read_dir(state.join("cache-rescue"))
        .unwrap()
        .map(|d| d.unwrap().path())
        .collect();
    assert_eq!(rescue.len(), 1, "{rescue:?}");
    let r = &rescue[0];
    assert!(r
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with("doomed-"));
    let ranges = std::fs::read_to_string(r.join("ranges")).unwrap();
    assert!(ranges.lines().count() >= 5, "{ranges}");
    // The backing works again: the script puts the data where it belongs.
    std::fs::remove_file(&trigger).unwrap();
    assert!(nbd_read(&kit.uri(), 0, 16 * MIB) != oracle);
    let out = run(tool("sh").arg(r.join("apply.sh"))).ok();
    assert!(out.stdout.contains("rescued data written back"), "{out}");
    assert!(
        nbd_read(&kit.uri(), 0, 16 * MIB) == oracle,
        "rescue did not restore the data"
    );
}

/// The issue's crash test, three times over. A real ext4 on a write-back
/// cache over a file, through the daemon (nbdfuse + losetup on its
/// export); each round writes files and `sync`s them, writes more without
/// syncing (O_DIRECT, so they sit dirty in the cache), and kills the daemon
/// with SIGKILL while the cache holds dirty data. After each crash, on a
/// copy of the backing file alone: mounting it replays ext4's journal
/// (what the kernel does after a power cut), after which `e2fsck -f -n`
/// must find the filesystem clean and every file synced in any round must
/// have its exact checksum. The next round starts a new daemon and cache
/// over the same (crashed) backing and goes on from there.
///
/// Why that is "as safe as the bare disk": `sync` makes ext4 commit its
/// journal with a FLUSH (and FUA), which the cache answers only after
/// writing back every dirty block and fsyncing the file; writes after it
/// may be lost, or partly written back in any order, exactly what a disk
/// with a volatile write cache may do at a power cut. ext4 is built to
/// survive that, so a clean fsck and intact synced files are precisely the
/// bare disk's guarantee.
#[test]
fn ext4_on_a_writeback_cache_survives_kill_9_of_the_daemon() {
    let tools = [
        "nbdfuse",
        "fusermount3",
        "losetup",
        "mkfs.ext4",
        "e2fsck",
        "mount",
        "umount",
        "cp",
        "sync",
        "sha256sum",
    ];
    if !require(&tools) || !require_root_block_devices() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let img = dir.join("backing.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(128 * MIB)
        .unwrap();
    let sizes: [usize; 5] = [1, 4097, 100_000, MIB as usize, 9 * MIB as usize + 5];
    // (path in the filesystem, sha256sum line) of every synced file so far.
    let mut synced: Vec<String> = Vec::new();
    let sums = |d: &Path, files: &[String]| {
        run(tool("sha256sum").current_dir(d).args(files))
            .ok()
            .stdout
    };
    for round in 0..3u64 {
        let mut e = Env::start(&[]);
        // Small next to what is written (evictions and write-backs under
        // pressure), and nothing written back by age: dirty data at the kill.
        e.ramd(&[
            "cache",
            "create",
            "fs",
            "--backing",
            img.to_str().unwrap(),
            "--size",
            "6M",
            "--mode",
            "writeback",
            "--max-dirty-age",
            "1h",
            "--dirty-high",
            "90",
            "--dirty-low",
            "80",
        ])
        .ok();
        let stack = FuseLoop::attach(&dir.join(format!("fuse{round}")), &e.d.uri("fs"));
        if round == 0 {
            run(tool("mkfs.ext4").args(["-q", "-F", stack.dev()])).ok();
        }
        // No periodic journal commit during the test: only `sync` commits.
        let mnt = Mounted::mount_opts(stack.dev(), &dir.join(format!("mnt{round}")), "commit=600");
        // Earlier rounds' synced files came through the crash.
        if !synced.is_empty() {
            let want: String = synced.iter().map(|l| format!("{l}\n")).collect();
            let files: Vec<String> = synced.iter().map(|l| l[66..].to_owned()).collect();
            assert_eq!(sums(&mnt.0, &files), want, "round {round}: before writing");
        }
        let sub = format!("r{round}");
        std::fs::create_dir(mnt.0.join(&sub)).unwrap();
        let mut files = Vec::new();
        for (i, len) in sizes.iter().enumerate() {
            let f = format!("{sub}/f{i}");
            std::fs::write(mnt.0.join(&f), random_bytes(*len, 100 * round + i as u64)).unwrap();
            files.push(f);
        }
        run(tool("sync").arg("-f").arg(&mnt.0)).ok();
        synced.extend(sums(&mnt.0, &files).lines().map(str::to_owned));
        // Not synced: lost or not, it must not harm what was. O_DIRECT sends
        // the data to the device at once, without a FLUSH: it stays dirty in
        // the cache.
        for i in 0..4 {
            run(tool("dd")
                .args(["if=/dev/urandom", "bs=64K", "count=12", "oflag=direct"])
                .arg(format!(
                    "of={}",
                    mnt.0.join(format!("{sub}/later{i}")).display()
                )))
            .ok();
        }
        let v = e.info("fs");
        let s = &v["stats"];
        eprintln!(
            "round {round}: at the kill: {} dirty bytes, {} evictions, {} bytes written back",
            s["dirty_bytes"], s["evictions"], s["writeback_bytes"]
        );
        assert!(
            s["dirty_bytes"].as_u64().unwrap() > 0,
            "the cache was meant to hold dirty data at the crash: {v}"
        );
        assert!(
            s["evictions"].as_u64().unwrap() > 0 && s["writeback_bytes"].as_u64().unwrap() > 0,
            "the cache was meant to be under pressure: {v}"
        );
        e.d.kill_hard();
        drop(mnt);
        drop(stack);

        // The backing file alone, as after a power cut: journal replay by a
        // mount, then a full read-only check, then every synced file.
        let copy = dir.join("copy.img");
        std::fs::copy(&img, &copy).unwrap();
        let lo = Loop::attach(&copy);
        Mounted::mount_opts(&lo.dev, &dir.join("replay"), "rw").unmount();
        let out = run(tool("e2fsck").args(["-f", "-n", &lo.dev]));
        assert_eq!(
            out.code(),
            0,
            "round {round}: the filesystem must be clean: {out}"
        );
        let mnt = Mounted::mount_opts(&lo.dev, &dir.join("check"), "ro");
        let want: String = synced.iter().map(|l| format!("{l}\n")).collect();
        let files: Vec<String> = synced.iter().map(|l| l[66..].to_owned()).collect();
        assert_eq!(
            sums(&mnt.0, &files),
            want,
            "round {round}: synced files differ after the crash"
        );
        mnt.unmount();
        drop(lo);
        std::fs::remove_file(&copy).unwrap();
    }
}

/// `ramd attach` works on a cache as on a drive: the cache as a file, a
/// loop device and ext4 on it; delete is refused while attached; after
/// detach and delete the backing file alone is a clean filesystem with the
/// file intact.
#[test]
fn ramd_attach_serves_a_cache_as_a_file() {
    let tools = ["losetup", "mkfs.ext4", "e2fsck", "mount", "umount", "sync"];
    if !require(&tools) || !require_root_block_devices() {
        return;
    }
    let e = Env::start(&[]);
    let dir = e.d.dir().to_owned();
    let img = dir.join("backing.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(64 * MIB)
        .unwrap();
    e.ramd(&[
        "cache",
        "create",
        "att",
        "--backing",
        img.to_str().unwrap(),
        "--size",
        "8M",
        "--mode",
        "writeback",
    ])
    .ok();
    let at = dir.join("at");
    std::fs::create_dir(&at).unwrap();
    let out = e.ramd(&["attach", "att", at.to_str().unwrap()]).ok();
    assert!(out.stdout.contains("attached att"), "{out}");
    let file = at.join("att");
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 64 * MIB);
    let v = e.info("att");
    assert_eq!(v["attachments"], json!([at.display().to_string()]), "{v}");
    let lo = Loop::attach(&file);
    run(tool("mkfs.ext4").args(["-q", "-F", &lo.dev])).ok();
    let mnt = Mounted::mount_opts(&lo.dev, &dir.join("mnt"), "rw");
    let data = random_bytes(3 * MIB as usize + 17, 42);
    std::fs::write(mnt.0.join("data"), &data).unwrap();
    run(tool("sync").arg("-f").arg(&mnt.0)).ok();
    let out = e.ramd(&["cache", "delete", "att"]).failed();
    assert!(out.stderr.contains("attached at"), "{out}");
    mnt.unmount();
    drop(lo);
    e.ramd(&["detach", at.to_str().unwrap()]).ok();
    let out = e.ramd(&["cache", "delete", "att"]).ok();
    assert!(out.stdout.contains("deleted cache att"), "{out}");
    let lo = Loop::attach(&img);
    let out = run(tool("e2fsck").args(["-f", "-n", &lo.dev]));
    assert_eq!(out.code(), 0, "{out}");
    let mnt = Mounted::mount_opts(&lo.dev, &dir.join("mnt2"), "ro");
    assert!(std::fs::read(mnt.0.join("data")).unwrap() == data);
    mnt.unmount();
}
