//! Directories in RAM inside the daemon: the [`DirManager`] and its
//! [`SyncWorker`], wired to start-up, the config file and shutdown.
//!
//! # Invariants
//!
//! - Every `[[dir]]` the config declares is in RAM before the API listens
//!   and before READY=1, or the daemon does not start (with the file and
//!   line, after releasing what was already mounted, synced): services
//!   ordered after ramd must find their directories in RAM, as they find
//!   their drives.
//! - A recorded directory whose recovery fails does not stop the daemon:
//!   it is listed as failed with the reason and the others go on (it holds
//!   someone's data; refusing to start would hide every other directory).
//! - At stop the sync thread ends first, then every directory is synced and
//!   unmounted (or handed over), so no periodic sync races the last one.
//! - Directories are not in the ledger (`control::ledger`): they are named
//!   by paths, not in the NBD export namespace, and their memory is
//!   tmpfs's, bounded by the kernel, not promised from the daemon budget.
//!   Their interval floor is the directory one (`control::spec`).
//!
//! ```text
//! start (before the API listens and before READY=1):
//!   open the manager ─► recover every recorded directory (restore / adopt /
//!   recovery copy) ─► drop config dirs the same config no longer declares ─►
//!   re-add config dirs whose settings changed ─► add new config dirs ─►
//!   start the sync thread
//! run:   add / remove / sync / sync all  (API handlers, on blocking threads)
//! stop:  SIGTERM/SIGINT ─► the API stops ─► stop(): the sync thread ends,
//!        every directory is synced and unmounted (or handed over)
//! ```

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use serde::Deserialize;
use toml::Spanned;

use super::spec::{self, format_interval, IntervalError, IntervalUse};
use crate::dirsync::manager::{
    AddRequest, DirChange, DirError, DirInfo, DirManager, DirOrigin, ManagerConfig, RecoverOutcome,
    StopOutcome, DEFAULT_DIR_SYNC_INTERVAL_MS, DEFAULT_RECOVERY_GENERATIONS,
};
use crate::dirsync::mounts::MountMode;
use crate::dirsync::schedule::SyncWorker;
use crate::dirsync::sync::SyncReport;
use crate::size::{format_size, Size};

/// Why the directories could not be brought up at start.
#[derive(Debug, thiserror::Error)]
pub enum DirsError {
    /// The manager could not read its state.
    #[error("directories in RAM: {0}")]
    Open(Box<DirError>),
    /// A `[[dir]]` could not be kept in RAM.
    #[error("{}:{}:{}: cannot keep {} in RAM: {source}", file.display(), line, column, path.display())]
    Declared {
        file: PathBuf,
        line: usize,
        column: usize,
        path: PathBuf,
        source: Box<DirError>,
    },
}

/// Why a directory path was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DirPathError {
    #[error("the directory must be an absolute path, not '{}'", .0.display())]
    NotAbsolute(PathBuf),
    #[error("'{}' contains '..': write the directory's real path", .0.display())]
    ParentDir(PathBuf),
}

/// Parses a directory's sync interval: `"10m"`, `"1h 30m"`, `"90s"` (at
/// least one second) into milliseconds.
pub fn parse_interval_ms(text: &str) -> Result<u64, IntervalError> {
    spec::parse_interval_ms(IntervalUse::DirSync, text)
}

/// A path as written, made absolute-and-clean: no `.`/`..` components, no
/// trailing slash. Symlinks are checked later (the path must be canonical).
pub fn clean_path(path: &Path) -> Result<PathBuf, DirPathError> {
    if !path.is_absolute() {
        return Err(DirPathError::NotAbsolute(path.to_owned()));
    }
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(n) => out.push(n),
            Component::ParentDir | Component::Prefix(_) => {
                return Err(DirPathError::ParentDir(path.to_owned()))
            }
        }
    }
    Ok(out)
}

/// `[[dir]]` as written in the config file (see [`DirSpec`], what it
/// becomes once checked).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DirEntry {
    pub path: Spanned<PathBuf>,
    pub interval: Option<Spanned<String>>,
    #[serde(default)]
    pub overlay: bool,
    pub size_limit: Option<Spanned<Size>>,
    pub recovery_generations: Option<Spanned<u32>>,
}

/// A directory declared in the config (`[[dir]]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirSpec {
    /// Absolute and clean.
    pub path: PathBuf,
    pub mode: MountMode,
    pub size_limit_bytes: Option<u64>,
    pub sync_interval_ms: u64,
    pub recovery_generations: u32,
    /// Where it is declared (file, line, column), for errors.
    pub at: (PathBuf, usize, usize),
}

impl DirSpec {
    /// Checks a parsed `[[dir]]`; errors carry the byte offset of the bad
    /// value in the file.
    pub fn from_entry(
        e: &DirEntry,
        at: (PathBuf, usize, usize),
    ) -> Result<DirSpec, (usize, String)> {
        let path =
            clean_path(e.path.get_ref()).map_err(|m| (e.path.span().start, m.to_string()))?;
        let sync_interval_ms = match &e.interval {
            Some(i) => {
                parse_interval_ms(i.get_ref()).map_err(|m| (i.span().start, m.to_string()))?
            }
            None => DEFAULT_DIR_SYNC_INTERVAL_MS,
        };
        let size_limit_bytes = match &e.size_limit {
            Some(s) if s.get_ref().0 == 0 => {
                return Err((
                    s.span().start,
                    "a size limit must be at least 1 byte (leave it out for the tmpfs default, half of RAM)".into(),
                ))
            }
            Some(s) => Some(s.get_ref().0),
            None => None,
        };
        let recovery_generations = match &e.recovery_generations {
            Some(g) if *g.get_ref() == 0 => {
                return Err((
                    g.span().start,
                    "recovery_generations must be at least 1".into(),
                ))
            }
            Some(g) => *g.get_ref(),
            None => DEFAULT_RECOVERY_GENERATIONS,
        };
        Ok(DirSpec {
            path,
            mode: if e.overlay {
                MountMode::Overlay
            } else {
                MountMode::Tmpfs
            },
            size_limit_bytes,
            sync_interval_ms,
            recovery_generations,
            at,
        })
    }

    fn request(&self) -> AddRequest {
        AddRequest {
            path: self.path.clone(),
            mode: self.mode,
            size_limit_bytes: self.size_limit_bytes,
            sync_interval_ms: self.sync_interval_ms,
            recovery_generations: self.recovery_generations,
            expected_uid: None,
            origin: DirOrigin::Config {
                file: self.at.0.clone(),
            },
            // A declared directory is added at start, before the services
            // ordered after ramd: something using it then is a mistake.
            force: false,
        }
    }

    fn error(&self, source: DirError) -> DirsError {
        DirsError::Declared {
            file: self.at.0.clone(),
            line: self.at.1,
            column: self.at.2,
            path: self.path.clone(),
            source: Box::new(source),
        }
    }
}

/// True when this process shares pid 1's mount namespace (None: unknown).
fn in_host_mount_namespace() -> Option<bool> {
    let ours = std::fs::read_link("/proc/self/ns/mnt").ok()?;
    let init = std::fs::read_link("/proc/1/ns/mnt").ok()?;
    Some(ours == init)
}

/// The daemon's directories: manager plus sync thread.
pub struct Dirs {
    /// Does the work; shared with the sync thread.
    pub manager: Arc<DirManager>,
    /// The sync thread; taken by [`Dirs::stop`]. A read lock for add,
    /// remove and syncs (they may run at once and take long), the write
    /// lock only to start and stop it.
    worker: RwLock<Option<SyncWorker>>,
}

impl Dirs {
    /// Opens the manager, recovers every recorded directory, applies the
    /// config's `[[dir]]`s and starts the sync thread. `config_file` is the
    /// config in use (its dirs are `declared`).
    pub fn start(
        run_dir: PathBuf,
        state_dir: PathBuf,
        config_file: Option<&Path>,
        declared: &[DirSpec],
    ) -> Result<Dirs, DirsError> {
        let manager = Arc::new(
            DirManager::open(ManagerConfig::new(run_dir, state_dir))
                .map_err(|e| DirsError::Open(Box::new(e)))?,
        );
        let records = manager.records();
        if (!records.is_empty() || !declared.is_empty()) && in_host_mount_namespace() == Some(false)
        {
            tracing::warn!("ramd runs in a private mount namespace: directories it keeps in RAM are visible only inside it; run it in the host's (systemd: PrivateMounts=no, no ProtectSystem/ProtectHome)");
        }
        if !records.is_empty() {
            status(&format!(
                "restoring {} director{} into RAM",
                records.len(),
                if records.len() == 1 { "y" } else { "ies" }
            ));
        }
        for (path, result) in manager.recover_all() {
            match result {
                // The manager logged each (the recovery copy with a warning).
                Ok(RecoverOutcome::Restored | RecoverOutcome::Adopted) => {}
                Ok(RecoverOutcome::Recovered { .. }) => {}
                Err(e) => tracing::error!(
                    path = %path.display(),
                    "not kept in RAM: {e} (listed as failed; fix it and restart ramd, or `ramd dir remove {}`)",
                    path.display()
                ),
            }
        }
        let dirs = Dirs {
            manager: manager.clone(),
            worker: RwLock::new(None),
        };
        if let Err(e) = dirs.apply_config(&records, config_file, declared) {
            dirs.release_all();
            return Err(e);
        }
        *dirs.worker.write() = Some(SyncWorker::start(manager));
        Ok(dirs)
    }

    /// Drops, re-adds and adds config-declared directories (see the module
    /// docs).
    fn apply_config(
        &self,
        records: &[crate::dirsync::state::DirRecord],
        config_file: Option<&Path>,
        declared: &[DirSpec],
    ) -> Result<(), DirsError> {
        let m = &self.manager;
        // Declared before by this very file, and no longer.
        for r in records {
            let DirOrigin::Config { file } = &r.origin else {
                continue;
            };
            if Some(file.as_path()) != config_file
                || declared.iter().any(|d| d.path == r.config.path)
            {
                continue;
            }
            let path = &r.config.path;
            match m.remove(path, false) {
                Ok(_) => tracing::info!(path = %path.display(),
                    "no longer declared in {}: synced and back on disk", file.display()),
                Err(e) => tracing::error!(path = %path.display(),
                    "no longer declared in {} but cannot be released: {e}", file.display()),
            }
        }
        for d in declared {
            let want = d.request();
            if let Some(r) = records.iter().find(|r| r.config.path == d.path) {
                let c = &r.config;
                let same = c.mode == want.mode
                    && c.size_limit_bytes == want.size_limit_bytes
                    && c.sync_interval_ms == want.sync_interval_ms
                    && c.recovery_generations == want.recovery_generations;
                if same {
                    continue;
                }
                let active = m
                    .info(&d.path)
                    .is_ok_and(|i| i.status == crate::dirsync::manager::DirStatus::Active);
                if !active {
                    tracing::warn!(path = %d.path.display(),
                        "{}:{}: new settings not applied: the directory could not be restored (see `ramd dir list`)",
                        d.at.0.display(), d.at.1);
                    continue;
                }
                status(&format!("applying new settings to {}", d.path.display()));
                if let Err(e) = m.remove(&d.path, false) {
                    tracing::error!(path = %d.path.display(),
                        "{}:{}: new settings not applied, the directory keeps its old ones: {e}",
                        d.at.0.display(), d.at.1);
                    continue;
                }
                tracing::info!(path = %d.path.display(), "settings changed in {}: synced, re-adding", d.at.0.display());
            }
            status(&format!("adding {}", d.path.display()));
            let info = m.add(want).map_err(|e| d.error(e))?;
            log_added(&info);
        }
        Ok(())
    }

    /// Keeps a directory in RAM and schedules its syncs.
    pub fn add(&self, req: AddRequest) -> Result<DirInfo, DirError> {
        let info = self.manager.add(req)?;
        if let Some(w) = self.worker.read().as_ref() {
            w.add(&info.path, Duration::from_millis(info.sync_interval_ms));
        }
        log_added(&info);
        Ok(info)
    }

    /// Syncs, unmounts and forgets a directory.
    pub fn remove(&self, path: &Path, force: bool) -> Result<StopOutcome, DirError> {
        let out = self.manager.remove(path, force)?;
        if let Some(w) = self.worker.read().as_ref() {
            w.remove(path);
        }
        Ok(out)
    }

    /// Changes a directory's settings and reschedules its syncs.
    pub fn reconfigure(&self, path: &Path, change: &DirChange) -> Result<DirInfo, DirError> {
        let info = self.manager.reconfigure(path, change)?;
        if change.sync_interval_ms.is_some() {
            if let Some(w) = self.worker.read().as_ref() {
                w.set_interval(path, Duration::from_millis(info.sync_interval_ms));
            }
        }
        Ok(info)
    }

    /// Syncs one directory now (durable on return).
    pub fn sync(&self, path: &Path) -> Result<SyncReport, DirError> {
        match self.worker.read().as_ref() {
            Some(w) => w.sync_now(path),
            None => self.manager.sync(path),
        }
    }

    /// Syncs every active directory (suspend hook, `ramd dir sync --all`).
    pub fn sync_all(&self) -> Vec<(PathBuf, Result<SyncReport, DirError>)> {
        match self.worker.read().as_ref() {
            Some(w) => w.before_suspend(),
            None => self.manager.sync_all(),
        }
    }

    /// The path of a managed directory given as its id or its path.
    pub fn resolve(&self, key: &str) -> Result<PathBuf, DirError> {
        self.manager.find(key)
    }

    /// Daemon stop: ends the sync thread, then syncs and releases every
    /// directory (or hands it over); logs what happened to each.
    pub fn stop(&self) {
        let worker = self.worker.write().take();
        let out = match worker {
            Some(w) => w.stop(),
            None => self.manager.shutdown(),
        };
        log_stopped(out);
    }

    fn release_all(&self) {
        log_stopped(self.manager.shutdown());
    }
}

fn log_added(info: &DirInfo) {
    tracing::info!(
        path = %info.path.display(),
        mode = ?info.mode,
        limit = %info.size_limit_bytes.map(format_size).unwrap_or_else(|| "tmpfs default".into()),
        interval = %format_interval(info.sync_interval_ms),
        "kept in RAM"
    );
}

fn log_stopped(out: Vec<(PathBuf, Result<StopOutcome, DirError>)>) {
    for (path, r) in out {
        match r {
            Ok(StopOutcome::Released { report, .. }) => tracing::info!(
                path = %path.display(),
                files = report.files_copied,
                bytes = report.bytes_copied,
                "synced and released"
            ),
            Ok(StopOutcome::HandedOver { .. }) => tracing::warn!(
                path = %path.display(),
                "synced; files are open for writing, so the RAM copy stays mounted for the next ramd"
            ),
            Ok(StopOutcome::Inactive) => {}
            Err(e) => tracing::error!(path = %path.display(), "final sync failed: {e}"),
        }
    }
}

/// A STATUS= line for systemd (what start-up is doing).
fn status(text: &str) {
    tracing::info!("{text}");
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Status(text)]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_are_at_least_a_second() {
        assert_eq!(parse_interval_ms("1s"), Ok(1000));
        assert!(matches!(
            parse_interval_ms("500ms"),
            Err(IntervalError::TooShort { .. })
        ));
    }

    #[test]
    fn paths_are_cleaned() {
        assert_eq!(
            clean_path(Path::new("/var/log/")),
            Ok(PathBuf::from("/var/log"))
        );
        assert_eq!(clean_path(Path::new("/a/./b")), Ok(PathBuf::from("/a/b")));
        assert!(clean_path(Path::new("a/b"))
            .unwrap_err()
            .to_string()
            .contains("absolute"));
        assert!(clean_path(Path::new("/a/../b"))
            .unwrap_err()
            .to_string()
            .contains(".."));
    }
}
