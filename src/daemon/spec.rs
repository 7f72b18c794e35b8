//! Drive names and `--drive NAME=SIZE[,mem-limit=SIZE][,read-only]` specs
//! (pure parsing, shared by the command line, the config file and the API).

use crate::size::parse_size;

/// Longest drive name.
pub const NAME_MAX_BYTES: usize = 64;

/// Why a name or spec was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// The name breaks the naming rule.
    #[error("invalid drive name '{0}': use 1-64 of a-z 0-9 _ -, starting with a letter or digit")]
    InvalidName(String),
    /// A size could not be parsed.
    #[error("{0}")]
    InvalidSize(String),
    /// The spec is malformed.
    #[error("{0}")]
    Malformed(String),
}

/// Checks a drive name: `[a-z0-9][a-z0-9_-]{0,63}`.
pub fn check_name(name: &str) -> Result<(), SpecError> {
    let b = name.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= NAME_MAX_BYTES
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_' || *c == b'-');
    if ok {
        Ok(())
    } else {
        Err(SpecError::InvalidName(name.to_owned()))
    }
}

/// Parses a drive size: a human size of at least one byte.
pub fn parse_drive_size(text: &str) -> Result<u64, SpecError> {
    let size = parse_size(text).map_err(SpecError::InvalidSize)?;
    if size == 0 {
        return Err(SpecError::InvalidSize(
            "a drive size must be at least 1 byte".into(),
        ));
    }
    Ok(size)
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
}

/// Parses `NAME=SIZE[,mem-limit=SIZE][,read-only][,overcommit]`.
pub fn parse_drive_spec(spec: &str) -> Result<DriveSpec, SpecError> {
    let mut parts = spec.split(',');
    let head = parts.next().unwrap_or_default();
    let Some((name, size)) = head.split_once('=') else {
        return Err(SpecError::Malformed(format!(
            "'{spec}': expected NAME=SIZE, like ram0=1G"
        )));
    };
    check_name(name)?;
    let size_bytes = parse_drive_size(size)?;
    let mut d = DriveSpec {
        name: name.to_owned(),
        size_bytes,
        mem_limit_bytes: None,
        read_only: false,
        overcommit: false,
    };
    for opt in parts {
        match opt.split_once('=') {
            Some(("mem-limit", v)) => {
                d.mem_limit_bytes = Some(parse_size(v).map_err(SpecError::InvalidSize)?)
            }
            None if opt == "read-only" || opt == "ro" => d.read_only = true,
            None if opt == "overcommit" => d.overcommit = true,
            _ => {
                return Err(SpecError::Malformed(format!(
                "'{spec}': unknown option '{opt}' (known: mem-limit=SIZE, read-only, overcommit)"
            )))
            }
        }
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for good in ["ram0", "0", "a_b-c", &"x".repeat(64)] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", "Ram", "-a", "_a", "a.b", "a b", &"x".repeat(65), "é"] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
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
        for bad in [
            "Bad=1G",
            "x=12Q",
            "x",
            "x=0",
            "x=1G,turbo",
            "x=1G,mem-limit=z",
        ] {
            assert!(parse_drive_spec(bad).is_err(), "{bad}");
        }
    }
}
