//! Values every kind's spec shares, parsed once (pure: no I/O). Sizes are
//! `crate::size::parse` (each kind adds its bounds); intervals are here.
//!
//! # Invariants
//!
//! - Every interval the daemon accepts, from the command line, the config
//!   file or the API, goes through [`parse_interval_ms`] (humantime
//!   syntax: `500ms`, `30s`, `1h 30m`) or [`check_interval_ms`] (a number
//!   of milliseconds), with the floor of what it paces ([`IntervalUse`]).
//! - There are two floors, because the work they pace differs by orders of
//!   magnitude: a persistent drive's sync writes only the pages it knows
//!   are dirty ([`MIN_DRIVE_SYNC_INTERVAL_MS`], 50 ms), a directory's sync
//!   walks its whole tree ([`MIN_DIR_SYNC_INTERVAL_MS`], 1 s, enforced by
//!   the directory manager itself).

use std::time::Duration;

use toml::Spanned;

use crate::nbd::access::{AccessRules, Network};

pub use crate::dirsync::manager::MIN_DIR_SYNC_INTERVAL_MS;

/// Shortest background sync interval of a persistent drive.
pub const MIN_DRIVE_SYNC_INTERVAL_MS: u64 = 50;

/// What an interval paces: each has its floor and its wording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntervalUse {
    /// A persistent drive's background syncs.
    DriveSync,
    /// A directory in RAM's syncs to disk.
    DirSync,
}

impl IntervalUse {
    /// The shortest interval accepted.
    pub fn min_ms(self) -> u64 {
        match self {
            IntervalUse::DriveSync => MIN_DRIVE_SYNC_INTERVAL_MS,
            IntervalUse::DirSync => MIN_DIR_SYNC_INTERVAL_MS,
        }
    }

    /// What the value is called in messages.
    fn noun(self) -> &'static str {
        match self {
            IntervalUse::DriveSync => "sync interval",
            IntervalUse::DirSync => "interval",
        }
    }

    /// Examples of valid values, for messages.
    fn examples(self) -> &'static str {
        match self {
            IntervalUse::DriveSync => "500ms, 30s, 10m",
            IntervalUse::DirSync => "30s, 10m, 1h",
        }
    }
}

/// Why an interval was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum IntervalError {
    /// Not a duration (humantime's reason).
    #[error("invalid {} '{text}': {source} (use a duration like {})", what.noun(), what.examples())]
    Syntax {
        what: IntervalUse,
        text: String,
        /// Boxed: keeps every error that carries an interval error small.
        #[source]
        source: Box<humantime::DurationError>,
    },
    /// Does not fit in milliseconds.
    #[error("{} '{text}' is too long", what.noun())]
    TooLong { what: IntervalUse, text: String },
    /// Below the floor of what it paces (`text`: as written).
    #[error("{}", too_short_text(*what, text, *ms))]
    TooShort {
        what: IntervalUse,
        text: String,
        ms: u64,
    },
}

fn too_short_text(what: IntervalUse, text: &str, ms: u64) -> String {
    let min = what.min_ms();
    match what {
        IntervalUse::DriveSync => {
            format!("a sync interval of {ms} ms is shorter than the minimum of {min} ms")
        }
        IntervalUse::DirSync => format!(
            "interval '{text}' is shorter than the minimum of {} s (a sync walks the whole tree)",
            min / 1000
        ),
    }
}

/// Parses an interval (`"10m"`, `" 1h 30m "`, `"500ms"`) into
/// milliseconds, at least the floor of `what`.
pub fn parse_interval_ms(what: IntervalUse, text: &str) -> Result<u64, IntervalError> {
    let d = humantime::parse_duration(text.trim()).map_err(|source| IntervalError::Syntax {
        what,
        text: text.to_owned(),
        source: Box::new(source),
    })?;
    let ms = u64::try_from(d.as_millis()).map_err(|_| IntervalError::TooLong {
        what,
        text: text.to_owned(),
    })?;
    check_floor(what, text, ms)
}

/// Checks an interval given in milliseconds against the floor of `what`.
pub fn check_interval_ms(what: IntervalUse, ms: u64) -> Result<u64, IntervalError> {
    check_floor(what, &format!("{ms}ms"), ms)
}

fn check_floor(what: IntervalUse, text: &str, ms: u64) -> Result<u64, IntervalError> {
    if ms < what.min_ms() {
        return Err(IntervalError::TooShort {
            what,
            text: text.to_owned(),
            ms,
        });
    }
    Ok(ms)
}

/// An interval for people: `10m`, `1m 30s`, `500ms`.
pub fn format_interval(ms: u64) -> String {
    humantime::format_duration(Duration::from_millis(ms)).to_string()
}

/// The access rules a config entry gives (`[[drive]]` and `[[cache]]`
/// share the keys `allow_identities`, `read_only_identities` and
/// `allow_networks`). An error has the byte offset of the network that does
/// not parse (None: an empty identity, which the caller places at the
/// entry's name) and the reason.
pub fn config_access(
    identities: &[String],
    read_only_identities: &[String],
    networks: &[Spanned<String>],
) -> Result<AccessRules, (Option<usize>, String)> {
    let networks = networks
        .iter()
        .map(|n| {
            n.get_ref()
                .parse::<Network>()
                .map_err(|e| (Some(n.span().start), e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let rules = AccessRules {
        identities: identities.to_vec(),
        read_only_identities: read_only_identities.to_vec(),
        networks,
    };
    rules.check().map_err(|e| (None, e.to_string()))?;
    Ok(rules)
}

#[cfg(test)]
mod tests {
    use super::*;
    use IntervalUse::{DirSync, DriveSync};

    #[test]
    fn intervals_for_directories() {
        assert_eq!(parse_interval_ms(DirSync, "10m"), Ok(600_000));
        assert_eq!(parse_interval_ms(DirSync, " 1h 30m "), Ok(5_400_000));
        assert_eq!(parse_interval_ms(DirSync, "1s"), Ok(1000));
        assert_eq!(
            parse_interval_ms(DirSync, "500ms").unwrap_err().to_string(),
            "interval '500ms' is shorter than the minimum of 1 s (a sync walks the whole tree)"
        );
        let e = parse_interval_ms(DirSync, "soon").unwrap_err().to_string();
        assert!(e.starts_with("invalid interval 'soon'"), "{e}");
        assert!(e.ends_with("(use a duration like 30s, 10m, 1h)"), "{e}");
        assert!(parse_interval_ms(DirSync, "").is_err());
    }

    #[test]
    fn intervals_for_drives() {
        assert_eq!(parse_interval_ms(DriveSync, "50ms"), Ok(50));
        assert_eq!(parse_interval_ms(DriveSync, "10s"), Ok(10_000));
        assert_eq!(
            parse_interval_ms(DriveSync, "1ms").unwrap_err().to_string(),
            "a sync interval of 1 ms is shorter than the minimum of 50 ms"
        );
        assert_eq!(
            check_interval_ms(DriveSync, 1).unwrap_err().to_string(),
            "a sync interval of 1 ms is shorter than the minimum of 50 ms"
        );
        let e = parse_interval_ms(DriveSync, "soon")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("invalid sync interval 'soon'"), "{e}");
        assert!(e.ends_with("(use a duration like 500ms, 30s, 10m)"), "{e}");
        let e = parse_interval_ms(DriveSync, "9999999999999999y").unwrap_err();
        assert!(matches!(
            e,
            IntervalError::TooLong { .. } | IntervalError::Syntax { .. }
        ));
    }

    #[test]
    fn formatting() {
        assert_eq!(format_interval(600_000), "10m");
        assert_eq!(format_interval(90_000), "1m 30s");
        assert_eq!(format_interval(500), "500ms");
    }
}
