//! The operations on persistent drives: create or restore, the restore
//! threads, `ramd restore`, sync, durability changes, the final save of
//! `delete --keep-data`, and clean shutdown. The invariants are the drive
//! map's (see `mod.rs`); the disk side is `persistent/`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::kept;
use super::persistent::{self, settings, DiskDrive, Found, Kept, Persistence, RestoreRecord};
use super::spec::{DriveSpec, PersistSpec};
use super::{
    data_end, error, not_found, not_ready, promise_for, Drive, DriveData, DriveError, DriveKind,
    DriveState, Drives,
};
use crate::block::backend::Backend;
use crate::control::ledger::{now_unix_s, Claim, Kind, Origin, Promise};
use crate::persist::{Durability, RestoreOptions, RestoreProgress, RestoreReport, SyncReport};
use crate::size::format_size;

/// Attempts of a restore that the host's memory shortage refuses.
const MEMORY_ATTEMPTS: u32 = 4;
/// How long a restore waits in all for the host's memory to recover.
const MEMORY_WAIT: Duration = Duration::from_secs(600);
/// Room that stopped growing this long counts as all that will come.
const MEMORY_SETTLE: Duration = Duration::from_secs(10);
/// Growth of the room that counts as memory still being freed.
const MEMORY_GROWTH: u64 = 16 << 20;

/// The drive map, locked.
type DrivesGuard<'a> = parking_lot::MutexGuard<'a, BTreeMap<String, Arc<Drive>>>;

/// What `dir` holds, where a drive whose `drive.json` is unusable counts
/// as broken: it fails with the reason instead of being restored (and
/// the file rewritten) with whatever settings the caller has.
fn probe_with_settings(dir: &std::path::Path, name: &str) -> Found {
    match persistent::probe(dir) {
        found @ Found::Existing { .. } => match settings::read_checked(dir, name) {
            Err(e) => Found::Broken(e.to_string()),
            Ok(_) => found,
        },
        found => found,
    }
}

impl Drives {
    /// `create_from` for a persistent drive: a new one, or a restore, or
    /// (`found` known already: an unusable `drive.json`) a failed one.
    pub(super) fn create_persistent(
        self: &Arc<Self>,
        spec: &DriveSpec,
        persist: &PersistSpec,
        origin: Origin,
        found: Option<Found>,
    ) -> Result<Arc<Drive>, DriveError> {
        let dir = self.drive_dir(&spec.name)?;
        let drives = self.drives.lock();
        // The name first (nothing promised yet), then the disk.
        let guard =
            self.ledger
                .claim_guarded(Kind::Drive, &spec.name, origin, &Promise::Bytes(0))?;
        let claim = guard.claim();
        let found = found.unwrap_or_else(|| probe_with_settings(&dir, &spec.name));
        let made = match found {
            Found::New => self.create_fresh(drives, dir, spec, persist, claim),
            Found::Existing { size_bytes } => {
                self.queue_restore(drives, dir, spec, persist, claim, size_bytes)
            }
            Found::Broken(error) => self.add_broken(drives, dir, spec, persist, claim, error),
        }?;
        guard.keep();
        Ok(made)
    }

    /// A new persistent drive in the empty `dir`: its files, then served.
    fn create_fresh(
        &self,
        mut drives: DrivesGuard<'_>,
        dir: PathBuf,
        spec: &DriveSpec,
        persist: &PersistSpec,
        claim: &Arc<Claim>,
    ) -> Result<Arc<Drive>, DriveError> {
        self.check_memlock(&drives, spec, spec.size_bytes, spec.mem_limit_bytes)?;
        let promise = promise_for(spec.size_bytes, spec.mem_limit_bytes, spec.overcommit);
        self.ledger.repromise(claim, &promise)?;
        let origin = claim.origin.name();
        let pd = persistent::create_new(
            &dir,
            spec,
            persist,
            origin,
            self.budget().clone(),
            kept::supervised(),
        )?;
        // Kept by a supervisor (if any) before clients can write.
        match &pd {
            DiskDrive::Raw(d) => self.keep_persistent(spec, &claim.origin, d.store(), &dir),
            DiskDrive::Compressed(d) => {
                self.keep_persistent_compressed(spec, &claim.origin, d.store(), &dir)
            }
        }
        let p = Arc::new(Persistence::new(
            dir.clone(),
            persist.clone(),
            origin,
            RestoreRecord::None,
        ));
        let drive = self.assemble(
            spec,
            claim.clone(),
            DriveKind::Persistent,
            DriveState::Ready,
            DriveData::Persistent(pd.clone()),
            Some(p.clone()),
            None,
            now_unix_s(),
        );
        if let Err(e) = self.insert(&mut drives, &drive) {
            self.forget_kept(&spec.name);
            return Err(e);
        }
        p.start_scheduler(&pd, &spec.name);
        tracing::info!(
            drive = %spec.name,
            size = %format_size(spec.size_bytes),
            durability = %persist.durability,
            interval = %crate::control::spec::format_interval(persist.sync_interval_ms),
            encrypted = persist.key_file.is_some(),
            compress = %spec.compress.map_or("off".to_owned(), |a| a.to_string()),
            dir = %dir.display(),
            "persistent drive created"
        );
        Ok(drive)
    }

    /// The drive in `dir` listed as restoring; its restore runs in the
    /// background.
    fn queue_restore(
        self: &Arc<Self>,
        mut drives: DrivesGuard<'_>,
        dir: PathBuf,
        spec: &DriveSpec,
        persist: &PersistSpec,
        claim: &Arc<Claim>,
        size_bytes: u64,
    ) -> Result<Arc<Drive>, DriveError> {
        self.check_memlock(&drives, spec, size_bytes, spec.mem_limit_bytes)?;
        let promise = promise_for(size_bytes, spec.mem_limit_bytes, spec.overcommit);
        self.ledger.repromise(claim, &promise)?;
        let p = Arc::new(Persistence::new(
            dir.clone(),
            persist.clone(),
            claim.origin.name(),
            RestoreRecord::Queued,
        ));
        let placeholder = self.assemble(
            spec,
            claim.clone(),
            DriveKind::Persistent,
            DriveState::Restoring,
            DriveData::Offline {
                size_bytes,
                mem_limit_bytes: spec.mem_limit_bytes,
                compress: spec.compress,
            },
            Some(p),
            None,
            now_unix_s(),
        );
        self.insert(&mut drives, &placeholder)?;
        drop(drives);
        tracing::info!(
            drive = %spec.name,
            dir = %dir.display(),
            size = %format_size(size_bytes),
            "restoring persistent drive from its state directory"
        );
        // A declared size (config, flags, `ramd create --size`)
        // is applied after the restore.
        let kept = self.take_kept_persistent(&spec.name, spec.compress);
        self.spawn_restore(
            &placeholder,
            Some(spec.size_bytes),
            RestoreOptions::default(),
            kept,
        );
        Ok(placeholder)
    }

    /// The drive in `dir`, which cannot be restored as it is, listed as
    /// failed with `error`.
    fn add_broken(
        &self,
        mut drives: DrivesGuard<'_>,
        dir: PathBuf,
        spec: &DriveSpec,
        persist: &PersistSpec,
        claim: &Arc<Claim>,
        error: String,
    ) -> Result<Arc<Drive>, DriveError> {
        let p = Arc::new(Persistence::new(
            dir,
            persist.clone(),
            claim.origin.name(),
            RestoreRecord::Failed(error.clone()),
        ));
        let drive = self.assemble(
            spec,
            claim.clone(),
            DriveKind::Persistent,
            DriveState::Failed(error.clone()),
            DriveData::Offline {
                size_bytes: 0,
                mem_limit_bytes: spec.mem_limit_bytes,
                compress: spec.compress,
            },
            Some(p),
            None,
            now_unix_s(),
        );
        self.insert(&mut drives, &drive)?;
        tracing::error!(drive = %spec.name, "persistent drive failed: {error}");
        Ok(drive)
    }

    /// Starts the restore of `placeholder` (registered, restoring) on its
    /// own thread; `want_size` is applied afterwards when given.
    fn spawn_restore(
        self: &Arc<Self>,
        placeholder: &Arc<Drive>,
        want_size: Option<u64>,
        opts: RestoreOptions,
        kept: Option<Kept>,
    ) {
        let (me, ph) = (self.clone(), placeholder.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("restore-{}", placeholder.name))
            .spawn(move || me.run_restore(&ph, want_size, opts, kept));
        if let Err(e) = spawned {
            let mut drives = self.drives.lock();
            self.finish_failed(
                &mut drives,
                placeholder,
                format!("cannot start the restore thread: {e}"),
            );
        }
    }

    fn run_restore(
        self: &Arc<Self>,
        placeholder: &Arc<Drive>,
        want_size: Option<u64>,
        opts: RestoreOptions,
        kept: Option<Kept>,
    ) {
        let Some(p) = placeholder.persist.clone() else {
            return;
        };
        let started = Instant::now();
        let Some(result) = self.open_until_memory_lets(placeholder, &p, opts, kept) else {
            return;
        };
        let mut drives = self.drives.lock();
        if !self.is_current_locked(&drives, placeholder)
            || self.shutting_down.load(Ordering::SeqCst)
        {
            // Deleted meanwhile, or the daemon is stopping: nothing was
            // served from it, so nothing needs saving.
            if let Ok((pd, _)) = result {
                let _ = pd.close();
            }
            return;
        }
        let (pd, report) = match result {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(
                    drive = %placeholder.name,
                    "restore failed after {:.2}s: {e}",
                    started.elapsed().as_secs_f64()
                );
                self.finish_failed(&mut drives, placeholder, e.to_string());
                return;
            }
        };
        let mut spec = placeholder.spec();
        spec.size_bytes = pd.size();
        let drive = self.assemble(
            &spec,
            placeholder.claim.clone(),
            DriveKind::Persistent,
            DriveState::Ready,
            DriveData::Persistent(pd.clone()),
            Some(p.clone()),
            Some(placeholder.metrics.clone()),
            placeholder.created_unix_s,
        );
        let text = persistent::report_text(&report);
        *p.restore.lock() = RestoreRecord::Done(report);
        // Kept by a supervisor (if any) before clients can write.
        let origin = placeholder.claim.origin.clone();
        match &pd {
            DiskDrive::Raw(d) => self.keep_persistent(&spec, &origin, d.store(), &p.dir),
            DiskDrive::Compressed(d) => {
                self.keep_persistent_compressed(&spec, &origin, d.store(), &p.dir)
            }
        }
        self.replace(&mut drives, placeholder, &drive);
        self.seed_kept_metrics(&drive);
        tracing::info!(drive = %drive.name, "{text}");
        if let Some(want) = want_size.filter(|&w| w != pd.size()) {
            self.apply_declared_size(&drive, want);
        }
        // Still under the drive map's lock: a delete or a shutdown that
        // sees the ready drive also sees its scheduler (and stops it); one
        // started after them would write into a removed state directory.
        p.save_settings(&drive.spec());
        p.start_scheduler(&pd, &drive.name);
        drop(drives);
    }

    /// Opens `placeholder`'s state directory (restore or adoption) in its
    /// turn; a restore refused because the host is short of memory waits
    /// until memory comes back ([`Drives::wait_for_memory`]) and starts
    /// again, up to [`MEMORY_ATTEMPTS`] attempts within [`MEMORY_WAIT`] (a
    /// restart after a kill -9 meets the dead process's memory still being
    /// freed). None when the drive was replaced (deleted) meanwhile.
    fn open_until_memory_lets(
        &self,
        placeholder: &Arc<Drive>,
        p: &Arc<Persistence>,
        opts: RestoreOptions,
        mut kept: Option<Kept>,
    ) -> Option<Result<(DiskDrive, RestoreReport), persistent::DiskError>> {
        let deadline = Instant::now() + MEMORY_WAIT;
        for attempt in 1.. {
            let progress = Arc::new(RestoreProgress::new());
            let result = {
                let _turn = self.restore_turn.lock();
                {
                    // Under the map's lock: a delete of a drive waiting
                    // for memory sees it either waiting or running.
                    let drives = self.drives.lock();
                    if !self.is_current_locked(&drives, placeholder) {
                        return None;
                    }
                    *p.restore.lock() = RestoreRecord::Running(progress.clone());
                }
                self.open_once(placeholder, p, opts, &progress, kept.take())
            };
            let error = match &result {
                // An adoption never asks for pages; one that fell back to
                // a restore did, and the next attempt is that restore.
                Err(e) if e.is_host_short() && attempt < MEMORY_ATTEMPTS => e,
                _ => return Some(result),
            };
            tracing::warn!(drive = %placeholder.name,
                "restore attempt {attempt} refused: {error}; starting again when the host's memory comes back (at most {MEMORY_ATTEMPTS} attempts within {} s)",
                MEMORY_WAIT.as_secs());
            *p.restore.lock() = RestoreRecord::WaitingForMemory {
                attempt,
                error: error.to_string(),
            };
            // Read again, the files' cached pages would turn active, which
            // the watcher counts as taken (in a memory cgroup).
            persistent::drop_page_cache(&p.dir);
            if !self.wait_for_memory(placeholder, deadline, progress.total_bytes()) {
                return Some(result);
            }
        }
        unreachable!("the attempts end the loop")
    }

    /// One open of the state directory.
    fn open_once(
        &self,
        placeholder: &Drive,
        p: &Persistence,
        opts: RestoreOptions,
        progress: &RestoreProgress,
        kept: Option<Kept>,
    ) -> Result<(DiskDrive, RestoreReport), persistent::DiskError> {
        let pspec = p.spec.lock().clone();
        let memory = persistent::Memory {
            mem_limit_bytes: placeholder.mem_limit_bytes(),
            compress: placeholder.compress(),
            lock_memory: placeholder.lock_memory,
            shared_memory: kept::supervised(),
        };
        persistent::open(
            &p.dir,
            &pspec,
            opts,
            progress,
            memory,
            self.budget().clone(),
            kept,
        )
    }

    /// Waits until memory came back for a restore of `needed` bytes (what
    /// its image and journal hold; a compressed drive needs less): the
    /// host is not short and the budget has that much room, or it is not
    /// short and its room stopped growing for [`MEMORY_SETTLE`] (whatever
    /// was being freed is freed; the attempt may fit anyway). False at the
    /// deadline, at shutdown, or when the drive was deleted meanwhile.
    fn wait_for_memory(&self, placeholder: &Arc<Drive>, deadline: Instant, needed: u64) -> bool {
        let budget = self.budget();
        // One reading at least after the refused attempt freed its pages.
        let first_reading = Instant::now() + crate::control::pressure::INTERVAL;
        let (mut best, mut since) = (0u64, Instant::now());
        loop {
            if self.shutting_down.load(Ordering::SeqCst) || !self.is_current(placeholder) {
                return false;
            }
            let room = budget.room_bytes();
            if Instant::now() < first_reading {
                since = Instant::now();
            } else if budget.host_short() {
                (best, since) = (0, Instant::now());
            } else if room >= needed || since.elapsed() >= MEMORY_SETTLE {
                return true;
            } else if room > best.saturating_add(MEMORY_GROWTH) {
                (best, since) = (room, Instant::now());
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Grows (or, when no data would be lost, shrinks) a restored drive to
    /// the size its declaration asks for; otherwise keeps it and says why.
    /// Called with the drive map locked (the drive was just registered).
    fn apply_declared_size(&self, drive: &Arc<Drive>, want: u64) {
        let have = drive.size_bytes();
        let name = &drive.name;
        let promise = promise_for(want, drive.mem_limit_bytes(), *drive.overcommit.lock());
        if let Err(e) = self.promise_change(drive, &promise) {
            tracing::warn!(drive = %name, "keeping the restored size {}: {e}", format_size(have));
            return;
        }
        if want < have {
            match data_end(&*drive.export.backend, want, have) {
                Ok(None) => {}
                Ok(Some(end)) => {
                    tracing::warn!(
                        drive = %name,
                        "keeping the restored size {}: the declared {} would discard data stored up to {}; shrink with `ramd resize {name} SIZE --force`",
                        format_size(have), format_size(want), format_size(end)
                    );
                    return;
                }
                Err(e) => {
                    tracing::warn!(drive = %name, "keeping the restored size: {e}");
                    return;
                }
            }
        }
        let resized = drive.resize_data(want);
        self.recommit(drive);
        match resized {
            Ok(()) => tracing::info!(
                drive = %name,
                from = %format_size(have),
                to = %format_size(want),
                "restored drive resized to its declared size"
            ),
            Err(e) => tracing::warn!(drive = %name, "cannot resize to the declared size: {e}"),
        }
    }

    /// Replaces `placeholder` with a failed drive showing `error`.
    fn finish_failed(
        &self,
        drives: &mut BTreeMap<String, Arc<Drive>>,
        placeholder: &Arc<Drive>,
        error: String,
    ) {
        if let Some(p) = &placeholder.persist {
            *p.restore.lock() = RestoreRecord::Failed(error.clone());
        }
        let spec = placeholder.spec();
        let drive = self.assemble(
            &spec,
            placeholder.claim.clone(),
            DriveKind::Persistent,
            DriveState::Failed(error),
            DriveData::Offline {
                size_bytes: placeholder.size_bytes(),
                mem_limit_bytes: placeholder.mem_limit_bytes(),
                compress: placeholder.compress(),
            },
            placeholder.persist.clone(),
            Some(placeholder.metrics.clone()),
            placeholder.created_unix_s,
        );
        self.replace(drives, placeholder, &drive);
    }

    fn is_current_locked(&self, drives: &BTreeMap<String, Arc<Drive>>, d: &Arc<Drive>) -> bool {
        drives.get(&d.name).is_some_and(|x| Arc::ptr_eq(x, d))
    }

    fn is_current(&self, d: &Arc<Drive>) -> bool {
        self.is_current_locked(&self.drives.lock(), d)
    }

    /// Restores a failed persistent drive again with `opts` (and, when
    /// given, another key file). Returns the drive, now restoring.
    pub fn restore(
        self: &Arc<Self>,
        name: &str,
        opts: RestoreOptions,
        key_file: Option<PathBuf>,
    ) -> Result<Arc<Drive>, DriveError> {
        let mut drives = self.drives.lock();
        let drive = drives.get(name).cloned().ok_or_else(|| not_found(name))?;
        let Some(p) = drive.persist.clone() else {
            return Err(DriveError::NotPersistent(name.to_owned()));
        };
        let state = drive.state.lock().clone();
        match state {
            DriveState::Failed(_) => {}
            DriveState::Ready => {
                return Err(error::NotReady::AlreadyReady {
                    name: name.to_owned(),
                }
                .into())
            }
            DriveState::Restoring => {
                return Err(error::NotReady::AlreadyRestoring {
                    name: name.to_owned(),
                    progress: p.restore_text(),
                }
                .into())
            }
        }
        let size_bytes = match persistent::probe(&p.dir) {
            Found::Existing { size_bytes } => size_bytes,
            Found::Broken(_) => 0,
            Found::New => {
                return Err(DriveError::NothingToRestore {
                    name: name.to_owned(),
                    dir: p.dir.clone(),
                })
            }
        };
        // The settings file: still unusable, only --force goes ahead (and
        // the restore rewrites it); fixed, a drive created through the API
        // takes its settings again.
        match settings::read_checked(&p.dir, name) {
            Err(source) if !opts.force => {
                return Err(error::NotReady::Settings {
                    name: name.to_owned(),
                    source,
                }
                .into())
            }
            Err(e) => tracing::warn!(drive = %name, "restoring with --force despite: {e}"),
            Ok(Some(stored)) if *drive.origin() == Origin::Api => {
                if let Ok(DriveSpec {
                    persist: Some(stored),
                    ..
                }) = stored.to_spec()
                {
                    *p.spec.lock() = stored;
                }
            }
            Ok(_) => {}
        }
        if let Some(k) = key_file {
            p.spec.lock().key_file = Some(k);
        }
        let promise = promise_for(
            size_bytes,
            drive.mem_limit_bytes(),
            *drive.overcommit.lock(),
        );
        self.promise_change(&drive, &promise)?;
        *p.restore.lock() = RestoreRecord::Queued;
        let spec = drive.spec();
        let placeholder = self.assemble(
            &spec,
            drive.claim.clone(),
            DriveKind::Persistent,
            DriveState::Restoring,
            DriveData::Offline {
                size_bytes,
                mem_limit_bytes: drive.mem_limit_bytes(),
                compress: drive.compress(),
            },
            Some(p),
            Some(drive.metrics.clone()),
            drive.created_unix_s,
        );
        self.replace(&mut drives, &drive, &placeholder);
        drop(drives);
        tracing::info!(drive = %name, force = opts.force, discard_journal = opts.discard_journal, "restoring again");
        self.spawn_restore(&placeholder, None, opts, None);
        Ok(placeholder)
    }

    /// True while any drive is restoring.
    pub fn restoring(&self) -> Vec<Arc<Drive>> {
        self.list()
            .into_iter()
            .filter(|d| *d.state.lock() == DriveState::Restoring)
            .collect()
    }

    /// Syncs a persistent drive now; returns once everything written
    /// before the call is durable.
    pub fn sync(&self, name: &str) -> Result<(Arc<Drive>, SyncReport), DriveError> {
        let drive = self.get(name)?;
        let pd = self.ready_persistent(&drive)?;
        let r = pd.sync().map_err(|source| error::SyncFailed::Sync {
            name: name.to_owned(),
            source,
        })?;
        Ok((drive.clone(), r))
    }

    fn ready_persistent<'a>(&self, drive: &'a Drive) -> Result<&'a DiskDrive, DriveError> {
        if drive.persist.is_none() {
            return Err(DriveError::NotPersistent(drive.name.clone()));
        }
        drive.persistent().ok_or_else(|| not_ready(drive))
    }

    /// Changes a persistent drive's durability and/or sync interval.
    pub fn set_persistence(
        &self,
        name: &str,
        durability: Option<Durability>,
        sync_interval_ms: Option<u64>,
    ) -> Result<Arc<Drive>, DriveError> {
        let drive = self.get(name)?;
        let pd = self.ready_persistent(&drive)?.clone();
        let p = drive.persist.clone().expect("checked persistent");
        {
            let mut s = p.spec.lock();
            if let Some(d) = durability {
                s.durability = d;
                pd.set_durability(d);
            }
            if let Some(ms) = sync_interval_ms {
                s.sync_interval_ms = ms;
                pd.set_sync_interval_ms(ms);
            }
        }
        p.wake_scheduler();
        p.save_settings(&drive.spec());
        tracing::info!(drive = %name, durability = ?durability, sync_interval_ms = ?sync_interval_ms, "persistence changed");
        Ok(drive)
    }

    /// Clean shutdown of every persistent drive: stops its sync thread and
    /// saves everything (sync and checkpoint), logging each. Call after
    /// the NBD server and attachments have stopped.
    ///
    /// Each drive is saved on its own: a panic while saving one (a bug,
    /// never expected) is reported and the next drive is still saved.
    pub fn shutdown_persistent(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        for d in self.list() {
            let saved =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| save_at_shutdown(&d)));
            if saved.is_err() {
                tracing::error!(drive = %d.name, "saving at shutdown panicked; the disk holds the last completed sync");
            }
        }
    }

    /// Saves a persistent drive being deleted with its data kept: waits
    /// (bounded) for its closing connections to finish their requests,
    /// syncs, checkpoints. On failure the drive is registered again.
    pub(super) fn final_save(
        &self,
        drive: &Arc<Drive>,
        pd: &DiskDrive,
        p: &Arc<Persistence>,
    ) -> Result<(), DriveError> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while drive.connections() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let saved = pd.sync().and_then(|_| pd.close());
        let Err(source) = saved else { return Ok(()) };
        let failed = error::SyncFailed::KeepData {
            name: drive.name.clone(),
            source,
        };
        let spec = drive.spec();
        let mut drives = self.drives.lock();
        // It held its promise until the delete: it gets it back unchecked.
        let back = self
            .ledger
            .claim_unchecked(
                Kind::Drive,
                &drive.name,
                drive.origin().clone(),
                drive.commitment(),
            )
            .map_err(DriveError::from)
            .and_then(|claim| {
                let back = self.assemble(
                    &spec,
                    claim,
                    DriveKind::Persistent,
                    DriveState::Ready,
                    DriveData::Persistent(pd.clone()),
                    Some(p.clone()),
                    Some(drive.metrics.clone()),
                    drive.created_unix_s,
                );
                self.insert(&mut drives, &back)
            });
        if back.is_err() {
            tracing::error!(drive = %drive.name, "{failed}; its name was taken meanwhile, so it cannot be served again: its unsaved writes are lost");
        } else {
            // Under the lock, as in `run_restore`.
            p.start_scheduler(pd, &drive.name);
            drop(drives);
        }
        Err(failed.into())
    }
}

/// Saves one persistent drive at shutdown (sync and checkpoint), logging
/// the outcome; a drive still restoring keeps its state directory as is.
fn save_at_shutdown(d: &Arc<Drive>) {
    let Some(p) = &d.persist else { return };
    match (&d.data, &*d.state.lock()) {
        (DriveData::Persistent(pd), _) => {
            p.stop_scheduler();
            let dirty = pd.status().dirty_bytes;
            let started = Instant::now();
            match pd.close() {
                Ok(r) => tracing::info!(
                    drive = %d.name,
                    dirty = %format_size(dirty),
                    journal = %format_size(r.journal_bytes),
                    ms = started.elapsed().as_millis() as u64,
                    "saved to {}",
                    p.dir.display()
                ),
                Err(e) => tracing::error!(
                    drive = %d.name,
                    "could not save at shutdown: {e}; the disk holds the last completed sync"
                ),
            }
        }
        (_, DriveState::Restoring) => tracing::info!(
            drive = %d.name,
            "was still restoring ({}); its state directory is unchanged and it restores at the next start",
            p.restore_text()
        ),
        _ => {}
    }
}
