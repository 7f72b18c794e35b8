//! nbdkit as a backing server: started on a unix socket in a directory of
//! its own (or at a given path, for a server that comes up late),
//! restartable after a SIGKILL, killed when dropped.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use super::{signal, tool, wait_until, KillOnDrop, DAEMON_TIMEOUT};

pub struct Nbdkit {
    dir: tempfile::TempDir,
    sock: PathBuf,
    child: Option<KillOnDrop>,
    args: Vec<String>,
}

impl Nbdkit {
    /// `nbdkit ARGS` on a socket in a fresh directory.
    #[track_caller]
    pub fn start(args: &[&str]) -> Nbdkit {
        let dir = tempfile::Builder::new()
            .prefix("ramd-nbdkit-")
            .tempdir()
            .unwrap();
        let sock = dir.path().join("nbdkit.sock");
        Nbdkit::start_at(dir, &sock, args)
    }

    /// `nbdkit ARGS` on `sock` (inside `dir`, which lives as long as the
    /// server).
    #[track_caller]
    pub fn start_at(dir: tempfile::TempDir, sock: &Path, args: &[&str]) -> Nbdkit {
        let mut n = Nbdkit {
            dir,
            sock: sock.to_path_buf(),
            child: None,
            args: args.iter().map(|s| s.to_string()).collect(),
        };
        n.spawn();
        n
    }

    /// nbdkit memory of `size` behind its error filter, which fails every
    /// request with EIO while `trigger` exists.
    #[track_caller]
    pub fn failing_memory(size: &str, trigger: &Path) -> Nbdkit {
        Nbdkit::start(&[
            "--filter=error",
            "memory",
            size,
            "error=EIO",
            "error-rate=100%",
            &format!("error-file={}", trigger.display()),
        ])
    }

    /// The server's directory (scratch space that lives as long as it).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn socket(&self) -> &Path {
        &self.sock
    }

    pub fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.sock.display())
    }

    /// Starts the server (again, after `kill9`) with the same arguments.
    #[track_caller]
    pub fn spawn(&mut self) {
        let _ = std::fs::remove_file(&self.sock);
        let child = tool("nbdkit")
            .args(["-f", "--exit-with-parent", "-U"])
            .arg(&self.sock)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nbdkit");
        self.child = Some(KillOnDrop(child));
        let sock = self.sock.clone();
        // The file exists from bind(); only a connect says listen() happened.
        wait_until("nbdkit to listen on its socket", DAEMON_TIMEOUT, || {
            std::os::unix::net::UnixStream::connect(&sock).is_ok()
        });
    }

    /// SIGKILL, no clean-up: a crashed server.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            signal(c.0.id(), libc::SIGKILL);
            let _ = c.0.wait();
        }
    }
}
