//! The engine's error type and progress report, shared by push, restore
//! and GC (its own file so those import it without importing `mod.rs`).

use super::{chunk, codec, lease, manifest, remote};

/// How far an operation is, for a progress bar. Sent after each chunk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    /// Chunks finished.
    pub chunks_done: u64,
    /// Chunks in all.
    pub chunks_total: u64,
    /// Drive bytes finished (zero chunks included).
    pub bytes_done: u64,
    /// The drive's size.
    pub bytes_total: u64,
    /// Bytes sent or received so far (object bytes, after compression).
    pub bytes_transferred: u64,
}

/// Why a snapshot operation failed. Each names what it was working on.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// Talking to the remote failed.
    #[error(transparent)]
    Remote(#[from] remote::RemoteError),
    /// Another push or GC holds the remote, or we lost our lease.
    #[error(transparent)]
    Lease(#[from] lease::LeaseError),
    /// An object's envelope is bad (truncated, wrong key, altered, ...).
    #[error("object {name}: {source}")]
    Object {
        /// The object's name under the prefix.
        name: String,
        /// What is wrong with it.
        source: codec::CodecError,
    },
    /// A chunk decoded, but its contents do not match its address.
    #[error("chunk {name} is corrupt: its contents do not hash to its name (the object was replaced or damaged); the snapshot cannot be restored from this remote")]
    ChunkMismatch {
        /// The chunk's object name.
        name: String,
    },
    /// A chunk decoded to the wrong length for its place in the drive.
    #[error(
        "chunk {name} holds {got} bytes where the manifest needs {expected}: corrupt snapshot"
    )]
    ChunkLength {
        /// The chunk's object name.
        name: String,
        /// Bytes the manifest needs.
        expected: u64,
        /// Bytes it holds.
        got: u64,
    },
    /// The drive would make a manifest too large to restore.
    #[error("a drive of {size_bytes} bytes in {chunk_bytes}-byte chunks makes more than {max} chunks: push it with chunks of at least {needed} bytes (the remote's chunk_size)", max = chunk::MAX_CHUNKS)]
    TooManyChunks {
        /// The drive's size.
        size_bytes: u64,
        /// The chunk size asked for.
        chunk_bytes: u64,
        /// The smallest chunk size that fits.
        needed: u64,
    },
    /// A chunk a manifest names is not on the remote.
    #[error("chunk {name}, needed by snapshot {snapshot}, is missing from the remote")]
    ChunkMissing {
        /// The chunk's object name.
        name: String,
        /// The snapshot that needs it.
        snapshot: String,
    },
    /// The snapshot asked for does not exist.
    #[error("snapshot {id} does not exist on {remote} (see the snapshot list)")]
    NoSuchSnapshot {
        /// The id asked for.
        id: String,
        /// The remote.
        remote: String,
    },
    /// A manifest decoded but is invalid.
    #[error("manifest {name}: {source}")]
    Manifest {
        /// The manifest's object name.
        name: String,
        /// What is wrong.
        source: manifest::ManifestError,
    },
    /// A manifest's contents disagree with its name.
    #[error("manifest {name} describes drive {drive:?} at {created_ms} ms, not what its name says: it was moved or replaced")]
    ManifestMismatch {
        /// The manifest's object name.
        name: String,
        /// The drive it describes.
        drive: String,
        /// Its creation time.
        created_ms: u64,
    },
    /// Reading the drive failed.
    #[error("reading the drive at byte {offset}: {source}")]
    SourceRead {
        /// Where.
        offset: u64,
        /// The error.
        source: std::io::Error,
    },
    /// Writing the restore's target failed.
    #[error("writing the restored drive at byte {offset}: {source}")]
    SinkWrite {
        /// Where.
        offset: u64,
        /// The error.
        source: std::io::Error,
    },
    /// The chunk size is not allowed.
    #[error(transparent)]
    ChunkSize(#[from] chunk::BadChunkSize),
    /// The drive name cannot be used in object names.
    #[error("drive name {0:?} cannot name snapshots: use 1-128 of A-Z a-z 0-9 . _ - (not starting with '.')")]
    DriveName(String),
    /// The label is too long.
    #[error("label is {0} bytes long; the limit is 1024")]
    LabelTooLong(usize),
    /// A worker task panicked or was cancelled (a bug).
    #[error("internal error: a worker task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}
