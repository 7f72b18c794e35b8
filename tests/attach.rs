//! `ramd attach`: a drive as a file through FUSE, then loop + ext4 on it,
//! with checksums across a detach and a re-attach. Needs root, /dev/fuse
//! and loop devices.

mod common;

use std::path::{Path, PathBuf};

use common::mounts;
use common::openapi::Spec;
use common::*;
use serde_json::Value;

/// Loop device and filesystem mount on an attached file; torn down (bounded,
/// best effort) on drop so a failing test leaves nothing mounted.
struct Stack {
    dev: Option<String>,
    mnt: PathBuf,
    mounted: bool,
}

impl Stack {
    fn new(file: &Path, mnt: &Path) -> Stack {
        let out = run(tool("losetup").args(["-f", "--show"]).arg(file)).ok();
        Stack {
            dev: Some(out.stdout.trim().to_owned()),
            mnt: mnt.to_owned(),
            mounted: false,
        }
    }
    fn dev(&self) -> &str {
        self.dev.as_deref().unwrap()
    }
    fn mount(&mut self) {
        run(tool("mount").arg(self.dev()).arg(&self.mnt)).ok();
        self.mounted = true;
    }
    fn teardown(&mut self) {
        if self.mounted {
            run(tool("umount").arg(&self.mnt)).ok();
            self.mounted = false;
        }
        if let Some(dev) = self.dev.take() {
            run(tool("losetup").args(["-d", &dev])).ok();
        }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if self.mounted {
            let _ = try_run(tool("umount").arg("-l").arg(&self.mnt), TOOL_TIMEOUT);
        }
        if let Some(dev) = self.dev.take() {
            let _ = try_run(tool("losetup").args(["-d", &dev]), TOOL_TIMEOUT);
        }
    }
}

fn sums(dir: &Path) -> String {
    run(tool("sha256sum")
        .args(["a.bin", "b.bin", "sub/c.txt"])
        .current_dir(dir))
    .ok()
    .stdout
}

#[test]
fn ext4_on_an_attached_drive_survives_detach_and_reattach() {
    if !require(&[
        "losetup",
        "mount",
        "umount",
        "mkfs.ext4",
        "e2fsck",
        "sha256sum",
        "fstrim",
        "fusermount3",
    ]) || !require_root_block_devices()
    {
        return;
    }
    let d = Daemon::start(&["ram0=128M"]);
    let spec = Spec::load();
    let fuse = d.dir().join("fuse");
    let mnt = d.dir().join("mnt");
    std::fs::create_dir_all(&fuse).unwrap();
    std::fs::create_dir_all(&mnt).unwrap();
    let fuse_s = fuse.to_str().unwrap();

    // Attach through the CLI: the file appears with the drive's size.
    let out = run(d.cli().args(["attach", "ram0", fuse_s])).ok();
    let file = fuse.join("ram0");
    assert!(
        out.stdout
            .contains(&format!("attached ram0 as {}", file.display())),
        "{out}"
    );
    assert!(out.stdout.contains("losetup -f --show"), "{out}");
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 128 << 20);
    let (status, body) = d.http("GET", "/v1/attachments", None);
    spec.check("GET", "/v1/attachments", status, &body);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["attachments"][0]["file"], file.display().to_string());
    // Attaching twice at one place is refused.
    let out = run(d.cli().args(["attach", "ram0", fuse_s])).failed();
    assert!(out.stderr.contains("already"), "{out}");

    // losetup + mkfs.ext4 + mount, then files with known checksums.
    let mut stack = Stack::new(&file, &mnt);
    run(tool("mkfs.ext4").args(["-q", "-F", stack.dev()])).ok();
    stack.mount();
    std::fs::write(mnt.join("a.bin"), random_bytes(3 << 20, 1)).unwrap();
    std::fs::write(mnt.join("b.bin"), random_bytes(777_777, 2)).unwrap();
    std::fs::create_dir_all(mnt.join("sub")).unwrap();
    std::fs::write(mnt.join("sub/c.txt"), "hello from a RAM drive\n").unwrap();
    run(&mut tool("sync")).ok();
    let before = sums(&mnt);

    // Busy: detach and delete refuse while the loop device holds the file.
    let out = run(d.cli().args(["detach", fuse_s])).failed();
    assert_eq!(out.code(), 1, "{out}");
    assert!(out.stderr.contains("busy"), "{out}");
    let (status, body) = d.http("DELETE", "/v1/drives/ram0?force=true", None);
    spec.check("DELETE", "/v1/drives/{name}", status, &body);
    assert_eq!(status, 409, "{body}");
    let (status, body) = d.http("DELETE", "/v1/drives/ram0", None);
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("attached at"), "{body}");

    // Tear down and detach for real; the data stays in the drive.
    stack.teardown();
    let out = run(d.cli().args(["detach", fuse_s])).ok();
    assert!(out.stdout.contains("detached ram0"), "{out}");
    assert!(!file.exists(), "the file is still there after detach");

    // Re-attach through the API and find every byte again.
    let body = serde_json::json!({"drive": "ram0", "mountpoint": fuse}).to_string();
    let (status, resp) = d.http("POST", "/v1/attachments", Some(&body));
    spec.check("POST", "/v1/attachments", status, &resp);
    assert_eq!(status, 201, "{resp}");
    let id = serde_json::from_str::<Value>(&resp).unwrap()["id"]
        .as_u64()
        .unwrap();
    let mut stack = Stack::new(&file, &mnt);
    run(tool("e2fsck").args(["-f", "-n", stack.dev()])).ok();
    stack.mount();
    assert_eq!(
        sums(&mnt),
        before,
        "files changed across detach and re-attach"
    );
    // Discard through the loop device returns memory (fstrim → punch hole).
    let used = |d: &Daemon| -> u64 {
        let v: Value = serde_json::from_str(&d.http("GET", "/v1/drives/ram0", None).1).unwrap();
        v["allocated_bytes"].as_u64().unwrap()
    };
    let full = used(&d);
    std::fs::remove_file(mnt.join("a.bin")).unwrap();
    run(tool("fstrim").arg(&mnt)).ok();
    assert!(
        used(&d) < full,
        "fstrim freed nothing ({full} bytes before)"
    );
    stack.teardown();
    let (status, resp) = d.http("DELETE", &format!("/v1/attachments/{id}"), None);
    spec.check("DELETE", "/v1/attachments/{id}", status, &resp);
    assert_eq!(status, 200, "{resp}");
    // Once detached, delete goes through.
    let (status, body) = d.http("DELETE", "/v1/drives/ram0", None);
    assert_eq!(status, 200, "{body}");
}

/// A tmpfs mounted at a scratch path (what the user already has mounted).
fn mount_tmpfs(at: &Path) {
    rustix::mount::mount(
        "tmpfs",
        at,
        "tmpfs",
        rustix::mount::MountFlags::empty(),
        c"size=1m",
    )
    .unwrap_or_else(|e| panic!("mount tmpfs at {}: {e}", at.display()));
}

/// The filesystem types mounted exactly at `at`, bottom first.
fn mounted_at(at: &Path) -> Vec<String> {
    ramd::dirsync::mountinfo::read()
        .unwrap()
        .into_iter()
        .filter(|m| m.mount_point == at)
        // ramd's FUSE mounts show as "fuse" (or "fuse.ramd").
        .map(|m| {
            if m.fs_type.starts_with("fuse") {
                "fuse".into()
            } else {
                m.fs_type
            }
        })
        .collect()
}

fn attach_body(mountpoint: &Path, force: bool) -> String {
    serde_json::json!({"drive": "ram0", "mountpoint": mountpoint, "force": force}).to_string()
}

#[test]
fn attach_refuses_root_mount_points_and_non_empty_dirs_unless_forced() {
    if !require(&["fusermount3"]) || !require_root_block_devices() {
        return;
    }
    let scratch = mounts::Scratch::new("attach", "rules");
    let d = Daemon::start(&["ram0=8M"]);
    let spec = Spec::load();

    // `/`: never, not even forced.
    for force in [false, true] {
        let (status, body) = d.http(
            "POST",
            "/v1/attachments",
            Some(&attach_body(Path::new("/"), force)),
        );
        spec.check("POST", "/v1/attachments", status, &body);
        assert_eq!(status, 422, "force={force}: {body}");
        assert!(body.contains("bad_mountpoint"), "{body}");
    }
    let out = run(d.cli().args(["attach", "ram0", "/", "--force"])).failed();
    assert!(out.stderr.contains("over /"), "{out}");

    // A mount point: refused, then forced; detach leaves the user's mount.
    let mnt = scratch.mkdir("mounted");
    mount_tmpfs(&mnt);
    std::fs::write(mnt.join("user.txt"), "mine").unwrap();
    let (status, body) = d.http("POST", "/v1/attachments", Some(&attach_body(&mnt, false)));
    assert_eq!(status, 422, "{body}");
    assert!(
        body.contains("bad_mountpoint") && body.contains("already a mount point"),
        "{body}"
    );
    let out = run(d.cli().args(["attach", "ram0"]).arg(&mnt)).failed();
    assert!(
        out.stderr.contains("mount point") && out.stderr.contains("--force"),
        "{out}"
    );
    let (status, body) = d.http("POST", "/v1/attachments", Some(&attach_body(&mnt, true)));
    spec.check("POST", "/v1/attachments", status, &body);
    assert_eq!(status, 201, "{body}");
    assert!(mnt.join("ram0").exists() && !mnt.join("user.txt").exists());
    run(d.cli().args(["detach"]).arg(&mnt)).ok();
    assert_eq!(
        mounted_at(&mnt),
        vec!["tmpfs".to_owned()],
        "the user's mount must stay"
    );
    assert_eq!(
        std::fs::read_to_string(mnt.join("user.txt")).unwrap(),
        "mine"
    );

    // A non-empty directory: refused, then forced through the CLI.
    let full = scratch.mkdir("full");
    std::fs::write(full.join("keep.txt"), "x").unwrap();
    let out = run(d.cli().args(["attach", "ram0"]).arg(&full)).failed();
    assert!(
        out.stderr.contains("not empty") && out.stderr.contains("keep.txt"),
        "{out}"
    );
    assert!(mounted_at(&full).is_empty());
    run(d.cli().args(["attach", "ram0", "--force"]).arg(&full)).ok();
    assert!(full.join("ram0").exists());
    run(d.cli().args(["detach"]).arg(&full)).ok();
    assert!(full.join("keep.txt").exists());
    assert!(mounted_at(&full).is_empty());
}

#[test]
fn detach_unmounts_only_what_ramd_mounted() {
    if !require(&["fusermount3"]) || !require_root_block_devices() {
        return;
    }
    let scratch = mounts::Scratch::new("attach", "detach");
    let d = Daemon::start(&["ram0=8M"]);
    let at = scratch.mkdir("at");
    let at_s = at.to_str().unwrap();

    // The user mounts something over the attachment: detach refuses and
    // both stay; once the user's mount is gone, detach works.
    run(d.cli().args(["attach", "ram0", at_s])).ok();
    mount_tmpfs(&at);
    let out = run(d.cli().args(["detach", at_s])).failed();
    assert!(out.stderr.contains("mounted over"), "{out}");
    assert_eq!(mounted_at(&at), vec!["fuse".to_owned(), "tmpfs".to_owned()]);
    rustix::mount::unmount(&at, rustix::mount::UnmountFlags::empty()).unwrap();
    run(d.cli().args(["detach", at_s])).ok();
    assert!(mounted_at(&at).is_empty());

    // Someone unmounts ramd's mount and mounts their own there: detach
    // forgets the attachment and leaves their mount alone.
    run(d.cli().args(["attach", "ram0", at_s])).ok();
    rustix::mount::unmount(&at, rustix::mount::UnmountFlags::empty()).unwrap();
    mount_tmpfs(&at);
    let out = run(d.cli().args(["detach", at_s])).ok();
    assert!(out.stdout.contains("detached ram0"), "{out}");
    assert_eq!(
        mounted_at(&at),
        vec!["tmpfs".to_owned()],
        "the user's mount must stay"
    );
    let (_, body) = d.http("GET", "/v1/attachments", None);
    assert!(!body.contains(at_s), "{body}");
    assert!(!d.log().contains("panicked"), "{}", d.log());
}

/// The fuse module's switch for FUSE over io_uring (kernel 6.14+).
const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Turns the fuse module's `enable_uring` on for one test and puts back
/// the value it had when dropped, so a failing test leaves it as it was.
/// Other tests of this file that mount meanwhile get the ring too: both
/// paths must pass them. The tests that turn it on take turns (`TURN`),
/// so each puts back what was there before any of them.
struct EnableUring {
    was: String,
    /// Held until the value is put back (dropped after `drop` runs).
    _turn: std::sync::MutexGuard<'static, ()>,
}

/// One test at a time switches `enable_uring`.
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl EnableUring {
    /// None (with the reason printed) where the kernel has no switch or
    /// it cannot be set.
    fn on() -> Option<EnableUring> {
        let turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        let was = match std::fs::read_to_string(ENABLE_URING) {
            Ok(v) => v.trim().to_owned(),
            Err(e) => {
                eprintln!("skipped: {ENABLE_URING}: {e} (a kernel without FUSE over io_uring)");
                return None;
            }
        };
        if let Err(e) = std::fs::write(ENABLE_URING, "Y") {
            eprintln!("skipped: cannot turn {ENABLE_URING} on: {e}");
            return None;
        }
        Some(EnableUring { was, _turn: turn })
    }
}

impl Drop for EnableUring {
    fn drop(&mut self) {
        let _ = std::fs::write(ENABLE_URING, &self.was);
    }
}

/// Writes the files `sums` checks, on the filesystem at `mnt`.
fn write_known_files(mnt: &Path) {
    std::fs::write(mnt.join("a.bin"), random_bytes(3 << 20, 1)).unwrap();
    std::fs::write(mnt.join("b.bin"), random_bytes(777_777, 2)).unwrap();
    std::fs::create_dir_all(mnt.join("sub")).unwrap();
    std::fs::write(mnt.join("sub/c.txt"), "hello from a RAM drive\n").unwrap();
    run(&mut tool("sync")).ok();
}

/// The path the API reports for the attachment at `file` ("fuse-uring",
/// "fuse-classic").
fn reported_path(d: &Daemon, file: &Path) -> String {
    let (_, body) = d.http("GET", "/v1/attachments", None);
    let v: Value = serde_json::from_str(&body).unwrap();
    v["attachments"]
        .as_array()
        .and_then(|all| all.iter().find(|a| a["file"] == file.display().to_string()))
        .and_then(|a| a["path"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("no attachment with a path for {}: {body}", file.display()))
}

#[test]
fn ext4_on_an_attached_drive_survives_detach_and_reattach_over_io_uring() {
    if !require(&[
        "losetup",
        "mount",
        "umount",
        "mkfs.ext4",
        "e2fsck",
        "sha256sum",
        "fstrim",
    ]) || !require_root_block_devices()
    {
        return;
    }
    let Some(_uring) = EnableUring::on() else {
        return;
    };
    let args: Vec<String> = ["serve", "--drive", "ram0=128M"].map(String::from).to_vec();
    let d = Daemon::launch(&args, &[("RAMD_FUSE_URING", "1")]);
    let fuse = d.dir().join("fuse");
    let mnt = d.dir().join("mnt");
    std::fs::create_dir_all(&fuse).unwrap();
    std::fs::create_dir_all(&mnt).unwrap();
    let fuse_s = fuse.to_str().unwrap();
    let file = fuse.join("ram0");

    // Attach: the mount is served through the ring, and says so.
    let out = run(d.cli().args(["attach", "ram0", fuse_s])).ok();
    assert!(out.stdout.contains("attached ram0"), "{out}");
    let path = reported_path(&d, &file);
    assert!(
        path.contains("fuse-uring"),
        "not on the ring: '{path}'\n{}",
        d.log()
    );

    // loop (direct I/O, as users set it up) + ext4, files with known sums.
    let mut stack = Stack::new(&file, &mnt);
    run(tool("mkfs.ext4").args(["-q", "-F", stack.dev()])).ok();
    stack.mount();
    write_known_files(&mnt);
    let before = sums(&mnt);
    let out = run(d.cli().args(["detach", fuse_s])).failed();
    assert!(out.stderr.contains("busy"), "{out}");
    stack.teardown();
    run(d.cli().args(["detach", fuse_s])).ok();
    assert!(!file.exists(), "the file is still there after detach");

    // Re-attach (the ring again) and find every byte.
    let body = serde_json::json!({"drive": "ram0", "mountpoint": fuse}).to_string();
    let (status, resp) = d.http("POST", "/v1/attachments", Some(&body));
    assert_eq!(status, 201, "{resp}");
    let path = reported_path(&d, &file);
    assert!(path.contains("fuse-uring"), "not on the ring: '{path}'");
    let mut stack = Stack::new(&file, &mnt);
    run(tool("e2fsck").args(["-f", "-n", stack.dev()])).ok();
    stack.mount();
    assert_eq!(
        sums(&mnt),
        before,
        "files changed across detach and re-attach"
    );

    // Discard through the ring frees memory.
    let used = |d: &Daemon| -> u64 {
        let v: Value = serde_json::from_str(&d.http("GET", "/v1/drives/ram0", None).1).unwrap();
        v["allocated_bytes"].as_u64().unwrap()
    };
    let full = used(&d);
    std::fs::remove_file(mnt.join("a.bin")).unwrap();
    run(tool("fstrim").arg(&mnt)).ok();
    assert!(
        used(&d) < full,
        "fstrim freed nothing ({full} bytes before)"
    );
    stack.teardown();
    run(d.cli().args(["detach", fuse_s])).ok();
    // Every ring thread returned: nothing panicked, nothing failed.
    let log = d.log();
    assert!(
        !log.contains("panicked") && !log.contains("session ended with"),
        "{log}"
    );
}

#[test]
fn kill_9_of_the_daemon_fails_io_on_the_ring_without_a_hang() {
    use std::os::unix::fs::FileExt;
    if !require(&["umount"]) || !require_root_block_devices() {
        return;
    }
    let Some(_uring) = EnableUring::on() else {
        return;
    };
    let args: Vec<String> = ["serve", "--drive", "ram0=64M"].map(String::from).to_vec();
    let mut d = Daemon::launch(&args, &[("RAMD_FUSE_URING", "1")]);
    let fuse = d.dir().join("fuse");
    std::fs::create_dir_all(&fuse).unwrap();
    let file = fuse.join("ram0");
    run(d.cli().arg("attach").arg("ram0").arg(&fuse)).ok();
    let path = reported_path(&d, &file);
    assert!(path.contains("fuse-uring"), "not on the ring: '{path}'");

    // Writes (direct I/O: the file is opened so), over and over, from a
    // thread, while the daemon dies; the thread reports how they ended.
    let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let written = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let count = written.clone();
    std::thread::spawn(move || {
        let buf = vec![7u8; 1 << 20];
        let mut at = 0u64;
        let end = loop {
            if let Err(e) = f.write_all_at(&buf, at) {
                break e;
            }
            count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            at = (at + (1 << 20)) % (64 << 20);
        };
        let _ = tx.send(end);
    });
    // Writing for a while (not a fixed sleep: a busy machine may not have
    // started the thread by then).
    wait_until("writes to the mount", WAIT_TIMEOUT, || {
        written.load(std::sync::atomic::Ordering::Relaxed) >= 8
    });
    assert!(rx.try_recv().is_err(), "the writes stopped early");
    d.kill9();

    // The kernel aborts the connection: the writes fail, nothing hangs.
    let end = rx
        .recv_timeout(WAIT_TIMEOUT)
        .expect("writes to the mount hang after kill -9");
    assert!(
        matches!(
            end.raw_os_error(),
            // ECANCELED: a request the ring had queued when the daemon
            // died is cancelled with the ring.
            Some(libc::ENOTCONN | libc::ECONNABORTED | libc::EIO | libc::ECANCELED)
        ),
        "{end}"
    );
    // A stat the kernel had already queued on the ring when it was torn
    // down ends with ECONNABORTED; one sent after the abort with ENOTCONN.
    let err = std::fs::metadata(&file).expect_err("the dead mount still answers");
    assert!(
        matches!(
            err.raw_os_error(),
            Some(libc::ENOTCONN | libc::ECONNABORTED)
        ),
        "{err}"
    );
    run(tool("umount").arg(&fuse)).ok();
}
