//! `drive.json`: the daemon's settings of one persistent drive, kept in its
//! state directory next to the engine's files, so a drive created through
//! the API comes back at the next start with the same promise, limits and
//! key file (the key itself is never stored).
//!
//! ```text
//!  STATE_DIR/drives/NAME/
//!    drive.json   this file (JSON, below)            written by the daemon
//!    meta         engine metadata (docs/formats.md)  ┐
//!    image        raw sparse image of the drive      │ written by
//!    pages        one entry per page of the image    │ src/persist
//!    journal      redo journal                       ┘
//! ```
//!
//! ```json
//! {"version": 1, "name": "db", "origin": "api", "size_bytes": 4294967296,
//!  "durability": "flush", "sync_interval_ms": 60000,
//!  "key_file": "/etc/ramd/db.key", "mem_limit_bytes": null,
//!  "read_only": false, "overcommit": false,
//!  "access": {"allow_identities": ["alice"], "read_only_identities": [],
//!             "allow_networks": ["10.0.0.0/8"]}}
//! ```
//!
//! `access` (the drive's NBD access rules, `nbd::access`) is written only
//! when the drive has rules, and `compress` (`"lz4"`, `"zstd:3"`) only
//! for a compressed drive, so the files of other drives stay readable by
//! daemons older than them; a file without them means no rules and the
//! raw store. The engine's files are the same either way (raw pages), so
//! a drive re-created with another `--compress` loads into that store.
//!
//! Written atomically (temporary file, fsync, rename, fsync of the
//! directory), so a crash leaves the old or the new file, never a torn one.
//! `size_bytes` is the size asked for at creation; the drive's real size is
//! the engine's (a resize is recorded by the next sync).
//!
//! Invariants:
//! - an unusable file (unreadable, not JSON, another drive's name, a bad
//!   value) is never rewritten behind the user's back: the drive fails
//!   with the reason, whoever declares it ([`read_checked`]), until the
//!   file is fixed or `ramd restore --force` replaces it;
//! - a drive re-created through the API (`ramd create NAME --persist`
//!   after `delete --keep-data`) keeps the stored settings it is not
//!   given explicitly ([`DriveSettings::fill`]), and the answer says
//!   which. A drive declared in the config or on the daemon's command
//!   line is described by its declaration (edit it to change them).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::control::drives::spec::{
    check_sync_interval_ms, parse_access, parse_compress, DriveSpec, PersistSpec, SpecError,
};
use crate::nbd::access::AccessRules;

/// The file name inside a drive's state directory.
pub const FILE: &str = "drive.json";

/// The format version this daemon writes and reads.
pub const VERSION: u32 = 1;

/// Why the settings file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// Reading or writing failed.
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file is not valid.
    #[error("{path} is unusable: {problem}; fix it, or remove it to restore the drive with the settings it is declared (or created) with, or `ramd restore NAME --force` to rewrite it with them")]
    Invalid { path: PathBuf, problem: Problem },
}

/// What is wrong with the contents of a `drive.json`.
#[derive(Debug, thiserror::Error)]
pub enum Problem {
    /// It is not valid JSON or not the expected shape.
    #[error(transparent)]
    Json(serde_json::Error),
    /// It describes another drive.
    #[error("it names drive '{found}', not '{expected}'")]
    OtherDrive { found: String, expected: String },
    /// A field is wrong.
    #[error(transparent)]
    Field(#[from] FieldError),
}

/// Which field of a `drive.json` is wrong.
#[derive(Debug, thiserror::Error)]
pub enum FieldError {
    /// A version this daemon does not read.
    #[error("version {found} is not the supported version {VERSION}")]
    Version { found: u32 },
    /// The durability is not a known mode (the engine's own reason).
    #[error(transparent)]
    Durability(#[from] crate::persist::durability::UnknownDurability),
    /// The sync interval is out of range, or the access rules do not
    /// parse (the spec's reason).
    #[error(transparent)]
    Spec(#[from] SpecError),
}

/// The contents of `drive.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DriveSettings {
    /// Format version ([`VERSION`]).
    pub version: u32,
    /// The drive name (equals the directory name).
    pub name: String,
    /// Who created it: "api", "config" or "command-line".
    pub origin: String,
    /// Size asked for at creation.
    pub size_bytes: u64,
    /// `none`, `periodic` or `flush`.
    pub durability: String,
    /// Background sync interval.
    pub sync_interval_ms: u64,
    /// Absolute path of the key file of an encrypted drive.
    pub key_file: Option<PathBuf>,
    /// The drive's own memory limit.
    pub mem_limit_bytes: Option<u64>,
    /// Locked read-only.
    pub read_only: bool,
    /// Created with overcommit.
    pub overcommit: bool,
    /// NBD access rules (absent: none).
    #[serde(default, skip_serializing_if = "StoredAccess::is_open")]
    pub access: StoredAccess,
    /// The compression (`lz4`, `zstd:LEVEL`; absent: the raw store).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compress: Option<String>,
    /// Its memory is locked in RAM (absent: not).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lock_memory: bool,
}

/// A drive's access rules as `drive.json` keeps them (the API's names).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoredAccess {
    #[serde(default)]
    pub allow_identities: Vec<String>,
    #[serde(default)]
    pub read_only_identities: Vec<String>,
    #[serde(default)]
    pub allow_networks: Vec<String>,
}

impl StoredAccess {
    fn of(rules: &AccessRules) -> StoredAccess {
        StoredAccess {
            allow_identities: rules.identities.clone(),
            read_only_identities: rules.read_only_identities.clone(),
            allow_networks: rules.networks.iter().map(|n| n.to_string()).collect(),
        }
    }

    fn is_open(&self) -> bool {
        self == &StoredAccess::default()
    }

    fn rules(&self) -> Result<AccessRules, SpecError> {
        parse_access(
            &self.allow_identities,
            &self.read_only_identities,
            &self.allow_networks,
        )
    }
}

impl DriveSettings {
    /// The settings of `spec` (which must be persistent).
    pub fn from_spec(spec: &DriveSpec, persist: &PersistSpec, origin: &str) -> DriveSettings {
        DriveSettings {
            version: VERSION,
            name: spec.name.clone(),
            origin: origin.to_owned(),
            size_bytes: spec.size_bytes,
            durability: persist.durability.as_str().to_owned(),
            sync_interval_ms: persist.sync_interval_ms,
            key_file: persist.key_file.clone(),
            mem_limit_bytes: spec.mem_limit_bytes,
            read_only: spec.read_only,
            overcommit: spec.overcommit,
            access: StoredAccess::of(&spec.access),
            compress: spec.compress.map(|a| a.to_string()),
            lock_memory: spec.lock_memory,
        }
    }

    /// The drive spec these settings describe; an error says which field
    /// is wrong.
    pub fn to_spec(&self) -> Result<DriveSpec, FieldError> {
        if self.version != VERSION {
            return Err(FieldError::Version {
                found: self.version,
            });
        }
        let durability = self.durability.parse::<crate::persist::Durability>()?;
        check_sync_interval_ms(self.sync_interval_ms)?;
        Ok(DriveSpec {
            name: self.name.clone(),
            size_bytes: self.size_bytes.max(1),
            mem_limit_bytes: self.mem_limit_bytes,
            read_only: self.read_only,
            overcommit: self.overcommit,
            persist: Some(PersistSpec {
                durability,
                sync_interval_ms: self.sync_interval_ms,
                key_file: self.key_file.clone(),
            }),
            access: self.access.rules()?,
            compress: match &self.compress {
                Some(c) => parse_compress(c)?,
                None => None,
            },
            lock_memory: self.lock_memory,
        })
    }
}

/// Settings a re-create was given explicitly (None / false: not given).
#[derive(Debug, Clone, Default)]
pub struct Given {
    /// A size: without one, a persistent drive in the state directory
    /// keeps its own (`Drives::create_from`; [`DriveSettings::fill`] never
    /// takes the stored size, which is the one asked for at creation).
    pub size: bool,
    pub durability: bool,
    pub sync_interval: bool,
    pub key_file: bool,
    pub mem_limit: bool,
    pub read_only: bool,
    pub overcommit: bool,
    pub access: bool,
    pub compress: bool,
    pub lock_memory: bool,
}

impl DriveSettings {
    /// Fills what `given` lacks in `spec` (a persistent drive about to be
    /// restored from this state directory) from these stored settings.
    /// Returns what was taken, for people (`durability flush`, ...).
    pub fn fill(&self, spec: &mut DriveSpec, given: &Given) -> Vec<String> {
        let Ok(stored) = self.to_spec() else {
            return Vec::new();
        };
        let (Some(p), Some(sp)) = (spec.persist.as_mut(), stored.persist) else {
            return Vec::new();
        };
        let mut taken = Vec::new();
        if !given.durability {
            p.durability = sp.durability;
            taken.push(format!("durability {}", sp.durability));
        }
        if !given.sync_interval {
            p.sync_interval_ms = sp.sync_interval_ms;
            taken.push(format!(
                "sync interval {}",
                crate::control::spec::format_interval(sp.sync_interval_ms)
            ));
        }
        if !given.key_file {
            if let Some(k) = &sp.key_file {
                taken.push(format!("key file {}", k.display()));
            }
            p.key_file = sp.key_file;
        }
        if !given.mem_limit {
            spec.mem_limit_bytes = stored.mem_limit_bytes;
            if let Some(m) = stored.mem_limit_bytes {
                taken.push(format!("memory limit {}", crate::size::format_size(m)));
            }
        }
        if !given.read_only && stored.read_only {
            spec.read_only = true;
            taken.push("read-only".into());
        }
        if !given.overcommit && stored.overcommit {
            spec.overcommit = true;
            taken.push("overcommit".into());
        }
        if !given.access && !stored.access.is_open() {
            spec.access = stored.access;
            taken.push("access rules".into());
        }
        if let (false, Some(a)) = (given.compress, stored.compress) {
            spec.compress = Some(a);
            taken.push(format!("compression {a}"));
        }
        if !given.lock_memory && stored.lock_memory {
            spec.lock_memory = true;
            taken.push("memory locked in RAM".into());
        }
        taken
    }
}

/// Reads `dir/drive.json` of drive `name` and checks it: Ok(None) when
/// there is none, Err with the reason (naming the file) when it is
/// unusable.
pub fn read_checked(dir: &Path, name: &str) -> Result<Option<DriveSettings>, SettingsError> {
    let Some(s) = read(dir)? else {
        return Ok(None);
    };
    let invalid = |problem: Problem| SettingsError::Invalid {
        path: dir.join(FILE),
        problem,
    };
    if s.name != name {
        return Err(invalid(Problem::OtherDrive {
            found: s.name.clone(),
            expected: name.to_owned(),
        }));
    }
    s.to_spec().map_err(|e| invalid(e.into()))?;
    Ok(Some(s))
}

/// Reads `dir/drive.json`; Ok(None) when there is none.
pub fn read(dir: &Path) -> Result<Option<DriveSettings>, SettingsError> {
    let path = dir.join(FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(SettingsError::Io {
                op: "read",
                path,
                source,
            })
        }
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| SettingsError::Invalid {
            path,
            problem: Problem::Json(e),
        })
}

/// Replaces `dir/drive.json` atomically and durably (0600 whatever the
/// umask: drive data is private, see `modes`; a failure leaves the old
/// file and no temporary).
pub fn write(dir: &Path, settings: &DriveSettings) -> Result<(), SettingsError> {
    let mut text = serde_json::to_string_pretty(settings).expect("settings serialize");
    text.push('\n');
    crate::paths::replace_private_file(&dir.join(FILE), text.as_bytes()).map_err(|e| {
        SettingsError::Io {
            op: e.op,
            path: e.path,
            source: e.source,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::persist::Durability;

    fn spec() -> DriveSpec {
        DriveSpec {
            name: "db".into(),
            size_bytes: 1 << 30,
            mem_limit_bytes: Some(1 << 20),
            read_only: true,
            overcommit: false,
            persist: Some(PersistSpec {
                durability: Durability::Flush,
                sync_interval_ms: 5000,
                key_file: Some("/k".into()),
            }),
            access: AccessRules {
                identities: vec!["alice".into()],
                read_only_identities: vec![],
                networks: vec!["10.0.0.0/8".parse().unwrap()],
            },
            compress: Some("zstd:5".parse().unwrap()),
            lock_memory: true,
        }
    }

    #[test]
    fn round_trip_through_the_file() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()).unwrap(), None);
        let s = spec();
        let st = DriveSettings::from_spec(&s, s.persist.as_ref().unwrap(), "api");
        write(dir.path(), &st).unwrap();
        let back = read(dir.path()).unwrap().unwrap();
        assert_eq!(back, st);
        assert_eq!(back.to_spec().unwrap(), s);
        assert!(!dir.path().join("drive.json.tmp").exists());
    }

    #[test]
    fn fill_takes_what_was_not_given_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let s = spec();
        let st = DriveSettings::from_spec(&s, s.persist.as_ref().unwrap(), "api");
        write(dir.path(), &st).unwrap();
        let stored = read_checked(dir.path(), "db").unwrap().unwrap();
        let mut fresh = DriveSpec {
            mem_limit_bytes: None,
            read_only: false,
            persist: Some(PersistSpec::default()),
            access: AccessRules::default(),
            compress: None,
            lock_memory: false,
            ..s.clone()
        };
        let given = Given {
            durability: true,
            ..Given::default()
        };
        let taken = stored.fill(&mut fresh, &given);
        assert_eq!(
            taken,
            [
                "sync interval 5s",
                "key file /k",
                "memory limit 1 MiB",
                "read-only",
                "access rules",
                "compression zstd:5",
                "memory locked in RAM"
            ]
        );
        assert_eq!(fresh.compress, s.compress);
        assert_eq!(fresh.access, s.access);
        let p = fresh.persist.as_ref().unwrap();
        assert_eq!(p.durability, Durability::default());
        assert_eq!(p.sync_interval_ms, 5000);
        assert!(fresh.read_only);
        assert!(read_checked(dir.path(), "other")
            .unwrap_err()
            .to_string()
            .contains("names drive 'db'"));
        std::fs::write(dir.path().join(FILE), "{").unwrap();
        assert!(read_checked(dir.path(), "db")
            .unwrap_err()
            .to_string()
            .contains("drive.json is unusable"));
    }

    #[test]
    fn damaged_files_are_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), "{\"version\": 1,").unwrap();
        let e = read(dir.path()).unwrap_err().to_string();
        assert!(e.contains("drive.json is unusable"), "{e}");
        let s = spec();
        let mut st = DriveSettings::from_spec(&s, s.persist.as_ref().unwrap(), "api");
        st.durability = "fast".into();
        assert!(st
            .to_spec()
            .unwrap_err()
            .to_string()
            .contains("unknown durability"));
        st.durability = "flush".into();
        st.access.allow_networks = vec!["lan".into()];
        assert!(st
            .to_spec()
            .unwrap_err()
            .to_string()
            .contains("'lan' is not a network"));
        st.access = StoredAccess::default();
        st.version = 9;
        assert!(st.to_spec().unwrap_err().to_string().contains("version 9"));
    }
}
