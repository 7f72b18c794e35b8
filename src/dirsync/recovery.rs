//! Recovery at start: what a managed directory looks like after a daemon
//! stop, a daemon crash or a reboot, and the dated recovery copies.
//!
//! ```text
//! mounts found at start                      situation   what happens
//! ─────────────────────────────────────────  ──────────  ──────────────────────────────
//! nothing of ours (reboot, clean release)    Fresh       fill a new tmpfs from disk,
//!                                                        then mount it at PATH
//! ours at PATH + handover marker             Adopt       keep the mounts, lock, sync
//!   (a clean stop left them in use)
//! ours at PATH, no marker (daemon crash)     Stale       copy the RAM content to a dated
//! our tmpfs in <run> only (PATH unmounted                recovery copy, detach it, then
//!   behind our back)                                     as Fresh
//! someone else's mount at PATH               Covered     refuse (error in the listing)
//! ```
//!
//! Recovery copies live in `<state>/dirs/<id>/recovery/<YYYYMMDDTHHMMSSZ>/`
//! (UTC). A copy is written under `<name>.partial` and renamed when complete,
//! so a listed copy is always whole; the newest `recovery_generations` are
//! kept and older ones (and leftover partial ones) deleted. `<id>/` and
//! `recovery/` are created 0700 (the copies hold users' files).

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use super::mountinfo::{self, Mount};
use super::mounts::{Layout, MountMode};
use super::sync::{self, SyncError, SyncOptions, SyncReport};

/// Recovery copy errors.
#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    /// writing the recovery copy failed
    #[error("cannot save the RAM content left by the previous daemon to {dir}: {source}; the RAM copy is left mounted as it was")]
    Copy { dir: PathBuf, source: SyncError },
    /// file system error around the copies
    #[error("cannot {what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Where stale RAM content can be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StaleSource {
    /// Through PATH (our mount is still on top there).
    Path,
    /// The tmpfs root in the runtime dir (tmpfs mode, PATH unmounted).
    Ram,
    /// The overlay upper dir (overlay mode, PATH unmounted): only the
    /// changed files, with overlay whiteouts as 0/0 device nodes.
    Upper,
}

/// What start-up finds for one directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Situation {
    Fresh,
    Adopt,
    Stale(StaleSource),
    /// Another mount covers PATH: (fs type, source).
    Covered(String, String),
}

/// Classifies from the mount table and whether the handover marker exists.
pub fn classify(
    mounts: &[Mount],
    path: &Path,
    layout: &Layout,
    mode: MountMode,
    handover: bool,
) -> Situation {
    let ours = |m: &Mount| m.source == layout.tag;
    match mountinfo::top_mount_at(mounts, path) {
        Some(m) if ours(m) => {
            if handover {
                Situation::Adopt
            } else {
                Situation::Stale(StaleSource::Path)
            }
        }
        Some(m) => Situation::Covered(m.fs_type.clone(), m.source.clone()),
        None => match mountinfo::top_mount_at(mounts, &layout.ram()) {
            Some(m) if ours(m) => Situation::Stale(match mode {
                MountMode::Tmpfs => StaleSource::Ram,
                MountMode::Overlay => StaleSource::Upper,
            }),
            _ => Situation::Fresh,
        },
    }
}

/// A complete recovery copy.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RecoveryCopy {
    /// Where it is.
    pub path: PathBuf,
    /// When it was made (seconds since the epoch, UTC).
    pub created_unix_s: u64,
}

/// `YYYYMMDDTHHMMSSZ` for a Unix time (UTC).
pub fn timestamp_name(unix_s: u64) -> String {
    let days = (unix_s / 86_400) as i64;
    let secs = unix_s % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// Parses [`timestamp_name`] (with an optional `-N` suffix) back.
pub fn parse_timestamp_name(name: &str) -> Option<u64> {
    parse_copy_name(name).map(|(t, _)| t)
}

/// A copy's name as (seconds, sequence): `BASE` is sequence 1, `BASE-N`
/// sequence N (N >= 2), so copies of one second sort by N as a number.
fn parse_copy_name(name: &str) -> Option<(u64, u32)> {
    let (base, seq) = match name.split_once('-') {
        None => (name, 1),
        Some((base, n)) => (base, n.parse::<u32>().ok().filter(|n| *n >= 2)?),
    };
    let b = base.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| base.get(r)?.parse::<u64>().ok();
    let (y, mo, d) = (num(0..4)?, num(4..6)?, num(6..8)?);
    let (h, mi, s) = (num(9..11)?, num(11..13)?, num(13..15)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let days = days_from_civil(y as i64, mo as u32, d as u32);
    Some((days as u64 * 86_400 + h * 3600 + mi * 60 + s, seq))
}

// Howard Hinnant's civil calendar algorithms (proleptic Gregorian).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (i64::from(m) + 9) % 12;
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Complete recovery copies in `dir`, oldest first.
pub fn list_copies(dir: &Path) -> Vec<RecoveryCopy> {
    sorted_copies(dir).into_iter().map(|(_, c)| c).collect()
}

/// Complete recovery copies with their sequence within their second,
/// oldest first.
fn sorted_copies(dir: &Path) -> Vec<(u32, RecoveryCopy)> {
    let mut v: Vec<(u32, RecoveryCopy)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let (created_unix_s, seq) = parse_copy_name(e.file_name().to_str()?)?;
            let path = e.path();
            Some((
                seq,
                RecoveryCopy {
                    path,
                    created_unix_s,
                },
            ))
        })
        .collect();
    v.sort_by_key(|(seq, c)| (c.created_unix_s, *seq));
    v
}

/// The name of the next copy: dated `now_unix_s`, but never before the
/// newest copy (a clock set back, say by NTP after boot, must not make
/// the new copy the oldest, which pruning would delete at once).
fn next_copy_name(dir: &Path, now_unix_s: u64) -> String {
    let (t, mut seq) = match sorted_copies(dir).last() {
        Some((seq, newest)) if newest.created_unix_s >= now_unix_s => {
            (newest.created_unix_s, seq + 1)
        }
        _ => (now_unix_s, 1),
    };
    let base = timestamp_name(t);
    loop {
        let name = match seq {
            1 => base.clone(),
            n => format!("{base}-{n}"),
        };
        if !dir.join(&name).exists() {
            return name;
        }
        seq += 1;
    }
}

/// Copies `src` into a new dated copy under `dir` (durably); returns its
/// path and what the copy did.
pub fn make_copy(
    src: &Path,
    dir: &Path,
    now_unix_s: u64,
) -> Result<(PathBuf, SyncReport), RecoveryError> {
    let io = |what, path: &Path| {
        let path = path.to_path_buf();
        move |source| RecoveryError::Io { what, path, source }
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(super::state::PRIVATE_DIR_MODE)
        .create(dir)
        .map_err(io("create", dir))?;
    let name = next_copy_name(dir, now_unix_s);
    let final_path = dir.join(&name);
    let partial = dir.join(format!("{name}.partial"));
    if partial.exists() {
        std::fs::remove_dir_all(&partial).map_err(io("remove", &partial))?;
    }
    std::fs::create_dir(&partial).map_err(io("create", &partial))?;
    let report = sync::sync_tree(src, &partial, &SyncOptions::default()).map_err(|source| {
        RecoveryError::Copy {
            dir: dir.to_path_buf(),
            source,
        }
    })?;
    std::fs::rename(&partial, &final_path).map_err(io("rename", &partial))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("fsync", dir))?;
    Ok((final_path, report))
}

/// Deletes all but the newest `keep` copies and any partial copy; returns
/// what it deleted.
pub fn prune(dir: &Path, keep: u32) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_name().to_string_lossy().ends_with(".partial")
            && std::fs::remove_dir_all(e.path()).is_ok()
        {
            removed.push(e.path());
        }
    }
    let copies = list_copies(dir);
    let excess = copies.len().saturating_sub(keep as usize);
    for c in &copies[..excess] {
        if std::fs::remove_dir_all(&c.path).is_ok() {
            removed.push(c.path.clone());
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_round_trip() {
        assert_eq!(timestamp_name(0), "19700101T000000Z");
        assert_eq!(timestamp_name(951_782_400), "20000229T000000Z");
        assert_eq!(timestamp_name(1_700_000_000), "20231114T221320Z");
        for t in [
            0u64,
            59,
            86_399,
            951_782_400,
            1_700_000_000,
            4_102_444_800 + 12_345,
        ] {
            assert_eq!(parse_timestamp_name(&timestamp_name(t)), Some(t), "{t}");
        }
        assert_eq!(
            parse_timestamp_name("20231114T221320Z-2"),
            Some(1_700_000_000)
        );
        for bad in [
            "",
            "x",
            "20231314T221320Z",
            "20231114X221320Z",
            "20231114T221320Z.partial",
            "2023111T4221320Z",
        ] {
            assert_eq!(parse_timestamp_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn copies_and_prune() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("src");
        std::fs::create_dir(&src).unwrap();
        std::fs::write(src.join("f"), b"data").unwrap();
        let rec = d.path().join("rec");
        for t in [100, 200, 200, 300] {
            make_copy(&src, &rec, t).unwrap();
        }
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&rec).unwrap().permissions().mode() & 0o7777;
            assert_eq!(mode, 0o700, "the recovery directory is private");
        }
        std::fs::create_dir(rec.join("19700101T000500Z.partial")).unwrap();
        assert_eq!(list_copies(&rec).len(), 4);
        let removed = prune(&rec, 2);
        assert_eq!(removed.len(), 3, "{removed:?}");
        let left = list_copies(&rec);
        assert_eq!(
            left.iter().map(|c| c.created_unix_s).collect::<Vec<_>>(),
            [200, 300]
        );
        assert_eq!(std::fs::read(left[1].path.join("f")).unwrap(), b"data");
    }

    #[test]
    fn a_clock_set_back_never_makes_the_new_copy_the_oldest() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("src");
        std::fs::create_dir(&src).unwrap();
        let rec = d.path().join("rec");
        let mut made = Vec::new();
        // Eleven copies in one second (sequence 10 sorts after 9), then
        // the clock goes back.
        for (i, t) in [500u64; 11].into_iter().chain([400, 300]).enumerate() {
            std::fs::write(src.join("f"), i.to_string()).unwrap();
            let (path, _) = make_copy(&src, &rec, t).unwrap();
            made.push(path);
            let left = list_copies(&rec);
            assert_eq!(left.last().unwrap().path, *made.last().unwrap(), "copy {i}");
            prune(&rec, 2);
            let left = list_copies(&rec);
            assert_eq!(
                std::fs::read(left.last().unwrap().path.join("f")).unwrap(),
                i.to_string().as_bytes()
            );
        }
        assert_eq!(made[10].file_name().unwrap(), "19700101T000820Z-11");
        assert_eq!(made[12].file_name().unwrap(), "19700101T000820Z-13");
        assert_eq!(parse_timestamp_name("19700101T000820Z-1"), None);
        assert_eq!(parse_timestamp_name("19700101T000820Z-x"), None);
    }

    #[test]
    fn classification() {
        let layout = Layout::new(Path::new("/run/ramd/dirs"), "c-1");
        let line = |id, mp: &str, fs: &str, src: &str| {
            format!("{id} 1 0:{id} / {mp} rw - {fs} {src} rw\n")
        };
        let p = Path::new("/home/u/c");
        let parse = |t: String| mountinfo::parse(&t).unwrap();
        let none = parse(line(1, "/", "ext4", "/dev/vda"));
        assert_eq!(
            classify(&none, p, &layout, MountMode::Tmpfs, false),
            Situation::Fresh
        );
        let at_path = parse(
            line(1, "/", "ext4", "/dev/vda") + &line(2, "/home/u/c", "tmpfs", "ramd-dir:c-1"),
        );
        assert_eq!(
            classify(&at_path, p, &layout, MountMode::Tmpfs, false),
            Situation::Stale(StaleSource::Path)
        );
        assert_eq!(
            classify(&at_path, p, &layout, MountMode::Tmpfs, true),
            Situation::Adopt
        );
        let only_ram = parse(
            line(1, "/", "ext4", "/dev/vda")
                + &line(3, "/run/ramd/dirs/c-1/ram", "tmpfs", "ramd-dir:c-1"),
        );
        assert_eq!(
            classify(&only_ram, p, &layout, MountMode::Overlay, false),
            Situation::Stale(StaleSource::Upper)
        );
        let other =
            parse(line(1, "/", "ext4", "/dev/vda") + &line(2, "/home/u/c", "tmpfs", "tmpfs"));
        assert_eq!(
            classify(&other, p, &layout, MountMode::Tmpfs, false),
            Situation::Covered("tmpfs".into(), "tmpfs".into())
        );
    }
}
