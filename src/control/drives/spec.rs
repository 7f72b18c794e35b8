//! Drive specs: `--drive NAME=SIZE[,mem-limit=SIZE][,read-only]
//! [,compress=lz4|zstd[:LEVEL]|lz4+zstd[:LEVEL]|off][,lock-memory]
//! [,persist,durability=MODE,sync-interval=DURATION,key-file=PATH]
//! [,allow-identity=ID][,read-only-identity=ID][,allow-network=CIDR]`, and
//! the drive fields of the config file and the API (pure parsing, shared by
//! all three). Names follow the ledger's rule and intervals go through
//! `control::spec`, the parsers every kind shares.

use std::path::PathBuf;

use crate::control::ledger::{self, Kind, NameError};
use crate::control::spec::{self as values, IntervalError, IntervalUse};
use crate::nbd::access::{AccessRules, BadNetwork, EmptyIdentity, Network};
use crate::persist::Durability;
use crate::size::{format_size, parse as parse_size};
use crate::store::compressed::{Algorithm, ParseAlgorithmError, MAX_COMPRESSED_DRIVE_BYTES};

/// Default background sync interval of a persistent drive.
pub const DEFAULT_DRIVE_SYNC_INTERVAL_MS: u64 = 60_000;

/// Why a name or spec was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpecError {
    /// The name breaks the naming rule.
    #[error(transparent)]
    InvalidName(#[from] NameError),
    /// A size could not be parsed or is out of range.
    #[error(transparent)]
    InvalidSize(#[from] SizeError),
    /// The spec is malformed.
    #[error(transparent)]
    Malformed(#[from] MalformedSpec),
    /// Persistence options that are malformed or do not fit together.
    #[error(transparent)]
    Persist(#[from] PersistError),
    /// Access rules that do not parse.
    #[error(transparent)]
    Access(#[from] AccessError),
    /// A compression that does not parse or does not fit the drive.
    #[error(transparent)]
    Compress(#[from] CompressError),
}

/// Why a drive's compression was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompressError {
    /// Not `lz4`, `zstd`, `zstd:LEVEL` or `off`.
    #[error("{0} (or off for an uncompressed drive)")]
    Unknown(#[from] ParseAlgorithmError),
    /// Larger than the largest compressed drive.
    #[error("a compressed drive holds at most {} ({} asked): give a smaller size, or --compress off", format_size(*max), format_size(*size))]
    TooLarge { size: u64, max: u64 },
}

/// Parses a drive's compression: `lz4`, `zstd`, `zstd:LEVEL` or `off`
/// (None: the raw store).
pub fn parse_compress(text: &str) -> Result<Option<Algorithm>, SpecError> {
    match text.trim() {
        "off" | "none" => Ok(None),
        t => Ok(Some(t.parse().map_err(CompressError::from)?)),
    }
}

/// Checks that a spec's compression fits its other options (the size:
/// a compressed drive's page tables address at most 64 TiB). Persistence
/// fits: a compressed drive's state directory is a raw drive's.
pub fn check_compress(spec: &DriveSpec) -> Result<(), SpecError> {
    let max = MAX_COMPRESSED_DRIVE_BYTES;
    if spec.compress.is_some() && spec.size_bytes > max {
        let size = spec.size_bytes;
        return Err(CompressError::TooLarge { size, max }.into());
    }
    Ok(())
}

/// Why access rules were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// A network that is neither a CIDR nor `unix` (names the value).
    #[error(transparent)]
    Network(#[from] BadNetwork),
    /// An empty identity.
    #[error(transparent)]
    Identity(#[from] EmptyIdentity),
}

/// Access rules from their three lists as a user gives them (flags,
/// config keys, API fields): every network must parse, every identity be
/// non-empty.
pub fn parse_access(
    identities: &[String],
    read_only_identities: &[String],
    networks: &[String],
) -> Result<AccessRules, SpecError> {
    let rules = AccessRules {
        identities: identities.to_vec(),
        read_only_identities: read_only_identities.to_vec(),
        networks: parse_networks(networks)?,
    };
    rules.check().map_err(AccessError::from)?;
    Ok(rules)
}

/// Parses networks (CIDRs or `unix`); the error names the first bad one.
pub fn parse_networks(networks: &[String]) -> Result<Vec<Network>, SpecError> {
    networks
        .iter()
        .map(|n| n.trim().parse::<Network>())
        .collect::<Result<_, _>>()
        .map_err(|e| AccessError::from(e).into())
}

/// Why a drive size or memory limit was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// Not a size (the size parser's reason).
    #[error(transparent)]
    Unparsable(#[from] crate::size::SizeError),
    /// A drive smaller than one page (`--size 3` was taken as 3 bytes).
    #[error("a drive needs at least {} (one page), not {}: give a size with a unit, like 64M or 4G", format_size(MIN_DRIVE_BYTES), format_size(*size))]
    TooSmall { size: u64 },
    /// A memory limit of 0 bytes.
    #[error("a memory limit of 0 bytes would refuse every write: give at least 1 byte, or \"none\" (leave it out) for no limit")]
    ZeroMemLimit,
    /// Larger than the largest drive.
    #[error("{} is larger than the largest drive ({})", format_size(*size), format_size(*max))]
    TooLarge { size: u64, max: u64 },
}

/// Why a `--drive` spec does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MalformedSpec {
    /// No `NAME=SIZE` at its head.
    #[error("'{spec}': expected NAME=SIZE, like ram0=1G")]
    NoSize { spec: String },
    /// An option this parser does not know.
    #[error("'{spec}': unknown option '{option}' (known: mem-limit=SIZE, compress=lz4|zstd[:LEVEL]|lz4+zstd[:LEVEL]|off, read-only, overcommit, lock-memory, persist, durability=none|periodic|flush, sync-interval=DURATION, key-file=PATH, allow-identity=ID, read-only-identity=ID, allow-network=CIDR)")]
    UnknownOption { spec: String, option: String },
    /// A new drive without a size (only a persistent drive that exists in
    /// the state directory may omit it: it keeps its own).
    #[error("missing field `size`: give the size of the new drive (a persistent drive that exists in the state directory keeps its own)")]
    MissingSize,
}

/// Why persistence options were refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PersistError {
    /// The sync interval is malformed or below the drives' minimum.
    #[error(transparent)]
    SyncInterval(#[from] IntervalError),
    /// Not a durability mode (the engine's reason).
    #[error(transparent)]
    Durability(#[from] crate::persist::durability::UnknownDurability),
    /// A persistence option on a RAM-only drive.
    #[error("{what} needs a persistent drive: add --persist (config: persist = true)")]
    NeedsPersist { what: &'static str },
    /// Encryption without a key file.
    #[error("encryption needs a key file: add --key-file F (a new file of 32 random bytes: (umask 077; set -C; head -c 32 /dev/urandom > F), where set -C refuses to overwrite an existing F)")]
    NoKeyFile,
    /// A key file without encryption.
    #[error("a key file is only used with encryption: add --encrypt")]
    KeyFileWithoutEncryption,
    /// A key file given as a relative path.
    #[error("the key file must be an absolute path, not '{}'", path.display())]
    RelativeKeyFile { path: PathBuf },
}

/// Checks a drive name (the ledger's rule, the same for every kind).
pub fn check_name(name: &str) -> Result<(), SpecError> {
    Ok(ledger::check_name(Kind::Drive, name)?)
}

/// The smallest drive: one page (smaller ones are typos: `--size 3`).
pub const MIN_DRIVE_BYTES: u64 = 4096;

/// Parses a drive size: a human size of at least [`MIN_DRIVE_BYTES`].
pub fn parse_drive_size(text: &str) -> Result<u64, SpecError> {
    let size = parse_size(text).map_err(SizeError::Unparsable)?;
    check_drive_size(size)
}

/// Checks a drive size: at least [`MIN_DRIVE_BYTES`].
pub fn check_drive_size(size: u64) -> Result<u64, SpecError> {
    if size < MIN_DRIVE_BYTES {
        return Err(SizeError::TooSmall { size }.into());
    }
    Ok(size)
}

/// Checks a drive's memory limit: at least one byte. A limit of 0 would
/// refuse every write; removing a limit is spelled `none` (API) or by
/// leaving it out.
pub fn check_mem_limit(bytes: u64) -> Result<u64, SpecError> {
    if bytes == 0 {
        return Err(SizeError::ZeroMemLimit.into());
    }
    Ok(bytes)
}

/// Parses a memory limit: a human size of at least one byte.
pub fn parse_mem_limit(text: &str) -> Result<u64, SpecError> {
    check_mem_limit(parse_size(text).map_err(SizeError::Unparsable)?)
}

/// A drive to create, however it was described.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriveSpec {
    pub name: String,
    pub size_bytes: u64,
    /// The drive's own memory limit (None: only the daemon budget bounds it).
    pub mem_limit_bytes: Option<u64>,
    pub read_only: bool,
    /// Allow the drive's size (or limit) to exceed what the daemon budget
    /// has left: writes past the budget then fail with ENOSPC.
    pub overcommit: bool,
    /// Keep the drive in a state directory (None: RAM only).
    pub persist: Option<PersistSpec>,
    /// Who may see it over NBD (`nbd::access`; default: everyone).
    pub access: AccessRules,
    /// Keep its pages compressed (`store::compressed`; None: the raw
    /// store). Its promise is still `min(size, mem_limit)`: give a memory
    /// limit below the size for compression to pay off.
    pub compress: Option<Algorithm>,
    /// Lock its memory in RAM as it is written: never swapped
    /// (`--lock-memory`; `drives::memlock` checks `RLIMIT_MEMLOCK`).
    pub lock_memory: bool,
}

impl DriveSpec {
    /// The spec of a persistent drive known only by its name (its
    /// `drive.json` is unusable): default settings, and a size of 1 that
    /// stands for "unknown" (it is registered failed and holds nothing).
    pub fn failed(name: &str) -> DriveSpec {
        DriveSpec {
            name: name.to_owned(),
            size_bytes: 1,
            mem_limit_bytes: None,
            read_only: false,
            overcommit: false,
            persist: Some(PersistSpec::default()),
            access: AccessRules::default(),
            compress: None,
            lock_memory: false,
        }
    }
}

/// How a persistent drive keeps its data on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PersistSpec {
    /// The promise (see `persist::Durability`).
    pub durability: Durability,
    /// Time between background syncs (periodic and flush modes).
    pub sync_interval_ms: u64,
    /// The key file when the drive is encrypted at rest (None: plain). An
    /// absolute path: the daemon reads it again at every start.
    pub key_file: Option<PathBuf>,
}

impl Default for PersistSpec {
    fn default() -> Self {
        PersistSpec {
            durability: Durability::default(),
            sync_interval_ms: DEFAULT_DRIVE_SYNC_INTERVAL_MS,
            key_file: None,
        }
    }
}

/// Parses a drive's sync interval: `60s`, `10m`, `500ms`, `1h 30m`.
pub fn parse_sync_interval_ms(text: &str) -> Result<u64, SpecError> {
    values::parse_interval_ms(IntervalUse::DriveSync, text)
        .map_err(|e| PersistError::from(e).into())
}

/// Checks a drive's sync interval in milliseconds.
pub fn check_sync_interval_ms(ms: u64) -> Result<(), SpecError> {
    values::check_interval_ms(IntervalUse::DriveSync, ms).map_err(PersistError::from)?;
    Ok(())
}

/// Parses a durability mode.
pub fn parse_durability(text: &str) -> Result<Durability, SpecError> {
    text.trim()
        .parse()
        .map_err(|e| PersistError::Durability(e).into())
}

/// Persistence options as a user gives them (flags, config keys, API
/// fields), checked together into a [`PersistSpec`].
#[derive(Debug, Clone, Default)]
pub struct PersistOptions {
    pub persist: bool,
    pub durability: Option<Durability>,
    pub sync_interval_ms: Option<u64>,
    pub encrypt: bool,
    pub key_file: Option<PathBuf>,
}

impl PersistOptions {
    /// The spec, None for a RAM-only drive; an error names what does not
    /// fit together (e.g. a durability without persistence).
    pub fn into_spec(self) -> Result<Option<PersistSpec>, SpecError> {
        let needs_persist = |what| SpecError::from(PersistError::NeedsPersist { what });
        if !self.persist {
            if self.durability.is_some() {
                return Err(needs_persist("a durability mode"));
            }
            if self.sync_interval_ms.is_some() {
                return Err(needs_persist("a sync interval"));
            }
            if self.encrypt || self.key_file.is_some() {
                return Err(needs_persist("encryption"));
            }
            return Ok(None);
        }
        match (self.encrypt, &self.key_file) {
            (true, None) => return Err(PersistError::NoKeyFile.into()),
            (false, Some(_)) => return Err(PersistError::KeyFileWithoutEncryption.into()),
            _ => {}
        }
        if let Some(f) = &self.key_file {
            if !f.is_absolute() {
                return Err(PersistError::RelativeKeyFile { path: f.clone() }.into());
            }
        }
        let sync_interval_ms = self
            .sync_interval_ms
            .unwrap_or(DEFAULT_DRIVE_SYNC_INTERVAL_MS);
        check_sync_interval_ms(sync_interval_ms)?;
        Ok(Some(PersistSpec {
            durability: self.durability.unwrap_or_default(),
            sync_interval_ms,
            key_file: self.key_file,
        }))
    }
}

/// Parses `NAME=SIZE[,mem-limit=SIZE][,compress=ALGO][,read-only][,overcommit][,lock-memory][,persist]
/// [,durability=MODE][,sync-interval=DURATION][,key-file=PATH]
/// [,allow-identity=ID][,read-only-identity=ID][,allow-network=CIDR]` (a
/// key file turns encryption on; the access keys repeat, one value each).
pub fn parse_drive_spec(spec: &str) -> Result<DriveSpec, SpecError> {
    let mut parts = spec.split(',');
    let head = parts.next().unwrap_or_default();
    let Some((name, size)) = head.split_once('=') else {
        return Err(MalformedSpec::NoSize {
            spec: spec.to_owned(),
        }
        .into());
    };
    check_name(name)?;
    let size_bytes = parse_drive_size(size)?;
    let mut d = DriveSpec {
        name: name.to_owned(),
        size_bytes,
        mem_limit_bytes: None,
        read_only: false,
        overcommit: false,
        persist: None,
        access: AccessRules::default(),
        compress: None,
        lock_memory: false,
    };
    let mut p = PersistOptions::default();
    let (mut ids, mut ro_ids, mut nets) = (Vec::new(), Vec::new(), Vec::new());
    for opt in parts {
        match opt.split_once('=') {
            Some(("allow-identity", v)) => ids.push(v.to_owned()),
            Some(("read-only-identity", v)) => ro_ids.push(v.to_owned()),
            Some(("allow-network", v)) => nets.push(v.to_owned()),
            Some(("mem-limit", v)) => d.mem_limit_bytes = Some(parse_mem_limit(v)?),
            Some(("compress", v)) => d.compress = parse_compress(v)?,
            Some(("durability", v)) => p.durability = Some(parse_durability(v)?),
            Some(("sync-interval", v)) => p.sync_interval_ms = Some(parse_sync_interval_ms(v)?),
            Some(("key-file", v)) => {
                p.encrypt = true;
                p.key_file = Some(PathBuf::from(v));
            }
            None if opt == "read-only" || opt == "ro" => d.read_only = true,
            None if opt == "overcommit" => d.overcommit = true,
            None if opt == "lock-memory" => d.lock_memory = true,
            None if opt == "persist" => p.persist = true,
            _ => {
                return Err(MalformedSpec::UnknownOption {
                    spec: spec.to_owned(),
                    option: opt.to_owned(),
                }
                .into())
            }
        }
    }
    d.persist = p.into_spec()?;
    d.access = parse_access(&ids, &ro_ids, &nets)?;
    check_compress(&d)?;
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_ledger() {
        assert!(check_name("ram0").is_ok());
        let e = check_name("Ram").unwrap_err().to_string();
        assert!(e.starts_with("invalid drive name 'Ram'"), "{e}");
    }

    #[test]
    fn drive_specs() {
        let d = parse_drive_spec("db=4G,mem-limit=1G,ro").unwrap();
        assert_eq!(
            (
                d.name.as_str(),
                d.size_bytes,
                d.mem_limit_bytes,
                d.read_only
            ),
            ("db", 4 << 30, Some(1 << 30), true)
        );
        assert!(parse_drive_spec("x=1G,overcommit").unwrap().overcommit);
        assert!(
            parse_drive_spec("x=1G,lock-memory,persist")
                .unwrap()
                .lock_memory
        );
        let c = parse_drive_spec("x=16G,mem-limit=1G,compress=zstd:3").unwrap();
        assert_eq!(c.compress, Some(Algorithm::Zstd { level: 3 }));
        assert_eq!(
            parse_drive_spec("x=1G,compress=off").unwrap().compress,
            None
        );
        let c = parse_drive_spec("x=1G,compress=lz4,persist,durability=flush").unwrap();
        assert_eq!(c.compress, Some(Algorithm::Lz4));
        assert_eq!(c.persist.unwrap().durability, Durability::Flush);
        let e = parse_drive_spec("x=100T,compress=lz4").unwrap_err();
        assert!(e.to_string().contains("at most 64 TiB"), "{e}");
        let p = parse_drive_spec("x=1G,persist,durability=flush,sync-interval=10s,key-file=/k")
            .unwrap()
            .persist
            .unwrap();
        assert_eq!(p.durability, Durability::Flush);
        assert_eq!(p.sync_interval_ms, 10_000);
        assert_eq!(p.key_file.as_deref(), Some(std::path::Path::new("/k")));
        let p = parse_drive_spec("x=1G,persist").unwrap().persist.unwrap();
        assert_eq!(p, PersistSpec::default());
        let a = parse_drive_spec(
            "x=1G,allow-identity=alice,allow-identity=carol,read-only-identity=bob,allow-network=10.0.0.0/8,allow-network=unix",
        )
        .unwrap()
        .access;
        assert_eq!(a.identities, ["alice", "carol"]);
        assert_eq!(a.read_only_identities, ["bob"]);
        assert_eq!(
            a.networks,
            [Network::Cidr("10.0.0.0".parse().unwrap(), 8), Network::Unix]
        );
        let e = parse_drive_spec("x=1G,allow-network=10.0.0.0/33").unwrap_err();
        assert!(
            e.to_string().starts_with("'10.0.0.0/33' is not a network"),
            "{e}"
        );
        for bad in [
            "Bad=1G",
            "x=12Q",
            "x",
            "x=0",
            "x=1G,turbo",
            "x=1G,mem-limit=z",
            "x=1G,mem-limit=0",
            "x=1G,durability=flush",
            "x=1G,persist,durability=fast",
            "x=1G,persist,sync-interval=1ms",
            "x=1G,persist,sync-interval=soon",
            "x=1G,persist,key-file=relative",
            "x=1G,key-file=/k",
            "x=1G,allow-network=lan",
            "x=1G,allow-identity=",
            "x=1G,compress=gzip",
            "x=1G,compress=zstd:99",
        ] {
            assert!(parse_drive_spec(bad).is_err(), "{bad}");
        }
    }
}
