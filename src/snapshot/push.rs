//! Push: one point-in-time image of a drive to the remote, uploading only
//! the chunks the remote lacks.
//!
//! The caller hands a [`ChunkSource`] that reads one moment of the drive
//! (a copy-on-write snapshot of the store, or a buffer in tests); the push
//! reads it chunk by chunk, in order. Per chunk:
//!
//! 1. all zero (or known unwritten): an `Entry::Zero`, nothing sent;
//! 2. else its address (chunk.rs); seen earlier in this push: deduplicated;
//! 3. else HEAD `chunks/..`: already there (an earlier snapshot, another
//!    drive, or an interrupted push): skipped;
//! 4. else encode (codec.rs) and PUT.
//!
//! Up to `concurrency` chunks are in flight at once; reading stays in
//! order, and CPU work runs on tokio's blocking pool. Only after every
//! chunk is on the remote is the manifest written (invariant 1 in
//! `mod.rs`), under a push lease that is checked just before (lease.rs).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use futures::{StreamExt, TryStreamExt};

use super::chunk::{is_zero, Addresser, Geometry, DEFAULT_CHUNK_BYTES};
use super::codec::{self, Keys};
use super::error::{Progress, SnapshotError};
use super::label;
use super::lease::{Lease, LeaseConfig, LeaseKind};
use super::manifest::{valid_drive_name, Entry, Manifest, SnapshotId, MAX_TEXT_BYTES};
use super::remote::{now_ms, random_u32, Remote};

/// One moment of a drive, to read from. Reads must all see the same
/// point in time (the caller takes the snapshot before the push).
pub trait ChunkSource {
    /// The drive's size in bytes at the cut.
    fn size_bytes(&self) -> u64;
    /// Fills `buf` with the bytes at `offset` (within `size_bytes`).
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> std::io::Result<()>;
    /// True when the range is known never written (it reads as zeroes),
    /// so the push need not read it. The default knows nothing.
    fn is_unwritten(&self, _offset: u64, _len: u64) -> bool {
        false
    }
}

/// A source over bytes in memory.
#[derive(Debug, Clone)]
pub struct BufferSource<'a>(pub &'a [u8]);

impl ChunkSource for BufferSource<'_> {
    fn size_bytes(&self) -> u64 {
        self.0.len() as u64
    }
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let at = offset as usize;
        buf.copy_from_slice(&self.0[at..at + buf.len()]);
        Ok(())
    }
}

/// What to push and how.
#[derive(Debug, Clone)]
pub struct PushOptions {
    /// The drive's name (part of the snapshot's id).
    pub drive: String,
    /// Free-form label kept in the manifest.
    pub label: String,
    /// Chunk size (see `chunk.rs` for the default's reasons).
    pub chunk_bytes: u64,
    /// Chunks in flight at once (each holds one chunk in memory); 0: by
    /// the chunk size (`chunk::in_flight`).
    pub concurrency: usize,
    /// Encrypt with these keys; None: plain (compressed only).
    pub keys: Option<Arc<Keys>>,
    /// Lease timing.
    pub lease: LeaseConfig,
}

impl PushOptions {
    /// Defaults: the default chunk size, in flight by chunk size, no
    /// encryption.
    pub fn new(drive: &str) -> PushOptions {
        PushOptions {
            drive: drive.to_owned(),
            label: String::new(),
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            concurrency: 0,
            keys: None,
            lease: LeaseConfig::default(),
        }
    }
}

/// What a push did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PushReport {
    /// The new snapshot.
    pub id: Option<SnapshotId>,
    /// Chunks in the drive.
    pub chunks_total: u64,
    /// Chunks uploaded now.
    pub chunks_uploaded: u64,
    /// Chunks already on the remote (earlier snapshots, resumed pushes).
    pub chunks_skipped: u64,
    /// Chunks equal to an earlier chunk of this push.
    pub chunks_deduped: u64,
    /// All-zero chunks (no object).
    pub chunks_zero: u64,
    /// Drive bytes in non-zero chunks.
    pub bytes_data: u64,
    /// Plaintext bytes of the chunks uploaded now.
    pub bytes_uploaded_plain: u64,
    /// Bytes sent: chunk objects plus the manifest, after compression
    /// and encryption (lease objects not counted).
    pub bytes_uploaded: u64,
}

impl PushReport {
    /// Drive data per byte of plaintext actually uploaded (higher is
    /// better; infinite when nothing needed uploading).
    pub fn dedup_ratio(&self) -> f64 {
        self.bytes_data as f64 / self.bytes_uploaded_plain as f64
    }
}

/// What became of one chunk.
enum Outcome {
    Zero,
    Deduped(u64),
    Skipped(u64),
    Uploaded { plain: u64, sent: u64 },
}

/// Shared by the chunk tasks of one push.
struct Ctx<'a> {
    remote: &'a Remote,
    keys: Option<Arc<Keys>>,
    addresser: Addresser,
    /// Addresses already handled in this push.
    seen: Mutex<HashSet<super::chunk::Address>>,
}

async fn process(ctx: &Ctx<'_>, data: Option<Vec<u8>>) -> Result<(Entry, Outcome), SnapshotError> {
    let Some(data) = data else {
        return Ok((Entry::Zero, Outcome::Zero));
    };
    let addresser = ctx.addresser.clone();
    let (addr, data) = tokio::task::spawn_blocking(move || {
        let a = (!is_zero(&data)).then(|| addresser.address(&data));
        (a, data)
    })
    .await?;
    let Some(addr) = addr else {
        return Ok((Entry::Zero, Outcome::Zero));
    };
    let len = data.len() as u64;
    let first = ctx
        .seen
        .lock()
        .expect("no panics under this lock")
        .insert(addr);
    if !first {
        return Ok((Entry::Data(addr), Outcome::Deduped(len)));
    }
    let name = addr.object_name();
    if ctx.remote.exists(&name).await? {
        return Ok((Entry::Data(addr), Outcome::Skipped(len)));
    }
    let keys = ctx.keys.clone();
    let n = name.clone();
    let bytes =
        tokio::task::spawn_blocking(move || codec::encode(&n, &data, keys.as_deref())).await?;
    let sent = bytes.len() as u64;
    ctx.remote.put(&name, bytes).await?;
    Ok((Entry::Data(addr), Outcome::Uploaded { plain: len, sent }))
}

fn check_options(opts: &PushOptions) -> Result<(), SnapshotError> {
    if !valid_drive_name(&opts.drive) {
        return Err(SnapshotError::DriveName(opts.drive.clone()));
    }
    if opts.label.len() > MAX_TEXT_BYTES {
        return Err(SnapshotError::LabelTooLong(opts.label.len()));
    }
    Ok(())
}

/// Pushes `source` as a new snapshot of `opts.drive`. `progress` is called
/// after each chunk. On error nothing is listed as a snapshot; chunks
/// already uploaded stay and the next push skips them.
///
/// Generic over the source so the future is `Send` (spawnable) exactly
/// when the source is; a source that borrows a store snapshot (not
/// `Send`) can still be pushed with `block_on` on its own thread.
pub async fn push<S: ChunkSource + ?Sized>(
    remote: &Remote,
    source: &mut S,
    opts: &PushOptions,
    progress: &mut (dyn FnMut(&Progress) + Send),
) -> Result<PushReport, SnapshotError> {
    check_options(opts)?;
    let geometry = Geometry::new(source.size_bytes(), opts.chunk_bytes)?;
    if geometry.count() > super::chunk::MAX_CHUNKS {
        return Err(SnapshotError::TooManyChunks {
            size_bytes: geometry.size_bytes,
            chunk_bytes: geometry.chunk_bytes,
            needed: super::chunk::chunk_bytes_for(geometry.size_bytes, geometry.chunk_bytes),
        });
    }
    let created_ms = now_ms();
    remote.check().await?;
    let mut lease = Lease::acquire(remote, LeaseKind::Push, opts.lease.clone()).await?;
    // Dated at the start, as the snapshots listed then: a push of the same
    // drive from elsewhere that ends first is not passed over.
    let result = match after_newest(remote, &opts.drive, created_ms).await {
        Ok(created_ms) => upload_all(remote, source, opts, geometry, progress)
            .await
            .map(|r| (created_ms, r)),
        Err(e) => Err(e),
    };
    let (created_ms, (entries, mut report)) = match result {
        Ok(r) => r,
        Err(e) => {
            // Best effort: a lease left behind only delays GC until it
            // goes stale (or this owner's next lease deletes it).
            let _ = lease.release().await;
            return Err(e);
        }
    };
    let manifest = Manifest {
        drive: opts.drive.clone(),
        label: opts.label.clone(),
        created_ms,
        keyed: opts.keys.is_some(),
        geometry,
        entries,
    };
    let id = SnapshotId {
        drive: opts.drive.clone(),
        created_ms,
        suffix: random_u32(),
    };
    let name = id.object_name();
    let bytes = codec::encode(&name, &manifest.encode(), opts.keys.as_deref());
    let metadata: Vec<_> = label::encode(&name, &opts.label, opts.keys.as_deref())
        .map(|v| (label::METADATA_KEY, v))
        .into_iter()
        .collect();
    let written = async {
        lease.ensure_live().await?;
        remote
            .put_with_metadata(&name, bytes.clone(), &metadata)
            .await?;
        Ok::<_, SnapshotError>(())
    }
    .await;
    let released = lease.release().await;
    written?;
    released?;
    report.bytes_uploaded += bytes.len() as u64;
    report.id = Some(id);
    Ok(report)
}

/// `created_ms`, or just after the drive's newest snapshot when that is
/// dated later: a clock set back (NTP after boot, another host's clock)
/// must not make the new snapshot the oldest, which `keep_last` deletes
/// first and `latest` passes over. A newest dated well ahead (a clock that
/// was wrong then) drags the new one's date along; that is logged.
async fn after_newest(remote: &Remote, drive: &str, created_ms: u64) -> Result<u64, SnapshotError> {
    let ids = super::restore::list_snapshots(remote, Some(drive)).await?;
    let Some(newest) = ids.last().filter(|n| n.created_ms >= created_ms) else {
        return Ok(created_ms);
    };
    if newest.created_ms - created_ms > 60_000 {
        tracing::warn!(
            newest = %newest,
            ahead_s = (newest.created_ms - created_ms) / 1000,
            "the drive's newest snapshot is dated ahead of this host's clock: the new one is dated just after it, so it stays the newest"
        );
    }
    Ok(newest.created_ms + 1)
}

/// Reads, checks and uploads every chunk; returns the manifest's entries.
async fn upload_all<S: ChunkSource + ?Sized>(
    remote: &Remote,
    source: &mut S,
    opts: &PushOptions,
    geometry: Geometry,
    progress: &mut (dyn FnMut(&Progress) + Send),
) -> Result<(Vec<Entry>, PushReport), SnapshotError> {
    let ctx = Ctx {
        remote,
        keys: opts.keys.clone(),
        addresser: codec::addresser(opts.keys.as_deref()),
        seen: Mutex::new(HashSet::new()),
    };
    let count = geometry.count();
    let mut report = PushReport {
        chunks_total: count,
        ..PushReport::default()
    };
    let mut p = Progress {
        chunks_total: count,
        bytes_total: geometry.size_bytes,
        ..Progress::default()
    };
    progress(&p);
    let ctx = &ctx;
    let mut results = futures::stream::iter(0..count)
        .map(|i| {
            let (offset, len) = (geometry.offset(i), geometry.len(i));
            let read = if source.is_unwritten(offset, len) {
                Ok(None)
            } else {
                let mut buf = vec![0u8; len as usize];
                source
                    .read_at(offset, &mut buf)
                    .map(|()| Some(buf))
                    .map_err(|e| SnapshotError::SourceRead { offset, source: e })
            };
            async move { process(ctx, read?).await.map(|r| (len, r)) }
        })
        .buffered(match opts.concurrency {
            0 => super::chunk::in_flight(geometry.chunk_bytes),
            n => n,
        });
    let mut entries = Vec::with_capacity(count as usize);
    while let Some((len, (entry, outcome))) = results.try_next().await? {
        entries.push(entry);
        match outcome {
            Outcome::Zero => report.chunks_zero += 1,
            Outcome::Deduped(n) => {
                report.chunks_deduped += 1;
                report.bytes_data += n;
            }
            Outcome::Skipped(n) => {
                report.chunks_skipped += 1;
                report.bytes_data += n;
            }
            Outcome::Uploaded { plain, sent } => {
                report.chunks_uploaded += 1;
                report.bytes_data += plain;
                report.bytes_uploaded_plain += plain;
                report.bytes_uploaded += sent;
            }
        }
        p.chunks_done += 1;
        p.bytes_done += len;
        p.bytes_transferred = report.bytes_uploaded;
        progress(&p);
    }
    Ok((entries, report))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_clock_set_back_never_makes_the_new_snapshot_the_oldest() {
        let store = Arc::new(object_store::memory::InMemory::new());
        let remote = Remote::from_store(store, "mem");
        let data = vec![7u8; 1 << 20];
        let opts = PushOptions::new("d");
        let push_one = || async {
            let mut src = BufferSource(&data);
            push(&remote, &mut src, &opts, &mut |_: &_| {})
                .await
                .unwrap()
                .id
                .unwrap()
        };
        let first = push_one().await;
        // A snapshot dated an hour ahead, as if the clock went back since.
        let ahead = SnapshotId {
            created_ms: first.created_ms + 3_600_000,
            ..first.clone()
        };
        let manifest = remote.get(&first.object_name()).await.unwrap().unwrap();
        remote
            .put(&ahead.object_name(), manifest.to_vec())
            .await
            .unwrap();
        let next = push_one().await;
        assert_eq!(next.created_ms, ahead.created_ms + 1);
        let listed = super::super::restore::list_snapshots(&remote, Some("d"))
            .await
            .unwrap();
        assert_eq!(listed.last(), Some(&next), "{listed:?}");
    }
}
