//! The daemon: one process holding every drive, the NBD listeners and the
//! REST API.
//!
//! # Invariants
//!
//! - Every named object (drive, cache) holds one claim in the ledger
//!   (`ledger.rs`), which keeps the rules they share: one namespace, the
//!   memory budget promised at most once, the export table, the delete
//!   rule. Kinds keep only what is theirs, so a new kind adds a module,
//!   not a copy of those rules.
//! - A declared object that cannot be created stops the start (naming its
//!   config line); READY=1 goes out only once every declared object exists
//!   and no drive is restoring, so services ordered after ramd find their
//!   data.
//! - Shutdown never drops data silently: whatever a cache could not write
//!   back is saved to a rescue file or reported, and the exit status is 1.
//! - The API depends on this module, never the reverse: `run.rs` is the
//!   only file that wires the API server, the listeners and shutdown.
//!
//! ```text
//!  main thread ── start-up: settings (flags > config > defaults), pid lock,
//!     │           drives, NBD bind, API bind ── READY=1 ── tokio runtime:
//!     │                                                  API server + sampler
//!  thread "nbd-accept"  NBD server: accept, one thread per connection
//!  thread "signals"     sigwait(SIGINT, SIGTERM) ─► shutdown
//!                       sigwait(SIGHUP) ─► reload the TLS certificates
//! ```
//!
//! Start-up: persistent drives (declared, or found in STATE_DIR/drives)
//! restore in the background while the API and NBD already serve; READY=1
//! goes to systemd once none is restoring (`run::wait_restores`).
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
//!
//! This file holds what the daemon *is* (settings, errors, the shared
//! [`Daemon`] state the API handlers take); `run.rs` is the one place that
//! wires it up (locks, drives, listeners, the API server, shutdown), so
//! the API can depend on the daemon without the daemon depending on it.
//!
//! ```text
//!  ledger.rs   names (one namespace for every kind), origins, budget
//!              promises, the export table, the delete rule, shared errors
//!     ▲  ▲
//!  drives/   caches/     one module per kind of named object: its objects,
//!                        states and I/O; each claims its names in the ledger
//!  dirs.rs               directories in RAM (paths, not named objects:
//!                        their manager keeps its own rules)
//!  spec.rs               values every kind parses alike (intervals)
//!  config.rs             the config file, parsed into the kinds' specs
//! ```

pub mod access;
pub mod api_listen;
pub mod caches;
pub mod config;
pub mod dirs;
pub mod drives;
pub mod fds;
pub mod kept_attachments;
pub mod ledger;
pub mod listen_addr;
pub mod lock;
pub mod logging;
pub mod nvme_listen;
pub mod pressure;
pub mod remotes;
pub mod run;
pub mod sampler;
pub mod sessions;
pub mod snapshots;
pub mod spec;
pub mod tokens;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use crate::fuse::Attachments;
use crate::nbd::tls::{ClientCerts, TlsMode, TlsSettings};
use crate::size::parse as parse_size;
use caches::{CacheSpec, Caches, CachesError};
pub use config::LogFormat;
use config::{Config, ConfigError};
use dirs::{DirSpec, Dirs, DirsError};
use drives::spec::{parse_drive_spec, DriveSpec};
use drives::{DriveError, Drives};
use ledger::{Ledger, Origin};
use lock::LockError;
use sampler::Sampler;

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

    /// Run under a small supervisor process that keeps the memory of
    /// every RAM drive and persistent drive (memfds; compressed ones
    /// too), the listening sockets and the I/O counts, and restarts the serving process if it dies (kill -9, a
    /// crash): drives come back with every acknowledged write, persistent
    /// ones with what they had not synced yet, and clients connecting
    /// meanwhile wait instead of being refused. `ramd upgrade` hands over
    /// to a new binary the same way (docs/restart.md). SIGTERM still stops
    /// everything. Under systemd, a unit with FileDescriptorStoreMax= keeps
    /// the same without this flag (contrib/systemd/ramd.service.d/
    /// fdstore.conf.example).
    #[arg(long)]
    pub supervise: bool,

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

    /// Also serve NBD on this TCP address (e.g. 127.0.0.1:10809, or a
    /// host name such as localhost:10809). Without TLS only a loopback
    /// address is allowed, unless --tls off says so. Repeatable.
    #[arg(long = "nbd-listen", value_name = "ADDR", value_parser = listen_addr::parse_listen_addr)]
    pub nbd_listen: Vec<SocketAddr>,

    /// Serve every drive as an NVMe/TCP subsystem on this address
    /// (ADDR[:PORT], port 4420 by default): `nvme discover -t tcp -a ADDR`
    /// lists them. Plaintext (NVMe/TCP TLS is not offered yet), so only a
    /// loopback address unless --nvme-plaintext. Repeatable. docs/nvme.md.
    #[arg(long = "nvme-listen", value_name = "ADDR[:PORT]", value_parser = nvme_listen::parse_nvme_listen)]
    pub nvme_listen: Vec<SocketAddr>,

    /// Serve NVMe/TCP in plaintext on addresses other machines reach (a
    /// trusted network only: anyone who reaches it reads and writes the
    /// drives its access rules allow).
    #[arg(long)]
    pub nvme_plaintext: bool,

    /// Also serve the REST API on this TCP address (e.g. 0.0.0.0:8443),
    /// over TLS with the --tls-certificates, every request needing a
    /// bearer token (`ramd token create`). Plaintext only on a loopback
    /// address with --tls off. See docs/api.md "Remote access". A host
    /// name (localhost:8443) binds the first address it resolves to.
    #[arg(long, value_name = "ADDR", value_parser = listen_addr::parse_listen_addr)]
    pub api_listen: Option<SocketAddr>,

    /// Serve the web dashboard, and the REST API beside it, on this TCP
    /// address (e.g. 127.0.0.1:8080 or localhost:8080): TLS and bearer
    /// tokens as for --api-listen (plaintext only on a loopback address
    /// with --tls off). Open it with the URL `ramd dashboard` prints. See
    /// docs/dashboard.md.
    #[arg(long, value_name = "ADDR", value_parser = listen_addr::parse_listen_addr)]
    pub http: Option<SocketAddr>,

    /// TLS on the TCP listeners: off, on (clients choose) or require
    /// (STARTTLS before anything else) [default: require with
    /// --tls-certificates, else off]. Plaintext on an address other
    /// machines can reach needs an explicit --tls off. See docs/tls.md.
    #[arg(long, value_name = "MODE")]
    pub tls: Option<TlsMode>,

    /// TLS on the NBD unix socket: off, on or require [default: on with
    /// --tls-certificates, else off].
    #[arg(long, value_name = "MODE")]
    pub nbd_socket_tls: Option<TlsMode>,

    /// Certificates directory, laid out like nbdkit's and qemu's:
    /// ca-cert.pem, server-cert.pem, server-key.pem, optional ca-crl.pem.
    /// Reloaded on SIGHUP and by `ramd tls reload`.
    #[arg(long, value_name = "DIR")]
    pub tls_certificates: Option<PathBuf>,

    /// Client certificates signed by ca-cert.pem: require, optional (as
    /// nbdkit's --tls-verify-peer) or off [default: require when the
    /// directory has ca-cert.pem, else off].
    #[arg(long, value_name = "POLICY", value_parser = parse_verify_peer_flag)]
    pub tls_verify_peer: Option<ClientCerts>,

    /// Give the NBD unix socket this group (name or number) and mode 0660,
    /// so its members can use drives without root [default: mode 0600].
    #[arg(long, value_name = "GROUP")]
    pub nbd_socket_group: Option<String>,

    /// A drive to create at start: NAME=SIZE[,mem-limit=SIZE][,read-only]
    /// [,compress=lz4|zstd[:LEVEL]|lz4+zstd[:LEVEL]][,overcommit][,lock-memory]
    /// [,persist][,durability=none|periodic|flush]
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

    /// Most NBD connections from one client address at once (an IP
    /// address; on the unix socket a user other than the daemon's);
    /// more are closed at accept [default: a quarter of
    /// --max-connections, 64 of 256].
    #[arg(long, value_name = "N", value_parser = parse_per_address_flag)]
    pub max_connections_per_address: Option<usize>,

    /// Most NBD connections of one client-certificate identity at once;
    /// more are refused after their TLS handshake [default: a quarter of
    /// --max-connections, 64 of 256].
    #[arg(long, value_name = "N", value_parser = parse_per_identity_flag)]
    pub max_connections_per_identity: Option<usize>,

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
    let bytes = parse_size(text)?;
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

/// `--max-connections-per-address`: at least 1.
fn parse_per_address_flag(text: &str) -> Result<usize, FlagError> {
    let n = parse_count(text)?;
    Ok(config::check_per_client("max_connections_per_address", n)?)
}

/// `--max-connections-per-identity`: at least 1.
fn parse_per_identity_flag(text: &str) -> Result<usize, FlagError> {
    let n = parse_count(text)?;
    Ok(config::check_per_client("max_connections_per_identity", n)?)
}

fn parse_count(text: &str) -> Result<usize, FlagError> {
    text.trim().parse().map_err(|source| FlagError::NotANumber {
        text: text.to_owned(),
        source,
    })
}

/// `--tls-verify-peer`: require, optional or off.
fn parse_verify_peer_flag(text: &str) -> Result<ClientCerts, FlagError> {
    Ok(config::parse_verify_peer(text)?)
}

/// `--log`: a known level or directives.
fn parse_log_flag(text: &str) -> Result<String, FlagError> {
    Ok(config::check_log_filter(text)?)
}

/// Why a daemon flag's value was refused (clap prints it after the flag).
#[derive(Debug, thiserror::Error)]
pub enum FlagError {
    /// Not a size (the size parser's reason).
    #[error(transparent)]
    Size(#[from] crate::size::SizeError),
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
    StateDir(#[from] drives::persistent::modes::StateModeError),
    /// A start-up drive could not be created.
    #[error("cannot create drive '{name}': {source}")]
    Drive {
        name: String,
        source: Box<DriveError>,
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
    /// The NVMe/TCP target did not start.
    #[error(transparent)]
    Nvme(#[from] nvme_listen::NvmeStartError),
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
    /// The TLS settings are refused (certificates that do not load, or
    /// plaintext on a network address not asked for).
    #[error("cannot start the NBD server: {0}")]
    Tls(#[from] crate::nbd::server::TlsSetupError),
    /// The API tokens file cannot be used.
    #[error(transparent)]
    Tokens(#[from] tokens::TokenError),
    /// `--api-listen` refused (no TLS, plaintext off loopback, the bind).
    #[error(transparent)]
    ApiListen(#[from] api_listen::ListenError),
    /// `--nbd-socket-group` names no group, or the socket could not be
    /// given it.
    #[error(transparent)]
    SocketGroup(#[from] SocketGroupError),
    /// Snapshot remotes or settings unusable, or a `restore_from` restore
    /// failed (the drive is not served empty instead).
    #[error(transparent)]
    Snapshots(Box<snapshots::SnapshotsError>),
}

impl From<snapshots::SnapshotsError> for DaemonError {
    fn from(e: snapshots::SnapshotsError) -> Self {
        DaemonError::Snapshots(Box::new(e))
    }
}

/// Why the NBD socket could not be given its group.
#[derive(Debug, thiserror::Error)]
pub enum SocketGroupError {
    /// No group of that name or number.
    #[error("--nbd-socket-group {0}: no such group (see /etc/group; create it with groupadd)")]
    Unknown(String),
    /// The group database could not be read.
    #[error("--nbd-socket-group {group}: cannot look it up: {source}")]
    Lookup {
        group: String,
        source: std::io::Error,
    },
    /// chown or chmod of the socket failed.
    #[error("cannot give {} the group {group}: {source}", path.display())]
    Chown {
        path: PathBuf,
        group: String,
        source: std::io::Error,
    },
}

/// Why `ramd tls reload` (SIGHUP, `POST /v1/tls/reload`) did nothing.
#[derive(Debug, thiserror::Error)]
pub enum TlsReloadError {
    /// The daemon runs without certificates.
    #[error("the daemon has no TLS certificates to reload (start it with --tls-certificates DIR)")]
    NotConfigured,
    /// The directory did not load; the certificates in use stay.
    #[error("{0}; the certificates in use are kept")]
    Load(#[from] crate::nbd::tls::TlsError),
}

/// Settings after flags, config and defaults are merged.
#[derive(Debug, Clone)]
pub struct Settings {
    pub api_socket: PathBuf,
    pub nbd_socket: PathBuf,
    pub state_dir: PathBuf,
    pub nbd_listen: Vec<SocketAddr>,
    /// `--nvme-listen`: the NVMe/TCP target's addresses (none: off).
    pub nvme_listen: Vec<SocketAddr>,
    /// `--nvme-plaintext`: NVMe/TCP on non-loopback addresses allowed.
    pub nvme_plaintext: bool,
    /// `--api-listen`: the API over TCP too.
    pub api_listen: Option<SocketAddr>,
    /// `--http`: the dashboard and the API on TCP.
    pub http: Option<SocketAddr>,
    /// `--tls` (None: not given, see `ServerConfig::tls_mode`).
    pub tls_mode: Option<TlsMode>,
    /// `--nbd-socket-tls` (None: not given).
    pub unix_tls_mode: Option<TlsMode>,
    /// `--tls-certificates`.
    pub tls_certificates: Option<PathBuf>,
    /// `--tls-verify-peer` (None: by whether the directory has a CA).
    pub tls_verify_peer: Option<ClientCerts>,
    /// `--nbd-socket-group` (None: the socket stays 0600).
    pub nbd_socket_group: Option<String>,
    /// None: the default fraction of MemAvailable.
    pub mem_budget_bytes: Option<u64>,
    pub max_connections: usize,
    /// `--max-connections-per-address` (None: the server's default).
    pub max_connections_per_address: Option<usize>,
    /// `--max-connections-per-identity` (None: the server's default).
    pub max_connections_per_identity: Option<usize>,
    pub poll_us: u32,
    pub keep_cpu_awake: bool,
    pub metrics: bool,
    /// When host memory counts as short (`control::pressure`).
    pub pressure: pressure::Thresholds,
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
    /// Snapshot remotes from the config.
    pub remotes: Vec<remotes::RemoteSpec>,
    /// Per-drive snapshot settings, from the config.
    pub snapshot_policies: std::collections::BTreeMap<String, snapshots::DrivePolicy>,
    /// Drives attached as ublk block devices at start (the config's
    /// `attach = "ublk"`).
    pub attach_ublk: Vec<String>,
    /// What requests over TCP may name on this host (`[api]`).
    pub api_policy: config::ApiPolicy,
}

/// `path` made absolute against the working directory at start, with `.`
/// and `..` taken out lexically (mount tables and URIs hold such paths).
/// Symbolic links are not followed: the runtime and state directories are
/// checked as given (a link there is refused, `paths::ensure_runtime_dir`).
fn absolute(path: PathBuf) -> PathBuf {
    let Ok(abs) = std::path::absolute(&path) else {
        return path;
    };
    let mut out = PathBuf::new();
    for c in abs.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
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
        // Every directory and socket absolute from here on: mounts, URIs
        // and later requests must not depend on the working directory.
        let runtime = absolute(
            args.runtime_dir
                .clone()
                .unwrap_or_else(crate::paths::runtime_dir),
        );
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
                .map_or_else(|| in_runtime("api.sock"), absolute),
            nbd_socket: args
                .nbd_socket
                .clone()
                .or(c.nbd_socket.clone())
                .map_or_else(|| in_runtime("nbd.sock"), absolute),
            state_dir: absolute(
                args.state_dir
                    .clone()
                    .or(c.state_dir.clone())
                    .unwrap_or_else(crate::paths::state_dir),
            ),
            nbd_listen: if args.nbd_listen.is_empty() {
                c.nbd_listen.clone().unwrap_or_default()
            } else {
                args.nbd_listen.clone()
            },
            nvme_listen: if args.nvme_listen.is_empty() {
                c.nvme_listen.clone().unwrap_or_default()
            } else {
                args.nvme_listen.clone()
            },
            nvme_plaintext: args.nvme_plaintext || c.nvme_plaintext.unwrap_or(false),
            api_listen: args.api_listen.or(c.api_listen),
            http: args.http.or(c.http),
            tls_mode: args.tls.or(c.tls),
            unix_tls_mode: args.nbd_socket_tls.or(c.nbd_socket_tls),
            tls_certificates: args
                .tls_certificates
                .clone()
                .or(c.tls_certificates.clone())
                .map(absolute),
            tls_verify_peer: args.tls_verify_peer.or(c.tls_verify_peer),
            nbd_socket_group: args.nbd_socket_group.clone().or(c.nbd_socket_group.clone()),
            mem_budget_bytes: args.mem_budget.or(c.mem_budget.map(|s| s.0)),
            max_connections: args.max_connections.or(c.max_connections).unwrap_or(256),
            max_connections_per_address: args
                .max_connections_per_address
                .or(c.max_connections_per_address),
            max_connections_per_identity: args
                .max_connections_per_identity
                .or(c.max_connections_per_identity),
            poll_us: args
                .poll_us
                .or(c.poll_us)
                .unwrap_or(crate::nbd::server::DEFAULT_POLL_US),
            keep_cpu_awake: args.keep_cpu_awake.or(c.keep_cpu_awake).unwrap_or(false),
            metrics: args.metrics.or(c.metrics).unwrap_or(true),
            pressure: pressure_thresholds(c),
            log: args.log.clone().or(c.log.clone()),
            log_format: args.log_format.or(c.log_format).unwrap_or_default(),
            drives,
            config_path: config.path,
            caches: config.caches,
            runtime_dir: runtime,
            dirs: config.dirs,
            declared_at: config.declared_at,
            remotes: config.remotes,
            api_policy: config.api,
            snapshot_policies: config.snapshot_policies,
            attach_ublk: config.attach_ublk,
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
    /// Every named object's name, origin and budget promise.
    pub ledger: Arc<Ledger>,
    /// The drives (the field keeps the name the API handlers use).
    pub drives: Arc<Drives>,
    pub attachments: Attachments,
    /// Drives attached as ublk block devices (`ramd attach --ublk`).
    pub ublk: crate::ublk::Devices,
    pub settings: Settings,
    /// TCP addresses actually bound (ports resolved).
    pub tcp_addrs: Vec<SocketAddr>,
    /// The NVMe/TCP node id when the target runs (drives' NQNs carry it).
    pub nvme_node: Option<String>,
    /// The NVMe/TCP target when it runs (the hosts connected per drive).
    pub nvme_target: Option<Arc<crate::nvme::Target>>,
    pub started: Instant,
    pub started_unix_s: u64,
    pub sampler: Arc<Sampler>,
    /// RAM caches in front of slower disks.
    pub caches: Arc<Caches>,
    /// Directories kept in RAM.
    pub dirs: Arc<Dirs>,
    /// The NBD server's certificates (None: no --tls-certificates), shared
    /// with the server so a reload reaches new connections.
    pub tls: Option<Arc<TlsSettings>>,
    /// The TLS mode of the TCP listeners, as the server resolved it (the
    /// URIs it shows: `nbds://` when TLS is required).
    pub tcp_tls_mode: TlsMode,
    /// The TLS mode of the unix socket: `nbds+unix://` URIs when required
    /// (a plain client cannot use the socket then).
    pub unix_tls_mode: TlsMode,
    /// NBD clients refused so far, by reason (`ramd_nbd_refusals_total`),
    /// counted by the server.
    pub nbd_refusals: Arc<crate::nbd::access::Refusals>,
    /// Bearer tokens of the API over TCP (`--api-listen`, `--http`).
    pub tokens: Arc<tokens::Tokens>,
    /// The dashboard's sign-in codes and sessions (memory only).
    pub sessions: Arc<sessions::Sessions>,
    /// Where the dashboard is served (`--http`), once bound.
    pub http: Option<api_listen::HttpEndpoint>,
    /// Turns true when the daemon stops: endless responses (the event
    /// stream) end then, so the API's graceful shutdown does not wait
    /// for them.
    pub stopping: tokio::sync::watch::Receiver<bool>,
    /// Snapshot remotes, pushes, restores and their state.
    pub snapshots: Arc<snapshots::Snapshots>,
    /// The memory-pressure watcher's state.
    pub pressure: Arc<pressure::Pressure>,
}

/// The pressure thresholds: the config's, else the defaults for this host.
fn pressure_thresholds(c: &config::DaemonSection) -> pressure::Thresholds {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let total = pressure::meminfo_field(&meminfo, "MemTotal").unwrap_or(0);
    let mut t = pressure::Thresholds::defaults(total);
    if let Some(s) = c.pressure_min_available {
        t.min_available_bytes = s.0;
    }
    if let Some(pct) = c.pressure_full_avg10 {
        t.full_avg10_pct = pct;
    }
    t
}

impl Daemon {
    /// The unix-socket NBD URI of a drive.
    pub fn unix_uri(&self, name: &str) -> String {
        let scheme = match self.unix_tls_mode {
            TlsMode::Require => "nbds+unix",
            TlsMode::Off | TlsMode::On => "nbd+unix",
        };
        format!(
            "{scheme}:///{name}?socket={}",
            self.settings.nbd_socket.display()
        )
    }

    /// The TCP NBD URIs of a drive (one per listener): `nbds://` when
    /// the listeners require TLS.
    pub fn tcp_uris(&self, name: &str) -> Vec<String> {
        let scheme = match self.tcp_tls_mode {
            TlsMode::Require => "nbds",
            TlsMode::Off | TlsMode::On => "nbd",
        };
        self.tcp_addrs
            .iter()
            .map(|a| format!("{scheme}://{a}/{name}"))
            .collect()
    }

    /// Reads the certificates directory again for new connections (SIGHUP,
    /// `POST /v1/tls/reload`); sessions already running keep theirs, and on
    /// an error the certificates in use stay. Returns the directory.
    pub fn reload_tls(&self) -> Result<PathBuf, TlsReloadError> {
        let tls = self.tls.as_ref().ok_or(TlsReloadError::NotConfigured)?;
        tls.reload().inspect_err(|e| {
            tracing::error!("TLS reload failed, the certificates in use are kept: {e}");
        })?;
        Ok(tls.dir().to_owned())
    }
}
