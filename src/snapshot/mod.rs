//! Drive snapshots in S3-compatible object storage: incremental,
//! deduplicated, compressed, optionally encrypted, verified on read.
//!
//! # Layout of a remote (`s3://BUCKET/PREFIX`)
//!
//! ```text
//!  PREFIX/chunks/ab/cdef..      one object per distinct non-zero chunk,
//!                               named by its content address (chunk.rs),
//!                               zstd + optional AEAD envelope (codec.rs)
//!  PREFIX/snapshots/DRIVE/MS-X  one manifest per snapshot (manifest.rs),
//!                               its label also in its metadata (label.rs)
//!  PREFIX/locks/push-.. gc-..   leases of running pushes / GCs (lease.rs)
//! ```
//!
//! # Flow
//!
//! ```text
//!  push:    ChunkSource ─ cut into chunks ─ zero? ─ address ─ on remote? ─ encode ─ PUT
//!           (push.rs)      (chunk.rs)                      (HEAD)        (codec.rs)
//!           ... then the manifest, LAST (manifest.rs + codec.rs)
//!  restore: GET manifest ─ verify ─ GET chunks in parallel ─ verify ─ ChunkSink
//!           (restore.rs)
//!  gc:      lease ─ retention plan (pure) ─ read kept manifests ─ delete
//!           pruned manifests ─ delete unreferenced, old-enough chunks (gc.rs)
//! ```
//!
//! # Invariants
//!
//! 1. A manifest is written only after every chunk it names is on the
//!    remote; so a snapshot that is listed is complete, and a push cut
//!    short (crash, network) leaves earlier snapshots intact. The next
//!    push skips the chunks that made it (resume).
//! 2. Every byte read back is verified: the envelope's tag (encrypted) or
//!    format (plain), then the chunk's address against the hash of its
//!    plaintext, the manifest against its checksum. A mismatch names the
//!    object. A restore reports success only after every chunk verified
//!    and was written: callers publish the restored drive only then.
//! 3. GC never deletes a chunk that a kept manifest names, nor one a
//!    running push may be about to name (leases, plus a grace period on
//!    chunk age); it deletes nothing when any kept manifest is unreadable.
//!
//! # Async
//!
//! The engine is async (tokio), as `object_store` is; CPU work (hashing,
//! zstd, encryption) runs on tokio's blocking pool so uploads and the
//! daemon's runtime keep going. Callers without a runtime can wrap a call
//! in `tokio::runtime::Runtime::block_on`.
//!
//! Pure parts (chunk.rs, manifest.rs, codec.rs, the retention plan in
//! gc.rs) do no I/O and carry most of the unit tests; remote.rs is the one
//! file that talks to the object store.

pub mod chunk;
pub mod codec;
pub mod error;
pub mod gc;
pub mod label;
pub mod lease;
pub mod manifest;
pub mod push;
pub mod remote;
pub mod restore;
pub mod source;

pub use chunk::{Address, DEFAULT_CHUNK_BYTES};
pub use codec::Keys;
pub use error::{Progress, SnapshotError};
pub use gc::{gc, GcOptions, GcReport, Retention};
pub use lease::LeaseConfig;
pub use manifest::{Manifest, SnapshotId};
pub use push::{push, BufferSource, ChunkSource, PushOptions, PushReport};
pub use remote::{Credentials, Remote, RemoteConfig, RemoteError, RemoteUrl};
pub use restore::{
    list_snapshots, read_manifest, restore, BufferSink, ChunkSink, RestoreOptions, RestoreReport,
};
pub use source::{BackendSink, BackendSource};
