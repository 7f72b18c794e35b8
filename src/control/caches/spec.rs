//! Cache specs: what `ramd cache create`, `POST /v1/caches` and a
//! `[[cache]]` config entry describe, parsed and checked in one place (pure:
//! no I/O; opening the backing is `Caches`' job).
//!
//! Every option has one user-facing name, spelled with dashes on the
//! command line (`--block-size`) and with underscores in JSON and TOML
//! (`block_size`); [`CacheSpec::set`] takes either spelling:
//!
//! | option | value | default |
//! |---|---|---|
//! | `block-size` | size, power of two, 4K..1M | 4K |
//! | `policy` | s3fifo, lru, fifo | s3fifo |
//! | `sequential-cutoff` | size (0: off) | 4M |
//! | `dirty-high`, `dirty-low` | percent | 50, 20 |
//! | `max-dirty-age` | duration | 30s |
//! | `writeback-max-io` | size | 1M |
//! | `retry-initial`, `retry-max` | duration | 100ms, 30s |
//! | `direct` | bool (O_DIRECT for files and devices) | false |
//! | `nbd-connections` | 1..=16 | 4 |
//! | `nbd-timeout` | duration, 1s..1h | 30s |
//! | `shutdown-timeout` | duration | 2m |

use serde::Deserialize;
use toml::Spanned;

use crate::cache::config::parse_duration;
use crate::cache::{BackingOptions, BackingSpec, CacheConfig, Mode};
use crate::control::ledger::{check_name, Kind, NameError};
use crate::control::spec::config_access;
use crate::nbd::access::AccessRules;
use crate::size::Size;
use crate::size::{format_size, parse as parse_size};
use crate::store::MAX_DRIVE_BYTES;

/// How long a clean shutdown keeps retrying a failing backing before it
/// gives up on writing back a cache's dirty data (see `shutdown.rs`).
pub const DEFAULT_SHUTDOWN_TIMEOUT_MS: u64 = 120_000;

/// Most connections to one NBD backing.
pub const MAX_NBD_CONNECTIONS: u64 = 16;

/// The option names [`CacheSpec::set`] knows, as the CLI spells them.
pub const OPTION_NAMES: &[&str] = &[
    "block-size",
    "policy",
    "sequential-cutoff",
    "dirty-high",
    "dirty-low",
    "max-dirty-age",
    "writeback-max-io",
    "retry-initial",
    "retry-max",
    "direct",
    "nbd-connections",
    "nbd-timeout",
    "shutdown-timeout",
];

/// Why a cache spec was refused. The API maps each to its own code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheSpecError {
    /// The name breaks the naming rule (the ledger's, the same for every
    /// kind).
    #[error(transparent)]
    InvalidName(#[from] NameError),
    /// The size does not parse, is 0 or too large.
    #[error(transparent)]
    InvalidSize(#[from] CacheSizeError),
    /// The mode or another option is unknown or out of range.
    #[error(transparent)]
    InvalidOption(#[from] CacheOptionError),
    /// The backing spec is empty or not a valid NBD URI.
    #[error(transparent)]
    InvalidBacking(#[from] CacheBackingError),
}

/// Why a cache size was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheSizeError {
    /// Not a size (the size parser's reason).
    #[error(transparent)]
    Unparsable(#[from] crate::size::SizeError),
    /// 0 bytes.
    #[error("a cache size must be at least 1 byte")]
    Zero,
    /// Larger than the largest cache.
    #[error("{} is larger than the largest cache ({})", format_size(*size), format_size(*max))]
    TooLarge { size: u64, max: u64 },
}

/// Why a cache option was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheOptionError {
    /// A value this layer checks is out of range or malformed.
    #[error("{key}={value}: {problem}")]
    BadValue {
        key: String,
        value: String,
        problem: String,
    },
    /// An option nobody knows.
    #[error("unknown cache option '{key}': use {}", OPTION_NAMES.join(", "))]
    Unknown { key: String },
    /// The cache engine refused the mode, an option or the combination
    /// (its reason).
    #[error("{reason}")]
    Engine { reason: String },
}

/// Why a cache's backing spec was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct CacheBackingError {
    /// The backing parser's reason.
    pub reason: String,
}

/// A cache to create, however it was described.
#[derive(Debug, Clone)]
pub struct CacheSpec {
    /// The cache's name, which is also its NBD export name.
    pub name: String,
    /// A file, a block device or an NBD URI, as the user wrote it.
    pub backing: String,
    /// Mode, size and every engine option.
    pub config: CacheConfig,
    /// How to open the backing (O_DIRECT, NBD connections and timeout).
    pub options: BackingOptions,
    /// At daemon shutdown, how long to keep retrying a failing backing
    /// before giving up on the dirty data (which is then saved to a rescue
    /// file, see docs/cache.md).
    pub shutdown_timeout_ms: u64,
    /// Who may see its export over NBD and NVMe/TCP: the drives' rules
    /// (`nbd::access`; open: none).
    pub access: AccessRules,
}

/// The cache engine's refusal of an option.
fn engine(reason: String) -> CacheSpecError {
    CacheOptionError::Engine { reason }.into()
}

impl CacheSpec {
    /// A spec with the required parts; every option at its default.
    pub fn new(name: &str, backing: &str, size: &str, mode: &str) -> Result<Self, CacheSpecError> {
        check_name(Kind::Cache, name)?;
        let backing = backing.trim();
        BackingSpec::parse(backing).map_err(|e| CacheBackingError {
            reason: e.to_string(),
        })?;
        let mode = Mode::parse(mode).map_err(|e| engine(e.to_string()))?;
        let size = parse_cache_size(size)?;
        Ok(CacheSpec {
            name: name.to_owned(),
            backing: backing.to_owned(),
            config: CacheConfig::new(mode, size),
            options: BackingOptions::default(),
            shutdown_timeout_ms: DEFAULT_SHUTDOWN_TIMEOUT_MS,
            access: AccessRules::default(),
        })
    }

    /// Sets one option by name (`block-size` or `block_size`; see the
    /// module docs). Call [`CacheSpec::validate`] when done.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), CacheSpecError> {
        let key = key.replace('_', "-");
        let value = value.trim();
        let bad = |problem: &str| -> CacheSpecError {
            CacheOptionError::BadValue {
                key: key.clone(),
                value: value.to_owned(),
                problem: problem.to_owned(),
            }
            .into()
        };
        let millis = || parse_duration(value).map_err(|e| bad(&e.to_string()));
        match key.as_str() {
            "direct" => {
                self.options.direct_io = match value {
                    "true" | "on" | "yes" | "1" | "" => true,
                    "false" | "off" | "no" | "0" => false,
                    _ => return Err(bad("expected true or false")),
                }
            }
            "nbd-connections" => match value.parse::<u64>() {
                Ok(n) if (1..=MAX_NBD_CONNECTIONS).contains(&n) => {
                    self.options.nbd_connections = n as usize
                }
                _ => {
                    return Err(bad(&format!(
                        "expected a number of connections from 1 to {MAX_NBD_CONNECTIONS}"
                    )))
                }
            },
            "nbd-timeout" => {
                let ms = millis()?;
                if !(1000..=3_600_000).contains(&ms) {
                    return Err(bad("the timeout must be between 1s and 1h"));
                }
                self.options.nbd_timeout = std::time::Duration::from_millis(ms);
            }
            "shutdown-timeout" => self.shutdown_timeout_ms = millis()?,
            "size" => self.config.cache_bytes = parse_cache_size(value)?,
            "mode" | "block-size" | "policy" | "sequential-cutoff" | "dirty-high" | "dirty-low"
            | "max-dirty-age" | "writeback-max-io" | "retry-initial" | "retry-max" => self
                .config
                .set(&key, value)
                .map_err(|e| engine(strip_prefix(&e.to_string())))?,
            _ => return Err(CacheOptionError::Unknown { key }.into()),
        }
        Ok(())
    }

    /// Checks the combination (watermarks, block size against the size...).
    pub fn validate(&self) -> Result<(), CacheSpecError> {
        self.config
            .validate()
            .map_err(|e| engine(strip_prefix(&e.to_string())))
    }

    /// A one-line summary for logs.
    pub fn summary(&self) -> String {
        format!(
            "{} cache of {} over {}",
            self.config.mode,
            format_size(self.config.cache_bytes),
            self.backing
        )
    }
}

/// Drops the engine's "invalid cache configuration: " prefix (our messages
/// say "cache 'NAME': ..." themselves).
fn strip_prefix(m: &str) -> String {
    m.trim_start_matches("invalid cache configuration: ")
        .to_owned()
}

/// Parses a cache size: at least one byte, at most the largest drive.
pub fn parse_cache_size(text: &str) -> Result<u64, CacheSpecError> {
    let size = parse_size(text).map_err(CacheSizeError::Unparsable)?;
    if size == 0 {
        return Err(CacheSizeError::Zero.into());
    }
    if size > MAX_DRIVE_BYTES {
        return Err(CacheSizeError::TooLarge {
            size,
            max: MAX_DRIVE_BYTES,
        }
        .into());
    }
    Ok(size)
}

/// A scalar in a config entry: text, an integer or a boolean, kept as the
/// text [`CacheSpec::set`] parses (so `dirty_high = 50` and
/// `dirty_high = "50%"` both work).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionText(pub String);

impl<'de> Deserialize<'de> for OptionText {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = OptionText;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string, a number or a boolean")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<OptionText, E> {
                Ok(OptionText(v.to_string()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<OptionText, E> {
                Ok(OptionText(v.to_string()))
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<OptionText, E> {
                Ok(OptionText(v.to_string()))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<OptionText, E> {
                Ok(OptionText(v.to_owned()))
            }
        }
        d.deserialize_any(V)
    }
}

/// `[[cache]]` in the config file: see docs/config.md.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheEntry {
    pub name: Spanned<String>,
    pub backing: Spanned<String>,
    pub size: Spanned<Size>,
    pub mode: Spanned<String>,
    pub block_size: Option<Spanned<OptionText>>,
    pub policy: Option<Spanned<OptionText>>,
    pub sequential_cutoff: Option<Spanned<OptionText>>,
    pub dirty_high: Option<Spanned<OptionText>>,
    pub dirty_low: Option<Spanned<OptionText>>,
    pub max_dirty_age: Option<Spanned<OptionText>>,
    pub writeback_max_io: Option<Spanned<OptionText>>,
    pub retry_initial: Option<Spanned<OptionText>>,
    pub retry_max: Option<Spanned<OptionText>>,
    pub direct: Option<Spanned<bool>>,
    pub nbd_connections: Option<Spanned<OptionText>>,
    pub nbd_timeout: Option<Spanned<OptionText>>,
    pub shutdown_timeout: Option<Spanned<OptionText>>,
    /// Scheduled snapshot pushes of the cache's logical image (checked
    /// with the drives' keys, `control::snapshots::policy`).
    pub snapshot_interval: Option<Spanned<String>>,
    pub snapshot_remote: Option<String>,
    pub snapshot_keep_last: Option<u64>,
    pub snapshot_keep_daily: Option<u64>,
    #[serde(default)]
    pub snapshot_encrypt: bool,
    /// Access rules, as a `[[drive]]`'s (`nbd::access`).
    #[serde(default)]
    pub allow_identities: Vec<String>,
    #[serde(default)]
    pub read_only_identities: Vec<String>,
    #[serde(default)]
    pub allow_networks: Vec<Spanned<String>>,
}

impl CacheEntry {
    /// The spec this entry declares, or the byte offset in the file of the
    /// value at fault and the reason.
    pub fn to_spec(&self) -> Result<CacheSpec, (usize, String)> {
        let at = |s: &Spanned<String>| s.span().start;
        let name = self.name.get_ref();
        let size = self.size.get_ref().0;
        let mut spec = CacheSpec::new(
            name,
            self.backing.get_ref(),
            &size.to_string(),
            self.mode.get_ref(),
        )
        .map_err(|e| {
            let offset = match e {
                CacheSpecError::InvalidName(_) => at(&self.name),
                CacheSpecError::InvalidBacking(_) => at(&self.backing),
                CacheSpecError::InvalidSize(_) => self.size.span().start,
                CacheSpecError::InvalidOption(_) => at(&self.mode),
            };
            (offset, e.to_string())
        })?;
        let options: [(&str, &Option<Spanned<OptionText>>); 12] = [
            ("block-size", &self.block_size),
            ("policy", &self.policy),
            ("sequential-cutoff", &self.sequential_cutoff),
            ("dirty-high", &self.dirty_high),
            ("dirty-low", &self.dirty_low),
            ("max-dirty-age", &self.max_dirty_age),
            ("writeback-max-io", &self.writeback_max_io),
            ("retry-initial", &self.retry_initial),
            ("retry-max", &self.retry_max),
            ("nbd-connections", &self.nbd_connections),
            ("nbd-timeout", &self.nbd_timeout),
            ("shutdown-timeout", &self.shutdown_timeout),
        ];
        for (key, value) in options {
            if let Some(v) = value {
                spec.set(key, &v.get_ref().0)
                    .map_err(|e| (v.span().start, e.to_string()))?;
            }
        }
        if let Some(d) = &self.direct {
            spec.options.direct_io = *d.get_ref();
        }
        spec.access = config_access(
            &self.allow_identities,
            &self.read_only_identities,
            &self.allow_networks,
        )
        .map_err(|(offset, e)| match offset {
            Some(offset) => (offset, e),
            None => (at(&self.name), format!("cache '{name}': {e}")),
        })?;
        spec.validate()
            .map_err(|e| (at(&self.name), format!("cache '{name}': {e}")))?;
        Ok(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::PolicyKind;

    #[test]
    fn options_by_either_spelling() {
        let mut s = CacheSpec::new("db", "/dev/sdb", "2G", "writeback").unwrap();
        for (k, v) in [
            ("block_size", "64K"),
            ("policy", "lru"),
            ("dirty-high", "70"),
            ("dirty_low", "10%"),
            ("max_dirty_age", "5s"),
            ("direct", "true"),
            ("nbd-connections", "2"),
            ("nbd_timeout", "10s"),
            ("shutdown-timeout", "1m"),
        ] {
            s.set(k, v).unwrap();
        }
        s.validate().unwrap();
        assert_eq!(s.config.mode, Mode::WriteBack);
        assert_eq!(s.config.block_bytes, 64 << 10);
        assert_eq!(s.config.policy, PolicyKind::Lru);
        assert_eq!(
            (s.config.dirty_high_percent, s.config.dirty_low_percent),
            (70, 10)
        );
        assert!(s.options.direct_io);
        assert_eq!(s.options.nbd_connections, 2);
        assert_eq!(s.shutdown_timeout_ms, 60_000);
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let e = CacheSpec::new("DB", "/x", "1G", "writeback").unwrap_err();
        assert!(
            matches!(&e, CacheSpecError::InvalidName(m) if m.to_string().contains("invalid cache name 'DB'")),
            "{e}"
        );
        let e = CacheSpec::new("db", "/x", "1G", "writeonce").unwrap_err();
        assert!(
            matches!(&e, CacheSpecError::InvalidOption(m) if m.to_string().contains("writeback"))
        );
        let e = CacheSpec::new("db", "/x", "0", "wb").unwrap_err();
        assert!(matches!(e, CacheSpecError::InvalidSize(_)));
        let e = CacheSpec::new("db", "/x", "12Q", "wb").unwrap_err();
        assert!(matches!(e, CacheSpecError::InvalidSize(_)));
        let e = CacheSpec::new("db", "nbd://", "1G", "wb").unwrap_err();
        assert!(matches!(e, CacheSpecError::InvalidBacking(_)), "{e}");
        let e = CacheSpec::new("db", "  ", "1G", "wb").unwrap_err();
        assert!(matches!(e, CacheSpecError::InvalidBacking(_)), "{e}");
        let mut s = CacheSpec::new("db", "/x", "1G", "wb").unwrap();
        let e = s.set("turbo", "on").unwrap_err().to_string();
        assert!(e.contains("unknown cache option 'turbo'") && e.contains("block-size"));
        assert!(s.set("nbd-connections", "0").is_err());
        assert!(s.set("nbd-timeout", "10ms").is_err());
        assert!(s.set("direct", "maybe").is_err());
        s.set("block-size", "3000").unwrap();
        let e = s.validate().unwrap_err().to_string();
        assert!(
            e.starts_with("block size 3000 must be a power of two"),
            "{e}"
        );
        let s = CacheSpec::new("db", "/x", "16K", "wb").unwrap();
        assert!(s.validate().unwrap_err().to_string().contains("fewer than"));
    }
}
