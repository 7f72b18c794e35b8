//! The cache over real backings: a file, a loop device (with and without
//! O_DIRECT), and remote NBD servers (nbdkit's memory and file plugins, over
//! a unix socket and TCP), including the failure paths: nbdkit's `error`
//! filter switched on and off by a file, and an NBD server killed with
//! SIGKILL and restarted. Also the cache served by our own NBD server to
//! real clients (qemu-io with unaligned I/O, fio with verify, nbdcopy).
//!
//! Each test checks what the backing itself holds afterwards, read by a
//! route that does not go through the cache.

mod common;

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use common::block::{FuseLoop, Loop, Mounted};
use common::nbdkit::Nbdkit;
use common::{
    random_bytes, require, require_root_block_devices, run, tool, wait_until, KillOnDrop,
};
use ramd::block::backend::{Backend, Error};
use ramd::cache::backing::nbd_client::{ClientOptions, NbdClient, NbdUri};
use ramd::cache::backing::FileBacking;
use ramd::cache::{BackingOptions, Cache, CacheConfig, CacheError, Mode};
use ramd::nbd::{Export, ExportTable, Server, ServerConfig};

const MIB: u64 = 1 << 20;

/// Random aligned and unaligned reads and writes through `cache`, checked
/// against `oracle` (which is updated), ending with a FLUSH.
fn exercise(cache: &Cache, oracle: &mut [u8], seed: u64, ops: usize) {
    let size = oracle.len() as u64;
    let mut rng = ramd::sim::Rng::seed(seed);
    let mut next = || rng.next_u64();
    for i in 0..ops {
        let r = next();
        let len = match r % 4 {
            0 => 4096,
            1 => 512 * (1 + (r >> 8) % 16),
            2 => 1 + (r >> 8) % 20_000,
            _ => 64 * 1024 + (r >> 8) % (200 * 1024),
        }
        .min(size);
        let off = match (r >> 4) % 3 {
            0 => (next() % (size - len + 1)) / 4096 * 4096,
            1 => (next() % (size - len + 1)) / 512 * 512,
            _ => next() % (size - len + 1),
        };
        let (o, l) = (off as usize, len as usize);
        if r % 5 < 2 {
            let mut buf = vec![0u8; l];
            cache.read(off, &mut buf).unwrap();
            assert!(buf == oracle[o..o + l], "op {i}: read {off}+{len} differs");
        } else {
            let data = random_bytes(l, next());
            cache.write(off, &data, r % 37 == 0).unwrap();
            oracle[o..o + l].copy_from_slice(&data);
        }
    }
    cache.flush().unwrap();
}

fn small_cache(mode: Mode, cache_bytes: u64) -> CacheConfig {
    let mut c = CacheConfig::new(mode, cache_bytes);
    c.retry_initial_ms = 20;
    c.retry_max_ms = 200;
    c
}

#[test]
fn file_backing_every_mode() {
    for mode in Mode::ALL {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("backing.img");
        let mut oracle = random_bytes((8 * MIB + 1234) as usize, 7);
        std::fs::write(&path, &oracle).unwrap();
        let cache = Cache::open(
            path.to_str().unwrap(),
            small_cache(mode, MIB),
            &BackingOptions::default(),
            None,
        )
        .unwrap();
        assert_eq!(cache.size(), oracle.len() as u64);
        exercise(&cache, &mut oracle, 11, 400);
        // After FLUSH the file holds everything.
        assert!(
            std::fs::read(&path).unwrap() == oracle,
            "{mode}: file differs after flush"
        );
        exercise(&cache, &mut oracle, 12, 200);
        let s = cache.stats();
        assert!(
            s.read_hits > 0 && s.read_misses > 0 && s.evictions > 0,
            "{mode}: {s:?}"
        );
        cache.close(false).unwrap();
        assert!(
            std::fs::read(&path).unwrap() == oracle,
            "{mode}: file differs after close"
        );
    }
}

#[test]
fn loop_device_backing_with_and_without_o_direct() {
    if !require(&["losetup"]) || !require_root_block_devices() {
        return;
    }
    for direct in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("disk.img");
        let mut oracle = random_bytes((16 * MIB) as usize, 3);
        std::fs::write(&file, &oracle).unwrap();
        let lo = Loop::attach(&file);
        let opts = BackingOptions {
            direct_io: direct,
            ..BackingOptions::default()
        };
        let backing = FileBacking::open(Path::new(&lo.dev), direct).unwrap();
        assert!(backing.is_block_device());
        assert_eq!(backing.size(), 16 * MIB);
        drop(backing);
        let cache =
            Cache::open(&lo.dev, small_cache(Mode::WriteBack, 2 * MIB), &opts, None).unwrap();
        // The device is ours exclusively while the cache has it.
        let again = FileBacking::open(Path::new(&lo.dev), false);
        assert!(
            again
                .as_ref()
                .err()
                .is_some_and(|e| e.to_string().contains("in use")),
            "a second exclusive open must fail: {:?}",
            again.err()
        );
        exercise(&cache, &mut oracle, 21, 300);
        cache.write_zeroes(5000, 100_000, false).unwrap();
        cache.trim(3 * MIB + 7, 70_000).unwrap();
        oracle[5000..105_000].fill(0);
        oracle[(3 * MIB + 7) as usize..(3 * MIB + 70_007) as usize].fill(0);
        cache.close(false).unwrap();
        drop(cache);
        let path = lo.file.clone();
        drop(lo);
        assert!(
            std::fs::read(&path).unwrap() == oracle,
            "direct={direct}: disk differs"
        );
    }
}

fn read_all(client: &NbdClient) -> Vec<u8> {
    let mut buf = vec![0u8; client.size() as usize];
    client.read(0, &mut buf).unwrap();
    buf
}

fn client(uri: &str) -> NbdClient {
    NbdClient::connect(&NbdUri::parse(uri).unwrap(), ClientOptions::default()).unwrap()
}

#[test]
fn nbd_backing_nbdkit_memory_unix_and_tcp() {
    if !require(&["nbdkit", "nbdcopy"]) {
        return;
    }
    let kit = Nbdkit::start(&["memory", "32M"]);
    let mut oracle = vec![0u8; (32 * MIB) as usize];
    for mode in Mode::ALL {
        let cache = Cache::open(
            &kit.uri(),
            small_cache(mode, 4 * MIB),
            &BackingOptions::default(),
            None,
        )
        .unwrap();
        assert_eq!(cache.size(), 32 * MIB);
        exercise(&cache, &mut oracle, 31 + mode as u64, 300);
        cache.write_zeroes(MIB + 3, 300_000, true).unwrap();
        oracle[(MIB + 3) as usize..(MIB + 300_003) as usize].fill(0);
        cache.close(false).unwrap();
        assert!(
            read_all(&client(&kit.uri())) == oracle,
            "{mode}: nbdkit differs"
        );
    }
    // An independent reader agrees.
    let out = kit.dir().join("copy.img");
    run(tool("nbdcopy").arg(kit.uri()).arg(&out)).ok();
    assert!(std::fs::read(&out).unwrap() == oracle);

    // TCP on the loopback, on a port the kernel just found free.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let _tcp = KillOnDrop(
        tool("nbdkit")
            .args([
                "-f",
                "--exit-with-parent",
                "-i",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .args(["memory", "8M"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let uri = format!("nbd://127.0.0.1:{port}/");
    wait_until("nbdkit to listen on TCP", common::DAEMON_TIMEOUT, || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let mut oracle = vec![0u8; (8 * MIB) as usize];
    let cache = Cache::open(
        &uri,
        small_cache(Mode::WriteBack, MIB),
        &BackingOptions::default(),
        None,
    )
    .unwrap();
    exercise(&cache, &mut oracle, 41, 200);
    cache.close(false).unwrap();
    assert!(read_all(&client(&uri)) == oracle, "TCP backing differs");
}

#[test]
fn bad_backings_give_clear_errors() {
    let opts = BackingOptions::default();
    let cfg = small_cache(Mode::WriteBack, MIB);
    let e = Cache::open(
        "nbd+unix:///?socket=/nonexistent/ramd.sock",
        cfg.clone(),
        &opts,
        None,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("cannot connect") && e.contains("/nonexistent/ramd.sock"),
        "{e}"
    );
    let e = Cache::open("nbds://h/x", cfg.clone(), &opts, None)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("TLS"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.img");
    std::fs::write(&empty, b"").unwrap();
    let e = Cache::open(empty.to_str().unwrap(), cfg.clone(), &opts, None)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("empty"), "{e}");
    let mut bad = cfg;
    bad.block_bytes = 12345;
    let e = Cache::open(empty.to_str().unwrap(), bad, &opts, None)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("power of two"), "{e}");
}

#[test]
fn nbd_export_that_does_not_exist_is_refused_by_name() {
    if !require(&["nbdkit"]) {
        return;
    }
    let kit = Nbdkit::start(&[
        "--filter=exportname",
        "memory",
        "1M",
        "exportname=only",
        "exportname-strict=true",
    ]);
    let uri = format!("nbd+unix:///other?socket={}", kit.socket().display());
    let e = Cache::open(
        &uri,
        small_cache(Mode::WriteBack, 64 * 4096),
        &BackingOptions::default(),
        None,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("refused export 'other'"), "{e}");
}

/// nbdkit's error filter fails every request while a file exists: the
/// cache keeps serving cached data, gives EIO for what needs the backing,
/// keeps its dirty data, refuses a clean close, and writes everything back
/// once the file is gone.
#[test]
fn failing_nbd_backing_keeps_dirty_data_and_recovers() {
    if !require(&["nbdkit"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trigger = dir.path().join("fail-now");
    let kit = Nbdkit::failing_memory("16M", &trigger);
    let cache = Cache::open(
        &kit.uri(),
        small_cache(Mode::WriteBack, 4 * MIB),
        &BackingOptions::default(),
        None,
    )
    .unwrap();
    let mut oracle = vec![0u8; (16 * MIB) as usize];
    exercise(&cache, &mut oracle, 51, 100);
    // Dirty data in RAM, then the backing dies.
    let hot = random_bytes(300_000, 9);
    cache.write(1_000_001, &hot, false).unwrap();
    oracle[1_000_001..1_300_001].copy_from_slice(&hot);
    std::fs::write(&trigger, b"").unwrap();
    let e = cache.flush().unwrap_err();
    assert!(matches!(&e, Error::Io(_)), "{e}");
    assert_eq!(ramd::nbd::proto::errno_for(&e), ramd::nbd::proto::EIO);
    // Cached data is still served.
    let mut back = vec![0u8; hot.len()];
    cache.read(1_000_001, &mut back).unwrap();
    assert!(back == hot);
    // Data that is not cached needs the backing: EIO. The cache holds at
    // most 4 of the 16 MiB, so some of these blocks are not cached.
    let failed = (0..16u64)
        .filter(|i| cache.read(i * MIB + 8192, &mut [0u8; 4096]).is_err())
        .count();
    assert!(
        failed > 0,
        "reads of uncached blocks must fail while the backing is down"
    );
    // New writes of whole 512-byte units still land in RAM (an unaligned
    // edge of a block that is not cached would need the backing: EIO).
    cache.write(2 * MIB, &[0xab; 8192], false).unwrap();
    oracle[2 * MIB as usize..2 * MIB as usize + 8192].fill(0xab);
    let s = cache.stats();
    assert!(s.backing.failing, "{s:?}");
    assert!(
        s.backing.write_errors > 0 && s.backing.read_errors > 0,
        "{s:?}"
    );
    assert!(
        s.backing
            .last_error
            .as_deref()
            .is_some_and(|m| m.contains("Input/output")),
        "{s:?}"
    );
    assert!(s.dirty_bytes >= 300_000, "dirty data must be kept: {s:?}");
    // A clean close refuses and says what is at stake.
    match cache.close(false) {
        Err(CacheError::DirtyData { dirty_bytes, .. }) => assert!(dirty_bytes >= 300_000),
        other => panic!("close must refuse with dirty data: {other:?}"),
    }
    // ...and the cache keeps serving.
    cache.read(1_000_001, &mut back).unwrap();
    // The flusher retries on its own, with backoff.
    wait_until("the flusher to retry", Duration::from_secs(30), || {
        cache.stats().backing.retries >= 2
    });
    assert!(cache.stats().backing.next_retry_in_ms <= 200);
    // The backing comes back: the flusher writes everything back without
    // any request asking.
    std::fs::remove_file(&trigger).unwrap();
    wait_until(
        "the flusher to write back after recovery",
        Duration::from_secs(30),
        || {
            let s = cache.stats();
            s.dirty_bytes == 0 && !s.backing.failing
        },
    );
    cache.flush().unwrap();
    assert!(
        read_all(&client(&kit.uri())) == oracle,
        "backing differs after recovery"
    );
    cache.close(false).unwrap();
}

#[test]
fn forced_close_drops_dirty_data_of_a_dead_backing() {
    let backing = Arc::new(ramd::sim::MemBacking::new(4 * MIB));
    let cache = Cache::new(backing.clone(), small_cache(Mode::WriteBack, MIB), None).unwrap();
    cache.write(0, &[1; 100_000], false).unwrap();
    backing.faults.set_all(true);
    assert!(matches!(
        cache.close(false),
        Err(CacheError::DirtyData { .. })
    ));
    let r = cache.close(true).unwrap();
    assert!(r.dropped_dirty_bytes >= 100_000, "{r:?}");
    assert_eq!(cache.dirty_bytes(), 0);
}

/// The NBD server behind the backing is killed (SIGKILL) with dirty data
/// in the cache, then restarted: the client reconnects and the flusher
/// writes the data back.
#[test]
fn nbd_server_killed_and_restarted_gets_dirty_data_written_back() {
    if !require(&["nbdkit"]) {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let img = store.path().join("disk.img");
    let mut oracle = random_bytes((8 * MIB) as usize, 5);
    std::fs::write(&img, &oracle).unwrap();
    let mut kit = Nbdkit::start(&["file", img.to_str().unwrap()]);
    let cache = Cache::open(
        &kit.uri(),
        small_cache(Mode::WriteBack, 2 * MIB),
        &BackingOptions::default(),
        None,
    )
    .unwrap();
    exercise(&cache, &mut oracle, 61, 100);
    kit.kill9();
    // Whole 512-byte units: they need nothing from the dead server.
    let data = random_bytes(700_416, 8);
    cache.write(122_880, &data, false).unwrap();
    oracle[122_880..823_296].copy_from_slice(&data);
    assert!(
        cache.flush().is_err(),
        "flush must fail while the server is down"
    );
    assert!(cache.stats().dirty_bytes > 0);
    kit.spawn();
    wait_until(
        "write-back after the server restarted",
        Duration::from_secs(30),
        || cache.stats().dirty_bytes == 0,
    );
    cache.close(false).unwrap();
    drop(kit);
    assert!(
        std::fs::read(&img).unwrap() == oracle,
        "image differs after restart"
    );
}

/// Our NBD server serving a cache (as `ramd cache create` will).
struct Served {
    dir: tempfile::TempDir,
    stop: ramd::nbd::ShutdownHandle,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Served {
    fn start(cache: Arc<Cache>) -> Served {
        let dir = tempfile::tempdir().unwrap();
        let table = Arc::new(ExportTable::new());
        table.insert(Arc::new(Export::new("cache0", "test cache", cache, false)));
        let server = Server::bind(ServerConfig::new(dir.path().join("nbd.sock")), table).unwrap();
        let stop = server.shutdown_handle();
        let thread = std::thread::spawn(move || server.run().unwrap());
        Served {
            dir,
            stop,
            thread: Some(thread),
        }
    }

    fn uri(&self) -> String {
        format!(
            "nbd+unix:///cache0?socket={}",
            self.dir.path().join("nbd.sock").display()
        )
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop.shutdown();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn real_clients_through_a_writeback_cache() {
    if !require(&["qemu-io", "fio", "nbdcopy"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("backing.img");
    std::fs::write(&path, vec![0u8; (64 * MIB) as usize]).unwrap();
    let mut cfg = small_cache(Mode::WriteBack, 8 * MIB);
    cfg.max_dirty_age_ms = 50;
    let cache = Arc::new(
        Cache::open(
            path.to_str().unwrap(),
            cfg,
            &BackingOptions::default(),
            None,
        )
        .unwrap(),
    );
    let served = Served::start(cache.clone());
    let uri = served.uri();
    // qemu-io: unaligned and 512-byte writes with pattern checks.
    let out = run(tool("qemu-io")
        .arg("--image-opts")
        .arg(format!(
            "driver=nbd,server.type=unix,server.path={},export=cache0",
            served.dir.path().join("nbd.sock").display()
        ))
        .args([
            "-c",
            "write -P 0x11 0 1M",
            "-c",
            "write -P 0x22 512 512",
            "-c",
            "write -P 0x33 4097 3",
            "-c",
            "write -P 0x44 20M 3M",
            "-c",
            "flush",
            "-c",
            "read -P 0x11 0 512",
            "-c",
            "read -P 0x22 512 512",
            "-c",
            "read -P 0x11 1024 3073",
            "-c",
            "read -P 0x33 4097 3",
            "-c",
            "read -P 0x44 20M 3M",
            "-c",
            "write -z 20M 4096",
            "-c",
            "read -P 0 20M 4096",
            "-c",
            "discard 21M 64k",
            "-c",
            "read -P 0 21M 64k",
        ]))
    .ok();
    assert!(!out.stdout.contains("Pattern verification failed"), "{out}");
    // fio: multi-connection random mixed I/O with 512-byte blocks, verified.
    let fio = run(tool("fio")
        .current_dir(dir.path())
        .args([
            "--ioengine=nbd",
            "--verify_fatal=1",
            "--verify_state_save=0",
        ])
        .arg(format!("--uri={uri}"))
        .args([
            "--name=mixed",
            "--rw=randrw",
            "--bsrange=512-64k",
            "--verify=crc32c",
            "--numjobs=2",
            "--iodepth=8",
            "--size=16M",
            "--offset=32M",
            "--offset_increment=16M",
        ]))
    .ok();
    assert_eq!(fio.stdout.matches("err= 0").count(), 2, "{fio}");
    // nbdcopy out through the cache equals the file after a flush.
    let copy = dir.path().join("copy.img");
    run(tool("nbdcopy").arg(&uri).arg(&copy)).ok();
    cache.sync().unwrap();
    assert!(std::fs::read(&copy).unwrap() == std::fs::read(&path).unwrap());
    let s = cache.stats();
    assert!(
        s.read_hits > 0 && s.write_hits + s.write_misses > 0,
        "{s:?}"
    );
    drop(served);
    cache.close(false).unwrap();
}

#[test]
fn a_cache_over_our_own_server_via_the_nbd_client() {
    // The backing is a ramd RAM drive served by our NBD server; the cache
    // reaches it through the NBD client (the code path of a remote disk).
    let store = Arc::new(
        ramd::store::RamStore::new(
            16 * MIB,
            None,
            Arc::new(ramd::store::MemoryBudget::new(u64::MAX)),
        )
        .unwrap(),
    );
    let dir = tempfile::tempdir().unwrap();
    let table = Arc::new(ExportTable::new());
    table.insert(Arc::new(Export::new("disk", "", store.clone(), false)));
    let server = Server::bind(ServerConfig::new(dir.path().join("s.sock")), table).unwrap();
    let stop = server.shutdown_handle();
    let t = std::thread::spawn(move || server.run().unwrap());
    let uri = format!(
        "nbd+unix:///disk?socket={}",
        dir.path().join("s.sock").display()
    );
    let mut oracle = vec![0u8; (16 * MIB) as usize];
    let cache = Cache::open(
        &uri,
        small_cache(Mode::WriteBack, 2 * MIB),
        &BackingOptions::default(),
        None,
    )
    .unwrap();
    exercise(&cache, &mut oracle, 71, 300);
    cache.trim(MIB, 2 * MIB + 5).unwrap();
    oracle[MIB as usize..(3 * MIB + 5) as usize].fill(0);
    cache.close(false).unwrap();
    let mut direct = vec![0u8; oracle.len()];
    store.read(0, &mut direct).unwrap();
    assert!(direct == oracle);
    stop.shutdown();
    t.join().unwrap();
}

/// A real ext4 on a write-back cache much smaller than what is written
/// (so blocks are evicted and written back while the filesystem works):
/// after unmount and a clean close, the backing file on its own passes
/// `e2fsck -f -n` and holds every file intact.
#[test]
fn ext4_on_a_writeback_cache_leaves_a_clean_backing_file() {
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
    let img = dir.path().join("backing.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(64 * MIB)
        .unwrap();
    let mut cfg = small_cache(Mode::WriteBack, 4 * MIB);
    cfg.max_dirty_age_ms = 200;
    let cache = Arc::new(
        Cache::open(img.to_str().unwrap(), cfg, &BackingOptions::default(), None).unwrap(),
    );
    let served = Served::start(cache.clone());
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let files: [(&str, usize); 5] = [
        ("one", 1),
        ("odd", 4097),
        ("small", 100_000),
        ("mib", MIB as usize),
        ("big", 9 * MIB as usize + 5),
    ];
    let names: Vec<&str> = files.iter().map(|f| f.0).collect();
    for (i, (name, len)) in files.iter().enumerate() {
        std::fs::write(src.join(name), random_bytes(*len, 200 + i as u64)).unwrap();
    }
    let sums = |d: &Path| {
        run(tool("sha256sum").current_dir(d).args(&names))
            .ok()
            .stdout
    };
    let want = sums(&src);

    let stack = FuseLoop::attach(&dir.path().join("fuse"), &served.uri());
    run(tool("mkfs.ext4").args(["-q", "-F", stack.dev()])).ok();
    let mnt = Mounted::mount(stack.dev(), &dir.path().join("mnt"));
    run(tool("cp")
        .arg("-t")
        .arg(&mnt.0)
        .args(&names)
        .current_dir(&src))
    .ok();
    run(tool("sync").arg("-f").arg(&mnt.0)).ok();
    assert_eq!(sums(&mnt.0), want);
    mnt.unmount();
    stack.teardown();
    drop(served);
    let s = cache.stats();
    assert!(
        s.evictions > 0 && s.writeback_bytes > 0,
        "the cache was meant to be under pressure: {s:?}"
    );
    cache.close(false).unwrap();

    // The backing file alone: a clean filesystem with every file intact.
    let lo = Loop::attach(&img);
    run(tool("e2fsck").args(["-f", "-n", &lo.dev])).ok();
    let mnt = Mounted::mount(&lo.dev, &dir.path().join("mnt2"));
    assert_eq!(sums(&mnt.0), want, "files differ on the bare backing");
    mnt.unmount();
}

/// `write_many` keeps many writes in flight on one connection: scattered
/// blocks, adjacent ones, unaligned ones and one larger than a pipeline
/// window all land where they should, the bytes between them untouched;
/// a server that fails the writes gives an error naming the offset, and
/// the client works again once the server does.
#[test]
fn nbd_client_pipelined_writes() {
    if !require(&["nbdkit"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trigger = dir.path().join("fail-now");
    let kit = Nbdkit::failing_memory("64M", &trigger);
    let c = client(&kit.uri());
    let mut oracle = vec![0u8; (64 * MIB) as usize];
    let mut datas: Vec<(u64, Vec<u8>)> = Vec::new();
    // 300 scattered 4 KiB blocks (several windows of 64), in random order,
    // none overlapping another (writes in flight together have no order).
    let mut rng = ramd::sim::Rng::seed(0x9e37_79b9_7f4a_7c15);
    let mut seen = std::collections::HashSet::new();
    for i in 0..300u64 {
        let x = rng.next_u64();
        let at = (x % (40 * MIB / 4096)) * 4096;
        if seen.insert(at) {
            datas.push((at, random_bytes(4096, i)));
        }
    }
    // Unaligned and adjacent pieces, and one of 9 MiB (more than a window's bytes).
    datas.push((61 * MIB + 17, random_bytes(1000, 1001)));
    datas.push((61 * MIB + 1017, random_bytes(3000, 1002)));
    datas.push((40 * MIB + 3, random_bytes(9 << 20, 1003)));
    for (at, d) in &datas {
        oracle[*at as usize..*at as usize + d.len()].copy_from_slice(d);
    }
    let writes: Vec<(u64, &[u8])> = datas.iter().map(|(a, d)| (*a, d.as_slice())).collect();
    c.write_many(&writes).unwrap();
    assert!(read_all(&c) == oracle, "the export differs from the writes");

    // Failing writes: an error, with the offset of a failed write.
    std::fs::write(&trigger, b"").unwrap();
    let e = c.write_many(&writes[..10]).unwrap_err();
    let text = e.to_string();
    assert!(text.contains("failed WRITE at"), "{text}");
    assert_eq!(ramd::nbd::proto::errno_for(&e), ramd::nbd::proto::EIO);
    std::fs::remove_file(&trigger).unwrap();
    let again = vec![(7 * 4096u64, &[0xee_u8; 4096][..])];
    c.write_many(&again).unwrap();
    oracle[7 * 4096..8 * 4096].fill(0xee);
    assert!(
        read_all(&c) == oracle,
        "the export differs after recovering"
    );

    // Out of range: refused before anything is sent.
    let past = vec![(64 * MIB - 10, &[1u8; 20][..])];
    assert!(c.write_many(&past).is_err());
}
