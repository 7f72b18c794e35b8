//! Creating a drive: [`Drives::create_from`] is the one path every new
//! drive takes, whoever asks for it ([`Source`]). The rules a new drive
//! must pass are decided there once, in this order, the same way for
//! every source:
//!
//! 1. the name rule (before any path is made from the name);
//! 2. the request completed: a persistent drive asked for through the API
//!    whose state directory holds one takes the stored settings it did
//!    not give, and its size from the disk when it gave none;
//! 3. the size (at least a page, at most `MAX_DRIVE_BYTES`) and the
//!    compression (at most `MAX_COMPRESSED_DRIVE_BYTES`);
//! 4. under the drive map lock: `RLIMIT_MEMLOCK` for a locked drive and
//!    the budget promise, claimed with the name in the ledger and held by
//!    a guard until the drive is registered (a failure gives both back);
//!    a persistent drive claims its name first, then
//! 5. learns what its state directory holds (nothing: created there, and
//!    promised its spec; a drive: restored from it, and promised its size
//!    on disk, `RLIMIT_MEMLOCK` checked for either; unusable: registered
//!    failed, promised nothing).
//!
//! Sources differ only in what they bring besides the spec: the ledger
//! origin of a declared drive, the API's record of what it was given, a
//! store a snapshot restore filled, the reason an unusable `drive.json`
//! gives. [`Drives::check_room`] answers steps 1, 3 and the promise of 4
//! without claiming, for work that must know before it starts.

use std::path::Path;
use std::sync::Arc;

use super::persistent::settings::{self, Given};
use super::persistent::{probe, Found};
use super::spec::{check_name, DriveSpec, MalformedSpec, SpecError};
use super::{
    check_spec, promise_for, store_options, Drive, DriveData, DriveError, DriveKind, DriveState,
    Drives,
};
use crate::block::backend::Backend;
use crate::control::ledger::{now_unix_s, Kind, Origin};
use crate::size::format_size;
use crate::store::compressed::CompressedStore;
use crate::store::RamStore;

/// Where a request for a new drive comes from, and what it brings besides
/// its spec.
pub enum Source {
    /// Declared at start: a config file's drive or `--drive` (the ledger
    /// origin says which). The declaration describes the drive.
    Declared(Origin),
    /// `POST /v1/drives`. A persistent drive whose state directory holds
    /// one takes the stored settings the request did not give; without
    /// `size` (then the spec's size is not read) it keeps the size on disk.
    Api(Given),
    /// A persistent drive in the state directory that nothing declares (at
    /// start), described by its `drive.json`.
    Stored,
    /// A drive in the state directory whose `drive.json` is unusable (this
    /// reason): registered failed, holding nothing; its spec is
    /// [`DriveSpec::failed`].
    Unusable(String),
    /// A snapshot restored into this RAM store (raw or compressed, of the
    /// spec's size), filled and verified by the caller: served only now.
    Adopted(DriveData),
    /// A snapshot restored into the drive's state directory, which now
    /// holds the whole drive: it loads from there like a stored one.
    Restored,
    /// A RAM drive a supervisor kept across a restart of the serving
    /// process (`kept`), adopted with its memory, under its origin.
    Kept(Origin, DriveData),
}

impl Source {
    /// The origin the drive's ledger claim records: a declared drive's
    /// declaration, else the API (changes through the API last, and a
    /// stored drive comes back at the next start).
    pub fn origin(&self) -> Origin {
        match self {
            Source::Declared(o) | Source::Kept(o, _) => o.clone(),
            _ => Origin::Api,
        }
    }

    /// A short name, for logs and tests.
    pub fn name(&self) -> &'static str {
        match self {
            Source::Declared(o) => o.name(),
            Source::Api(_) => "api",
            Source::Stored => "stored",
            Source::Unusable(_) => "unusable",
            Source::Adopted(_) => "adopted",
            Source::Restored => "restored",
            Source::Kept(..) => "kept",
        }
    }
}

/// A drive [`Drives::create_from`] registered.
#[derive(Debug)]
pub struct Created {
    pub drive: Arc<Drive>,
    /// For people: the stored settings an API request kept (None: none).
    pub notice: Option<String>,
}

impl Drives {
    /// Creates a drive and starts serving it, deciding every rule a new
    /// drive must pass (see the module docs). A persistent drive whose
    /// state directory already holds one is restored instead: it is
    /// registered as restoring at once and becomes ready (or failed) when
    /// its restore thread is done.
    pub fn create_from(
        self: &Arc<Self>,
        spec: DriveSpec,
        source: Source,
    ) -> Result<Created, DriveError> {
        check_name(&spec.name)?;
        let (spec, notice) = match &source {
            Source::Api(given) => self.complete_from_disk(spec, given)?,
            _ => (spec, None),
        };
        if !matches!(source, Source::Unusable(_)) {
            check_spec(&spec)?;
        }
        let origin = source.origin();
        let drive = match source {
            Source::Adopted(data) | Source::Kept(_, data) => {
                debug_assert!(spec.persist.is_none() && spec.size_bytes == data_size(&data));
                self.create_ram(&spec, origin, Some(data))
            }
            Source::Unusable(error) => {
                let persist = spec.persist.clone().unwrap_or_default();
                self.create_persistent(&spec, &persist, origin, Some(Found::Broken(error)))
            }
            _ => match &spec.persist {
                Some(p) => self.create_persistent(&spec, p, origin, None),
                None => self.create_ram(&spec, origin, None),
            },
        }?;
        Ok(Created { drive, notice })
    }

    /// Whether a drive of `spec` could be created now (the name legal and
    /// free, the size and compression legal, its promise within the
    /// budget), without claiming: a snapshot restore asks before it
    /// downloads anything, so an answer that would come at the end comes
    /// at once. (Also for restores into persistent drives, which promise
    /// the same.)
    pub fn check_room(&self, spec: &DriveSpec) -> Result<(), DriveError> {
        check_name(&spec.name)?;
        check_spec(spec)?;
        let promise = promise_for(spec.size_bytes, spec.mem_limit_bytes, spec.overcommit);
        Ok(self.ledger.check_claim(Kind::Drive, &spec.name, &promise)?)
    }

    /// Step 2 for the API: a persistent drive whose state directory holds
    /// one keeps the stored settings the request did not give (an
    /// unusable `drive.json` is left for the registration to fail the
    /// drive with) and, without a size, its size on disk. Returns the spec
    /// and a notice naming what was kept.
    fn complete_from_disk(
        &self,
        mut spec: DriveSpec,
        given: &Given,
    ) -> Result<(DriveSpec, Option<String>), DriveError> {
        let existing = match (&spec.persist, self.drive_dir(&spec.name)) {
            (Some(_), Ok(dir)) => match probe(&dir) {
                Found::Existing { size_bytes } => Some((dir, size_bytes)),
                _ => None,
            },
            _ => None,
        };
        match (given.size, &existing) {
            (true, _) => {}
            (false, Some((_, size_bytes))) => spec.size_bytes = *size_bytes,
            (false, None) => return Err(SpecError::from(MalformedSpec::MissingSize).into()),
        }
        let notice = match &existing {
            Some((dir, _)) => match settings::read_checked(dir, &spec.name) {
                Ok(Some(stored)) => stored_notice(dir, &stored.fill(&mut spec, given)),
                _ => None,
            },
            None => None,
        };
        Ok((spec, notice))
    }

    /// A RAM drive (raw or compressed): over `data` when a snapshot
    /// restore filled it, else over a new empty store.
    fn create_ram(
        &self,
        spec: &DriveSpec,
        origin: Origin,
        data: Option<DriveData>,
    ) -> Result<Arc<Drive>, DriveError> {
        let mut drives = self.drives.lock();
        self.check_memlock(&drives, spec, spec.size_bytes, spec.mem_limit_bytes)?;
        let promise = promise_for(spec.size_bytes, spec.mem_limit_bytes, spec.overcommit);
        let claim = self
            .ledger
            .claim_guarded(Kind::Drive, &spec.name, origin.clone(), &promise)?;
        let adopted = data.is_some();
        let data = match data {
            Some(data) => data,
            None => self.new_store(spec)?,
        };
        // Kept by a supervisor (if any) before clients can write.
        match &data {
            DriveData::Ram(store) => self.keep(spec, &origin, store),
            DriveData::Compressed(store) => self.keep_compressed(spec, &origin, store),
            _ => {}
        }
        let drive = self.assemble(
            spec,
            claim.claim().clone(),
            DriveKind::Ram,
            DriveState::Ready,
            data,
            None,
            None,
            now_unix_s(),
        );
        if let Err(e) = self.insert(&mut drives, &drive) {
            self.forget_kept(&spec.name);
            return Err(e);
        }
        claim.keep();
        if adopted {
            tracing::info!(drive = %spec.name, size = %format_size(spec.size_bytes), "drive created from restored data");
        } else {
            tracing::info!(
                drive = %spec.name,
                size = %format_size(spec.size_bytes),
                read_only = spec.read_only,
                compress = %spec.compress.map_or("off".to_owned(), |a| a.to_string()),
                lock_memory = spec.lock_memory,
                "drive created"
            );
        }
        Ok(drive)
    }

    /// A new empty RAM store for `spec`: raw, or compressed.
    fn new_store(&self, spec: &DriveSpec) -> Result<DriveData, DriveError> {
        let (limit, budget) = (spec.mem_limit_bytes, self.budget().clone());
        let (size, lock) = (spec.size_bytes, spec.lock_memory);
        Ok(match spec.compress {
            None => {
                let mut opts = store_options(limit, lock);
                // In a memfd a supervisor keeps (`kept`), when there is one.
                opts.shared_memory = crate::handover::serving::get().is_some();
                RamStore::with_options(size, opts, budget).map(|s| DriveData::Ram(s.into()))
            }
            // In memfds a supervisor keeps, when there is one.
            Some(a) if crate::handover::serving::get().is_some() => {
                CompressedStore::kept(size, a, limit, budget, lock, false)
                    .map(|s| DriveData::Compressed(s.into()))
            }
            Some(a) => CompressedStore::with_lock(size, a, limit, budget, lock)
                .map(|s| DriveData::Compressed(s.into())),
        }?)
    }
}

/// The size of a store handed to [`Drives::create_from`].
fn data_size(data: &DriveData) -> u64 {
    match data {
        DriveData::Ram(s) => s.size(),
        DriveData::Compressed(c) => c.size(),
        DriveData::Persistent(p) => p.size(),
        DriveData::Offline { size_bytes, .. } => *size_bytes,
    }
}

/// Says which stored settings a re-created persistent drive keeps.
fn stored_notice(dir: &Path, taken: &[String]) -> Option<String> {
    (!taken.is_empty()).then(|| {
        format!(
            "kept the drive's stored settings from {}: {} (give them explicitly to change them)",
            dir.join(settings::FILE).display(),
            taken.join(", ")
        )
    })
}

#[cfg(test)]
impl Drives {
    /// For tests across the crate: a drive wholly described by `spec`
    /// (nothing taken from disk), through [`Drives::create_from`], under
    /// `origin` (a declared one, or the API's: a stored drive).
    pub(crate) fn create(
        self: &Arc<Self>,
        spec: &DriveSpec,
        origin: Origin,
    ) -> Result<Arc<Drive>, DriveError> {
        let source = match origin {
            Origin::Api => Source::Stored,
            declared => Source::Declared(declared),
        };
        self.create_from(spec.clone(), source).map(|c| c.drive)
    }
}
