//! Scratch directories for tests that mount (tmpfs, overlayfs): a unique
//! base under the target's tmp directory whose mounts are all detached, and
//! which is deleted, on drop. Tests holding a [`Scratch`] run one at a time
//! (see [`SERIAL`]).

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use ramd::dirsync::mountinfo;

use super::SKIP_ENV;

/// Root only (mounts). Fails, or skips with RAMD_SKIP_MISSING_TOOLS=1.
pub fn require_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    if std::env::var(SKIP_ENV).as_deref() == Ok("1") {
        eprintln!("SKIPPED: needs root for tmpfs/overlay mounts ({SKIP_ENV}=1)");
        return false;
    }
    panic!("this test needs root (tmpfs and overlayfs mounts); set {SKIP_ENV}=1 to skip");
}

/// Serialises the tests that hold a [`Scratch`]: a child process another
/// test thread forks inherits, until it execs, every file this process has
/// open (close-on-exec or not), and a file open for writing in a directory
/// in RAM makes its remove fail as busy (or its stop hand it over). Real
/// programs do not fork under ramd's feet like that; parallel tests would.
static SERIAL: Mutex<()> = Mutex::new(());

/// A unique directory on disk whose mounts are all detached on drop.
pub struct Scratch {
    pub base: PathBuf,
    /// Held for the test's life (see [`SERIAL`]).
    _serial: Option<MutexGuard<'static, ()>>,
}

impl Scratch {
    /// `$CARGO_TARGET_TMPDIR/PREFIX-NAME-PID`, emptied of what an earlier run
    /// left there.
    pub fn new(prefix: &str, name: &str) -> Scratch {
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let base = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("{prefix}-{name}-{}", std::process::id()));
        // Dropping it detaches and deletes what an earlier run left.
        drop(Scratch {
            base: base.clone(),
            _serial: None,
        });
        std::fs::create_dir_all(&base).unwrap();
        Scratch {
            base: std::fs::canonicalize(&base).unwrap(),
            _serial: Some(serial),
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.base.join(rel)
    }

    pub fn mkdir(&self, rel: &str) -> PathBuf {
        let p = self.path(rel);
        std::fs::create_dir_all(&p).unwrap();
        p
    }

    /// Detaches every mount below the base (several rounds: detaching a
    /// stacked mount reveals the next).
    pub fn unmount_all(&self) {
        for _ in 0..6 {
            let Ok(mounts) = mountinfo::read() else {
                return;
            };
            let under = mountinfo::mounts_under(&mounts, &self.base);
            if under.is_empty() {
                break;
            }
            for m in under.iter().rev() {
                let _ = rustix::mount::unmount(&m.mount_point, rustix::mount::UnmountFlags::DETACH);
            }
        }
    }

    pub fn cleanup(&self) {
        self.unmount_all();
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        self.cleanup();
    }
}
