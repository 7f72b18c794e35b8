//! An in-process NBD `Server` for the protocol-level tests (protocol.rs,
//! nbd_limits.rs, tls.rs): RAM drives of the test's choosing, served on a
//! unix socket in a private directory (and TCP when the config asks) from
//! a thread of its own.
//!
//! A panic hook counts panics on the server's connection threads (named
//! `nbd-conn-*`), which the server survives, so a client may see nothing
//! more than a closed connection, or (when the dead thread leaks its
//! socket) a timeout. Stopping a test server (dropping it) asserts that
//! there were none while it ran and that `run()` returned Ok.
//!
//! Threads are not named per server, so a panic caused by one test can
//! also fail another running at the same time; the message tells them
//! apart.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Once};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use ramd::block::backend::Backend;
use ramd::nbd::{Export, ExportTable, Server, ServerConfig, ShutdownHandle};
use ramd::store::{MemoryBudget, RamStore};

/// How long a stopped server may take to end its connections and return
/// from `run()`. Generous: the machine may be busy.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// One drive a test server exports (a plain `RamStore`).
#[derive(Clone, Copy, Debug)]
pub struct Drive {
    pub name: &'static str,
    pub description: &'static str,
    pub size: u64,
    /// The drive's memory limit (None: its size).
    pub mem_limit: Option<u64>,
    pub read_only: bool,
}

impl Drive {
    /// A writable drive of `size` bytes with no description or limit.
    pub const fn new(name: &'static str, size: u64) -> Drive {
        Drive {
            name,
            description: "",
            size,
            mem_limit: None,
            read_only: false,
        }
    }

    /// The same drive, read-only.
    pub const fn read_only(self) -> Drive {
        Drive {
            read_only: true,
            ..self
        }
    }

    /// The same drive with `description`.
    pub const fn described(self, description: &'static str) -> Drive {
        Drive {
            description,
            ..self
        }
    }

    /// The same drive with a memory limit.
    pub const fn limited(self, mem_limit: u64) -> Drive {
        Drive {
            mem_limit: Some(mem_limit),
            ..self
        }
    }
}

static SERVER_PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn record_server_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let name = thread::current().name().unwrap_or("").to_owned();
            if name.starts_with("nbd-conn") {
                let mut panics = SERVER_PANICS.lock().unwrap_or_else(|e| e.into_inner());
                panics.push(format!("{name}: {info}"));
            }
            previous(info)
        }));
    });
}

/// For failure messages: the server panics recorded after the first `since`.
pub fn server_panics_since(since: usize) -> String {
    let panics = SERVER_PANICS.lock().unwrap_or_else(|e| e.into_inner());
    let new = &panics[since.min(panics.len())..];
    match new.len() {
        0 => "no server thread panicked".into(),
        n => format!(
            "{n} server thread panics, the first: {:#?}",
            &new[..n.min(3)]
        ),
    }
}

/// For failure messages: every server panic recorded in this process.
pub fn server_panics() -> String {
    server_panics_since(0)
}

/// Server thread panics recorded in this process so far.
pub fn server_panic_count() -> usize {
    SERVER_PANICS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .len()
}

/// A server running on its own thread, with a private socket directory.
pub struct TestServer {
    /// The unix socket.
    pub socket: PathBuf,
    /// The TCP addresses bound (when the config asked for some).
    pub tcp: Vec<SocketAddr>,
    pub shutdown: ShutdownHandle,
    run: Option<JoinHandle<io::Result<()>>>,
    /// `server_panic_count()` when this server started.
    panics_at_start: usize,
    _dir: tempfile::TempDir,
}

impl TestServer {
    /// Binds a server exporting `drives` (the first is the default
    /// export) on DIR/nbd.sock, with `tweak` applied to its config, and
    /// runs it on a thread.
    #[track_caller]
    pub fn start(drives: &[Drive], tweak: impl FnOnce(&mut ServerConfig)) -> TestServer {
        record_server_panics();
        let panics_at_start = server_panic_count();
        let dir = tempfile::tempdir().expect("tempdir");
        let exports = Arc::new(ExportTable::new());
        for d in drives {
            let budget = Arc::new(MemoryBudget::new(u64::MAX));
            let store = RamStore::new(d.size, d.mem_limit, budget).expect("store");
            let backend = Arc::new(store) as Arc<dyn Backend>;
            assert!(exports.insert(Arc::new(Export::new(
                d.name,
                d.description,
                backend,
                d.read_only
            ))));
        }
        let socket = dir.path().join("nbd.sock");
        let mut config = ServerConfig::new(&socket);
        tweak(&mut config);
        let server = Server::bind(config, exports).expect("bind");
        let tcp = server.tcp_addrs().to_vec();
        let shutdown = server.shutdown_handle();
        let run = thread::Builder::new()
            .name("test-server".into())
            .spawn(move || server.run())
            .expect("spawn server");
        TestServer {
            socket,
            tcp,
            shutdown,
            run: Some(run),
            panics_at_start,
            _dir: dir,
        }
    }

    /// For failure messages: the server panics since this server started.
    pub fn panics(&self) -> String {
        server_panics_since(self.panics_at_start)
    }

    /// Stops the server, waits (bounded) for `run()` and returns what it
    /// returned; fails if a server thread panicked meanwhile.
    #[track_caller]
    pub fn stop(&mut self) -> io::Result<()> {
        self.shutdown.shutdown();
        let run = self.run.take().expect("server already stopped");
        super::wait_until(
            &format!(
                "the server to finish after shutdown (a connection thread is stuck \
                 or died; {})",
                self.panics()
            ),
            STOP_TIMEOUT,
            || run.is_finished(),
        );
        let result = run.join().expect("server run() panicked");
        assert_eq!(
            server_panic_count(),
            self.panics_at_start,
            "while this server ran: {}",
            self.panics()
        );
        result
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if self.run.is_some() && !thread::panicking() {
            self.stop().expect("server run() failed");
        } else {
            self.shutdown.shutdown();
        }
    }
}
