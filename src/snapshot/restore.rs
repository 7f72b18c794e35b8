//! Restore: a snapshot back into a drive (or any [`ChunkSink`]), every
//! chunk verified.
//!
//! The manifest is fetched and verified first (envelope, checksum, and
//! that it describes the drive and time its name says). Then the distinct
//! addresses are fetched, up to `concurrency` at once; each is decoded
//! (tag, format), its plaintext hashed and compared with its address, its
//! length compared with the manifest's, and only then written at every
//! offset that holds it. Zero chunks are handed to
//! [`ChunkSink::write_zeroes`] (a fresh drive can ignore them).
//!
//! `restore` returns `Ok` only after the last chunk is written; on any
//! error the sink holds a partial image that the caller must discard (a
//! restored drive is published only after success, invariant 2 in
//! `mod.rs`).

use std::collections::HashMap;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};

use super::chunk::Address;
use super::codec::{self, Keys};
use super::error::{Progress, SnapshotError};
use super::manifest::{Entry, Manifest, SnapshotId};
use super::remote::Remote;

/// Where a restore writes. Offsets and lengths are within the manifest's
/// drive size, which the caller learns from [`read_manifest`] first.
pub trait ChunkSink {
    /// Writes `data` at `offset`.
    fn write_at(&mut self, offset: u64, data: &[u8]) -> std::io::Result<()>;
    /// The range reads as zeroes in the snapshot. The default does
    /// nothing: right for a new, empty target.
    fn write_zeroes(&mut self, _offset: u64, _len: u64) -> std::io::Result<()> {
        Ok(())
    }
}

/// A sink into a zero-filled buffer of the drive's size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferSink(pub Vec<u8>);

impl ChunkSink for BufferSink {
    fn write_at(&mut self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        let at = offset as usize;
        self.0[at..at + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn write_zeroes(&mut self, offset: u64, len: u64) -> std::io::Result<()> {
        self.0[offset as usize..(offset + len) as usize].fill(0);
        Ok(())
    }
}

/// How to restore.
#[derive(Debug, Clone)]
pub struct RestoreOptions {
    /// Chunks downloaded at once; 0: by the snapshot's chunk size
    /// (`chunk::in_flight`).
    pub concurrency: usize,
    /// The snapshot's keys, if it is encrypted.
    pub keys: Option<Arc<Keys>>,
}

impl Default for RestoreOptions {
    /// Downloads in flight by chunk size, no key.
    fn default() -> RestoreOptions {
        RestoreOptions {
            concurrency: 0,
            keys: None,
        }
    }
}

/// What a restore did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RestoreReport {
    /// Chunk objects downloaded (distinct addresses).
    pub chunks_fetched: u64,
    /// Zero chunks.
    pub chunks_zero: u64,
    /// Object bytes downloaded.
    pub bytes_downloaded: u64,
    /// Drive bytes written (zero chunks excluded).
    pub bytes_written: u64,
}

/// The snapshots on the remote, oldest first; only `drive`'s when given.
pub async fn list_snapshots(
    remote: &Remote,
    drive: Option<&str>,
) -> Result<Vec<SnapshotId>, SnapshotError> {
    let dir = match drive {
        Some(d) => format!("snapshots/{d}"),
        None => "snapshots".to_owned(),
    };
    let mut ids: Vec<SnapshotId> = remote
        .list(&dir)
        .await?
        .iter()
        .filter_map(|l| SnapshotId::from_object_name(&l.name))
        .filter(|id| drive.map_or(true, |d| id.drive == d))
        .collect();
    ids.sort_by(|a, b| (a.created_ms, &a.drive, a.suffix).cmp(&(b.created_ms, &b.drive, b.suffix)));
    Ok(ids)
}

/// Longest manifest accepted: 64 MiB chunks of a 16 EiB drive would need
/// more, but 1 GiB covers 32 million chunks (8 TiB at 256 KiB, 32 TiB
/// at 1 MiB).
const MANIFEST_LIMIT_BYTES: u64 = 1 << 30;

/// Fetches and verifies a snapshot's manifest.
pub async fn read_manifest(
    remote: &Remote,
    id: &SnapshotId,
    keys: Option<&Keys>,
) -> Result<Manifest, SnapshotError> {
    let name = id.object_name();
    let bytes = remote
        .get(&name)
        .await?
        .ok_or_else(|| SnapshotError::NoSuchSnapshot {
            id: id.to_string(),
            remote: remote.label().to_owned(),
        })?;
    let plain = codec::decode(&name, &bytes, keys, MANIFEST_LIMIT_BYTES).map_err(|source| {
        SnapshotError::Object {
            name: name.clone(),
            source,
        }
    })?;
    let m = Manifest::decode(&plain).map_err(|source| SnapshotError::Manifest {
        name: name.clone(),
        source,
    })?;
    if m.drive != id.drive || m.created_ms != id.created_ms || m.keyed != keys.is_some() {
        return Err(SnapshotError::ManifestMismatch {
            name,
            drive: m.drive,
            created_ms: m.created_ms,
        });
    }
    Ok(m)
}

/// Fetches one chunk and verifies it; returns (object bytes, plaintext).
async fn fetch_chunk(
    remote: &Remote,
    snapshot: &str,
    addr: Address,
    expected_len: u64,
    keys: Option<Arc<Keys>>,
) -> Result<(u64, Vec<u8>), SnapshotError> {
    let name = addr.object_name();
    let bytes = remote
        .get(&name)
        .await?
        .ok_or_else(|| SnapshotError::ChunkMissing {
            name: name.clone(),
            snapshot: snapshot.to_owned(),
        })?;
    let got = bytes.len() as u64;
    tokio::task::spawn_blocking(move || {
        let plain =
            codec::decode(&name, &bytes, keys.as_deref(), expected_len).map_err(|source| {
                SnapshotError::Object {
                    name: name.clone(),
                    source,
                }
            })?;
        if codec::addresser(keys.as_deref()).address(&plain) != addr {
            return Err(SnapshotError::ChunkMismatch { name });
        }
        if plain.len() as u64 != expected_len {
            return Err(SnapshotError::ChunkLength {
                name,
                expected: expected_len,
                got: plain.len() as u64,
            });
        }
        Ok((got, plain))
    })
    .await?
}

/// Restores snapshot `id` into `sink` (see the module docs). The future
/// is `Send` when the sink is.
pub async fn restore<K: ChunkSink + ?Sized>(
    remote: &Remote,
    id: &SnapshotId,
    sink: &mut K,
    opts: &RestoreOptions,
    progress: &mut (dyn FnMut(&Progress) + Send),
) -> Result<RestoreReport, SnapshotError> {
    let m = read_manifest(remote, id, opts.keys.as_deref()).await?;
    let g = m.geometry;
    let mut report = RestoreReport::default();
    let mut p = Progress {
        chunks_total: g.count(),
        bytes_total: g.size_bytes,
        ..Progress::default()
    };
    // Each distinct address once, with every chunk index holding it.
    let mut order: Vec<Address> = Vec::new();
    let mut places: HashMap<Address, Vec<u64>> = HashMap::new();
    for (i, e) in m.entries.iter().enumerate() {
        let i = i as u64;
        match e {
            Entry::Zero => {
                let (offset, len) = (g.offset(i), g.len(i));
                sink.write_zeroes(offset, len)
                    .map_err(|source| SnapshotError::SinkWrite { offset, source })?;
                report.chunks_zero += 1;
                p.chunks_done += 1;
                p.bytes_done += len;
            }
            Entry::Data(a) => places
                .entry(*a)
                .or_insert_with(|| {
                    order.push(*a);
                    Vec::new()
                })
                .push(i),
        }
    }
    progress(&p);
    let snapshot = id.to_string();
    let (snapshot, places_ref) = (&snapshot, &places);
    let mut fetched = futures::stream::iter(order)
        .map(|a| {
            let len = g.len(places_ref[&a][0]);
            let keys = opts.keys.clone();
            async move {
                fetch_chunk(remote, snapshot, a, len, keys)
                    .await
                    .map(|r| (a, r))
            }
        })
        .buffer_unordered(match opts.concurrency {
            0 => super::chunk::in_flight(g.chunk_bytes),
            n => n,
        });
    while let Some((a, (got, plain))) = fetched.try_next().await? {
        report.chunks_fetched += 1;
        report.bytes_downloaded += got;
        p.bytes_transferred += got;
        for &i in &places[&a] {
            let offset = g.offset(i);
            if g.len(i) != plain.len() as u64 {
                // The same contents cannot have two lengths.
                return Err(SnapshotError::ChunkLength {
                    name: a.object_name(),
                    expected: g.len(i),
                    got: plain.len() as u64,
                });
            }
            sink.write_at(offset, &plain)
                .map_err(|source| SnapshotError::SinkWrite { offset, source })?;
            report.bytes_written += plain.len() as u64;
            p.chunks_done += 1;
            p.bytes_done += plain.len() as u64;
        }
        progress(&p);
    }
    Ok(report)
}
