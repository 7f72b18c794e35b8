//! Snapshot ids as users type them (pure).

use super::error::SnapshotsError;
use crate::snapshot::SnapshotId;

/// A snapshot id from the CLI: the full `DRIVE/MS-SUFFIX` or `MS-SUFFIX`
/// of `drive`.
pub fn parse_id(drive: &str, text: &str) -> Result<SnapshotId, SnapshotsError> {
    let full = if text.contains('/') {
        text.to_owned()
    } else {
        format!("{drive}/{text}")
    };
    let id: SnapshotId = full.parse().map_err(|source| SnapshotsError::BadId {
        text: text.to_owned(),
        source,
    })?;
    if id.drive != drive {
        return Err(SnapshotsError::NoSnapshot {
            remote: String::new(),
            drive: drive.to_owned(),
        });
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_full_ids_of_the_drive() {
        let full = parse_id("db", "db/0001764000000123-1a2b3c4d").unwrap();
        let short = parse_id("db", "0001764000000123-1a2b3c4d").unwrap();
        assert_eq!(full, short);
        assert_eq!(full.drive, "db");
        assert!(matches!(
            parse_id("db", "other/0001764000000123-1a2b3c4d"),
            Err(SnapshotsError::NoSnapshot { .. })
        ));
        assert!(matches!(
            parse_id("db", "nonsense"),
            Err(SnapshotsError::BadId { .. })
        ));
    }
}
