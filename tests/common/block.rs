//! Block devices for tests that put a filesystem on a drive or a cache
//! (root): a loop device over a file, nbdfuse + loop over an NBD export,
//! and an ext4 mount. Each is taken down on drop, in an order that cannot
//! hang (nbdfuse is killed before anything else), if the test failed
//! before taking it down itself.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use super::{run, tool, try_run, wait_timeout, wait_until, TOOL_TIMEOUT};

/// A loop device over a file; detached on drop.
pub struct Loop {
    pub dev: String,
    pub file: PathBuf,
}

impl Loop {
    #[track_caller]
    pub fn attach(file: &Path) -> Loop {
        let out = run(tool("losetup").args(["-f", "--show"]).arg(file)).ok();
        Loop {
            dev: out.stdout.trim().to_owned(),
            file: file.to_owned(),
        }
    }
}

impl Drop for Loop {
    /// Detaches the device and waits (up to 30 s) until the kernel has
    /// let go of the file: `losetup -d` of a device someone still has
    /// open (udev probing it after an unmount, say) only marks it for
    /// release when they close it, so the file can still be in use when
    /// losetup returns, and a `ramd detach` right after would be refused.
    fn drop(&mut self) {
        let _ = try_run(tool("losetup").args(["-d", &self.dev]), TOOL_TIMEOUT);
        let name = self.dev.trim_start_matches("/dev/");
        let backing = PathBuf::from(format!("/sys/block/{name}/loop/backing_file"));
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while backing.exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// nbdfuse exposing an NBD export as FUSE_DIR/nbd, with a loop device over
/// that file.
pub struct FuseLoop {
    fuse_dir: PathBuf,
    nbdfuse: Option<Child>,
    dev: Option<String>,
}

impl FuseLoop {
    #[track_caller]
    pub fn attach(fuse_dir: &Path, uri: &str) -> FuseLoop {
        std::fs::create_dir_all(fuse_dir).unwrap();
        let child = tool("nbdfuse")
            .arg(fuse_dir)
            .arg(uri)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nbdfuse");
        let mut s = FuseLoop {
            fuse_dir: fuse_dir.to_owned(),
            nbdfuse: Some(child),
            dev: None,
        };
        let file = fuse_dir.join("nbd");
        wait_until(
            "nbdfuse to expose its file",
            Duration::from_secs(30),
            || file.exists(),
        );
        let out = run(tool("losetup").args(["-f", "--show"]).arg(&file)).ok();
        s.dev = Some(out.stdout.trim().to_owned());
        s
    }

    pub fn dev(&self) -> &str {
        self.dev.as_deref().unwrap()
    }

    /// Detaches the loop device, unmounts nbdfuse (retrying while the
    /// loop device still holds its file) and waits for it, failing on any
    /// error.
    pub fn teardown(mut self) {
        run(tool("losetup").args(["-d", self.dev.take().unwrap().as_str()])).ok();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !run(tool("fusermount3").arg("-u").arg(&self.fuse_dir))
            .status
            .success()
        {
            assert!(
                std::time::Instant::now() < deadline,
                "cannot unmount nbdfuse"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut c = self.nbdfuse.take().unwrap();
        assert!(wait_timeout(&mut c, Duration::from_secs(30)).is_some());
    }
}

impl Drop for FuseLoop {
    fn drop(&mut self) {
        let t = Duration::from_secs(20);
        if let Some(mut c) = self.nbdfuse.take() {
            let _ = c.kill();
            let _ = wait_timeout(&mut c, t);
        }
        if let Some(dev) = self.dev.take() {
            let _ = try_run(tool("losetup").args(["-d", &dev]), t);
        }
        let _ = try_run(tool("fusermount3").arg("-uz").arg(&self.fuse_dir), t);
    }
}

/// A mounted ext4; lazily unmounted on drop.
pub struct Mounted(pub PathBuf);

impl Mounted {
    /// Mounts `dev` at `at` with the default options.
    #[track_caller]
    pub fn mount(dev: &str, at: &Path) -> Mounted {
        Self::mount_args(dev, at, &[])
    }

    /// Mounts `dev` at `at` with `-o opts`.
    #[track_caller]
    pub fn mount_opts(dev: &str, at: &Path, opts: &str) -> Mounted {
        Self::mount_args(dev, at, &["-o", opts])
    }

    #[track_caller]
    fn mount_args(dev: &str, at: &Path, extra: &[&str]) -> Mounted {
        std::fs::create_dir_all(at).unwrap();
        run(tool("mount")
            .args(["-t", "ext4"])
            .args(extra)
            .arg(dev)
            .arg(at))
        .ok();
        Mounted(at.to_owned())
    }

    #[track_caller]
    pub fn unmount(self) {
        run(tool("umount").arg(&self.0)).ok();
        std::mem::forget(self);
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = try_run(
            tool("umount").arg("-l").arg(&self.0),
            Duration::from_secs(20),
        );
    }
}
