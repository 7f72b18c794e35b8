//! A drive's or a cache's snapshot settings from its `[[drive]]` or
//! `[[cache]]` table (pure parsing): scheduled pushes
//! (`snapshot_interval`, `snapshot_remote`, retention) and, for drives,
//! `restore_from` (fill the drive from its newest snapshot at start when
//! its local state is missing).

use crate::snapshot::Retention;

/// The shortest interval between scheduled pushes: each push reads the
/// whole drive (hashing every chunk) even when little changed.
pub const MIN_SNAPSHOT_INTERVAL_MS: u64 = 10_000;

/// What a snapshot is taken of. Drives and caches share one namespace of
/// names (NBD export names), so a name says which one it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum TargetKind {
    /// A drive: its data as clients see it.
    #[default]
    Drive,
    /// A cache: its logical image (the backing with the dirty data
    /// written back, read through the cache).
    Cache,
}

impl TargetKind {
    /// `drive` or `cache` (also the label name in /metrics).
    pub fn name(self) -> &'static str {
        match self {
            TargetKind::Drive => "drive",
            TargetKind::Cache => "cache",
        }
    }
}

/// A drive's (or a cache's) snapshot settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrivePolicy {
    /// What the settings are of.
    pub kind: TargetKind,
    /// Push every this often (None: no scheduled pushes).
    pub interval_ms: Option<u64>,
    /// Where scheduled pushes go.
    pub remote: Option<String>,
    /// Applied (with GC) after each scheduled push, when set.
    pub retention: Retention,
    /// Encrypt scheduled pushes with the remote's key.
    pub encrypt: bool,
    /// Restore the drive from this remote at start when its local state
    /// is missing.
    pub restore_from: Option<String>,
}

/// Why a drive's snapshot settings were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// Not a duration.
    #[error("snapshot_interval '{text}' is not a duration like \"15m\", \"1h\" or \"30s\"")]
    Interval { text: String },
    /// Below the floor.
    #[error("snapshot_interval '{text}' is shorter than the minimum of 10s")]
    TooShort { text: String },
    /// An interval without a remote, or the other way.
    #[error("snapshot_interval and snapshot_remote go together: give both")]
    Incomplete,
    /// Retention without a schedule.
    #[error("snapshot_keep_last / snapshot_keep_daily apply to scheduled pushes: add snapshot_interval and snapshot_remote")]
    RetentionWithoutSchedule,
    /// A retention that keeps nothing.
    #[error("snapshot_keep_last / snapshot_keep_daily of 0 would delete every snapshot: give at least 1 (or leave it out to keep all)")]
    KeepNothing,
    /// `restore_from` on a cache (its data lives in its backing).
    #[error("restore_from applies to drives only: a cache's data is its backing (restore a cache's snapshot into a drive with `ramd restore NAME --from REMOTE --as DRIVE`)")]
    RestoreIntoCache,
}

/// The raw keys as the config has them.
#[derive(Debug, Clone, Default)]
pub struct PolicyKeys<'a> {
    pub interval: Option<&'a str>,
    pub remote: Option<&'a str>,
    pub keep_last: Option<u64>,
    pub keep_daily: Option<u64>,
    pub encrypt: bool,
    pub restore_from: Option<&'a str>,
}

/// Parses a snapshot interval (humantime: `15m`, `1h 30m`).
pub fn parse_snapshot_interval_ms(text: &str) -> Result<u64, PolicyError> {
    let d = humantime::parse_duration(text.trim()).map_err(|_| PolicyError::Interval {
        text: text.to_owned(),
    })?;
    let ms = d.as_millis() as u64;
    if ms < MIN_SNAPSHOT_INTERVAL_MS {
        return Err(PolicyError::TooShort {
            text: text.to_owned(),
        });
    }
    Ok(ms)
}

impl DrivePolicy {
    /// Checks the keys together. None: the drive has no snapshot settings.
    pub fn from_keys(k: &PolicyKeys<'_>) -> Result<Option<DrivePolicy>, PolicyError> {
        let interval_ms = k.interval.map(parse_snapshot_interval_ms).transpose()?;
        if interval_ms.is_some() != k.remote.is_some() {
            return Err(PolicyError::Incomplete);
        }
        if (k.keep_last.is_some() || k.keep_daily.is_some()) && interval_ms.is_none() {
            return Err(PolicyError::RetentionWithoutSchedule);
        }
        if k.keep_last == Some(0) || k.keep_daily == Some(0) {
            return Err(PolicyError::KeepNothing);
        }
        let p = DrivePolicy {
            kind: TargetKind::Drive,
            interval_ms,
            remote: k.remote.map(str::to_owned),
            retention: Retention {
                keep_last: k.keep_last.map(|n| n as usize),
                keep_daily: k.keep_daily.map(|n| n as usize),
            },
            encrypt: k.encrypt,
            restore_from: k.restore_from.map(str::to_owned),
        };
        Ok((p != DrivePolicy::default()).then_some(p))
    }

    /// [`DrivePolicy::from_keys`] for a `[[cache]]`: no `restore_from`.
    pub fn for_cache(k: &PolicyKeys<'_>) -> Result<Option<DrivePolicy>, PolicyError> {
        if k.restore_from.is_some() {
            return Err(PolicyError::RestoreIntoCache);
        }
        Ok(DrivePolicy::from_keys(k)?.map(|p| DrivePolicy {
            kind: TargetKind::Cache,
            ..p
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_go_together() {
        let k = PolicyKeys {
            interval: Some("15m"),
            remote: Some("s3"),
            keep_last: Some(3),
            ..PolicyKeys::default()
        };
        let p = DrivePolicy::from_keys(&k).unwrap().unwrap();
        assert_eq!(p.interval_ms, Some(900_000));
        assert_eq!(p.retention.keep_last, Some(3));
        let only = PolicyKeys {
            interval: Some("15m"),
            ..PolicyKeys::default()
        };
        assert_eq!(DrivePolicy::from_keys(&only), Err(PolicyError::Incomplete));
        let short = PolicyKeys {
            interval: Some("1s"),
            remote: Some("s3"),
            ..PolicyKeys::default()
        };
        assert!(matches!(
            DrivePolicy::from_keys(&short),
            Err(PolicyError::TooShort { .. })
        ));
        let zero = PolicyKeys {
            keep_daily: Some(0),
            ..k
        };
        assert_eq!(DrivePolicy::from_keys(&zero), Err(PolicyError::KeepNothing));
        assert_eq!(DrivePolicy::from_keys(&PolicyKeys::default()), Ok(None));
        let c = DrivePolicy::for_cache(&k).unwrap().unwrap();
        assert_eq!((c.kind, c.interval_ms), (TargetKind::Cache, Some(900_000)));
        let r = PolicyKeys {
            restore_from: Some("s3"),
            ..PolicyKeys::default()
        };
        assert_eq!(
            DrivePolicy::for_cache(&r),
            Err(PolicyError::RestoreIntoCache)
        );
        assert_eq!(DrivePolicy::for_cache(&PolicyKeys::default()), Ok(None));
    }
}
