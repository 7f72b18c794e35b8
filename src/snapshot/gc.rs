//! Retention and garbage collection.
//!
//! Retention decides which snapshots to keep, per drive, from their ids
//! alone (pure, [`retain`]): the `keep_last` newest, plus the newest of
//! each of the `keep_daily` most recent UTC days that have one. A policy
//! with neither keeps everything (GC then only sweeps chunks), so a
//! missing setting can never delete every snapshot.
//!
//! GC ([`gc`]) then, under the exclusive GC lease (lease.rs):
//!
//! 1. reads every kept manifest; if any cannot be read (missing key,
//!    corrupt, another key), it stops before deleting anything: it cannot
//!    know what that snapshot needs;
//! 2. deletes the manifests retention dropped;
//! 3. lists `chunks/` and deletes each chunk that no kept manifest names
//!    *and* that is older than `grace_ms` by the server's clock ([`sweep`],
//!    pure). The grace period protects chunks of a push that does not
//!    hold a lease (an older client, or one whose lease went stale while
//!    it still ran); the lease is checked before each batch of deletes.
//!
//! The invariant, checked by a proptest model below: no chunk named by a
//! kept manifest is ever deleted.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::{StreamExt, TryStreamExt};

use super::chunk::Address;
use super::codec::Keys;
use super::error::SnapshotError;
use super::lease::{Lease, LeaseConfig, LeaseKind};
use super::manifest::SnapshotId;
use super::remote::Remote;
use super::restore::{list_snapshots, read_manifest};

const DAY_MS: u64 = 86_400_000;
/// Deletes between two lease checks.
const DELETE_BATCH: usize = 256;

/// Which snapshots to keep, per drive.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retention {
    /// Keep the N newest.
    pub keep_last: Option<usize>,
    /// Keep the newest of each of the N most recent days with snapshots.
    pub keep_daily: Option<usize>,
}

/// Splits `ids` into (kept, dropped) by `r` (see the module docs). Both
/// come out oldest first.
pub fn retain(ids: &[SnapshotId], r: &Retention) -> (Vec<SnapshotId>, Vec<SnapshotId>) {
    if r.keep_last.is_none() && r.keep_daily.is_none() {
        let mut all = ids.to_vec();
        all.sort_by_key(order_key);
        return (all, Vec::new());
    }
    let mut by_drive: BTreeMap<&str, Vec<&SnapshotId>> = BTreeMap::new();
    for id in ids {
        by_drive.entry(&id.drive).or_default().push(id);
    }
    let (mut kept, mut dropped) = (Vec::new(), Vec::new());
    for (_, mut list) in by_drive {
        list.sort_by_key(|id| std::cmp::Reverse(order_key(id)));
        let mut days = Vec::new();
        for (n, id) in list.into_iter().enumerate() {
            let by_last = r.keep_last.is_some_and(|k| n < k);
            let day = id.created_ms / DAY_MS;
            let by_day = match r.keep_daily {
                Some(k) if !days.contains(&day) && days.len() < k => {
                    days.push(day);
                    true
                }
                _ => false,
            };
            if by_last || by_day {
                kept.push(id.clone());
            } else {
                dropped.push(id.clone());
            }
        }
    }
    kept.sort_by_key(order_key);
    dropped.sort_by_key(order_key);
    (kept, dropped)
}

fn order_key(id: &SnapshotId) -> (u64, String, u32) {
    (id.created_ms, id.drive.clone(), id.suffix)
}

/// The chunks to delete: not in `referenced` and at least `grace_ms` old.
/// `chunks` holds (address, age in ms).
pub fn sweep(
    chunks: &[(Address, u64)],
    referenced: &HashSet<Address>,
    grace_ms: u64,
) -> Vec<Address> {
    chunks
        .iter()
        .filter(|(a, age)| !referenced.contains(a) && *age >= grace_ms)
        .map(|(a, _)| *a)
        .collect()
}

/// How to collect.
#[derive(Debug, Clone)]
pub struct GcOptions {
    /// Which snapshots to keep.
    pub retention: Retention,
    /// Unreferenced chunks younger than this stay.
    pub grace_ms: u64,
    /// Keys to read encrypted manifests.
    pub keys: Option<Arc<Keys>>,
    /// Lease timing.
    pub lease: LeaseConfig,
    /// Deletes in flight at once.
    pub concurrency: usize,
}

impl Default for GcOptions {
    /// Keep everything, sweep chunks older than 2 hours.
    fn default() -> GcOptions {
        GcOptions {
            retention: Retention::default(),
            grace_ms: 2 * 3_600_000,
            keys: None,
            lease: LeaseConfig::default(),
            concurrency: 8,
        }
    }
}

/// What a GC did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Snapshots kept.
    pub snapshots_kept: u64,
    /// Snapshots (manifests) deleted.
    pub snapshots_deleted: u64,
    /// Chunk objects kept because a kept snapshot names them.
    pub chunks_referenced: u64,
    /// Unreferenced chunks kept because they are younger than the grace.
    pub chunks_young: u64,
    /// Chunk objects deleted.
    pub chunks_deleted: u64,
    /// Bytes of the deleted chunk objects.
    pub bytes_freed: u64,
}

/// Applies retention and deletes unreferenced chunks (see the module docs).
pub async fn gc(remote: &Remote, opts: &GcOptions) -> Result<GcReport, SnapshotError> {
    remote.check().await?;
    let mut lease = Lease::acquire(remote, LeaseKind::Gc, opts.lease.clone()).await?;
    let result = collect(remote, opts, &mut lease).await;
    let released = lease.release().await;
    let report = result?;
    released?;
    Ok(report)
}

async fn collect(
    remote: &Remote,
    opts: &GcOptions,
    lease: &mut Lease,
) -> Result<GcReport, SnapshotError> {
    let ids = list_snapshots(remote, None).await?;
    let (kept, dropped) = retain(&ids, &opts.retention);
    let mut referenced = HashSet::new();
    for id in &kept {
        let m = read_manifest(remote, id, opts.keys.as_deref()).await?;
        referenced.extend(m.addresses());
    }
    let mut report = GcReport {
        snapshots_kept: kept.len() as u64,
        ..GcReport::default()
    };
    for batch in dropped.chunks(DELETE_BATCH) {
        lease.ensure_live().await?;
        delete_all(
            remote,
            batch.iter().map(SnapshotId::object_name),
            opts.concurrency,
        )
        .await?;
        report.snapshots_deleted += batch.len() as u64;
    }
    // The server's "now": our lease object's time, so ages do not depend
    // on this host's clock.
    let locks = remote.list("locks").await?;
    let now = locks
        .iter()
        .find(|l| l.name == lease.name())
        .map_or_else(SystemTime::now, |l| l.modified);
    let listed = remote.list("chunks").await?;
    let mut sizes = std::collections::HashMap::new();
    let chunks: Vec<(Address, u64)> = listed
        .iter()
        .filter_map(|l| {
            let a = Address::from_object_name(&l.name)?;
            sizes.insert(a, l.size_bytes);
            let age = now.duration_since(l.modified).unwrap_or(Duration::ZERO);
            Some((a, age.as_millis() as u64))
        })
        .collect();
    let doomed = sweep(&chunks, &referenced, opts.grace_ms);
    report.chunks_referenced = chunks
        .iter()
        .filter(|(a, _)| referenced.contains(a))
        .count() as u64;
    report.chunks_young = (chunks.len() as u64) - report.chunks_referenced - doomed.len() as u64;
    for batch in doomed.chunks(DELETE_BATCH) {
        lease.ensure_live().await?;
        delete_all(
            remote,
            batch.iter().map(Address::object_name),
            opts.concurrency,
        )
        .await?;
        report.chunks_deleted += batch.len() as u64;
        report.bytes_freed += batch.iter().map(|a| sizes[a]).sum::<u64>();
    }
    Ok(report)
}

async fn delete_all(
    remote: &Remote,
    names: impl Iterator<Item = String>,
    concurrency: usize,
) -> Result<(), SnapshotError> {
    futures::stream::iter(names)
        .map(|n| async move { remote.delete(&n).await })
        .buffer_unordered(concurrency.max(1))
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn id(drive: &str, created_ms: u64, suffix: u32) -> SnapshotId {
        SnapshotId {
            drive: drive.into(),
            created_ms,
            suffix,
        }
    }

    #[test]
    fn keep_last_and_daily_per_drive() {
        let h = 3_600_000;
        let ids = vec![
            id("a", 0, 1),
            id("a", h, 2),
            id("a", DAY_MS + h, 3),
            id("a", 2 * DAY_MS, 4),
            id("a", 2 * DAY_MS + h, 5),
            id("b", 0, 6),
        ];
        let r = Retention {
            keep_last: Some(1),
            keep_daily: Some(2),
        };
        let (kept, dropped) = retain(&ids, &r);
        let s = |v: &[SnapshotId]| v.iter().map(|i| i.suffix).collect::<Vec<_>>();
        // a: newest (5) by last and as day 2's newest, 3 as day 1's newest; b: 6.
        assert_eq!(s(&kept), vec![6, 3, 5]);
        assert_eq!(s(&dropped), vec![1, 2, 4]);
        let (all, none) = retain(&ids, &Retention::default());
        assert_eq!((all.len(), none.len()), (6, 0));
    }

    /// The engine against an in-memory object store, checked against an
    /// oracle: random changes (random bytes, zeroed ranges, copied
    /// chunks), a push after each, now and then a GC with a random
    /// retention; every snapshot still listed restores to exactly the
    /// image it was pushed from, and GC dropped exactly what retention
    /// said. Seeded; the seed is in the failure message.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn engine_model_push_gc_restore_against_an_oracle() {
        use crate::sim::Rng;
        use crate::snapshot::push::{push, BufferSource, PushOptions};
        use crate::snapshot::restore::{restore, BufferSink, RestoreOptions};
        const CHUNK: usize = 64 << 10;
        for seed in 1..=4u64 {
            let mut rng = Rng::seed(seed);
            let store = Arc::new(object_store::memory::InMemory::new());
            let remote = Remote::from_store(store, "mem");
            let keys = (seed % 2 == 0).then(|| Arc::new(Keys::from_secret(&[seed as u8; 32])));
            let size = 20 * CHUNK + 1000;
            let mut image = vec![0u8; size];
            let mut oracle = std::collections::HashMap::new();
            for round in 0..10 {
                for _ in 0..1 + rng.below(4) {
                    let at = rng.below(size as u64) as usize;
                    let len = (1 + rng.below(3 * CHUNK as u64) as usize).min(size - at);
                    match rng.below(3) {
                        0 => rng.fill(&mut image[at..at + len]),
                        1 => image[at..at + len].fill(0),
                        _ => {
                            let (a, b) = (rng.below(20) as usize, rng.below(20) as usize);
                            let c = image[a * CHUNK..(a + 1) * CHUNK].to_vec();
                            image[b * CHUNK..(b + 1) * CHUNK].copy_from_slice(&c);
                        }
                    }
                }
                let o = PushOptions {
                    chunk_bytes: CHUNK as u64,
                    keys: keys.clone(),
                    concurrency: 1 + rng.below(4) as usize,
                    ..PushOptions::new(if round % 3 == 0 { "b" } else { "a" })
                };
                let rep = push(&remote, &mut BufferSource(&image), &o, &mut |_: &_| {})
                    .await
                    .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
                oracle.insert(rep.id.unwrap(), image.clone());
                if rng.chance(0.4) {
                    let before = list_snapshots(&remote, None).await.unwrap();
                    let retention = Retention {
                        keep_last: rng.chance(0.7).then(|| rng.below(4) as usize),
                        keep_daily: rng.chance(0.3).then(|| 1 + rng.below(2) as usize),
                    };
                    let opts = GcOptions {
                        retention,
                        grace_ms: 0,
                        keys: keys.clone(),
                        ..GcOptions::default()
                    };
                    gc(&remote, &opts)
                        .await
                        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
                    let after = list_snapshots(&remote, None).await.unwrap();
                    assert_eq!(after, retain(&before, &retention).0, "seed {seed}");
                    oracle.retain(|id, _| after.contains(id));
                }
            }
            for (id, want) in &oracle {
                let mut sink = BufferSink(vec![0xa5; size]);
                let o = RestoreOptions {
                    keys: keys.clone(),
                    ..RestoreOptions::default()
                };
                restore(&remote, id, &mut sink, &o, &mut |_: &_| {})
                    .await
                    .unwrap_or_else(|e| panic!("seed {seed}: {id}: {e}"));
                assert!(sink.0 == *want, "seed {seed}: {id} restores to other bytes");
            }
        }
    }

    /// A push of a buffer is a `Send` future (the daemon can spawn it).
    #[test]
    fn push_and_restore_futures_are_send() {
        fn send<T: Send>(_: T) {}
        let remote = Remote::from_store(Arc::new(object_store::memory::InMemory::new()), "mem");
        let o = crate::snapshot::push::PushOptions::new("a");
        let mut src = crate::snapshot::push::BufferSource(&[]);
        send(crate::snapshot::push::push(
            &remote,
            &mut src,
            &o,
            &mut |_: &_| {},
        ));
        let id: SnapshotId = "a/0000000000000001-00000001".parse().unwrap();
        let mut sink = crate::snapshot::restore::BufferSink(Vec::new());
        let ro = crate::snapshot::restore::RestoreOptions::default();
        send(crate::snapshot::restore::restore(
            &remote,
            &id,
            &mut sink,
            &ro,
            &mut |_: &_| {},
        ));
    }

    proptest! {
        /// The GC plan never deletes a chunk a kept snapshot needs, keeps
        /// each drive's newest snapshot, and deletes exactly the
        /// unreferenced chunks past the grace period.
        #[test]
        fn gc_plan_never_deletes_a_needed_chunk(
            snaps in prop::collection::vec(
                (0..3u8, 0..(5 * DAY_MS), prop::collection::hash_set(0..40u8, 0..10)),
                0..25,
            ),
            ages in prop::collection::vec(0..1000u64, 40),
            keep_last in prop::option::of(0..4usize),
            keep_daily in prop::option::of(0..4usize),
            grace_ms in 0..1000u64,
        ) {
            let addr = |n: u8| Address([n; 32]);
            let ids: Vec<SnapshotId> = snaps
                .iter()
                .enumerate()
                .map(|(i, (d, t, _))| id(&format!("d{d}"), *t, i as u32))
                .collect();
            let needs = |id: &SnapshotId| snaps[id.suffix as usize].2.iter().map(|&n| addr(n)).collect::<Vec<_>>();
            let r = Retention { keep_last, keep_daily };
            let (kept, dropped) = retain(&ids, &r);
            prop_assert_eq!(kept.len() + dropped.len(), ids.len());
            let referenced: HashSet<Address> = kept.iter().flat_map(needs).collect();
            let chunks: Vec<(Address, u64)> = (0..40u8).map(|n| (addr(n), ages[n as usize])).collect();
            let doomed = sweep(&chunks, &referenced, grace_ms);
            for k in &kept {
                for a in needs(k) {
                    prop_assert!(!doomed.contains(&a), "kept {} needs deleted {:?}", k, a);
                }
            }
            for (a, age) in &chunks {
                prop_assert_eq!(doomed.contains(a), !referenced.contains(a) && *age >= grace_ms);
            }
            let keeps_some = keep_last.unwrap_or(0) > 0 || keep_daily.unwrap_or(0) > 0
                || (keep_last.is_none() && keep_daily.is_none());
            for d in ids.iter().map(|i| &i.drive) {
                let newest = ids.iter().filter(|i| &i.drive == d).max_by_key(|i| order_key(i)).unwrap();
                prop_assert_eq!(kept.contains(newest), keeps_some);
            }
        }
    }
}
