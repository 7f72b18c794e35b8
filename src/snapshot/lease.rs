//! Leases: how a push and a garbage collection keep out of each other's
//! way on a remote shared by several hosts.
//!
//! The danger: a push finds chunk X already on the remote and skips its
//! upload, while a GC that does not yet see the push's manifest finds X
//! unreferenced and deletes it. The manifest then names a missing chunk.
//!
//! The rule: pushes hold a *shared* lease, a GC an *exclusive* one, each an
//! object `locks/<kind>-<ms>-<suffix>[-<owner>]`. To take a lease, write
//! the object, then list `locks/`: if a live lease of a conflicting kind is
//! there (push vs gc, gc vs gc), delete ours and fail with [`LeaseBusy`].
//! Both sides write before they list, and S3 listings are strongly
//! consistent after a PUT, so of two racing takers at least one sees the
//! other: a push and a GC never both proceed (both may back off; retry
//! later).
//!
//! # Liveness: renewed while held, short-lived once not
//!
//! A lease is *live* while its object's last-modified time (the server's
//! clock, so hosts' clocks do not matter) is within `stale_ms` of the
//! newest lease object. A holder rewrites its object every `refresh_ms`
//! from a background task for as long as it holds the lease, whatever the
//! operation is doing (a chunk that takes minutes to upload does not let
//! it lapse), so `stale_ms` can be short: 2 minutes by default. A holder
//! that dies (kill -9, power cut) thus blocks the other side for at most
//! `stale_ms` after its last refresh.
//!
//! A holder that could not refresh for `stale_ms - refresh_ms` (measured
//! on its own monotonic clock) may already look dead to others, so it
//! stops before its next dangerous step (a push before writing its
//! manifest, a GC before each batch of deletes) with [`LeaseLapsed`];
//! re-running a push resumes it (its chunks are on the remote already).
//!
//! # Owners: a restarted daemon frees what its earlier run left
//!
//! A [`LeaseOwner`] (one per daemon, its id kept in the state directory)
//! tags the names of the leases it takes and remembers which it holds
//! now. A lease with its tag that it does not hold was left by an earlier
//! run of the same daemon (killed mid-push): whoever of that owner takes
//! a lease next deletes it at once instead of waiting for it to go stale.
//! Two live daemons must not share an owner id (they do not share a state
//! directory); should they, the grace period below still protects chunks.
//!
//! As a second line, GC never deletes a chunk younger than its grace
//! period (see `gc.rs`), which covers writers that take no lease.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use super::remote::{Remote, RemoteError};

/// Lease timing, and who takes the lease.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    /// A lease not refreshed for this long is dead.
    pub stale_ms: u64,
    /// How often a holder rewrites its lease (in the background).
    pub refresh_ms: u64,
    /// The daemon taking it (None: untagged, never released early).
    pub owner: Option<Arc<LeaseOwner>>,
}

impl Default for LeaseConfig {
    /// 2 minutes to die, refreshed every 15 seconds, no owner.
    fn default() -> LeaseConfig {
        LeaseConfig {
            stale_ms: 120_000,
            refresh_ms: 15_000,
            owner: None,
        }
    }
}

impl LeaseConfig {
    /// The default timing, leases tagged with `owner`.
    pub fn owned_by(owner: Arc<LeaseOwner>) -> LeaseConfig {
        LeaseConfig {
            owner: Some(owner),
            ..LeaseConfig::default()
        }
    }
}

/// Who takes leases (see the module docs): an id, and the leases held now.
#[derive(Debug)]
pub struct LeaseOwner {
    id: String,
    /// Names of the leases this process holds now (a plain mutex: never
    /// held across an `.await`).
    held: Mutex<HashSet<String>>,
}

/// Why an owner id was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("lease owner id {0:?} must be 8 to 32 lowercase hex digits")]
pub struct BadOwnerId(pub String);

impl LeaseOwner {
    /// An owner with `id` (8-32 lowercase hex digits: it goes into object
    /// names).
    pub fn new(id: &str) -> Result<LeaseOwner, BadOwnerId> {
        let ok = (8..=32).contains(&id.len())
            && id
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !ok {
            return Err(BadOwnerId(id.to_owned()));
        }
        Ok(LeaseOwner {
            id: id.to_owned(),
            held: Mutex::new(HashSet::new()),
        })
    }

    /// A new random id (16 hex digits).
    pub fn random_id() -> String {
        format!(
            "{:08x}{:08x}",
            super::remote::random_u32(),
            super::remote::random_u32()
        )
    }

    /// The id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// True when `name` carries our tag but we do not hold it: left by an
    /// earlier run.
    fn is_orphan(&self, name: &str) -> bool {
        owner_of(name) == Some(self.id.as_str()) && !self.held.lock().contains(name)
    }
}

/// Which side holds a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseKind {
    /// A push (shared with other pushes).
    Push,
    /// A garbage collection (exclusive).
    Gc,
}

impl LeaseKind {
    fn as_str(self) -> &'static str {
        match self {
            LeaseKind::Push => "push",
            LeaseKind::Gc => "gc",
        }
    }

    fn conflicts(self, other: LeaseKind) -> bool {
        !(self == LeaseKind::Push && other == LeaseKind::Push)
    }
}

/// Another holder's live lease is in the way.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("the remote is busy: {other} holds a live lease; retry when it ends (a crashed holder's lease expires {stale_s} s after its last refresh)")]
pub struct LeaseBusy {
    /// The other lease's object name.
    pub other: String,
    /// `stale_ms` in seconds.
    pub stale_s: u64,
}

/// We could not refresh our lease in time; others may consider it dead.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("lost the lease {name}: not refreshed for {idle_s} s; run the operation again (a push resumes where it stopped)")]
pub struct LeaseLapsed {
    /// Our lease's object name.
    pub name: String,
    /// Seconds since the last refresh.
    pub idle_s: u64,
}

/// Why a lease operation failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// See [`LeaseBusy`].
    #[error(transparent)]
    Busy(#[from] LeaseBusy),
    /// See [`LeaseLapsed`].
    #[error(transparent)]
    Lapsed(#[from] LeaseLapsed),
    /// Writing, listing or deleting lease objects failed.
    #[error(transparent)]
    Remote(#[from] RemoteError),
}

/// The background task that keeps a lease live.
struct Refresher {
    /// Tells the task to stop after its current PUT.
    stop: Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<()>,
}

/// A lease we hold. Call [`Lease::release`] when done; a dropped lease
/// stops being refreshed and stays on the remote until it goes stale (or
/// its owner's next lease deletes it).
pub struct Lease {
    remote: Remote,
    name: String,
    config: LeaseConfig,
    /// When the last refresh that succeeded started (shared with the
    /// refresher; a plain mutex, never held across an `.await`).
    last_refresh: Arc<Mutex<Instant>>,
    refresher: Option<Refresher>,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease").field("name", &self.name).finish()
    }
}

fn parse_kind(name: &str) -> Option<LeaseKind> {
    let rest = name.strip_prefix("locks/")?;
    if rest.starts_with("push-") {
        Some(LeaseKind::Push)
    } else if rest.starts_with("gc-") {
        Some(LeaseKind::Gc)
    } else {
        None
    }
}

/// The owner tag of a lease name (`locks/KIND-MS-SUFFIX-OWNER`), if any.
fn owner_of(name: &str) -> Option<&str> {
    let rest = name.strip_prefix("locks/")?;
    let mut parts = rest.splitn(4, '-');
    let _kind = parts.next()?;
    let _ms = parts.next()?;
    let _suffix = parts.next()?;
    parts.next()
}

impl Lease {
    /// Takes a lease of `kind` (see the module docs). Leases its owner
    /// left behind in an earlier run are deleted on the way.
    pub async fn acquire(
        remote: &Remote,
        kind: LeaseKind,
        config: LeaseConfig,
    ) -> Result<Lease, LeaseError> {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        let mut name = format!(
            "locks/{}-{ms:016}-{:08x}",
            kind.as_str(),
            super::remote::random_u32()
        );
        if let Some(o) = &config.owner {
            name = format!("{name}-{}", o.id);
            o.held.lock().insert(name.clone());
        }
        // From here a drop of `lease` forgets the name (see Drop).
        let mut lease = Lease {
            remote: remote.clone(),
            name,
            config,
            last_refresh: Arc::new(Mutex::new(Instant::now())),
            refresher: None,
        };
        remote
            .put(&lease.name, kind.as_str().as_bytes().to_vec())
            .await?;
        let blocker = match lease.find_blocker(kind).await {
            Ok(b) => b,
            Err(e) => {
                let _ = lease.release().await;
                return Err(e);
            }
        };
        if let Some(other) = blocker {
            let stale_s = lease.config.stale_ms / 1000;
            lease.release().await?;
            return Err(LeaseBusy { other, stale_s }.into());
        }
        lease.start_refresher();
        Ok(lease)
    }

    /// Lists `locks/`: the first live lease that conflicts with ours;
    /// our owner's orphans are deleted instead of counted.
    async fn find_blocker(&self, kind: LeaseKind) -> Result<Option<String>, LeaseError> {
        let listed = self.remote.list("locks").await?;
        let newest = listed.iter().map(|l| l.modified).max();
        let stale = Duration::from_millis(self.config.stale_ms);
        let mut blocker = None;
        for l in &listed {
            if l.name == self.name {
                continue;
            }
            if self
                .config
                .owner
                .as_ref()
                .is_some_and(|o| o.is_orphan(&l.name))
            {
                match self.remote.delete(&l.name).await {
                    Ok(()) => {
                        tracing::info!(lease = %l.name, remote = %self.remote.label(), "deleted a lease left by an earlier run of this daemon")
                    }
                    Err(e) => {
                        tracing::warn!(lease = %l.name, "cannot delete a lease left by an earlier run of this daemon: {e}")
                    }
                }
                continue;
            }
            let live =
                newest.is_some_and(|n| n.duration_since(l.modified).unwrap_or_default() < stale);
            if blocker.is_none() && live && parse_kind(&l.name).is_some_and(|k| kind.conflicts(k)) {
                blocker = Some(l.name.clone());
            }
        }
        Ok(blocker)
    }

    /// Starts rewriting the lease every `refresh_ms` until it is released
    /// or dropped.
    fn start_refresher(&mut self) {
        let stop = Arc::new(tokio::sync::Notify::new());
        let (remote, name, last) = (
            self.remote.clone(),
            self.name.clone(),
            self.last_refresh.clone(),
        );
        let every = Duration::from_millis(self.config.refresh_ms.max(1));
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stopped.notified() => return,
                    _ = tokio::time::sleep(every) => {}
                }
                let started = Instant::now();
                match remote.put(&name, b"refresh".to_vec()).await {
                    Ok(()) => note_refresh(&last, started),
                    Err(e) => {
                        tracing::debug!(lease = %name, "lease refresh failed (tried again in {every:?}): {e}")
                    }
                }
            }
        });
        self.refresher = Some(Refresher { stop, task });
    }

    /// The lease's object name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Fails with [`LeaseLapsed`] when the lease may look dead to others,
    /// else refreshes it: call before every step a rival must not overlap.
    pub async fn ensure_live(&mut self) -> Result<(), LeaseError> {
        let idle = self.last_refresh.lock().elapsed();
        let limit = self.config.stale_ms.saturating_sub(self.config.refresh_ms);
        if idle >= Duration::from_millis(limit) {
            return Err(LeaseLapsed {
                name: self.name.clone(),
                idle_s: idle.as_secs(),
            }
            .into());
        }
        let started = Instant::now();
        self.remote.put(&self.name, b"refresh".to_vec()).await?;
        note_refresh(&self.last_refresh, started);
        Ok(())
    }

    /// Stops the refresher (after its PUT in flight, so it cannot rewrite
    /// the object after the delete) and deletes the lease object.
    pub async fn release(mut self) -> Result<(), LeaseError> {
        if let Some(r) = self.refresher.take() {
            r.stop.notify_one();
            let _ = r.task.await;
        }
        self.remote.delete(&self.name).await?;
        Ok(())
    }
}

/// Records a refresh that started at `started` (never moving backwards).
fn note_refresh(last: &Mutex<Instant>, started: Instant) {
    let mut l = last.lock();
    if started > *l {
        *l = started;
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(r) = self.refresher.take() {
            r.task.abort();
        }
        // Not ours any more: if the object is still there (a failed
        // delete, a dropped lease), the owner's next lease deletes it.
        if let Some(o) = &self.config.owner {
            o.held.lock().remove(&self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote() -> Remote {
        Remote::from_store(Arc::new(object_store::memory::InMemory::new()), "mem")
    }

    #[tokio::test]
    async fn pushes_share_gc_excludes() {
        let r = remote();
        let c = LeaseConfig::default();
        let p1 = Lease::acquire(&r, LeaseKind::Push, c.clone())
            .await
            .unwrap();
        let p2 = Lease::acquire(&r, LeaseKind::Push, c.clone())
            .await
            .unwrap();
        let e = Lease::acquire(&r, LeaseKind::Gc, c.clone())
            .await
            .unwrap_err();
        assert!(matches!(e, LeaseError::Busy(_)), "{e}");
        p1.release().await.unwrap();
        p2.release().await.unwrap();
        // The refused GC removed its own object.
        assert!(r.list("locks").await.unwrap().is_empty());
        let g = Lease::acquire(&r, LeaseKind::Gc, c.clone()).await.unwrap();
        assert!(matches!(
            Lease::acquire(&r, LeaseKind::Push, c.clone()).await,
            Err(LeaseError::Busy(_))
        ));
        assert!(matches!(
            Lease::acquire(&r, LeaseKind::Gc, c.clone()).await,
            Err(LeaseError::Busy(_))
        ));
        g.release().await.unwrap();
        Lease::acquire(&r, LeaseKind::Push, c).await.unwrap();
    }

    #[tokio::test]
    async fn stale_leases_are_ignored_and_lapsed_holders_stop() {
        let r = remote();
        let tight = LeaseConfig {
            stale_ms: 30,
            refresh_ms: 10,
            owner: None,
        };
        let mut dead = Lease::acquire(&r, LeaseKind::Push, tight.clone())
            .await
            .unwrap();
        // A holder that can no longer refresh (its refresher stopped, as
        // when the network is down).
        dead.refresher.take().unwrap().task.abort();
        // No timing assertion: only "after at least stale_ms" matters.
        tokio::time::sleep(Duration::from_millis(60)).await;
        let g = Lease::acquire(&r, LeaseKind::Gc, tight).await.unwrap();
        let e = dead.ensure_live().await.unwrap_err();
        assert!(matches!(e, LeaseError::Lapsed(_)), "{e}");
        g.release().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_held_lease_is_renewed_in_the_background() {
        let r = remote();
        // Refreshed 100 times per stale period: only a stalled runtime
        // could let it lapse.
        let c = LeaseConfig {
            stale_ms: 2_000,
            refresh_ms: 20,
            owner: None,
        };
        let mut held = Lease::acquire(&r, LeaseKind::Push, c.clone())
            .await
            .unwrap();
        // Idle for longer than stale_ms: the refresher keeps it live.
        tokio::time::sleep(Duration::from_millis(3_000)).await;
        let e = Lease::acquire(&r, LeaseKind::Gc, c.clone())
            .await
            .unwrap_err();
        assert!(matches!(e, LeaseError::Busy(_)), "{e}");
        held.ensure_live().await.unwrap();
        held.release().await.unwrap();
        assert!(r.list("locks").await.unwrap().is_empty());
        Lease::acquire(&r, LeaseKind::Gc, c).await.unwrap();
    }

    #[tokio::test]
    async fn an_owner_frees_what_its_earlier_run_left_at_once() {
        let r = remote();
        let id = LeaseOwner::random_id();
        let earlier = LeaseConfig::owned_by(Arc::new(LeaseOwner::new(&id).unwrap()));
        // A push of the earlier run, killed: its object stays, fresh.
        let killed = Lease::acquire(&r, LeaseKind::Push, earlier).await.unwrap();
        let left = killed.name().to_owned();
        drop(killed);
        // Someone else must wait for it to go stale...
        let other =
            LeaseConfig::owned_by(Arc::new(LeaseOwner::new(&LeaseOwner::random_id()).unwrap()));
        let e = Lease::acquire(&r, LeaseKind::Gc, other).await.unwrap_err();
        assert!(matches!(&e, LeaseError::Busy(b) if b.other == left), "{e}");
        // ...but the same owner, restarted, deletes it and goes on.
        let owner = Arc::new(LeaseOwner::new(&id).unwrap());
        let now = LeaseConfig::owned_by(owner.clone());
        let p = Lease::acquire(&r, LeaseKind::Push, now.clone())
            .await
            .unwrap();
        let names: Vec<String> = r
            .list("locks")
            .await
            .unwrap()
            .into_iter()
            .map(|l| l.name)
            .collect();
        assert_eq!(names, vec![p.name().to_owned()]);
        // Its own live lease is no orphan: a GC of the same owner waits.
        let e = Lease::acquire(&r, LeaseKind::Gc, now.clone())
            .await
            .unwrap_err();
        assert!(
            matches!(&e, LeaseError::Busy(b) if b.other == p.name()),
            "{e}"
        );
        p.release().await.unwrap();
        Lease::acquire(&r, LeaseKind::Gc, now)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        assert!(owner.held.lock().is_empty());
        assert!(LeaseOwner::new("Not-hex!").is_err());
    }
}
