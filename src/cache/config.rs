//! How a cache is set up: mode, sizes, policy, write-back thresholds and the
//! retry policy for a failing backing. Pure data plus validation.

use std::fmt;
use std::str::FromStr;

use super::policy::PolicyKind;
use super::CacheError;

/// How writes reach the backing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Write the backing and the cache; acknowledge after the backing write.
    WriteThrough,
    /// Write the backing only and drop any cached copy (reads still fill
    /// the cache): for data written once and rarely read back.
    WriteAround,
    /// Write RAM only and mark it dirty; a background flusher writes it back.
    /// FLUSH and FUA write back what they cover and flush the backing first.
    WriteBack,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Mode::WriteThrough, Mode::WriteAround, Mode::WriteBack];

    /// Parses a mode name (`writeback`, `write-back`, `wb`, ...).
    pub fn parse(s: &str) -> Result<Mode, SettingError> {
        match s.to_ascii_lowercase().replace(['-', '_'], "").as_str() {
            "writethrough" | "wt" => Ok(Mode::WriteThrough),
            "writearound" | "wa" => Ok(Mode::WriteAround),
            "writeback" | "wb" => Ok(Mode::WriteBack),
            _ => Err(SettingError::UnknownMode(s.to_owned())),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Mode::WriteThrough => "writethrough",
            Mode::WriteAround => "writearound",
            Mode::WriteBack => "writeback",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// [`Mode::parse`], for `str::parse`.
impl FromStr for Mode {
    type Err = SettingError;
    fn from_str(s: &str) -> Result<Self, SettingError> {
        Mode::parse(s)
    }
}

/// A cache setting's value that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingError {
    #[error("unknown cache mode '{0}': use writethrough, writearound or writeback")]
    UnknownMode(String),
    #[error("'{0}' is not a duration (like 500ms, 30s, 5m)")]
    NotADuration(String),
    #[error("'{0}' has no time unit: write {0}ms, {0}s or {0}m")]
    NoTimeUnit(String),
    #[error("unknown time unit '{unit}' in '{text}': use ms, s, m or h")]
    UnknownTimeUnit { unit: String, text: String },
    #[error("duration '{0}' is too long")]
    DurationTooLong(String),
    #[error("expected a percentage from 0 to 100")]
    NotAPercentage,
}

/// Smallest and largest cache block.
pub const MIN_BLOCK_BYTES: u64 = 4 << 10;
pub const MAX_BLOCK_BYTES: u64 = 1 << 20;
/// A cache must hold at least this many blocks to be useful.
pub const MIN_BLOCKS: u64 = 16;

/// Everything that defines a cache besides its backing.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheConfig {
    /// How writes reach the backing.
    pub mode: Mode,
    /// RAM the cache may hold for data (rounded down to whole blocks).
    pub cache_bytes: u64,
    /// The unit of caching, eviction and write-back: a power of two from
    /// 4 KiB to 1 MiB. Small blocks waste no backing bandwidth on random
    /// I/O; large blocks cost less metadata (about 100 bytes per block).
    pub block_bytes: u64,
    /// Which blocks to evict.
    pub policy: PolicyKind,
    /// A stream of sequential I/O longer than this bypasses the cache
    /// (misses are not inserted; writes go to the backing), so a backup or
    /// a copy does not flush the working set. 0 turns bypass off.
    pub sequential_cutoff_bytes: u64,
    /// Write-back: the flusher starts writing back when dirty data reaches
    /// this share of the cache (percent)...
    pub dirty_high_percent: u8,
    /// ...and stops when it is down to this share.
    pub dirty_low_percent: u8,
    /// Write-back: dirty data older than this is written back even below the
    /// high watermark, bounding what a crash of the host can lose.
    pub max_dirty_age_ms: u64,
    /// Largest single write the flusher sends to the backing (adjacent
    /// dirty blocks are merged up to this).
    pub writeback_max_io_bytes: u64,
    /// First wait before retrying a failed backing, doubled per failure...
    pub retry_initial_ms: u64,
    /// ...up to this.
    pub retry_max_ms: u64,
}

impl CacheConfig {
    /// A cache of `cache_bytes` in `mode` with every other setting at its
    /// default.
    pub fn new(mode: Mode, cache_bytes: u64) -> Self {
        CacheConfig {
            mode,
            cache_bytes,
            block_bytes: 4 << 10,
            policy: PolicyKind::S3Fifo,
            sequential_cutoff_bytes: 4 << 20,
            dirty_high_percent: 50,
            dirty_low_percent: 20,
            max_dirty_age_ms: 30_000,
            writeback_max_io_bytes: 1 << 20,
            retry_initial_ms: 100,
            retry_max_ms: 30_000,
        }
    }

    /// Checks every setting; the message says what to change.
    pub fn validate(&self) -> Result<(), CacheError> {
        let bad = |m: String| Err(CacheError::Config(m));
        let b = self.block_bytes;
        if !b.is_power_of_two() || !(MIN_BLOCK_BYTES..=MAX_BLOCK_BYTES).contains(&b) {
            return bad(format!(
                "block size {b} must be a power of two from 4K to 1M (like 4K, 64K, 1M)"
            ));
        }
        if self.cache_bytes / b < MIN_BLOCKS {
            return bad(format!(
                "cache size {} holds fewer than {MIN_BLOCKS} blocks of {b} bytes: use a larger --size or a smaller --block-size",
                self.cache_bytes
            ));
        }
        if self.cache_bytes / b >= u32::MAX as u64 {
            return bad(format!(
                "cache size {} has too many blocks of {b} bytes: use a larger --block-size",
                self.cache_bytes
            ));
        }
        if self.dirty_high_percent == 0
            || self.dirty_high_percent > 100
            || self.dirty_low_percent >= self.dirty_high_percent
        {
            return bad(format!(
                "dirty watermarks must satisfy 0 <= low < high <= 100 (got low {} high {})",
                self.dirty_low_percent, self.dirty_high_percent
            ));
        }
        if self.writeback_max_io_bytes < b || self.writeback_max_io_bytes > 32 << 20 {
            return bad(format!(
                "write-back I/O size {} must be between the block size and 32M",
                self.writeback_max_io_bytes
            ));
        }
        if self.retry_initial_ms == 0 || self.retry_max_ms < self.retry_initial_ms {
            return bad("retry backoff must satisfy 0 < initial <= max".into());
        }
        Ok(())
    }

    /// Number of cache blocks (slots).
    pub fn slots(&self) -> u64 {
        self.cache_bytes / self.block_bytes
    }

    /// Sets one option by its user-facing name, the way the CLI flags, the
    /// config file and the API spell it: `mode`, `size`, `block-size`,
    /// `policy`, `sequential-cutoff`, `dirty-high`, `dirty-low` (percent),
    /// `max-dirty-age`, `retry-initial`, `retry-max` (durations like
    /// `500ms`, `30s`, `5m`), `writeback-max-io`. Sizes take binary units.
    /// Call [`CacheConfig::validate`] when done.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), CacheError> {
        let bad = |m: &dyn fmt::Display| CacheError::Config(format!("{key}={value}: {m}"));
        let size = || crate::size::parse(value).map_err(|e| bad(&e));
        let percent = || match value.trim_end_matches('%').parse::<u8>() {
            Ok(p) if p <= 100 => Ok(p),
            _ => Err(bad(&SettingError::NotAPercentage)),
        };
        let millis = || parse_duration(value).map_err(|e| bad(&e));
        match key {
            "mode" => self.mode = Mode::parse(value).map_err(|e| bad(&e))?,
            "size" => self.cache_bytes = size()?,
            "block-size" => self.block_bytes = size()?,
            "policy" => self.policy = value.parse().map_err(|e| bad(&e))?,
            "sequential-cutoff" => self.sequential_cutoff_bytes = size()?,
            "dirty-high" => self.dirty_high_percent = percent()?,
            "dirty-low" => self.dirty_low_percent = percent()?,
            "max-dirty-age" => self.max_dirty_age_ms = millis()?,
            "writeback-max-io" => self.writeback_max_io_bytes = size()?,
            "retry-initial" => self.retry_initial_ms = millis()?,
            "retry-max" => self.retry_max_ms = millis()?,
            _ => {
                return Err(CacheError::Config(format!(
                    "unknown cache option '{key}': use mode, size, block-size, policy, \
                     sequential-cutoff, dirty-high, dirty-low, max-dirty-age, \
                     writeback-max-io, retry-initial or retry-max"
                )))
            }
        }
        Ok(())
    }
}

/// Parses `250ms`, `30s`, `5m`, `1h 30m` (humantime, as every interval
/// in ramd) into milliseconds. A bare number is refused: `10` read as
/// 10 ms surprised users who meant seconds, so a unit is required (JSON
/// numbers in the API are milliseconds by their documented type).
pub fn parse_duration(text: &str) -> Result<u64, SettingError> {
    let t = text.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(SettingError::NoTimeUnit(t.to_owned()));
    }
    let d = humantime::parse_duration(t).map_err(|e| match e {
        humantime::DurationError::UnknownUnit { unit, .. } => SettingError::UnknownTimeUnit {
            unit,
            text: text.to_owned(),
        },
        humantime::DurationError::NumberOverflow => SettingError::DurationTooLong(text.to_owned()),
        _ => SettingError::NotADuration(text.to_owned()),
    })?;
    u64::try_from(d.as_millis()).map_err(|_| SettingError::DurationTooLong(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse() {
        assert_eq!("writeback".parse(), Ok(Mode::WriteBack));
        assert_eq!("write-through".parse(), Ok(Mode::WriteThrough));
        assert_eq!("WRITE_AROUND".parse(), Ok(Mode::WriteAround));
        assert!("writeonce"
            .parse::<Mode>()
            .unwrap_err()
            .to_string()
            .contains("writeback"));
    }

    #[test]
    fn options_by_name() {
        let mut c = CacheConfig::new(Mode::WriteThrough, 0);
        for (k, v) in [
            ("mode", "writeback"),
            ("size", "2G"),
            ("block-size", "64K"),
            ("policy", "lru"),
            ("sequential-cutoff", "8M"),
            ("dirty-high", "70%"),
            ("dirty-low", "10"),
            ("max-dirty-age", "5s"),
            ("retry-max", "1m"),
        ] {
            c.set(k, v).unwrap();
        }
        c.validate().unwrap();
        assert_eq!(c.mode, Mode::WriteBack);
        assert_eq!((c.cache_bytes, c.block_bytes), (2 << 30, 64 << 10));
        assert_eq!(c.policy, PolicyKind::Lru);
        assert_eq!((c.dirty_high_percent, c.dirty_low_percent), (70, 10));
        assert_eq!((c.max_dirty_age_ms, c.retry_max_ms), (5000, 60_000));
        assert!(c.set("dirty-high", "101").is_err());
        assert!(c.set("max-dirty-age", "5 fortnights").is_err());
        let e = c.set("turbo", "on").unwrap_err().to_string();
        assert!(
            e.contains("unknown cache option 'turbo'") && e.contains("block-size"),
            "{e}"
        );
        let e = parse_duration("250").unwrap_err();
        assert_eq!(e, SettingError::NoTimeUnit("250".into()));
        assert!(e.to_string().contains("250ms, 250s or 250m"), "{e}");
        assert_eq!(parse_duration("250ms"), Ok(250));
        assert_eq!(parse_duration("1m 30s"), Ok(90_000));
        assert!(matches!(
            parse_duration("5 fortnights"),
            Err(SettingError::UnknownTimeUnit { .. })
        ));
    }

    #[test]
    fn validation_explains() {
        let mut c = CacheConfig::new(Mode::WriteBack, 1 << 20);
        c.validate().unwrap();
        c.block_bytes = 3000;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("power of two"));
        c.block_bytes = 2 << 20;
        assert!(c.validate().is_err());
        c.block_bytes = 128 << 10;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("fewer than 16"));
        c.block_bytes = 4096;
        c.dirty_low_percent = 60;
        assert!(c.validate().unwrap_err().to_string().contains("watermarks"));
    }
}
