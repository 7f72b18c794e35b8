//! The persisted set of managed directories and their settings.
//!
//! # Format (`<state>/dirs/dirs.state`)
//!
//! ```text
//! ramd-dirs-state 1\n                 magic and format version
//! crc32c 1a2b3c4d len 345\n           checksum and length of the body
//! {"dirs":[{"id":"cache-…",…}]}       JSON body (len bytes)
//! ```
//!
//! Written atomically: the new text goes to `dirs.state.tmp`, is fsynced and
//! renamed over `dirs.state`, then the directory is fsynced. The previous
//! version is kept as `dirs.state.bak` (hard link made before the rename), so
//! a state file damaged on disk falls back to the one before, and says so.
//! A file with a newer version is refused rather than misread.
//!
//! # Privacy
//!
//! Everything under `<state>/dirs` may hold other users' data (recovery
//! copies of their directories) or reveal which directories are managed:
//! directories are created 0700 and files 0600 whatever the umask, and
//! [`make_private`] (run at every start) fixes what an older ramd or a hand
//! left more open.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::mounts::MountMode;

const MAGIC: &str = "ramd-dirs-state";
/// The format version this code writes and reads.
pub const VERSION: u32 = 1;
const FILE_NAME: &str = "dirs.state";

/// State file errors.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// reading or writing the state file failed
    #[error("cannot {what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// the state file is damaged
    #[error("state file {path} is damaged ({reason}) and so is its backup; move it aside to start with no managed directories (the directories themselves are intact on disk)")]
    Corrupt { path: PathBuf, reason: String },
    /// the state file is from a newer ramd
    #[error("state file {path} has format version {version}, newer than this ramd understands ({VERSION}); upgrade ramd")]
    TooNew { path: PathBuf, version: u32 },
}

/// Settings of one managed directory, as given when it was added.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DirConfig {
    /// The directory programs use (absolute, canonical).
    pub path: PathBuf,
    /// tmpfs copy or overlay.
    pub mode: MountMode,
    /// tmpfs `size=`; None means tmpfs's default (half of RAM).
    pub size_limit_bytes: Option<u64>,
    /// Time between periodic syncs.
    pub sync_interval_ms: u64,
    /// How many dated recovery copies to keep.
    pub recovery_generations: u32,
    /// The owner PATH must have (None: any).
    pub expected_uid: Option<u32>,
}

/// One managed directory in the state file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DirRecord {
    /// Stable id: runtime and recovery directories are named after it.
    pub id: String,
    /// The settings.
    pub config: DirConfig,
    /// When it was added (seconds since the epoch).
    pub added_unix_s: u64,
    /// Who asked for it (absent in files written before it existed: the API).
    #[serde(default)]
    pub origin: DirOrigin,
}

/// Who asked for a directory to be kept in RAM.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum DirOrigin {
    /// `ramd dir add` / `POST /v1/dirs`: kept until removed the same way.
    #[default]
    Api,
    /// A `[[dir]]` in this config file: dropped at a start with the same
    /// file when the file no longer declares it.
    Config { file: PathBuf },
}

/// Everything the state file holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DirsState {
    /// Managed directories, in the order they were added.
    pub dirs: Vec<DirRecord>,
}

/// Encodes the state as file bytes.
pub fn encode(state: &DirsState) -> Vec<u8> {
    let body = serde_json::to_vec_pretty(state).expect("state serializes");
    let mut out = format!(
        "{MAGIC} {VERSION}\ncrc32c {:08x} len {}\n",
        crc32c::crc32c(&body),
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out
}

/// Why bytes are not a valid state file (or its version, when too new).
#[derive(Debug, PartialEq, Eq)]
pub enum DecodeError {
    Corrupt(String),
    TooNew(u32),
}

/// Decodes file bytes, checking magic, version, length and checksum.
pub fn decode(bytes: &[u8]) -> Result<DirsState, DecodeError> {
    let bad = |r: &str| DecodeError::Corrupt(r.to_string());
    let nl1 = bytes
        .iter()
        .position(|&b| b == b'\n')
        .ok_or_else(|| bad("no header"))?;
    let line1 = std::str::from_utf8(&bytes[..nl1]).map_err(|_| bad("header is not text"))?;
    let version = line1
        .strip_prefix(MAGIC)
        .and_then(|v| v.trim().parse::<u32>().ok())
        .ok_or_else(|| bad("not a ramd dirs state file"))?;
    if version > VERSION {
        return Err(DecodeError::TooNew(version));
    }
    let rest = &bytes[nl1 + 1..];
    let nl2 = rest
        .iter()
        .position(|&b| b == b'\n')
        .ok_or_else(|| bad("no checksum line"))?;
    let line2 = std::str::from_utf8(&rest[..nl2]).map_err(|_| bad("checksum line is not text"))?;
    let f: Vec<&str> = line2.split(' ').collect();
    let (crc, len) = match f.as_slice() {
        ["crc32c", crc, "len", len] => (
            u32::from_str_radix(crc, 16).map_err(|_| bad("bad checksum field"))?,
            len.parse::<usize>().map_err(|_| bad("bad length field"))?,
        ),
        _ => return Err(bad("bad checksum line")),
    };
    let body = &rest[nl2 + 1..];
    if body.len() != len {
        return Err(bad(&format!(
            "body is {} bytes, header says {len} (torn write?)",
            body.len()
        )));
    }
    if crc32c::crc32c(body) != crc {
        return Err(bad("checksum mismatch"));
    }
    serde_json::from_slice(body).map_err(|e| bad(&format!("body: {e}")))
}

/// The state file in a directory.
#[derive(Debug, Clone)]
pub struct StateFile {
    /// `<state>/dirs`.
    dir: PathBuf,
}

impl StateFile {
    pub fn new(dir: &Path) -> StateFile {
        StateFile {
            dir: dir.to_path_buf(),
        }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(FILE_NAME)
    }

    fn bak(&self) -> PathBuf {
        self.dir.join(format!("{FILE_NAME}.bak"))
    }

    /// Loads the state: empty when there is no file yet; the backup when the
    /// file is damaged (the returned warning says so).
    pub fn load(&self) -> Result<(DirsState, Option<String>), StateError> {
        let path = self.path();
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok((DirsState::default(), None))
            }
            Err(source) => {
                return Err(StateError::Io {
                    what: "read",
                    path,
                    source,
                })
            }
        };
        match decode(&bytes) {
            Ok(s) => Ok((s, None)),
            Err(DecodeError::TooNew(version)) => Err(StateError::TooNew { path, version }),
            Err(DecodeError::Corrupt(reason)) => {
                let bak = std::fs::read(self.bak()).ok().map(|b| decode(&b));
                match bak {
                    Some(Ok(s)) => Ok((
                        s,
                        Some(format!(
                            "state file {} is damaged ({reason}); using the previous version {}",
                            path.display(),
                            self.bak().display()
                        )),
                    )),
                    _ => Err(StateError::Corrupt { path, reason }),
                }
            }
        }
    }

    /// Saves the state atomically (see the module docs).
    pub fn save(&self, state: &DirsState) -> Result<(), StateError> {
        let io = |what, path: &Path| {
            let path = path.to_path_buf();
            move |source| StateError::Io { what, path, source }
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(PRIVATE_DIR_MODE)
            .create(&self.dir)
            .map_err(io("create", &self.dir))?;
        let path = self.path();
        if path.exists() {
            let bak_tmp = self.dir.join(format!("{FILE_NAME}.bak.tmp"));
            let _ = std::fs::remove_file(&bak_tmp);
            std::fs::hard_link(&path, &bak_tmp).map_err(io("back up", &path))?;
            std::fs::rename(&bak_tmp, self.bak()).map_err(io("back up", &path))?;
        }
        // 0600 whatever the umask, atomic and durable.
        crate::paths::replace_private_file(&path, &encode(state)).map_err(|e| StateError::Io {
            what: e.op,
            path: e.path,
            source: e.source,
        })
    }
}

/// Mode of every directory ramd creates under `<state>/dirs`.
pub const PRIVATE_DIR_MODE: u32 = 0o700;
/// Mode of the state files.
pub const PRIVATE_FILE_MODE: u32 = 0o600;

/// Makes `dir` (`<state>/dirs`) private: itself, every directory in it and
/// the `recovery` directory of each 0700, its files 0600 (recovery copies
/// keep their own modes inside). Symlinks are left alone. Returns what it
/// changed (the caller logs it); a missing `dir` is fine.
pub fn make_private(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut fixed = Vec::new();
    if !fix_mode(dir, &mut fixed)? {
        return Ok(fixed);
    }
    for ent in std::fs::read_dir(dir)? {
        let p = ent?.path();
        if fix_mode(&p, &mut fixed)? && p.is_dir() {
            fix_mode(&p.join("recovery"), &mut fixed)?;
        }
    }
    Ok(fixed)
}

/// Sets 0700 (directory) or 0600 (file) on `p` when it is more open; false
/// when `p` is missing.
fn fix_mode(p: &Path, fixed: &mut Vec<PathBuf>) -> std::io::Result<bool> {
    let md = match std::fs::symlink_metadata(p) {
        Ok(md) => md,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    let want = if md.is_dir() {
        PRIVATE_DIR_MODE
    } else if md.is_file() {
        PRIVATE_FILE_MODE
    } else {
        return Ok(true);
    };
    if md.permissions().mode() & 0o7777 != want {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(want))?;
        fixed.push(p.to_path_buf());
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn state_files_are_private_whatever_the_umask() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("dirs");
        let f = StateFile::new(&dir);
        f.save(&DirsState::default()).unwrap();
        f.save(&sample()).unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&f.path()), 0o600);
        assert_eq!(mode(&f.bak()), 0o600);
        // What an older ramd left open is fixed.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(f.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::create_dir_all(dir.join("x-1/recovery/20260101T000000Z")).unwrap();
        for p in ["x-1", "x-1/recovery"] {
            std::fs::set_permissions(dir.join(p), std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let fixed = make_private(&dir).unwrap();
        assert_eq!(fixed.len(), 4, "{fixed:?}");
        for p in [dir.clone(), dir.join("x-1"), dir.join("x-1/recovery")] {
            assert_eq!(mode(&p), 0o700, "{}", p.display());
        }
        assert_eq!(mode(&f.path()), 0o600);
        assert!(make_private(&dir).unwrap().is_empty());
        assert!(make_private(&d.path().join("missing")).unwrap().is_empty());
    }

    fn sample() -> DirsState {
        DirsState {
            dirs: vec![DirRecord {
                id: "cache-01020304".into(),
                config: DirConfig {
                    path: "/home/u/.cache".into(),
                    mode: MountMode::Overlay,
                    size_limit_bytes: Some(1 << 30),
                    sync_interval_ms: 600_000,
                    recovery_generations: 3,
                    expected_uid: Some(1000),
                },
                added_unix_s: 1_700_000_000,
                origin: DirOrigin::Config {
                    file: "/etc/ramd/ramd.toml".into(),
                },
            }],
        }
    }

    #[test]
    fn records_without_origin_are_api_ones() {
        let body = br#"{"dirs":[{"id":"x-1","config":{"path":"/x","mode":"tmpfs","size_limit_bytes":null,"sync_interval_ms":1000,"recovery_generations":3,"expected_uid":null},"added_unix_s":1}]}"#;
        let state: DirsState = serde_json::from_slice(body).unwrap();
        assert_eq!(state.dirs[0].origin, DirOrigin::Api);
    }

    #[test]
    fn round_trip() {
        assert_eq!(decode(&encode(&sample())).unwrap(), sample());
        assert_eq!(
            decode(&encode(&DirsState::default())).unwrap(),
            DirsState::default()
        );
    }

    #[test]
    fn every_truncation_and_bit_flip_is_caught() {
        let good = encode(&sample());
        for cut in 0..good.len() {
            assert!(decode(&good[..cut]).is_err(), "truncated at {cut} accepted");
        }
        for i in 0..good.len() {
            let mut b = good.clone();
            b[i] ^= 0x20;
            // A flip may still decode only if it lands in insignificant
            // whitespace of the header... which the format has none of.
            assert!(
                decode(&b).is_err() || decode(&b).unwrap() == sample(),
                "flip at {i}"
            );
        }
    }

    #[test]
    fn newer_version_refused() {
        let mut b = encode(&sample());
        b[MAGIC.len() + 1] = b'9';
        assert_eq!(decode(&b), Err(DecodeError::TooNew(9)));
    }

    #[test]
    fn save_load_and_fallback_to_backup() {
        let dir = tempfile::tempdir().unwrap();
        let f = StateFile::new(dir.path());
        assert_eq!(f.load().unwrap().0, DirsState::default());
        f.save(&DirsState::default()).unwrap();
        f.save(&sample()).unwrap();
        assert_eq!(f.load().unwrap(), (sample(), None));
        // Damage the current file: the backup (the empty state) is used.
        let mut b = std::fs::read(f.path()).unwrap();
        b.truncate(b.len() - 3);
        std::fs::write(f.path(), &b).unwrap();
        let (s, warn) = f.load().unwrap();
        assert_eq!(s, DirsState::default());
        assert!(warn.unwrap().contains("damaged"));
        std::fs::write(f.bak(), b"junk").unwrap();
        assert!(matches!(f.load(), Err(StateError::Corrupt { .. })));
    }
}
