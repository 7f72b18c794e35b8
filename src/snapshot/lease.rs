//! Leases: how a push and a garbage collection keep out of each other's
//! way on a remote shared by several hosts.
//!
//! The danger: a push finds chunk X already on the remote and skips its
//! upload, while a GC that does not yet see the push's manifest finds X
//! unreferenced and deletes it. The manifest then names a missing chunk.
//!
//! The rule: pushes hold a *shared* lease, a GC an *exclusive* one, each an
//! object `locks/<kind>-<ms>-<suffix>`. To take a lease, write the object,
//! then list `locks/`: if a live lease of a conflicting kind is there
//! (push vs gc, gc vs gc), delete ours and fail with [`LeaseBusy`]. Both
//! sides write before they list, and S3 listings are strongly consistent
//! after a PUT, so of two racing takers at least one sees the other:
//! a push and a GC never both proceed (both may back off; retry later).
//!
//! A holder that dies leaves its object behind. A lease is *live* while its
//! object's last-modified time (the server's clock, so hosts' clocks do
//! not matter) is within `stale_ms` of the newest lease object; holders
//! rewrite their object every `refresh_ms` (well below `stale_ms`). A
//! holder that could not refresh for `stale_ms - refresh_ms` (measured on
//! its own monotonic clock) may already look dead to others, so it stops
//! before its next dangerous step (a push before writing its manifest, a
//! GC before each batch of deletes) with [`LeaseLapsed`]; re-running a
//! push resumes it (its chunks are on the remote already).
//!
//! As a second line, GC never deletes a chunk younger than its grace
//! period (see `gc.rs`), which covers writers that take no lease.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::remote::{Remote, RemoteError};

/// Lease timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseConfig {
    /// A lease not refreshed for this long is dead.
    pub stale_ms: u64,
    /// How often a holder rewrites its lease.
    pub refresh_ms: u64,
}

impl Default for LeaseConfig {
    /// 30 minutes to die, refreshed every minute.
    fn default() -> LeaseConfig {
        LeaseConfig {
            stale_ms: 30 * 60_000,
            refresh_ms: 60_000,
        }
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

/// A lease we hold. Call [`Lease::release`] when done; a dropped lease
/// stays on the remote until it goes stale.
#[derive(Debug)]
pub struct Lease {
    remote: Remote,
    name: String,
    config: LeaseConfig,
    last_refresh: Instant,
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

impl Lease {
    /// Takes a lease of `kind` (see the module docs).
    pub async fn acquire(
        remote: &Remote,
        kind: LeaseKind,
        config: LeaseConfig,
    ) -> Result<Lease, LeaseError> {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        let name = format!(
            "locks/{}-{ms:016}-{:08x}",
            kind.as_str(),
            super::remote::random_u32()
        );
        let started = Instant::now();
        remote.put(&name, kind.as_str().as_bytes().to_vec()).await?;
        let lease = Lease {
            remote: remote.clone(),
            name,
            config,
            last_refresh: started,
        };
        let listed = remote.list("locks").await?;
        let newest = listed.iter().map(|l| l.modified).max();
        let stale = Duration::from_millis(config.stale_ms);
        let blocker = listed.iter().find(|l| {
            l.name != lease.name
                && parse_kind(&l.name).is_some_and(|k| kind.conflicts(k))
                && newest.is_some_and(|n| n.duration_since(l.modified).unwrap_or_default() < stale)
        });
        if let Some(b) = blocker {
            let other = b.name.clone();
            lease.release().await?;
            return Err(LeaseBusy {
                other,
                stale_s: config.stale_ms / 1000,
            }
            .into());
        }
        Ok(lease)
    }

    /// The lease's object name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Rewrites the lease if `refresh_ms` has passed since the last time.
    pub async fn refresh_if_due(&mut self) -> Result<(), LeaseError> {
        if self.last_refresh.elapsed() >= Duration::from_millis(self.config.refresh_ms) {
            self.refresh().await?;
        }
        Ok(())
    }

    /// Fails with [`LeaseLapsed`] when the lease may look dead to others,
    /// else refreshes it: call before every step a rival must not overlap.
    pub async fn ensure_live(&mut self) -> Result<(), LeaseError> {
        let idle = self.last_refresh.elapsed();
        let limit = self.config.stale_ms.saturating_sub(self.config.refresh_ms);
        if idle >= Duration::from_millis(limit) {
            return Err(LeaseLapsed {
                name: self.name.clone(),
                idle_s: idle.as_secs(),
            }
            .into());
        }
        self.refresh().await
    }

    async fn refresh(&mut self) -> Result<(), LeaseError> {
        let started = Instant::now();
        self.remote.put(&self.name, b"refresh".to_vec()).await?;
        self.last_refresh = started;
        Ok(())
    }

    /// Deletes the lease object.
    pub async fn release(self) -> Result<(), LeaseError> {
        self.remote.delete(&self.name).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn remote() -> Remote {
        Remote::from_store(Arc::new(object_store::memory::InMemory::new()), "mem")
    }

    #[tokio::test]
    async fn pushes_share_gc_excludes() {
        let r = remote();
        let c = LeaseConfig::default();
        let p1 = Lease::acquire(&r, LeaseKind::Push, c).await.unwrap();
        let p2 = Lease::acquire(&r, LeaseKind::Push, c).await.unwrap();
        let e = Lease::acquire(&r, LeaseKind::Gc, c).await.unwrap_err();
        assert!(matches!(e, LeaseError::Busy(_)), "{e}");
        p1.release().await.unwrap();
        p2.release().await.unwrap();
        // The refused GC removed its own object.
        assert!(r.list("locks").await.unwrap().is_empty());
        let g = Lease::acquire(&r, LeaseKind::Gc, c).await.unwrap();
        assert!(matches!(
            Lease::acquire(&r, LeaseKind::Push, c).await,
            Err(LeaseError::Busy(_))
        ));
        assert!(matches!(
            Lease::acquire(&r, LeaseKind::Gc, c).await,
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
        };
        let mut dead = Lease::acquire(&r, LeaseKind::Push, tight).await.unwrap();
        // No timing assertion: only "after at least stale_ms" matters.
        tokio::time::sleep(Duration::from_millis(60)).await;
        let g = Lease::acquire(&r, LeaseKind::Gc, tight).await.unwrap();
        let e = dead.ensure_live().await.unwrap_err();
        assert!(matches!(e, LeaseError::Lapsed(_)), "{e}");
        g.release().await.unwrap();
    }
}
