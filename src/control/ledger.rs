//! The ledger: every named object the daemon serves (drives and caches
//! today, later kinds such as compressed drives or snapshots) under one set
//! of rules.
//!
//! # Invariants
//!
//! - A name belongs to at most one object, whatever its kind: drives and
//!   caches share the NBD export namespace, so a kind [`Ledger::claim`]s a
//!   name before it builds anything under it and [`Ledger::release`]s it
//!   only after it has let go of the object. Every name is valid
//!   ([`check_name`]).
//! - An export is in the export table only while its name is claimed: the
//!   table changes only through [`Ledger::publish`], [`Ledger::withdraw`]
//!   and [`Ledger::release`].
//! - The memory budget is never promised twice: the promises of all claims
//!   together stay within the budget's limit. A promise is checked when it
//!   is made or raised; lowering one is always allowed. The only promises
//!   recorded without a check are facts a kind cannot refuse (a restored
//!   drive that came back larger, a drive put back after its delete
//!   failed); the budget's hard limit still holds at write time.
//! - The ledger's mutex is the innermost lock: a kind may hold its own map
//!   lock when it calls in, and the ledger never calls out while holding
//!   it. It is a plain (parking_lot) mutex, never held across an `.await`.
//!
//! # Why one ledger
//!
//! Names, the budget and the export table are shared by every kind, so
//! their rules live once, here, and each kind (`drives`, `caches`) keeps
//! only what is its own: its objects, their states and their I/O. The
//! refusals every kind shares (bad name, name taken, not found, over the
//! budget, in use) are [`LedgerError`]; each kind's error wraps it.
//!
//! A claim is an `Arc<Claim>` the object holds: operations take the claim,
//! not the name, so an object that was deleted (and whose name was taken
//! again) can never change its successor's promise or export.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use crate::block::{Export, ExportTable};
use crate::size::format_size;
use crate::store::MemoryBudget;

/// Longest object name.
pub const NAME_MAX_BYTES: usize = 64;

/// What kind of object a name belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Drive,
    Cache,
}

impl Kind {
    /// The word for one, in messages.
    pub fn noun(self) -> &'static str {
        match self {
            Kind::Drive => "drive",
            Kind::Cache => "cache",
        }
    }

    /// The command that lists them.
    fn list_command(self) -> &'static str {
        match self {
            Kind::Drive => "ramd list",
            Kind::Cache => "ramd cache list",
        }
    }

    /// The command that deletes one.
    fn delete_command(self) -> &'static str {
        match self {
            Kind::Drive => "ramd delete",
            Kind::Cache => "ramd cache delete",
        }
    }
}

/// Who asked for an object: declared objects come back at every start, so
/// run-time changes to them are reported as lasting until a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Declared in this config file.
    Config(PathBuf),
    /// `--drive` on the daemon's command line (or the built-in default).
    CommandLine,
    /// Created through the API.
    Api,
}

impl Origin {
    pub fn name(&self) -> &'static str {
        match self {
            Origin::Config(_) => "config",
            Origin::CommandLine => "command-line",
            Origin::Api => "api",
        }
    }

    /// A notice for run-time changes to a drive the daemon re-creates at
    /// start, or None.
    pub fn ephemeral_notice(&self, name: &str) -> Option<String> {
        match self {
            Origin::Config(file) => Some(format!(
                "drive '{name}' is declared in {}: this change lasts until the daemon restarts; edit the file to keep it",
                file.display()
            )),
            Origin::CommandLine => Some(format!(
                "drive '{name}' comes from the daemon's command line: this change lasts until the daemon restarts"
            )),
            Origin::Api => None,
        }
    }
}

/// Seconds since the epoch (0 before it), for creation times in listings.
pub fn now_unix_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A name that breaks the naming rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {} name '{name}': use 1-64 of a-z 0-9 _ -, starting with a letter or digit", kind.noun())]
pub struct NameError {
    pub kind: Kind,
    pub name: String,
}

/// Checks a name for an object of `kind`: `[a-z0-9][a-z0-9_-]{0,63}`
/// (the same rule for every kind: they share the export namespace).
pub fn check_name(kind: Kind, name: &str) -> Result<(), NameError> {
    let b = name.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= NAME_MAX_BYTES
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_' || *c == b'-');
    if ok {
        Ok(())
    } else {
        Err(NameError {
            kind,
            name: name.to_owned(),
        })
    }
}

/// What an object asks of the budget, and how a refusal explains it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Promise {
    /// A drive of `size` that may hold `data` bytes, plus `meta` of
    /// metadata.
    Drive { size: u64, data: u64, meta: u64 },
    /// An overcommitted drive of `size`: only its metadata is promised.
    Metadata { size: u64, meta: u64 },
    /// Any other object: `bytes` in all.
    Bytes(u64),
}

impl Promise {
    /// The bytes promised.
    pub fn bytes(&self) -> u64 {
        match *self {
            Promise::Drive { data, meta, .. } => data + meta,
            Promise::Metadata { meta, .. } => meta,
            Promise::Bytes(b) => b,
        }
    }
}

/// Something would not fit in the memory budget.
#[derive(Debug, thiserror::Error)]
pub enum OverBudget {
    /// A drive's metadata alone does not fit in what is free.
    #[error("drive '{name}' of {} needs {} of metadata but only {} of the {} memory budget is free; choose a smaller size", format_size(*size), format_size(*meta), format_size(*room), format_size(*limit))]
    Metadata {
        name: String,
        size: u64,
        meta: u64,
        room: u64,
        limit: u64,
    },
    /// A drive could hold more than the unpromised budget.
    #[error("drive '{name}' could hold {} (plus {} of metadata) but only {} of the daemon's {} memory budget is unpromised; choose a smaller size, cap its memory with mem-limit, allow overcommit (writes past the budget then fail with ENOSPC), or start the daemon with a larger --mem-budget", format_size(*data), format_size(*meta), format_size(*room), format_size(*limit))]
    Drive {
        name: String,
        data: u64,
        meta: u64,
        room: u64,
        limit: u64,
    },
    /// Something other than a drive (`what`: "cache 'NAME'") does not fit.
    #[error("{what} needs {} but only {} of the {} memory budget is not promised to drives and caches; use a smaller --size, delete a drive or cache, or start the daemon with a larger --mem-budget", format_size(*bytes), format_size(*room), format_size(*limit))]
    Other {
        what: String,
        bytes: u64,
        room: u64,
        limit: u64,
    },
}

/// A name is taken (by `holder`) when an object of `wanted` asked for it.
#[derive(Debug, thiserror::Error)]
#[error("{}", taken_text(*wanted, *holder, name))]
pub struct Taken {
    pub wanted: Kind,
    pub holder: Kind,
    pub name: String,
}

fn taken_text(wanted: Kind, holder: Kind, name: &str) -> String {
    let h = holder.noun();
    match (wanted, holder) {
        (Kind::Drive, Kind::Drive) => {
            format!("a drive named '{name}' already exists; pick another name or delete it first")
        }
        (Kind::Cache, Kind::Cache) => format!(
            "a cache named '{name}' already exists; pick another name or delete it first (ramd cache delete {name})"
        ),
        _ => format!(
            "a {h} named '{name}' already exists (drives and caches share NBD export names); pick another name"
        ),
    }
}

/// No object of `kind` has that name.
#[derive(Debug, thiserror::Error)]
#[error("no {} named '{name}' (see `{}`)", kind.noun(), kind.list_command())]
pub struct NotFound {
    pub kind: Kind,
    pub name: String,
}

/// The object is in use, so it cannot be deleted.
#[derive(Debug, thiserror::Error)]
pub enum Busy {
    /// Attached at mountpoints (`force`: the delete was forced already).
    #[error("{} '{name}' is attached at {}; unmount what uses it and run `ramd detach MOUNTPOINT` first{}", kind.noun(), join_paths(mountpoints), if *force { "" } else { " (or delete with force)" })]
    Attached {
        kind: Kind,
        name: String,
        mountpoints: Vec<PathBuf>,
        force: bool,
    },
    /// NBD clients are connected.
    #[error("{} '{name}' has {connections} open NBD connection{}; disconnect the client{} or delete with force ({} --force), which closes them", kind.noun(), plural(*connections), plural(*connections), kind.delete_command())]
    Connections {
        kind: Kind,
        name: String,
        connections: usize,
    },
}

/// A refusal every kind shares. Each kind's error wraps it; the API
/// answers by [`LedgerError::kind`] and variant.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error(transparent)]
    BadName(#[from] NameError),
    #[error(transparent)]
    Taken(#[from] Taken),
    #[error(transparent)]
    NotFound(#[from] NotFound),
    #[error(transparent)]
    OverBudget(#[from] OverBudget),
    #[error(transparent)]
    Busy(#[from] Busy),
}

impl LedgerError {
    /// The kind of object the refused request was about (None: a budget
    /// refusal, the same for every kind).
    pub fn kind(&self) -> Option<Kind> {
        match self {
            LedgerError::BadName(e) => Some(e.kind),
            LedgerError::Taken(e) => Some(e.wanted),
            LedgerError::NotFound(e) => Some(e.kind),
            LedgerError::OverBudget(_) => None,
            LedgerError::Busy(Busy::Attached { kind, .. } | Busy::Connections { kind, .. }) => {
                Some(*kind)
            }
        }
    }
}

/// The delete rule every kind follows: refused while attached (even with
/// `force`: attachments are detached by the caller first), and while NBD
/// clients are connected unless `force` (which closes them).
pub fn check_delete(
    kind: Kind,
    name: &str,
    attached: &[PathBuf],
    connections: usize,
    force: bool,
) -> Result<(), LedgerError> {
    if !attached.is_empty() {
        return Err(Busy::Attached {
            kind,
            name: name.to_owned(),
            mountpoints: attached.to_vec(),
            force,
        }
        .into());
    }
    if connections > 0 && !force {
        return Err(Busy::Connections {
            kind,
            name: name.to_owned(),
            connections,
        }
        .into());
    }
    Ok(())
}

/// Paths as one comma-separated list, for messages.
pub(crate) fn join_paths(paths: &[PathBuf]) -> String {
    let shown: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    shown.join(", ")
}

/// The plural ending for `n` things.
pub(crate) fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// One claimed name: what the ledger knows of the object behind it.
#[derive(Debug)]
pub struct Claim {
    /// The name, which is also the NBD export name.
    pub name: String,
    /// What the object is: messages and API codes name it.
    pub kind: Kind,
    /// Who asked for it: declared objects come back at every start.
    pub origin: Origin,
    /// Budget promised to the object; changed only under the ledger mutex.
    promised_bytes: AtomicU64,
}

impl Claim {
    /// Budget promised to the object now.
    pub fn promised_bytes(&self) -> u64 {
        self.promised_bytes.load(Ordering::Relaxed)
    }
}

/// The daemon's named objects (see the module docs).
pub struct Ledger {
    /// Claims by name. Held only for short, non-blocking work.
    claims: Mutex<BTreeMap<String, Arc<Claim>>>,
    /// What the NBD server serves.
    exports: Arc<ExportTable>,
    /// The daemon-wide memory budget every store charges.
    budget: Arc<MemoryBudget>,
}

type Claims = BTreeMap<String, Arc<Claim>>;

impl Ledger {
    pub fn new(exports: Arc<ExportTable>, budget: Arc<MemoryBudget>) -> Self {
        Ledger {
            claims: Mutex::new(BTreeMap::new()),
            exports,
            budget,
        }
    }

    pub fn budget(&self) -> &Arc<MemoryBudget> {
        &self.budget
    }

    /// The export of `name`, if it is served.
    pub fn export(&self, name: &str) -> Option<Arc<Export>> {
        self.exports.get(name)
    }

    /// Budget promised to every object together.
    pub fn committed_bytes(&self) -> u64 {
        promised(&self.claims.lock(), None)
    }

    /// The kind of the object named `name`, if any.
    pub fn kind_of(&self, name: &str) -> Option<Kind> {
        self.claims.lock().get(name).map(|c| c.kind)
    }

    /// Claims `name` for a new object of `kind`, with `promise` from the
    /// budget if it fits.
    pub fn claim(
        &self,
        kind: Kind,
        name: &str,
        origin: Origin,
        promise: &Promise,
    ) -> Result<Arc<Claim>, LedgerError> {
        self.claim_with(kind, name, origin, Some(promise), promise.bytes())
    }

    /// [`Ledger::claim`] held by a guard that gives the name (and its
    /// promise) back when dropped, unless [`ClaimGuard::keep`] hands the
    /// claim on: a creation that fails half-way cannot leak its name.
    pub fn claim_guarded(
        &self,
        kind: Kind,
        name: &str,
        origin: Origin,
        promise: &Promise,
    ) -> Result<ClaimGuard<'_>, LedgerError> {
        let claim = self.claim(kind, name, origin, promise)?;
        Ok(ClaimGuard {
            ledger: self,
            claim: Some(claim),
        })
    }

    /// Whether [`Ledger::claim`] would succeed now (the name free, the
    /// promise within the budget), without claiming: for work that must
    /// know before it starts (a snapshot restore checks before it
    /// downloads; the claim itself comes at the end and may still fail).
    pub fn check_claim(
        &self,
        kind: Kind,
        name: &str,
        promise: &Promise,
    ) -> Result<(), LedgerError> {
        check_name(kind, name)?;
        let claims = self.claims.lock();
        if let Some(holder) = claims.get(name) {
            return Err(Taken {
                wanted: kind,
                holder: holder.kind,
                name: name.to_owned(),
            }
            .into());
        }
        self.check_fits(&claims, None, kind, name, promise)
    }

    /// Claims `name` with `bytes` promised without a budget check: for an
    /// object that held its promise before (put back after a failed
    /// delete) or that holds nothing yet.
    pub fn claim_unchecked(
        &self,
        kind: Kind,
        name: &str,
        origin: Origin,
        bytes: u64,
    ) -> Result<Arc<Claim>, LedgerError> {
        self.claim_with(kind, name, origin, None, bytes)
    }

    fn claim_with(
        &self,
        kind: Kind,
        name: &str,
        origin: Origin,
        check: Option<&Promise>,
        bytes: u64,
    ) -> Result<Arc<Claim>, LedgerError> {
        check_name(kind, name)?;
        let mut claims = self.claims.lock();
        if let Some(holder) = claims.get(name) {
            return Err(Taken {
                wanted: kind,
                holder: holder.kind,
                name: name.to_owned(),
            }
            .into());
        }
        if let Some(p) = check {
            self.check_fits(&claims, None, kind, name, p)?;
        }
        let claim = Arc::new(Claim {
            name: name.to_owned(),
            kind,
            origin,
            promised_bytes: AtomicU64::new(bytes),
        });
        claims.insert(name.to_owned(), claim.clone());
        Ok(claim)
    }

    /// Changes what `claim` is promised: a larger promise only if it fits
    /// (a smaller one always does). A claim no longer current is left
    /// alone.
    pub fn repromise(&self, claim: &Arc<Claim>, promise: &Promise) -> Result<(), LedgerError> {
        let claims = self.claims.lock();
        if !is_current(&claims, claim) {
            return Ok(());
        }
        if promise.bytes() > claim.promised_bytes() {
            self.check_fits(&claims, Some(claim), claim.kind, &claim.name, promise)?;
        }
        claim
            .promised_bytes
            .store(promise.bytes(), Ordering::Relaxed);
        Ok(())
    }

    /// Checks that `promise` would fit in place of what `claim` holds now,
    /// without changing anything.
    pub fn check_repromise(
        &self,
        claim: &Arc<Claim>,
        promise: &Promise,
    ) -> Result<(), LedgerError> {
        let claims = self.claims.lock();
        self.check_fits(&claims, Some(claim), claim.kind, &claim.name, promise)
    }

    /// Records what `claim`'s object holds after a change it could not
    /// refuse (see the module invariants).
    pub fn record(&self, claim: &Arc<Claim>, bytes: u64) {
        let claims = self.claims.lock();
        if is_current(&claims, claim) {
            claim.promised_bytes.store(bytes, Ordering::Relaxed);
        }
    }

    /// Refused (over the budget) unless `promise` fits beside every claim
    /// but `except`.
    fn check_fits(
        &self,
        claims: &Claims,
        except: Option<&Arc<Claim>>,
        kind: Kind,
        name: &str,
        promise: &Promise,
    ) -> Result<(), LedgerError> {
        let limit = self.budget.limit_bytes();
        let room = limit.saturating_sub(promised(claims, except));
        if promise.bytes() <= room {
            return Ok(());
        }
        let name = name.to_owned();
        Err(match *promise {
            Promise::Drive { data, meta, .. } => OverBudget::Drive {
                name,
                data,
                meta,
                room,
                limit,
            },
            Promise::Metadata { size, meta } => OverBudget::Metadata {
                name,
                size,
                meta,
                room,
                limit,
            },
            Promise::Bytes(bytes) => OverBudget::Other {
                what: format!("{} '{name}'", kind.noun()),
                bytes,
                room,
                limit,
            },
        }
        .into())
    }

    /// Serves `export` (named as `claim`) over NBD. Refused when the name
    /// is served already, which only a table changed behind the ledger's
    /// back allows.
    pub fn publish(&self, claim: &Arc<Claim>, export: Arc<Export>) -> Result<(), LedgerError> {
        let claims = self.claims.lock();
        debug_assert_eq!(export.name, claim.name);
        if !is_current(&claims, claim) || !self.exports.insert(export) {
            tracing::error!(name = %claim.name, "export table out of step with the ledger");
            return Err(Taken {
                wanted: claim.kind,
                holder: claims.get(&claim.name).map_or(claim.kind, |c| c.kind),
                name: claim.name.clone(),
            }
            .into());
        }
        Ok(())
    }

    /// Stops serving `claim`'s export (its connections keep their `Arc`
    /// until they end; the caller closes them).
    pub fn withdraw(&self, claim: &Arc<Claim>) {
        let claims = self.claims.lock();
        if is_current(&claims, claim) {
            self.exports.remove(&claim.name);
        }
    }

    /// Serves `new` in place of the export now served under `claim`'s name.
    pub fn republish(&self, claim: &Arc<Claim>, new: Arc<Export>) {
        let claims = self.claims.lock();
        if !is_current(&claims, claim) {
            return;
        }
        self.exports.remove(&claim.name);
        if !self.exports.insert(new) {
            tracing::error!(name = %claim.name, "export table out of step with the ledger");
        }
    }

    /// Gives the name up, with its promise and its export.
    pub fn release(&self, claim: &Arc<Claim>) {
        let mut claims = self.claims.lock();
        if is_current(&claims, claim) {
            self.exports.remove(&claim.name);
            claims.remove(&claim.name);
            claim.promised_bytes.store(0, Ordering::Relaxed);
        }
    }
}

/// A claim being made into an object: released on drop unless kept
/// (see [`Ledger::claim_guarded`]).
#[must_use = "dropping the guard releases the claim at once"]
pub struct ClaimGuard<'a> {
    ledger: &'a Ledger,
    /// Some until kept or dropped.
    claim: Option<Arc<Claim>>,
}

impl ClaimGuard<'_> {
    /// The claim (for the object being built).
    pub fn claim(&self) -> &Arc<Claim> {
        self.claim
            .as_ref()
            .expect("a guard holds its claim until kept")
    }

    /// The object is registered: the claim is its from now on.
    pub fn keep(mut self) -> Arc<Claim> {
        self.claim
            .take()
            .expect("a guard holds its claim until kept")
    }
}

impl Drop for ClaimGuard<'_> {
    fn drop(&mut self) {
        if let Some(claim) = self.claim.take() {
            self.ledger.release(&claim);
        }
    }
}

fn is_current(claims: &Claims, claim: &Arc<Claim>) -> bool {
    claims
        .get(&claim.name)
        .is_some_and(|c| Arc::ptr_eq(c, claim))
}

/// What every claim but `except` is promised.
fn promised(claims: &Claims, except: Option<&Arc<Claim>>) -> u64 {
    claims
        .values()
        .filter(|c| !except.is_some_and(|e| Arc::ptr_eq(c, e)))
        .map(|c| c.promised_bytes())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger(budget: u64) -> Ledger {
        Ledger::new(
            Arc::new(ExportTable::new()),
            Arc::new(MemoryBudget::new(budget)),
        )
    }

    #[test]
    fn names() {
        for good in ["ram0", "0", "a_b-c", &"x".repeat(64)] {
            assert!(check_name(Kind::Drive, good).is_ok(), "{good}");
        }
        for bad in ["", "Ram", "-a", "_a", "a.b", "a b", &"x".repeat(65), "é"] {
            assert!(check_name(Kind::Drive, bad).is_err(), "{bad}");
        }
        let e = check_name(Kind::Cache, "DB").unwrap_err().to_string();
        assert!(e.starts_with("invalid cache name 'DB'"), "{e}");
    }

    #[test]
    fn a_guarded_claim_is_given_back_unless_kept() {
        let l = ledger(1 << 20);
        {
            let g = l
                .claim_guarded(Kind::Drive, "a", Origin::Api, &Promise::Bytes(1000))
                .unwrap();
            assert_eq!(g.claim().name, "a");
            assert_eq!(l.committed_bytes(), 1000);
            // A failure half-way: the guard is dropped.
        }
        assert_eq!(l.committed_bytes(), 0);
        assert_eq!(l.kind_of("a"), None);
        let kept = l
            .claim_guarded(Kind::Drive, "a", Origin::Api, &Promise::Bytes(1000))
            .unwrap()
            .keep();
        assert_eq!(l.kind_of("a"), Some(Kind::Drive));
        assert_eq!(kept.promised_bytes(), 1000);
        // check_claim: a dry run that says what claim would.
        let e = l
            .check_claim(Kind::Cache, "a", &Promise::Bytes(0))
            .unwrap_err();
        assert!(e.to_string().contains("a drive named 'a'"), "{e}");
        let e = l
            .check_claim(Kind::Drive, "b", &Promise::Bytes(2 << 20))
            .unwrap_err();
        assert!(matches!(e, LedgerError::OverBudget(_)), "{e}");
        assert!(l
            .check_claim(Kind::Drive, "b", &Promise::Bytes(1000))
            .is_ok());
        assert_eq!(l.kind_of("b"), None);
    }

    #[test]
    fn a_name_is_taken_once_across_kinds() {
        let l = ledger(1 << 20);
        let d = l
            .claim(Kind::Drive, "a", Origin::Api, &Promise::Bytes(0))
            .unwrap();
        let e = l
            .claim(Kind::Cache, "a", Origin::Api, &Promise::Bytes(0))
            .unwrap_err();
        assert!(e.to_string().contains("a drive named 'a'"), "{e}");
        assert_eq!(e.kind(), Some(Kind::Cache));
        let e = l
            .claim(Kind::Drive, "a", Origin::Api, &Promise::Bytes(0))
            .unwrap_err();
        assert!(e.to_string().contains("delete it first"), "{e}");
        l.release(&d);
        assert_eq!(l.kind_of("a"), None);
        let c = l
            .claim(Kind::Cache, "a", Origin::Api, &Promise::Bytes(0))
            .unwrap();
        // A stale claim changes nothing of its successor's.
        l.release(&d);
        l.record(&d, 5);
        assert_eq!(l.kind_of("a"), Some(Kind::Cache));
        assert_eq!(c.promised_bytes(), 0);
    }

    #[test]
    fn the_budget_is_never_promised_twice() {
        let l = ledger(100);
        let a = l
            .claim(Kind::Cache, "a", Origin::Api, &Promise::Bytes(60))
            .unwrap();
        let e = l
            .claim(Kind::Cache, "b", Origin::Api, &Promise::Bytes(41))
            .unwrap_err();
        assert!(matches!(e, LedgerError::OverBudget(_)), "{e}");
        assert!(e.to_string().starts_with("cache 'b' needs 41 B"), "{e}");
        let b = l
            .claim(Kind::Cache, "b", Origin::Api, &Promise::Bytes(40))
            .unwrap();
        // Raising is checked, lowering is not.
        assert!(l.repromise(&a, &Promise::Bytes(61)).is_err());
        l.repromise(&a, &Promise::Bytes(10)).unwrap();
        l.repromise(&b, &Promise::Bytes(90)).unwrap();
        assert_eq!(l.committed_bytes(), 100);
        l.release(&b);
        assert_eq!(l.committed_bytes(), 10);
    }

    #[test]
    fn an_export_is_served_only_while_its_name_is_claimed() {
        let l = ledger(1 << 20);
        let c = l
            .claim(Kind::Drive, "a", Origin::Api, &Promise::Bytes(0))
            .unwrap();
        let store = Arc::new(crate::store::RamStore::new(4096, None, l.budget().clone()).unwrap());
        let export = || Arc::new(Export::new("a", "test", store.clone(), false));
        l.publish(&c, export()).unwrap();
        assert!(l.export("a").is_some());
        // A second export under the name is refused.
        assert!(l.publish(&c, export()).is_err());
        l.withdraw(&c);
        assert!(l.export("a").is_none());
        l.publish(&c, export()).unwrap();
        l.release(&c);
        assert!(l.export("a").is_none());
        // A released claim serves nothing.
        assert!(l.publish(&c, export()).is_err());
        assert!(l.export("a").is_none());
    }

    #[test]
    fn delete_rules() {
        let busy = check_delete(Kind::Cache, "c", &[], 2, false).unwrap_err();
        assert!(
            busy.to_string()
                .contains("2 open NBD connections; disconnect the clients or delete with force (ramd cache delete --force)"),
            "{busy}"
        );
        check_delete(Kind::Cache, "c", &[], 2, true).unwrap();
        let at = [PathBuf::from("/mnt/x")];
        let e = check_delete(Kind::Drive, "d", &at, 0, true).unwrap_err();
        assert!(
            e.to_string().contains("drive 'd' is attached at /mnt/x"),
            "{e}"
        );
    }
}
