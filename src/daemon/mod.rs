//! The daemon: one process holding every drive, the NBD listeners and the
//! REST API.
//!
//! ```text
//!  main thread ── start-up: settings (flags > config > defaults), pid lock,
//!     │           drives, NBD bind, API bind ── READY=1 ── tokio runtime:
//!     │                                                  API server + sampler
//!  thread "nbd-accept"  NBD server: accept, one thread per connection
//!  thread "signals"     sigwait(SIGINT, SIGTERM) ─► shutdown
//! ```
//!
//! Start-up: persistent drives (declared, or found in STATE_DIR/drives)
//! restore in the background while the API and NBD already serve; READY=1
//! goes to systemd once none is restoring (`persistent::wait_restores`).
//!
//! Shutdown (SIGTERM/SIGINT): STOPPING=1 to systemd; the API stops
//! accepting and finishes the requests it has; the NBD server stops
//! accepting, answers every request already received and closes each
//! connection; FUSE attachments are unmounted; every persistent drive is
//! synced and checkpointed (logged); every cache writes its dirty data
//! back (`caches::shutdown`: bounded, and never silent about data a dead
//! backing could not take: exit status 1 then); sockets and the pid lock
//! are removed. Exit status 0.
//!
//! The NBD data path stays on plain threads with blocking I/O (measured
//! faster than async for RAM requests); tokio runs only the API.

pub mod caches;
pub mod config;
pub mod dirs;
pub mod lock;
mod logging;
pub mod persistent;
pub mod registry;
pub mod sampler;
pub mod spec;

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::attach::Attachments;
use crate::nbd::{ExportTable, Server, ServerConfig};
use crate::size::{format_size, parse_size};
use crate::store::MemoryBudget;
use caches::{CacheSpec, Caches, CachesError};
pub use config::LogFormat;
use config::{Config, ConfigError};
use dirs::{DirSpec, Dirs, DirsError};
use lock::{LockError, PidLock};
use registry::{Origin, Registry, RegistryError};
use sampler::Sampler;
use spec::{parse_drive_spec, DriveSpec};

/// `ramd daemon` (alias `serve`) flags. Each wins over its config key.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct DaemonArgs {
    /// Config file (TOML, see docs/config.md) [default: /etc/ramd/ramd.toml
    /// when it exists].
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Ignore /etc/ramd/ramd.toml even when it exists.
    #[arg(long, conflicts_with = "config")]
    pub no_config: bool,

    /// Put the API socket, NBD socket and lock file in DIR [default:
    /// $XDG_RUNTIME_DIR/ramd, /run/ramd for root, else /tmp/ramd-UID].
    #[arg(long, value_name = "DIR")]
    pub runtime_dir: Option<PathBuf>,

    /// REST API unix socket (mode 0600) [default: RUNTIME_DIR/api.sock].
    #[arg(long, value_name = "PATH")]
    pub api_socket: Option<PathBuf>,

    /// NBD unix socket [default: RUNTIME_DIR/nbd.sock].
    #[arg(long = "socket", visible_alias = "nbd-socket", value_name = "PATH")]
    pub nbd_socket: Option<PathBuf>,

    /// State directory (persistent drives) [default: $XDG_STATE_HOME/ramd,
    /// /var/lib/ramd for root, else ~/.local/state/ramd].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// Also serve NBD on this TCP address (e.g. 127.0.0.1:10809; no TLS:
    /// trusted networks only). Repeatable.
    #[arg(long = "nbd-listen", value_name = "ADDR")]
    pub nbd_listen: Vec<SocketAddr>,

    /// A drive to create at start: NAME=SIZE[,mem-limit=SIZE][,read-only]
    /// [,overcommit][,persist][,durability=none|periodic|flush]
    /// [,sync-interval=DURATION][,key-file=PATH]. Repeatable. A persistent
    /// drive is restored from STATE_DIR/drives/NAME when it is there.
    /// Without any --drive and without drives in the config, a 1 GiB drive
    /// "ram0" is created.
    #[arg(long = "drive", value_name = "SPEC")]
    pub drives: Vec<String>,

    /// Start with no drive at all when none is given.
    #[arg(long)]
    pub no_default_drive: bool,

    /// Memory all drives together may hold [default: 75% of MemAvailable].
    #[arg(long, value_name = "SIZE", value_parser = parse_mem_budget_flag)]
    pub mem_budget: Option<u64>,

    /// Most NBD connections served at once [default: 256].
    #[arg(long, value_name = "N", value_parser = parse_max_connections_flag)]
    pub max_connections: Option<usize>,

    /// Microseconds a connection polls for its next request before sleeping
    /// (cuts QD1 latency on VMs and speeds up QD2-QD8 2.5-4x; pipelining
    /// clients with a backlog of replies get short timer naps instead; 0
    /// sleeps at once) [default: 50].
    #[arg(long, value_name = "US")]
    pub poll_us: Option<u32>,

    /// While a client sends request after request at QD1, keep the other
    /// CPUs out of their halt with idle-priority spinners, so replies wake
    /// the client fast (on/off; 2-4 CPU machines only; costs the idle time
    /// of those CPUs while such a client runs) [default: off].
    #[arg(long, value_name = "BOOL", value_parser = clap::builder::BoolishValueParser::new())]
    pub keep_cpu_awake: Option<bool>,

    /// Record per-request metrics (on/off) [default: on].
    #[arg(long, value_name = "BOOL", value_parser = clap::builder::BoolishValueParser::new())]
    pub metrics: Option<bool>,

    /// Log filter: error, warn, info, debug, trace, or a tracing directive
    /// [default: info; env: RUST_LOG].
    #[arg(long, value_name = "LEVEL", value_parser = parse_log_flag)]
    pub log: Option<String>,

    /// Log format.
    #[arg(long, value_name = "FORMAT")]
    pub log_format: Option<LogFormat>,
}

/// `--mem-budget`: a size of at least one byte.
fn parse_mem_budget_flag(text: &str) -> Result<u64, FlagError> {
    let bytes = parse_size(text).map_err(|reason| FlagError::Size { reason })?;
    Ok(config::check_mem_budget(bytes)?)
}

/// `--max-connections`: at least 1.
fn parse_max_connections_flag(text: &str) -> Result<usize, FlagError> {
    let n = text
        .trim()
        .parse()
        .map_err(|source| FlagError::NotANumber {
            text: text.to_owned(),
            source,
        })?;
    Ok(config::check_max_connections(n)?)
}

/// `--log`: a known level or directives.
fn parse_log_flag(text: &str) -> Result<String, FlagError> {
    Ok(config::check_log_filter(text)?)
}

/// Why a daemon flag's value was refused (clap prints it after the flag).
#[derive(Debug, thiserror::Error)]
pub enum FlagError {
    /// Not a size (the size parser's reason).
    #[error("{reason}")]
    Size { reason: String },
    /// Not a whole number.
    #[error("'{text}' is not a number: {source}")]
    NotANumber {
        text: String,
        source: std::num::ParseIntError,
    },
    /// A value out of range.
    #[error(transparent)]
    Value(#[from] config::DaemonValueError),
}

/// Why the daemon could not start (or stopped with an error).
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A `--drive` flag is malformed.
    #[error("--drive {spec}: {reason}")]
    DriveFlag { spec: String, reason: String },
    /// A drive given twice.
    #[error("drive '{0}' is given twice (in the config and/or --drive)")]
    Duplicate(String),
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The runtime directory (or a socket's directory) is not the daemon's
    /// own.
    #[error(transparent)]
    RuntimeDir(#[from] crate::paths::DirError),
    /// The state directory is not private to the daemon's user.
    #[error(transparent)]
    StateDir(#[from] persistent::modes::StateModeError),
    /// A start-up drive could not be created.
    #[error("cannot create drive '{name}': {source}")]
    Drive {
        name: String,
        source: Box<RegistryError>,
    },
    /// A drive or cache declared in the config file could not be created
    /// (the message names its declaration).
    #[error("{path}:{line}:{column}: {message}")]
    Declared {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    /// The NBD listeners could not be bound.
    #[error("cannot start the NBD server: {0}")]
    Nbd(std::io::Error),
    /// The API socket could not be bound.
    #[error("cannot listen on the API socket {path}: {source}")]
    Api {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Threads or the runtime could not start.
    #[error("cannot start: {0}")]
    Start(std::io::Error),
    /// A start-up cache could not be created.
    #[error("cannot create cache '{name}': {source}")]
    Cache { name: String, source: CachesError },
    /// At shutdown, dirty data of caches could not reach their backing;
    /// one description per cache (rescued where, or lost).
    #[error("stopped, but dirty cache data did not reach its backing: {}", failed.join("; "))]
    CacheData { failed: Vec<String> },
    /// Directories in RAM could not be brought up.
    #[error(transparent)]
    Dirs(#[from] DirsError),
}

/// Settings after flags, config and defaults are merged.
#[derive(Debug, Clone)]
pub struct Settings {
    pub api_socket: PathBuf,
    pub nbd_socket: PathBuf,
    pub state_dir: PathBuf,
    pub nbd_listen: Vec<SocketAddr>,
    /// None: the default fraction of MemAvailable.
    pub mem_budget_bytes: Option<u64>,
    pub max_connections: usize,
    pub poll_us: u32,
    pub keep_cpu_awake: bool,
    pub metrics: bool,
    pub log: Option<String>,
    pub log_format: LogFormat,
    /// Drives to create at start, with where each was declared.
    pub drives: Vec<(DriveSpec, Origin)>,
    /// The config file read, if any.
    pub config_path: Option<PathBuf>,
    /// Caches to create at start (from the config).
    pub caches: Vec<CacheSpec>,
    /// The runtime directory (directories in RAM keep their mounts in
    /// `dirs/` there).
    pub runtime_dir: PathBuf,
    /// Directories to keep in RAM, from the config.
    pub dirs: Vec<DirSpec>,
    /// Where the config declares each drive and cache (line, column).
    pub declared_at: std::collections::BTreeMap<String, (usize, usize)>,
}

impl Settings {
    /// Merges flags over the config over defaults.
    pub fn resolve(args: &DaemonArgs) -> Result<Settings, DaemonError> {
        let config = match (&args.config, args.no_config) {
            (Some(path), _) => config::load(path)?,
            (None, false) if Path::new(config::DEFAULT_CONFIG_PATH).exists() => {
                config::load(Path::new(config::DEFAULT_CONFIG_PATH))?
            }
            _ => Config::default(),
        };
        let c = &config.daemon;
        let runtime = args
            .runtime_dir
            .clone()
            .unwrap_or_else(crate::paths::runtime_dir);
        let in_runtime = |f: &str| runtime.join(f);
        let mut drives: Vec<(DriveSpec, Origin)> = Vec::new();
        let origin = config
            .path
            .clone()
            .map_or(Origin::CommandLine, Origin::Config);
        for d in &config.drives {
            drives.push((d.clone(), origin.clone()));
        }
        for s in &args.drives {
            let d = parse_drive_spec(s).map_err(|e| DaemonError::DriveFlag {
                spec: s.clone(),
                reason: e.to_string(),
            })?;
            if drives.iter().any(|(x, _)| x.name == d.name) {
                return Err(DaemonError::Duplicate(d.name));
            }
            drives.push((d, Origin::CommandLine));
        }
        if drives.is_empty() && config.path.is_none() && !args.no_default_drive {
            let d = parse_drive_spec("ram0=1G").expect("the default drive spec is valid");
            drives.push((d, Origin::CommandLine));
        }
        Ok(Settings {
            api_socket: args
                .api_socket
                .clone()
                .or(c.api_socket.clone())
                .unwrap_or_else(|| in_runtime("api.sock")),
            nbd_socket: args
                .nbd_socket
                .clone()
                .or(c.nbd_socket.clone())
                .unwrap_or_else(|| in_runtime("nbd.sock")),
            state_dir: args
                .state_dir
                .clone()
                .or(c.state_dir.clone())
                .unwrap_or_else(crate::paths::state_dir),
            nbd_listen: if args.nbd_listen.is_empty() {
                c.nbd_listen.clone().unwrap_or_default()
            } else {
                args.nbd_listen.clone()
            },
            mem_budget_bytes: args.mem_budget.or(c.mem_budget.map(|s| s.0)),
            max_connections: args.max_connections.or(c.max_connections).unwrap_or(256),
            poll_us: args
                .poll_us
                .or(c.poll_us)
                .unwrap_or(crate::nbd::server::DEFAULT_POLL_US),
            keep_cpu_awake: args.keep_cpu_awake.or(c.keep_cpu_awake).unwrap_or(false),
            metrics: args.metrics.or(c.metrics).unwrap_or(true),
            log: args.log.clone().or(c.log.clone()),
            log_format: args.log_format.or(c.log_format).unwrap_or_default(),
            drives,
            config_path: config.path,
            caches: config.caches,
            runtime_dir: runtime,
            dirs: config.dirs,
            declared_at: config.declared_at,
        })
    }
}

impl Settings {
    /// `message` as an error at the config line declaring `name`, when
    /// it comes from the config.
    fn declared(&self, name: &str, origin: &Origin, message: &str) -> Option<DaemonError> {
        let (Origin::Config(path), Some(&(line, column))) = (origin, self.declared_at.get(name))
        else {
            return None;
        };
        Some(DaemonError::Declared {
            path: path.clone(),
            line,
            column,
            message: message.to_owned(),
        })
    }
}

/// What the API handlers share: the running daemon.
pub struct Daemon {
    pub registry: Arc<Registry>,
    pub attachments: Attachments,
    pub settings: Settings,
    /// TCP addresses actually bound (ports resolved).
    pub tcp_addrs: Vec<SocketAddr>,
    pub started: Instant,
    pub started_unix_s: u64,
    pub sampler: Arc<Sampler>,
    /// RAM caches in front of slower disks.
    pub caches: Arc<Caches>,
    /// Directories kept in RAM.
    pub dirs: Arc<Dirs>,
}

impl Daemon {
    /// The unix-socket NBD URI of a drive.
    pub fn unix_uri(&self, name: &str) -> String {
        format!(
            "nbd+unix:///{name}?socket={}",
            self.settings.nbd_socket.display()
        )
    }

    /// The TCP NBD URIs of a drive (one per listener).
    pub fn tcp_uris(&self, name: &str) -> Vec<String> {
        self.tcp_addrs
            .iter()
            .map(|a| format!("nbd://{a}/{name}"))
            .collect()
    }
}

/// Blocks SIGINT and SIGTERM in this thread and every thread spawned after
/// (call first), returning the set for `sigwait`.
fn block_shutdown_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data initialised by sigemptyset before use;
    // pthread_sigmask only changes this thread's mask (inherited by threads
    // spawned later).
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// Makes sure the directories the lock and sockets go into are the
/// daemon's own (`paths::ensure_runtime_dir`; a socket directory named
/// on the command line: `paths::ensure_socket_dir`).
fn secure_socket_dirs(s: &Settings) -> Result<(), DaemonError> {
    crate::paths::ensure_runtime_dir(&s.runtime_dir)?;
    for sock in [&s.api_socket, &s.nbd_socket] {
        if let Some(dir) = sock.parent().filter(|d| !d.as_os_str().is_empty()) {
            if dir != s.runtime_dir {
                crate::paths::ensure_socket_dir(dir)?;
            }
        }
    }
    Ok(())
}

/// Binds the API socket with mode 0600, whatever the umask: the socket's
/// inode gets 0600 before `bind` (Linux creates the file with the
/// socket's mode minus the umask), and the file exactly 0600 right after.
/// The process umask is never touched (other threads run by now).
fn bind_api(path: &Path) -> Result<std::os::unix::net::UnixListener, DaemonError> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    let err = |source| DaemonError::Api {
        path: path.to_owned(),
        source,
    };
    let last = || std::io::Error::last_os_error();
    // The pid lock is held: a socket file here is a dead daemon's.
    if std::fs::symlink_metadata(path).is_ok() {
        std::fs::remove_file(path).map_err(err)?;
    }
    // SAFETY: socket(2) takes no pointers; the fd is owned right away.
    let raw = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(err(last()));
    }
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: fchmod on a descriptor we own; no memory is passed.
    if unsafe { libc::fchmod(fd.as_raw_fd(), 0o600) } != 0 {
        return Err(err(last()));
    }
    // SAFETY: sockaddr_un is plain data; zeroed is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() {
        return Err(err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("the path is longer than {} bytes", addr.sun_path.len() - 1),
        )));
    }
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    // SAFETY: `addr` is an initialised sockaddr_un, NUL-terminated within
    // `len` bytes, and outlives the call.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            std::ptr::addr_of!(addr).cast::<libc::sockaddr>(),
            len as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(err(last()));
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    // SAFETY: listen on a bound socket we own.
    if unsafe { libc::listen(fd.as_raw_fd(), 128) } != 0 {
        return Err(err(last()));
    }
    Ok(std::os::unix::net::UnixListener::from(fd))
}

/// The registry with every drive the settings declare (and those stored
/// in the state directory), then the cache registry with every declared
/// cache (drives and caches share export names).
fn create_declared(
    settings: &Settings,
    exports: &Arc<ExportTable>,
    budget: &Arc<MemoryBudget>,
) -> Result<(Arc<Registry>, Arc<Caches>), DaemonError> {
    let registry = Arc::new(
        Registry::new(exports.clone(), budget.clone(), settings.metrics)
            .with_state_dir(settings.state_dir.clone()),
    );
    for (spec, origin) in &settings.drives {
        registry.create(spec, origin.clone()).map_err(|source| {
            let message = format!("cannot create drive '{}': {source}", spec.name);
            settings
                .declared(&spec.name, origin, &message)
                .unwrap_or(DaemonError::Drive {
                    name: spec.name.clone(),
                    source: Box::new(source),
                })
        })?;
    }
    // Persistent drives created through the API (or no longer declared)
    // come back too; restores run in the background, READY=1 waits.
    persistent::restore_stored(&registry, settings);
    // Caches after every drive (drives and caches share export names).
    let caches = Arc::new(Caches::new(
        exports.clone(),
        registry.clone(),
        settings.metrics,
    ));
    let cache_origin = settings
        .config_path
        .clone()
        .map_or(Origin::CommandLine, Origin::Config);
    for spec in &settings.caches {
        caches
            .create_at_start(spec.clone(), cache_origin.clone())
            .map_err(|source| {
                let message = format!("cannot create cache '{}': {source}", spec.name);
                settings
                    .declared(&spec.name, &cache_origin, &message)
                    .unwrap_or(DaemonError::Cache {
                        name: spec.name.clone(),
                        source,
                    })
            })?;
    }
    Ok((registry, caches))
}

/// An error naming every cache whose dirty data did not reach its
/// backing at shutdown (rescued where, or lost).
fn cache_shutdown_result(
    outcomes: &[(String, caches::shutdown::Outcome)],
) -> Result<(), DaemonError> {
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|(_, o)| o.failed())
        .map(|(name, o)| match o {
            caches::shutdown::Outcome::Rescued {
                saved_bytes, dir, ..
            } => format!(
                "cache '{name}': {} of dirty data saved to {} (run its apply.sh once the backing works)",
                format_size(*saved_bytes),
                dir.display()
            ),
            _ => format!("cache '{name}': dirty data LOST (see the log)"),
        })
        .collect();
    if !failed.is_empty() {
        tracing::error!(
            "stopped, but not every cache could write back: {}",
            failed.join("; ")
        );
        return Err(DaemonError::CacheData { failed });
    }
    Ok(())
}

/// The NBD server bound to the settings' sockets. A refused bind leaves
/// no socket behind (one bound by a listener that failed after it, say a
/// TCP port in use).
fn bind_nbd(settings: &Settings, exports: Arc<ExportTable>) -> Result<Server, DaemonError> {
    let mut nbd_config = ServerConfig::new(&settings.nbd_socket);
    nbd_config.tcp = settings.nbd_listen.clone();
    nbd_config.max_connections = settings.max_connections;
    nbd_config.poll_us = settings.poll_us;
    nbd_config.keep_cpu_awake = settings.keep_cpu_awake;
    let nbd_before = file_id(&settings.nbd_socket);
    Server::bind(nbd_config, exports).map_err(|e| {
        if file_id(&settings.nbd_socket) != nbd_before {
            remove_if_socket(&settings.nbd_socket);
        }
        DaemonError::Nbd(e)
    })
}

/// A thread that waits for SIGTERM/SIGINT (`signals`, blocked in every
/// thread) and then tells systemd and the API to stop.
fn spawn_signal_waiter(
    signals: libc::sigset_t,
    stop_tx: tokio::sync::watch::Sender<bool>,
) -> Result<(), DaemonError> {
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut sig: libc::c_int = 0;
            // SAFETY: `signals` is an initialised sigset and `sig` a valid
            // out pointer; the signals are blocked in every thread.
            unsafe { libc::sigwait(&signals, &mut sig) };
            tracing::info!("signal {sig}: finishing open requests and shutting down");
            let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
            let _ = stop_tx.send(true);
        })
        .map_err(DaemonError::Start)?;
    Ok(())
}

/// READY=1 to systemd once no drive is restoring (the API answers
/// meanwhile).
fn notify_ready_when_restored(registry: &Registry) {
    persistent::wait_restores(registry);
    let _ = sd_notify::notify(
        false,
        &[
            sd_notify::NotifyState::Ready,
            sd_notify::NotifyState::Status(&format!("serving {} drive(s)", registry.list().len())),
        ],
    );
}

/// Syncs and releases the directories in RAM, telling systemd so.
fn stop_dirs(dirs: &Dirs) {
    if !dirs.manager.paths().is_empty() {
        let _ = sd_notify::notify(
            false,
            &[sd_notify::NotifyState::Status(
                "syncing directories to disk",
            )],
        );
    }
    dirs.stop();
}

/// Runs the daemon until SIGTERM/SIGINT.
pub fn run(args: DaemonArgs) -> Result<(), DaemonError> {
    let signals = block_shutdown_signals();
    let settings = Settings::resolve(&args)?;
    logging::init(settings.log.as_deref(), settings.log_format);
    secure_socket_dirs(&settings)?;
    let _lock = PidLock::acquire(&settings.api_socket)?;
    // Each narrowed mode is logged (WARN) where it is fixed.
    persistent::modes::secure_state_dir(&settings.state_dir)?;

    let budget = Arc::new(match settings.mem_budget_bytes {
        Some(b) => MemoryBudget::new(b),
        None => MemoryBudget::default_daemon(),
    });
    let exports = Arc::new(ExportTable::new());
    let (registry, caches) = create_declared(&settings, &exports, &budget)?;

    // A refused start leaves no socket behind: from here on the NBD and
    // API sockets, until the daemon serves.
    let server = bind_nbd(&settings, exports)?;
    let mut bound = BoundSockets {
        paths: [settings.nbd_socket.as_path(), settings.api_socket.as_path()],
        serving: false,
    };
    let nbd_handle = server.shutdown_handle();
    registry.set_nbd(nbd_handle.clone());
    caches.set_nbd(nbd_handle.clone());
    let tcp_addrs = server.tcp_addrs().to_vec();

    let api_listener = bind_api(&settings.api_socket)?;
    api_listener
        .set_nonblocking(true)
        .map_err(DaemonError::Start)?;
    // Before the API serves and before READY=1: every directory is in RAM
    // (or listed as failed) before anything may use it. API requests made
    // meanwhile wait in the listen queue.
    let dirs = Dirs::start(
        settings.runtime_dir.join("dirs"),
        settings.state_dir.join("dirs"),
        settings.config_path.as_deref(),
        &settings.dirs,
    )
    .inspect_err(|_| remove_if_socket(&settings.api_socket))?;

    let daemon = Arc::new(Daemon {
        registry: registry.clone(),
        attachments: Attachments::new(),
        settings: settings.clone(),
        tcp_addrs,
        started: Instant::now(),
        started_unix_s: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        sampler: Arc::new(Sampler::new()),
        caches: caches.clone(),
        dirs: Arc::new(dirs),
    });

    let nbd_thread = std::thread::Builder::new()
        .name("nbd-accept".into())
        .spawn(move || server.run())
        .map_err(DaemonError::Start)?;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("ramd-api")
        .enable_all()
        .build()
        .map_err(DaemonError::Start)?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    spawn_signal_waiter(signals, stop_tx)?;

    bound.serving = true;
    announce(&daemon);
    let served = runtime.block_on(async {
        let listener = tokio::net::UnixListener::from_std(api_listener)?;
        tokio::spawn(daemon.sampler.clone().run(daemon.registry.clone()));
        tokio::spawn(caches::sample_loop(daemon.caches.clone()));
        // READY=1 once no drive is restoring (the API answers meanwhile).
        let r = daemon.registry.clone();
        tokio::task::spawn_blocking(move || notify_ready_when_restored(&r));
        let mut stop = stop_rx;
        crate::api::serve(listener, daemon.clone(), async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .await
    });
    if let Err(e) = &served {
        tracing::error!("API server failed: {e}");
    }
    // No more API requests: sync and release the directories in RAM (the
    // systemd unit's stop ordering relies on this happening before exit).
    stop_dirs(&daemon.dirs);
    // The API has stopped; now NBD: finish in-flight requests, close.
    nbd_handle.shutdown();
    match nbd_thread.join() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!("NBD server: {e}"),
        Err(_) => tracing::error!("NBD server thread panicked"),
    }
    daemon.attachments.shutdown();
    // No client can write any more: save every persistent drive, and
    // write every cache back (bounded, loud).
    registry.shutdown_persistent();
    let outcomes = daemon
        .caches
        .shutdown(&settings.state_dir.join("cache-rescue"));
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    remove_if_socket(&settings.api_socket);
    cache_shutdown_result(&outcomes)?;
    tracing::info!("stopped");
    Ok(())
}

/// The sockets a start has bound, removed again when the start is
/// refused (dropped before `serving` is set).
struct BoundSockets<'a> {
    paths: [&'a Path; 2],
    serving: bool,
}

impl Drop for BoundSockets<'_> {
    fn drop(&mut self) {
        if !self.serving {
            for p in self.paths {
                remove_if_socket(p);
            }
        }
    }
}

/// Device and inode of a file (None: no file), to tell a socket this
/// process bound from one that was there before.
fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

fn remove_if_socket(path: &Path) {
    use std::os::unix::fs::FileTypeExt;
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = std::fs::remove_file(path);
    }
}

/// Tells the user where everything is and what to try.
fn announce(d: &Daemon) {
    let s = &d.settings;
    let drives = d.registry.list();
    tracing::info!(
        "ramd {} ready: {} drive(s), memory budget {}, API {}",
        env!("CARGO_PKG_VERSION"),
        drives.len(),
        format_size(d.registry.budget().limit_bytes()),
        s.api_socket.display()
    );
    if let Some(p) = &s.config_path {
        tracing::info!("config: {}", p.display());
    }
    for c in d.caches.list() {
        tracing::info!(
            "cache {} ({}, {}) at {}",
            c.name,
            c.spec.summary(),
            c.state().name(),
            d.unix_uri(&c.name)
        );
    }
    let dirs = d.dirs.manager.paths();
    if !dirs.is_empty() {
        tracing::info!(
            "{} director{} in RAM (ramd dir list)",
            dirs.len(),
            if dirs.len() == 1 { "y" } else { "ies" }
        );
    }
    for drive in &drives {
        tracing::info!(
            "drive {} ({}{}) at {}",
            drive.name,
            format_size(drive.size_bytes()),
            if drive.export.is_read_only() {
                ", read-only"
            } else {
                ""
            },
            d.unix_uri(&drive.name)
        );
        for uri in d.tcp_uris(&drive.name) {
            tracing::info!("drive {} also at {uri}", drive.name);
        }
    }
    let client_env = if s.api_socket == crate::paths::api_socket() {
        String::new()
    } else {
        format!("RAMD_API_SOCKET={} ", s.api_socket.display())
    };
    if let Some(first) = drives.first() {
        tracing::info!("try: nbdinfo '{}'", d.unix_uri(&first.name));
        tracing::info!(
            "attach as a file: mkdir -p /mnt/{n} && {client_env}ramd attach {n} /mnt/{n} && losetup -f --show /mnt/{n}/{n}",
            n = first.name
        );
    }
    tracing::info!("manage: {client_env}ramd list | ramd create NAME --size 4G | ramd stats --watch   (stop with Ctrl-C)");
}
