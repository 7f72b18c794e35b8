//! The declarative config file (TOML), parsed strictly.
//!
//! Every key is documented in docs/config.md. Unknown keys, wrong types,
//! bad sizes, bad names and duplicate drives are errors that name the file,
//! the line and the column (`FILE:LINE:COL: reason`), so the daemon refuses
//! to start on a config it would misread.
//!
//! ```toml
//! [daemon]
//! api_socket = "/run/ramd/api.sock"
//! nbd_socket = "/run/ramd/nbd.sock"
//! state_dir = "/var/lib/ramd"
//! nbd_listen = ["127.0.0.1:10809"]
//! api_listen = "0.0.0.0:8443"  # the REST API over TCP: TLS + bearer tokens
//! http = "127.0.0.1:8080"      # the web dashboard (and the API): docs/dashboard.md
//! tls = "require"             # off | on | require (the TCP listeners)
//! nbd_socket_tls = "on"       # off | on | require (the unix socket)
//! tls_certificates = "/etc/ramd/pki"
//! tls_verify_peer = "require" # require | optional | off
//! nbd_socket_group = "ramd"   # the NBD socket: this group, mode 0660
//! mem_budget = "16G"
//! max_connections = 256
//! max_connections_per_address = 64   # default: a quarter of max_connections
//! max_connections_per_identity = 64  # (per client certificate identity)
//! poll_us = 50
//! keep_cpu_awake = false
//! metrics = true
//! log = "info"
//! log_format = "text"
//!
//! [[drive]]
//! name = "ram0"
//! size = "1G"
//! mem_limit = "512M"
//! compress = "lz4"            # lz4 | zstd | zstd:LEVEL | lz4+zstd[:LEVEL] | off
//! read_only = false
//! overcommit = false
//! lock_memory = false          # lock its memory in RAM (never swapped; RLIMIT_MEMLOCK)
//! persist = true              # keep it in STATE_DIR/drives/NAME
//! durability = "flush"        # none | periodic | flush
//! sync_interval = "60s"
//! encrypt = true
//! key_file = "/etc/ramd/ram0.key"
//! allow_identities = ["alice"]         # who may see it (certificate CN or first SAN)
//! read_only_identities = ["bob"]       # ...and who may, read-only
//! allow_networks = ["10.0.0.0/8", "unix"] # from where (CIDRs; "unix": the socket)
//! snapshot_interval = "15m"   # push a snapshot every 15 minutes...
//! snapshot_remote = "s3"      # ...to this [[remote]]
//! snapshot_keep_last = 24     # then prune: keep the 24 newest...
//! snapshot_keep_daily = 7     # ...and one per day for 7 days
//! snapshot_encrypt = false    # encrypt with the remote's encrypt_key_file
//! restore_from = "s3"         # no local state at start: restore the newest
//!
//! [[remote]]
//! name = "s3"
//! url = "s3://bucket/prefix"
//! endpoint = "http://127.0.0.1:3900"   # S3-compatible server (none: AWS)
//! region = "garage"
//! credentials_file = "/etc/ramd/s3.toml" # 0600; else AWS_* in the environment
//! encrypt_key_file = "/etc/ramd/s3.key"
//!
//! [[dir]]
//! path = "/var/log"
//! interval = "10m"
//! overlay = false
//! size_limit = "2G"
//! recovery_generations = 3
//!
//! [[cache]]
//! name = "db"
//! backing = "/dev/sdb"        # a file, a block device or an NBD URI
//! size = "2G"
//! mode = "writeback"
//! block_size = "64K"          # ...and every option of `ramd cache create`
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use toml::Spanned;

use super::caches::{CacheConfigEntry, CacheSpec};
use super::dirs::{DirEntry, DirSpec};
use super::drives::spec::{
    check_compress, check_mem_limit, check_name, parse_compress, parse_drive_size,
    parse_durability, parse_sync_interval_ms, DriveSpec, PersistOptions,
};
use super::ledger::{Kind, Ledger, LedgerError, Origin};
use super::listen_addr::{de_listen_addr, de_listen_addrs};
use super::remotes::{RemoteEntry, RemoteSpec};
use super::snapshots::{DrivePolicy, PolicyKeys};
use crate::nbd::access::AccessRules;
use crate::nbd::tls::{ClientCerts, TlsMode};
use crate::size::Size;
use crate::store::MemoryBudget;

/// The default config file, read when present and no `--config` is given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/ramd/ramd.toml";

/// Why a config file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file holds an S3 secret and group or others may read it.
    #[error("{source} (it holds the S3 secret of remote '{remote}'; or move the secret to a credentials_file)")]
    SecretReadable {
        remote: String,
        source: crate::paths::NotPrivate,
    },
    /// The file is not valid (syntax, unknown key, bad value).
    #[error("{path}:{line}:{column}: {message}")]
    Invalid {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (for journald/log shippers).
    Json,
}

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// Daemon settings.
    #[serde(default)]
    pub daemon: DaemonSection,
    /// Drives created at start.
    #[serde(default, rename = "drive")]
    pub drives: Vec<DriveEntry>,
    /// RAM caches created at start.
    #[serde(default, rename = "cache")]
    pub caches: Vec<CacheConfigEntry>,
    /// Directories kept in RAM (added or restored at start).
    #[serde(default, rename = "dir")]
    pub dirs: Vec<DirEntry>,
    /// Object storage for drive snapshots.
    #[serde(default, rename = "remote")]
    pub remotes: Vec<RemoteEntry>,
    /// What requests over TCP (the API and the dashboard) may name.
    #[serde(default)]
    pub api: ApiSection,
}

/// `[api]`: what a token holder over TCP may name on this host. The unix
/// socket's callers are not limited by it (the socket's permissions and
/// the peer's uid decide); over TCP, a token is not a local shell, so host
/// paths and NBD hosts are refused unless listed here (default: none).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiSection {
    /// Directories inside which TCP requests may name host paths
    /// (mountpoints, cache backings, key and credentials files).
    #[serde(default)]
    pub allowed_paths: Vec<Spanned<PathBuf>>,
    /// Hosts that TCP requests may name in `nbd://` / `nbds://` cache
    /// backings (as written in the URI).
    #[serde(default)]
    pub allowed_backing_hosts: Vec<String>,
}

/// `[daemon]`: each key matches a `ramd daemon` flag, which wins over it.
/// Values that would leave the daemon unusable (a budget of 0, no
/// connection allowed, a log filter that logs nothing) are refused where
/// they are read, so the error names the file, line and column.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonSection {
    pub api_socket: Option<PathBuf>,
    pub nbd_socket: Option<PathBuf>,
    pub state_dir: Option<PathBuf>,
    /// Addresses as `--nbd-listen` takes them (`localhost:10809` too).
    #[serde(default, deserialize_with = "de_listen_addrs")]
    pub nbd_listen: Option<Vec<SocketAddr>>,
    /// Addresses as `--nvme-listen` takes them (port 4420 by default).
    #[serde(default, deserialize_with = "super::nvme_listen::de_nvme_listen")]
    pub nvme_listen: Option<Vec<SocketAddr>>,
    /// `--nvme-plaintext`.
    pub nvme_plaintext: Option<bool>,
    /// The REST API on TCP too (TLS and bearer tokens; docs/api.md).
    #[serde(default, deserialize_with = "de_listen_addr")]
    pub api_listen: Option<SocketAddr>,
    /// The web dashboard and the API on TCP (docs/dashboard.md).
    #[serde(default, deserialize_with = "de_listen_addr")]
    pub http: Option<SocketAddr>,
    /// TLS on every TCP listener (`nbd_listen` is a list of addresses, so
    /// the mode is daemon-wide; the unix socket has its own key).
    #[serde(default, deserialize_with = "de_tls_mode")]
    pub tls: Option<TlsMode>,
    #[serde(default, deserialize_with = "de_tls_mode")]
    pub nbd_socket_tls: Option<TlsMode>,
    pub tls_certificates: Option<PathBuf>,
    #[serde(default, deserialize_with = "de_verify_peer")]
    pub tls_verify_peer: Option<ClientCerts>,
    pub nbd_socket_group: Option<String>,
    #[serde(default, deserialize_with = "de_mem_budget")]
    pub mem_budget: Option<Size>,
    #[serde(default, deserialize_with = "de_max_connections")]
    pub max_connections: Option<usize>,
    #[serde(default, deserialize_with = "de_per_address")]
    pub max_connections_per_address: Option<usize>,
    #[serde(default, deserialize_with = "de_per_identity")]
    pub max_connections_per_identity: Option<usize>,
    pub poll_us: Option<u32>,
    pub keep_cpu_awake: Option<bool>,
    pub metrics: Option<bool>,
    /// Memory is short below this much available (control::pressure).
    pub pressure_min_available: Option<Size>,
    /// Memory is short at this `full avg10` of /proc/pressure/memory (%).
    pub pressure_full_avg10: Option<f64>,
    #[serde(default, deserialize_with = "de_log")]
    pub log: Option<String>,
    pub log_format: Option<LogFormat>,
}

/// Why a `[daemon]` value (or its `ramd daemon` flag) was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DaemonValueError {
    /// A memory budget of 0 bytes.
    #[error("a memory budget of 0 bytes leaves no memory for any drive: give a size like \"16G\" (or leave it out: 75% of MemAvailable)")]
    ZeroBudget,
    /// `max_connections = 0`.
    #[error(
        "max_connections = 0 would refuse every NBD connection: give at least 1 (default 256)"
    )]
    ZeroConnections,
    /// A per-client connection limit of 0.
    #[error("{key} = 0 would refuse every NBD client: give at least 1 (default: a quarter of max_connections)")]
    ZeroPerClient { key: &'static str },
    /// A log filter naming no known level.
    #[error("unknown log level '{0}': use error, warn, info, debug, trace or off, or directives like \"info,ramd::nbd=debug\"")]
    LogLevel(String),
    /// A client-certificate policy that is none of the three.
    #[error("unknown client-certificate policy '{0}': expected require, optional or off")]
    VerifyPeer(String),
}

/// Parses a client-certificate policy (config `tls_verify_peer` or its
/// flag): `require`, `optional` (nbdkit's `--tls-verify-peer`: a
/// certificate shown must be valid) or `off`.
pub fn parse_verify_peer(text: &str) -> Result<ClientCerts, DaemonValueError> {
    match text.trim() {
        "require" => Ok(ClientCerts::Require),
        "optional" => Ok(ClientCerts::Optional),
        "off" => Ok(ClientCerts::Off),
        other => Err(DaemonValueError::VerifyPeer(other.to_owned())),
    }
}

/// The name of a client-certificate policy, as `parse_verify_peer` reads it.
pub fn verify_peer_name(c: ClientCerts) -> &'static str {
    match c {
        ClientCerts::Require => "require",
        ClientCerts::Optional => "optional",
        ClientCerts::Off => "off",
    }
}

fn de_tls_mode<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<TlsMode>, D::Error> {
    String::deserialize(d)?
        .parse()
        .map(Some)
        .map_err(serde::de::Error::custom)
}

fn de_verify_peer<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<ClientCerts>, D::Error> {
    parse_verify_peer(&String::deserialize(d)?)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

/// Checks a memory budget (config key or flag).
pub fn check_mem_budget(bytes: u64) -> Result<u64, DaemonValueError> {
    if bytes == 0 {
        return Err(DaemonValueError::ZeroBudget);
    }
    Ok(bytes)
}

/// Checks a connection limit (config key or flag).
pub fn check_max_connections(n: usize) -> Result<usize, DaemonValueError> {
    if n == 0 {
        return Err(DaemonValueError::ZeroConnections);
    }
    Ok(n)
}

/// Checks a per-client connection limit (config key or flag): `key` is
/// `max_connections_per_address` or `max_connections_per_identity`.
pub fn check_per_client(key: &'static str, n: usize) -> Result<usize, DaemonValueError> {
    if n == 0 {
        return Err(DaemonValueError::ZeroPerClient { key });
    }
    Ok(n)
}

/// Checks a log filter: comma-separated directives, each a level
/// (`error`, `warn`, `info`, `debug`, `trace`, `off`) or `TARGET=LEVEL`.
/// A bare word that is not a level is refused: tracing would take it as
/// a target name and log nothing else.
pub fn check_log_filter(text: &str) -> Result<String, DaemonValueError> {
    use std::str::FromStr;
    use tracing_subscriber::filter::LevelFilter;
    let bad = || DaemonValueError::LogLevel(text.to_owned());
    let is_level = |s: &str| LevelFilter::from_str(s.trim()).is_ok();
    let directives: Vec<&str> = text.split(',').map(str::trim).collect();
    if directives.iter().all(|d| d.is_empty()) {
        return Err(bad());
    }
    for d in directives.into_iter().filter(|d| !d.is_empty()) {
        let ok = match d.rsplit_once('=') {
            Some((target, level)) => !target.trim().is_empty() && is_level(level),
            None => is_level(d),
        };
        if !ok {
            return Err(bad());
        }
    }
    tracing_subscriber::EnvFilter::try_new(text).map_err(|_| bad())?;
    Ok(text.to_owned())
}

fn de_mem_budget<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Size>, D::Error> {
    let s = Size::deserialize(d)?;
    check_mem_budget(s.0)
        .map(|b| Some(Size(b)))
        .map_err(serde::de::Error::custom)
}

fn de_max_connections<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    check_max_connections(usize::deserialize(d)?)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

fn de_per_address<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    check_per_client("max_connections_per_address", usize::deserialize(d)?)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

fn de_per_identity<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    check_per_client("max_connections_per_identity", usize::deserialize(d)?)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

fn de_log<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    check_log_filter(&String::deserialize(d)?)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

/// `[[drive]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DriveEntry {
    pub name: Spanned<String>,
    pub size: Spanned<Size>,
    pub mem_limit: Option<Spanned<Size>>,
    /// `lz4`, `zstd`, `zstd:LEVEL`, `lz4+zstd[:LEVEL]` or `off` (`store::compressed`).
    pub compress: Option<Spanned<String>>,
    #[serde(default)]
    pub read_only: bool,
    #[serde(default)]
    pub overcommit: bool,
    /// Lock its memory in RAM as it is written (never swapped).
    #[serde(default)]
    pub lock_memory: bool,
    /// Keep the drive in the state directory (restored at every start).
    pub persist: Option<Spanned<bool>>,
    /// `none`, `periodic` or `flush`.
    pub durability: Option<Spanned<String>>,
    /// A duration: `"60s"`, `"10m"`, `"500ms"`.
    pub sync_interval: Option<Spanned<String>>,
    /// Encrypt the state directory (needs `key_file`).
    pub encrypt: Option<Spanned<bool>>,
    /// The key: 32 raw bytes or 64 hex digits.
    pub key_file: Option<Spanned<PathBuf>>,
    /// Access rules (`nbd::access`): identities that may see the drive.
    #[serde(default)]
    pub allow_identities: Vec<String>,
    /// Identities that may see it read-only.
    #[serde(default)]
    pub read_only_identities: Vec<String>,
    /// Source networks it may be reached from: CIDRs, `"unix"`.
    #[serde(default)]
    pub allow_networks: Vec<Spanned<String>>,
    /// Scheduled snapshot pushes (`control::snapshots::policy`).
    pub snapshot_interval: Option<Spanned<String>>,
    pub snapshot_remote: Option<String>,
    pub snapshot_keep_last: Option<u64>,
    pub snapshot_keep_daily: Option<u64>,
    #[serde(default)]
    pub snapshot_encrypt: bool,
    /// Restore from this remote at start when the local state is missing.
    pub restore_from: Option<String>,
    /// `"ublk"`: attach the drive as a block device (/dev/ublkbN) at
    /// start; `"none"` (the default): no device.
    pub attach: Option<Spanned<String>>,
}

/// Whether a `[[drive]]` asks for a ublk device at start (`attach`).
fn drive_attach(
    d: &DriveEntry,
    invalid: &impl Fn(usize, String) -> ConfigError,
) -> Result<bool, ConfigError> {
    let Some(v) = &d.attach else {
        return Ok(false);
    };
    match v.get_ref().trim() {
        "ublk" => Ok(true),
        "none" => Ok(false),
        other => Err(invalid(
            v.span().start,
            format!("attach = \"{other}\": give \"ublk\" (a block device /dev/ublkbN at start, docs/attach.md) or \"none\""),
        )),
    }
}

/// The snapshot settings of a `[[drive]]` (None: it has none).
fn drive_policy(
    d: &DriveEntry,
    invalid: &impl Fn(usize, String) -> ConfigError,
) -> Result<Option<DrivePolicy>, ConfigError> {
    let keys = PolicyKeys {
        interval: d.snapshot_interval.as_ref().map(|v| v.get_ref().as_str()),
        remote: d.snapshot_remote.as_deref(),
        keep_last: d.snapshot_keep_last,
        keep_daily: d.snapshot_keep_daily,
        encrypt: d.snapshot_encrypt,
        restore_from: d.restore_from.as_deref(),
    };
    let at = d
        .snapshot_interval
        .as_ref()
        .map_or(d.name.span().start, |v| v.span().start);
    DrivePolicy::from_keys(&keys).map_err(|e| invalid(at, e.to_string()))
}

/// The snapshot settings of a `[[cache]]` (None: it has none).
fn cache_policy(
    c: &CacheConfigEntry,
    invalid: &impl Fn(usize, String) -> ConfigError,
) -> Result<Option<DrivePolicy>, ConfigError> {
    let keys = PolicyKeys {
        interval: c.snapshot_interval.as_ref().map(|v| v.get_ref().as_str()),
        remote: c.snapshot_remote.as_deref(),
        keep_last: c.snapshot_keep_last,
        keep_daily: c.snapshot_keep_daily,
        encrypt: c.snapshot_encrypt,
        restore_from: None,
    };
    let at = c
        .snapshot_interval
        .as_ref()
        .map_or(c.name.span().start, |v| v.span().start);
    DrivePolicy::for_cache(&keys)
        .map_err(|e| invalid(at, format!("cache '{}': {e}", c.name.get_ref())))
}

/// The access rules of a `[[drive]]` (open: it has none); an error points
/// at the network that does not parse, or the drive with an empty
/// identity.
fn drive_access(
    d: &DriveEntry,
    invalid: &impl Fn(usize, String) -> ConfigError,
) -> Result<AccessRules, ConfigError> {
    super::spec::config_access(
        &d.allow_identities,
        &d.read_only_identities,
        &d.allow_networks,
    )
    .map_err(|(at, e)| match at {
        Some(at) => invalid(at, e),
        None => invalid(
            d.name.span().start,
            format!("drive '{}': {e}", d.name.get_ref()),
        ),
    })
}

/// A parsed and checked config.
#[derive(Debug, Default)]
pub struct Config {
    /// The file it came from (None: built-in defaults).
    pub path: Option<PathBuf>,
    /// `[api]`, resolved.
    pub api: ApiPolicy,
    pub daemon: DaemonSection,
    pub drives: Vec<DriveSpec>,
    /// Caches to create at start.
    pub caches: Vec<CacheSpec>,
    /// Directories to keep in RAM, each with where it is declared.
    pub dirs: Vec<DirSpec>,
    /// Snapshot remotes (`[[remote]]`).
    pub remotes: Vec<RemoteSpec>,
    /// Snapshot settings of the drives that have some.
    pub snapshot_policies: BTreeMap<String, DrivePolicy>,
    /// Drives to attach as ublk block devices at start (`attach = "ublk"`).
    pub attach_ublk: Vec<String>,
    /// Line and column of each drive's and cache's `name`, so start-up
    /// refusals (a drive over the budget) can point at the declaration.
    pub declared_at: BTreeMap<String, (usize, usize)>,
}

/// What requests over TCP may name on this host (`[api]`, resolved:
/// directories canonical, so a symbolic link cannot lead out of them).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ApiPolicy {
    pub allowed_paths: Vec<PathBuf>,
    pub allowed_backing_hosts: Vec<String>,
}

/// 1-based line and column of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, column)
}

/// The drive a `[[drive]]` table declares; errors point at the key that
/// is wrong (`invalid` makes them from an offset and a message).
fn drive_spec(
    d: &DriveEntry,
    invalid: &impl Fn(usize, String) -> ConfigError,
) -> Result<DriveSpec, ConfigError> {
    let name = d.name.get_ref();
    let size = d.size.get_ref().0;
    parse_drive_size(&size.to_string()).map_err(|e| invalid(d.size.span().start, e.to_string()))?;
    let mem_limit_bytes = match &d.mem_limit {
        Some(v) => Some(
            check_mem_limit(v.get_ref().0).map_err(|e| invalid(v.span().start, e.to_string()))?,
        ),
        None => None,
    };
    let mut p = PersistOptions {
        persist: d.persist.as_ref().is_some_and(|v| *v.get_ref()),
        encrypt: d.encrypt.as_ref().is_some_and(|v| *v.get_ref()),
        key_file: d.key_file.as_ref().map(|v| v.get_ref().clone()),
        ..PersistOptions::default()
    };
    if let Some(v) = &d.durability {
        p.durability = Some(
            parse_durability(v.get_ref()).map_err(|e| invalid(v.span().start, e.to_string()))?,
        );
    }
    if let Some(v) = &d.sync_interval {
        p.sync_interval_ms = Some(
            parse_sync_interval_ms(v.get_ref())
                .map_err(|e| invalid(v.span().start, e.to_string()))?,
        );
    }
    // Point at the key that made the combination wrong.
    let blame = d
        .key_file
        .as_ref()
        .map(|v| v.span().start)
        .or(d.encrypt.as_ref().map(|v| v.span().start))
        .or(d.durability.as_ref().map(|v| v.span().start))
        .or(d.sync_interval.as_ref().map(|v| v.span().start))
        .unwrap_or(d.name.span().start);
    let persist = p.into_spec().map_err(|e| {
        invalid(
            blame,
            e.to_string()
                .replace("--persist (config: persist = true)", "persist = true")
                .replace("--key-file F", "key_file")
                .replace("--encrypt", "encrypt = true"),
        )
    })?;
    let compress = match &d.compress {
        Some(v) => {
            parse_compress(v.get_ref()).map_err(|e| invalid(v.span().start, e.to_string()))?
        }
        None => None,
    };
    let spec = DriveSpec {
        name: name.clone(),
        size_bytes: size,
        mem_limit_bytes,
        read_only: d.read_only,
        overcommit: d.overcommit,
        persist,
        access: drive_access(d, invalid)?,
        compress,
        lock_memory: d.lock_memory,
    };
    if let Err(e) = check_compress(&spec) {
        let at = d
            .compress
            .as_ref()
            .map_or(d.name.span().start, |v| v.span().start);
        return Err(invalid(
            at,
            e.to_string()
                .replace("--persist (config: persist)", "persist")
                .replace(
                    "--compress (compress = \"off\")",
                    "compress (compress = \"off\")",
                ),
        ));
    }
    Ok(spec)
}

/// Parses config text; `path` is used in messages.
pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
    let invalid = |offset: usize, message: String| {
        let (line, column) = line_col(text, offset);
        ConfigError::Invalid {
            path: path.to_owned(),
            line,
            column,
            message,
        }
    };
    let file: ConfigFile = toml::from_str(text).map_err(|e| {
        let offset = e.span().map_or(0, |s| s.start);
        invalid(offset, e.message().trim().to_owned())
    })?;
    let mut declared_at = BTreeMap::new();
    // Names by the ledger's rule (one namespace for every kind), checked
    // here so that a clash names its line before anything is built.
    let names = Ledger::new(Arc::default(), Arc::new(MemoryBudget::new(0)));
    let origin = Origin::Config(path.to_owned());
    let taken_by = |kind, name: &str| match names.claim_unchecked(kind, name, origin.clone(), 0) {
        Err(LedgerError::Taken(t)) => Some(t.holder),
        _ => None,
    };
    let mut drives: Vec<DriveSpec> = Vec::new();
    let mut attach_ublk = Vec::new();
    let mut snapshot_policies = BTreeMap::new();
    for d in &file.drives {
        let name = d.name.get_ref();
        declared_at.insert(name.clone(), line_col(text, d.name.span().start));
        check_name(name).map_err(|e| invalid(d.name.span().start, e.to_string()))?;
        if taken_by(Kind::Drive, name).is_some() {
            return Err(invalid(
                d.name.span().start,
                format!("drive '{name}' is declared twice"),
            ));
        }
        drives.push(drive_spec(d, &invalid)?);
        if drive_attach(d, &invalid)? {
            attach_ublk.push(name.clone());
        }
        if let Some(p) = drive_policy(d, &invalid)? {
            snapshot_policies.insert(name.clone(), p);
        }
    }
    let remotes = config_remotes(&file.remotes, &invalid)?;
    let mut caches: Vec<CacheSpec> = Vec::new();
    for c in &file.caches {
        let spec = c.to_spec().map_err(|(offset, m)| invalid(offset, m))?;
        let name = &spec.name;
        if let Some(holder) = taken_by(Kind::Cache, name) {
            let what = match holder {
                Kind::Drive => "a drive",
                Kind::Cache => "another cache",
            };
            return Err(invalid(
                c.name.span().start,
                format!("cache '{name}': the name is taken by {what} (drives and caches share NBD export names)"),
            ));
        }
        declared_at.insert(name.clone(), line_col(text, c.name.span().start));
        if let Some(p) = cache_policy(c, &invalid)? {
            snapshot_policies.insert(name.clone(), p);
        }
        caches.push(spec);
    }
    let mut dirs: Vec<DirSpec> = Vec::new();
    for d in &file.dirs {
        let at = |offset: usize| {
            let (line, column) = line_col(text, offset);
            (path.to_owned(), line, column)
        };
        let spec = DirSpec::from_entry(d, at(d.path.span().start))
            .map_err(|(offset, message)| invalid(offset, message))?;
        if let Some(other) = dirs
            .iter()
            .find(|o| o.path.starts_with(&spec.path) || spec.path.starts_with(&o.path))
        {
            let message = if other.path == spec.path {
                format!("directory {} is declared twice", spec.path.display())
            } else {
                format!(
                    "directory {} overlaps {} (line {}): one directory cannot be kept in RAM inside another",
                    spec.path.display(),
                    other.path.display(),
                    other.at.1
                )
            };
            return Err(invalid(d.path.span().start, message));
        }
        dirs.push(spec);
    }
    let api = api_policy(&file.api, &invalid)?;
    Ok(Config {
        path: Some(path.to_owned()),
        api,
        daemon: file.daemon,
        drives,
        caches,
        dirs,
        remotes,
        snapshot_policies,
        attach_ublk,
        declared_at,
    })
}

/// `[api]`, checked (absolute directories) and resolved (canonical, so a
/// symbolic link cannot lead out of them).
fn api_policy(
    api: &ApiSection,
    invalid: &impl Fn(usize, String) -> ConfigError,
) -> Result<ApiPolicy, ConfigError> {
    for p in &api.allowed_paths {
        if !p.get_ref().is_absolute() {
            return Err(invalid(
                p.span().start,
                format!(
                    "allowed_paths: '{}' is relative: give absolute directories",
                    p.get_ref().display()
                ),
            ));
        }
    }
    Ok(ApiPolicy {
        allowed_paths: api
            .allowed_paths
            .iter()
            .map(|p| crate::paths::resolve(p.get_ref()))
            .collect(),
        allowed_backing_hosts: api.allowed_backing_hosts.clone(),
    })
}

/// The `[[remote]]`s, checked (names unique).
fn config_remotes(
    entries: &[RemoteEntry],
    invalid: &impl Fn(usize, String) -> ConfigError,
) -> Result<Vec<RemoteSpec>, ConfigError> {
    let mut remotes: Vec<RemoteSpec> = Vec::new();
    for r in entries {
        let spec = r.to_spec().map_err(|(offset, m)| invalid(offset, m))?;
        if remotes.iter().any(|o| o.name == spec.name) {
            return Err(invalid(
                r.name.span().start,
                format!("remote '{}' is declared twice", spec.name),
            ));
        }
        remotes.push(spec);
    }
    Ok(remotes)
}

/// Reads and parses a config file. One that holds an S3 secret
/// (`secret_access_key` of a `[[remote]]`) must be readable by its owner
/// only, as a credentials file must.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let read_err = |source| ConfigError::Read {
        path: path.to_owned(),
        source,
    };
    let text = std::fs::read_to_string(path).map_err(read_err)?;
    let config = parse(path, &text)?;
    if let Some(remote) = config.remotes.iter().find(|r| r.has_inline_secret()) {
        let meta = std::fs::metadata(path).map_err(read_err)?;
        crate::paths::check_secret_file("config", path, &meta).map_err(|e| {
            ConfigError::SecretReadable {
                remote: remote.name.clone(),
                source: e,
            }
        })?;
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        parse(Path::new("ramd.toml"), text).unwrap_err().to_string()
    }

    /// Issue 28: a config holding an S3 secret that group or others may
    /// read is refused with the chmod to run; without a secret it is not.
    #[test]
    fn a_config_with_an_s3_secret_must_be_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ramd.toml");
        let secret = "[[remote]]\nname = \"r\"\nurl = \"s3://snapshots/ramd\"\naccess_key_id = \"GK1\"\nsecret_access_key = \"s3cr3t\"\n";
        std::fs::write(&path, secret).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = load(&path).unwrap_err().to_string();
        assert!(
            e.contains(&format!("`chmod 600 {}`", path.display())),
            "{e}"
        );
        assert!(e.contains("remote 'r'") && !e.contains("s3cr3t"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(load(&path).unwrap().remotes.len(), 1);
        let no_secret = "[[remote]]\nname = \"r\"\nurl = \"s3://snapshots/ramd\"\n";
        std::fs::write(&path, no_secret).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(load(&path).unwrap().remotes.len(), 1);
    }

    #[test]
    fn full_config() {
        let c = parse(
            Path::new("x.toml"),
            r#"
[daemon]
nbd_listen = ["127.0.0.1:10809"]
mem_budget = "2G"
max_connections = 8
metrics = false
log_format = "json"

[[drive]]
name = "a"
size = "1G"
mem_limit = 1048576
compress = "zstd:3"

[[drive]]
name = "b"
size = 4096
read_only = true
"#,
        )
        .unwrap();
        assert_eq!(c.daemon.mem_budget, Some(Size(2 << 30)));
        assert_eq!(c.daemon.log_format, Some(LogFormat::Json));
        assert_eq!(c.drives.len(), 2);
        assert_eq!(c.drives[0].mem_limit_bytes, Some(1 << 20));
        assert_eq!(
            c.drives[0].compress,
            Some(crate::store::compressed::Algorithm::Zstd { level: 3 })
        );
        assert_eq!(c.drives[1].compress, None);
        assert!(c.drives[1].read_only);
    }

    #[test]
    fn tls_keys_parse_and_bad_values_name_their_line() {
        let c = parse(
            Path::new("x.toml"),
            r#"
[daemon]
tls = "require"
nbd_socket_tls = "off"
tls_certificates = "/etc/ramd/tls"
tls_verify_peer = "optional"
nbd_socket_group = "ramd"
"#,
        )
        .unwrap();
        assert_eq!(c.daemon.tls, Some(TlsMode::Require));
        assert_eq!(c.daemon.nbd_socket_tls, Some(TlsMode::Off));
        assert_eq!(c.daemon.tls_verify_peer, Some(ClientCerts::Optional));
        assert_eq!(c.daemon.nbd_socket_group.as_deref(), Some("ramd"));
        let e = err("[daemon]\ntls = \"yes\"\n");
        assert!(
            e.starts_with("ramd.toml:2:") && e.contains("off, on or require"),
            "{e}"
        );
        let e = err("[daemon]\n\ntls_verify_peer = \"maybe\"\n");
        assert!(
            e.starts_with("ramd.toml:3:") && e.contains("require, optional or off"),
            "{e}"
        );
    }

    #[test]
    fn listen_addresses_take_host_names() {
        let c = parse(
            Path::new("x.toml"),
            "[daemon]\nnbd_listen = [\"localhost:10809\", \"[::1]:10810\"]\napi_listen = \"127.0.0.1:8443\"\nhttp = \"localhost:8080\"\n",
        )
        .unwrap();
        let d = &c.daemon;
        let nbd = d.nbd_listen.as_deref().unwrap();
        assert_eq!(nbd[0], "127.0.0.1:10809".parse().unwrap());
        assert_eq!(nbd[1], "[::1]:10810".parse().unwrap());
        assert_eq!(d.api_listen, Some("127.0.0.1:8443".parse().unwrap()));
        assert_eq!(d.http, Some("127.0.0.1:8080".parse().unwrap()));
        let e = err("[daemon]\n\nhttp = \"localhost\"\n");
        assert!(
            e.starts_with("ramd.toml:3:") && e.contains("no port"),
            "{e}"
        );
    }

    #[test]
    fn drives_attached_as_ublk_at_start() {
        let text = "[[drive]]\nname = \"a\"\nsize = \"1G\"\nattach = \"ublk\"\n\n[[drive]]\nname = \"b\"\nsize = \"1G\"\nattach = \"none\"\n\n[[drive]]\nname = \"c\"\nsize = \"1G\"\n";
        let c = parse(Path::new("x.toml"), text).unwrap();
        assert_eq!(c.attach_ublk, ["a"]);
        let bad = "[[drive]]\nname = \"a\"\nsize = \"1G\"\nattach = \"nbd\"\n";
        let e = parse(Path::new("ramd.toml"), bad).unwrap_err().to_string();
        assert!(
            e.starts_with("ramd.toml:4:10: attach = \"nbd\": give \"ublk\""),
            "{e}"
        );
    }

    #[test]
    fn caches() {
        let c = parse(
            Path::new("x.toml"),
            "[[drive]]\nname = \"a\"\nsize = \"1G\"\n\n[[cache]]\nname = \"db\"\nbacking = \"/dev/sdb\"\nsize = \"64M\"\nmode = \"writeback\"\nblock_size = \"64K\"\ndirty_high = 70\nmax_dirty_age = \"5s\"\ndirect = true\nnbd_timeout = \"10s\"\n",
        )
        .unwrap();
        assert_eq!(c.caches.len(), 1);
        let s = &c.caches[0];
        assert_eq!((s.name.as_str(), s.backing.as_str()), ("db", "/dev/sdb"));
        assert_eq!(s.config.cache_bytes, 64 << 20);
        assert_eq!(s.config.block_bytes, 64 << 10);
        assert_eq!(s.config.dirty_high_percent, 70);
        assert_eq!(s.config.max_dirty_age_ms, 5000);
        assert!(s.options.direct_io);
        assert_eq!(s.options.nbd_timeout.as_millis(), 10_000);
        let base = "[[cache]]\nname = \"db\"\nbacking = \"/x\"\nsize = \"64M\"\nmode = \"wb\"\n";
        for (extra, want) in [
            (
                "policy = \"mru\"\n",
                "ramd.toml:6:10: policy=mru: unknown eviction policy",
            ),
            ("dirty_high = 101\n", "ramd.toml:6:14: dirty-high=101"),
            (
                "block_size = \"3K\"\n",
                "ramd.toml:2:8: cache 'db': block size",
            ),
            ("turbo = 1\n", "ramd.toml:6:1: unknown field `turbo`"),
            (
                "nbd_connections = 99\n",
                "ramd.toml:6:19: nbd-connections=99",
            ),
        ] {
            let e = err(&format!("{base}{extra}"));
            assert!(e.starts_with(want), "want {want:?}, got {e:?}");
        }
        for (text, want) in [
            (
                "[[cache]]\nname = \"DB\"\nbacking = \"/x\"\nsize = \"64M\"\nmode = \"wb\"\n",
                "ramd.toml:2:8: invalid cache name 'DB'",
            ),
            (
                "[[cache]]\nname = \"db\"\nbacking = \"nbd://\"\nsize = \"64M\"\nmode = \"wb\"\n",
                "ramd.toml:3:11: ",
            ),
            (
                "[[cache]]\nname = \"db\"\nbacking = \"/x\"\nsize = \"0\"\nmode = \"wb\"\n",
                "ramd.toml:4:8: ",
            ),
            (
                "[[cache]]\nname = \"db\"\nbacking = \"/x\"\nsize = \"64M\"\nmode = \"fast\"\n",
                "ramd.toml:5:8: unknown cache mode 'fast'",
            ),
            (
                "[[cache]]\nname = \"db\"\nbacking = \"/x\"\nsize = \"64M\"\n",
                "missing field `mode`",
            ),
            (
                "[[drive]]\nname = \"db\"\nsize = 4096\n[[cache]]\nname = \"db\"\nbacking = \"/x\"\nsize = \"64M\"\nmode = \"wb\"\n",
                "ramd.toml:5:8: cache 'db': the name is taken by a drive",
            ),
            (
                "[[cache]]\nname = \"db\"\nbacking = \"/x\"\nsize = \"64M\"\nmode = \"wb\"\n[[cache]]\nname = \"db\"\nbacking = \"/y\"\nsize = \"64M\"\nmode = \"wb\"\n",
                "ramd.toml:7:8: cache 'db': the name is taken by another cache",
            ),
        ] {
            let e = err(text);
            assert!(e.contains(want), "want {want:?} in {e:?}");
        }
    }

    #[test]
    fn drive_access_rules() {
        let c = parse(
            Path::new("ramd.toml"),
            "[[drive]]\nname = \"a\"\nsize = \"1M\"\nallow_identities = [\"alice\"]\nread_only_identities = [\"bob\"]\nallow_networks = [\"10.0.0.0/8\", \"unix\"]\n[[drive]]\nname = \"b\"\nsize = \"1M\"\n",
        )
        .unwrap();
        let a = &c.drives[0].access;
        assert_eq!(a.identities, ["alice"]);
        assert_eq!(a.read_only_identities, ["bob"]);
        assert_eq!(a.networks.len(), 2);
        assert!(c.drives[1].access.is_open(), "no rules: open");
        let e = err("[[drive]]\nname = \"a\"\nsize = \"1M\"\nallow_networks = [\"unix\", \"10.0.0.0/33\"]\n");
        assert!(
            e.starts_with("ramd.toml:4:27: '10.0.0.0/33' is not a network"),
            "{e}"
        );
        let e = err("[[drive]]\nname = \"a\"\nsize = \"1M\"\nallow_identities = [\"\"]\n");
        assert!(
            e.starts_with("ramd.toml:2:8: drive 'a': an identity cannot be empty"),
            "{e}"
        );
        // A [[cache]] takes the same keys, checked the same way.
        let cache = "[[cache]]\nname = \"k\"\nbacking = \"/dev/null\"\nsize = \"1M\"\nmode = \"writeback\"\n";
        let c = parse(
            Path::new("ramd.toml"),
            &format!("{cache}allow_identities = [\"alice\"]\nallow_networks = [\"unix\"]\n"),
        )
        .unwrap();
        assert_eq!(c.caches[0].access.identities, ["alice"]);
        assert_eq!(c.caches[0].access.networks.len(), 1);
        let e = err(&format!("{cache}allow_networks = [\"lan\"]\n"));
        assert!(
            e.starts_with("ramd.toml:6:19: 'lan' is not a network"),
            "{e}"
        );
        let e = err(&format!("{cache}read_only_identities = [\"\"]\n"));
        assert!(e.contains("cache 'k': an identity cannot be empty"), "{e}");
    }

    #[test]
    fn persistent_drives() {
        let c = parse(
            Path::new("x.toml"),
            "[[drive]]\nname = \"db\"\nsize = \"1G\"\npersist = true\ndurability = \"flush\"\nsync_interval = \"5s\"\nencrypt = true\nkey_file = \"/etc/k\"\n",
        )
        .unwrap();
        let p = c.drives[0].persist.as_ref().unwrap();
        assert_eq!(p.durability, crate::persist::Durability::Flush);
        assert_eq!(p.sync_interval_ms, 5000);
        assert_eq!(p.key_file.as_deref(), Some(Path::new("/etc/k")));
        let d = "[[drive]]\nname = \"db\"\nsize = \"1G\"\n";
        for (extra, want) in [
            (
                "durability = \"flush\"\n",
                "ramd.toml:4:14: a durability mode needs a persistent drive: add persist = true",
            ),
            (
                "persist = true\ndurability = \"fast\"\n",
                "ramd.toml:5:14: unknown durability 'fast'",
            ),
            (
                "persist = true\nsync_interval = \"1ms\"\n",
                "ramd.toml:5:17: a sync interval of 1 ms is shorter",
            ),
            (
                "persist = true\nsync_interval = \"soon\"\n",
                "ramd.toml:5:17: invalid sync interval",
            ),
            (
                "persist = true\nencrypt = true\n",
                "ramd.toml:5:11: encryption needs a key file: add key_file",
            ),
            (
                "persist = true\nkey_file = \"/k\"\n",
                "ramd.toml:5:12: a key file is only used with encryption: add encrypt = true",
            ),
            (
                "persist = true\nencrypt = true\nkey_file = \"k\"\n",
                "ramd.toml:6:12: the key file must be an absolute path",
            ),
            ("persist = 1\n", "ramd.toml:4:11: invalid type"),
        ] {
            let e = err(&format!("{d}{extra}"));
            assert!(e.starts_with(want), "want {want:?} got {e:?}");
        }
    }

    #[test]
    fn dirs() {
        let c = parse(
            Path::new("x.toml"),
            "[[dir]]\npath = \"/var/log/\"\ninterval = \"5m\"\nsize_limit = \"1G\"\n\n[[dir]]\npath = \"/home/u/.cache\"\noverlay = true\nrecovery_generations = 1\n",
        )
        .unwrap();
        assert_eq!(c.dirs.len(), 2);
        assert_eq!(c.dirs[0].path, Path::new("/var/log"));
        assert_eq!(c.dirs[0].sync_interval_ms, 300_000);
        assert_eq!(c.dirs[0].size_limit_bytes, Some(1 << 30));
        assert_eq!(c.dirs[0].at.1, 2);
        assert_eq!(c.dirs[1].mode, crate::dirsync::mounts::MountMode::Overlay);
        assert_eq!(c.dirs[1].recovery_generations, 1);
        assert_eq!(
            c.dirs[1].sync_interval_ms,
            crate::dirsync::manager::DEFAULT_DIR_SYNC_INTERVAL_MS
        );
        for (text, want) in [
            (
                "[[dir]]\npath = \"var/log\"\n",
                "ramd.toml:2:8: the directory must be an absolute path",
            ),
            ("[[dir]]\npath = \"/a/../b\"\n", "ramd.toml:2:8: "),
            (
                "[[dir]]\npath = \"/a\"\ninterval = \"soon\"\n",
                "ramd.toml:3:12: invalid interval",
            ),
            (
                "[[dir]]\npath = \"/a\"\ninterval = \"10ms\"\n",
                "ramd.toml:3:12: ",
            ),
            (
                "[[dir]]\npath = \"/a\"\nsize_limit = \"12Q\"\n",
                "ramd.toml:3:14: unknown size unit",
            ),
            (
                "[[dir]]\npath = \"/a\"\nsize_limit = 0\n",
                "ramd.toml:3:14: ",
            ),
            (
                "[[dir]]\npath = \"/a\"\nrecovery_generations = 0\n",
                "ramd.toml:3:24: ",
            ),
            (
                "[[dir]]\npath = \"/a\"\nintervall = \"1m\"\n",
                "ramd.toml:3:1: unknown field `intervall`",
            ),
            (
                "[[dir]]\npath = \"/a\"\n[[dir]]\npath = \"/a\"\n",
                "ramd.toml:4:8: directory /a is declared twice",
            ),
            (
                "[[dir]]\npath = \"/a\"\n[[dir]]\npath = \"/a/b\"\n",
                "ramd.toml:4:8: directory /a/b overlaps /a (line 2)",
            ),
            ("[[dir]]\ninterval = \"1m\"\n", "missing field `path`"),
        ] {
            let e = err(text);
            assert!(e.contains(want), "want {want:?} in {e:?} for {text:?}");
        }
    }

    #[test]
    fn useless_daemon_values_are_refused_at_their_line() {
        for (text, want) in [
            (
                "[daemon]\nmem_budget = \"0\"\n",
                "ramd.toml:2:14: a memory budget of 0",
            ),
            (
                "[daemon]\nmax_connections = 0\n",
                "ramd.toml:2:19: max_connections = 0",
            ),
            (
                "[daemon]\nmax_connections_per_address = 0\n",
                "ramd.toml:2:31: max_connections_per_address = 0 would refuse every NBD client",
            ),
            (
                "[daemon]\nlog = \"infp\"\n",
                "ramd.toml:2:7: unknown log level 'infp'",
            ),
            (
                "[[drive]]\nname = \"a\"\nsize = \"1M\"\nmem_limit = 0\n",
                "ramd.toml:4:13: a memory limit of 0",
            ),
        ] {
            let e = err(text);
            assert!(e.starts_with(want), "want {want:?} got {e:?}");
        }
        for good in ["info", "WARN", "off", "warn,ramd::nbd=debug", "ramd=trace"] {
            assert!(check_log_filter(good).is_ok(), "{good}");
        }
        for bad in ["infp", "", " , ", "info,nbd", "=debug", "ramd=loud"] {
            assert!(check_log_filter(bad).is_err(), "{bad:?}");
        }
        let c = parse(
            Path::new("x.toml"),
            "[[drive]]\nname = \"a\"\nsize = \"1M\"\n\n[[cache]]\nname = \"c\"\nbacking = \"/x\"\nsize = \"1M\"\nmode = \"wb\"\n",
        )
        .unwrap();
        assert_eq!(c.declared_at["a"], (2, 8));
        assert_eq!(c.declared_at["c"], (6, 8));
    }

    #[test]
    fn errors_name_file_line_and_reason() {
        let e = err("[daemon]\nmax_connections = 3\nturbo = true\n");
        assert!(e.starts_with("ramd.toml:3:1: "), "{e}");
        assert!(e.contains("unknown field `turbo`"), "{e}");
        let e = err("[[drive]]\nname = \"a\"\nsize = \"12Q\"\n");
        assert!(e.starts_with("ramd.toml:3:8: "), "{e}");
        assert!(e.contains("unknown size unit"), "{e}");
        let e = err("[[drive]]\nname = \"A\"\nsize = \"1G\"\n");
        assert!(e.starts_with("ramd.toml:2:8: invalid drive name"), "{e}");
        let e = err("[[drive]]\nname = \"a\"\nsize = \"1G\"\n[[drive]]\nname = \"a\"\nsize = 1\n");
        assert!(
            e.starts_with("ramd.toml:5:8: drive 'a' is declared twice"),
            "{e}"
        );
        let e = err("[[drive]]\nname = \"a\"\nsize = 0\n");
        assert!(e.starts_with("ramd.toml:3:8: "), "{e}");
        let e = err("[daemon\n");
        assert!(e.starts_with("ramd.toml:1:"), "{e}");
        let e = err("[[drive]]\nname = \"a\"\n");
        assert!(e.contains("missing field `size`"), "{e}");
        let e = err("[daemon]\nnbd_listen = [\"nowhere\"]\n");
        assert!(e.starts_with("ramd.toml:2:"), "{e}");
    }
}
