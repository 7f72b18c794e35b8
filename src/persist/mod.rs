//! Persistent RAM drives: crash-safe incremental sync, fast restore,
//! durable FLUSH.
//!
//! # The promise, per drive ([`Durability`])
//!
//! - `none`: volatile between explicit syncs (`ramd sync`, clean shutdown);
//!   FLUSH is a no-op.
//! - `periodic`: the state on disk is always one whole point-in-time image of
//!   the drive, at most one interval plus one sync old, never a mix of two
//!   moments.
//! - `flush`: `periodic`, plus an acknowledged FLUSH or FUA write means every
//!   write acknowledged before it is on stable storage.
//!
//! # How a sync works
//!
//! ```text
//!  RamStore ──snapshot()──► pre-cut pages, chunk by chunk (copy-on-write for
//!     │                     pages a writer changes before the sync saves them)
//!     │                            │ coalesced into runs of up to 1 MiB
//!     │                            ▼
//!     │                 journal: records of generation G ... commit(G)
//!     │                            │ fdatasync            ◄── G is durable here
//!     │                            ▼
//!     │                 checkpoint: replay committed records into image+pages
//!     │                            │ fdatasync image, pages
//!     │                            ▼
//!     │                 meta.image_gen := G (tmp, fsync, rename, fsync dir)
//!     │                            ▼
//!     │                 journal truncated to 0, fdatasync
//! ```
//!
//! A crash anywhere leaves either the previous durable state or G: restore
//! loads the image (verifying every page's checksum, except pages the journal
//! is about to replace) and replays the committed generations newer than
//! `meta.image_gen`.
//!
//! # Modules (one job each)
//!
//! - [`storage`]: the `Storage` trait and real directories.
//! - The simulated disk for crash tests is `crate::sim::SimDisk` (test
//!   support, compiled for tests and the `sim` feature only).
//! - [`format`]: on-disk layouts (pure; drawn there and in docs/formats.md).
//! - [`crypto`]: AES-256-GCM per page, key files.
//! - [`journal`]: appending generations, scanning them back (torn tails,
//!   corruption).
//! - [`image`]: the image and its page table: checkpoint writes, loading.
//! - [`engine`]: a state directory: create, sync, checkpoint.
//! - [`restore`]: opening a state directory into a RAM store.
//! - [`drive`]: `PersistentDrive`, the `Backend` layer with durability modes.
//! - [`scheduler`]: the background sync thread (interval, retries, backoff).
//! - [`status`]: the status and metrics the daemon shows.

pub mod crypto;
pub mod drive;
pub mod durability;
pub mod engine;
pub mod format;
pub mod image;
pub mod journal;
pub mod priority;
pub mod restore;
pub mod scheduler;
pub mod status;
pub mod storage;

pub use crypto::Key;
pub use drive::{PersistConfig, PersistentDrive, RetryPolicy};
pub use durability::{Durability, SyncCause};
pub use engine::{Engine, SyncReport};
pub use restore::{RestoreOptions, RestoreProgress, RestoreReport};
pub use scheduler::SyncScheduler;
pub use status::{PersistStatus, SyncState};
pub use storage::{DirStorage, Storage, StorageFile};

/// File names inside a state directory.
pub mod names {
    /// Metadata.
    pub const META: &str = "meta";
    /// Metadata being replaced.
    pub const META_TMP: &str = "meta.tmp";
    /// The drive's bytes.
    pub const IMAGE: &str = "image";
    /// One entry per page of the image.
    pub const PAGES: &str = "pages";
    /// The redo journal.
    pub const JOURNAL: &str = "journal";
}

/// CRC-32C (Castagnoli), hardware accelerated where the CPU has it.
pub(crate) fn crc(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// Errors of the persistence layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A disk operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: String,
        source: std::io::Error,
    },
    /// The metadata file is damaged or not ramd's; nothing was changed.
    #[error("metadata {path} is unusable: {detail}. Nothing was changed on disk; the image file next to it is a raw copy of the drive as of its last checkpoint{raw_hint}")]
    CorruptMeta {
        path: String,
        detail: String,
        raw_hint: &'static str,
    },
    /// A page of the image failed verification; nothing was changed.
    #[error("image {path} is corrupt at page {page} (byte offset {offset}): {detail}. Nothing was changed on disk; `ramd restore --force` loads the drive anyway with such pages as they are (zero when encrypted)")]
    CorruptImage {
        path: String,
        page: u64,
        offset: u64,
        detail: String,
    },
    /// The journal is damaged where acknowledged data lives.
    #[error("journal {path} is corrupt at byte {offset}: {detail}; generation {later_gen} after it is intact, so acknowledged data would be lost. Nothing was changed on disk; `ramd restore --force` keeps the generations before the damage, `--discard-journal` loads only the image")]
    CorruptJournal {
        path: String,
        offset: u64,
        detail: String,
        later_gen: u64,
    },
    /// The state directory holds no drive.
    #[error("no persistent drive in {0} (no meta file)")]
    NotFound(String),
    /// A drive already lives in the state directory.
    #[error("a persistent drive already exists in {0}; restore it instead of creating one")]
    AlreadyExists(String),
    /// The drive is encrypted and no key was given.
    #[error("the drive in {0} is encrypted: give its key file")]
    KeyRequired(String),
    /// A key was given but the drive is not encrypted.
    #[error("the drive in {0} is not encrypted, but a key was given; refusing to guess")]
    KeyNotExpected(String),
    /// The key does not open this drive.
    #[error(
        "wrong key for the encrypted drive in {0}: the key check in its metadata does not open"
    )]
    WrongKey(String),
    /// Memory kept across a restart of the serving process that the
    /// state directory has moved on from (`restore::adopt`).
    #[error("the memory kept for {dir} is not of this directory's state (the directory is at generation {dir_gen}, the memory last committed {mem_gen}, or it was saved to another directory): another process wrote the directory since")]
    StaleKeptMemory {
        dir: String,
        dir_gen: u64,
        mem_gen: u64,
    },
    /// Encryption failed.
    #[error("encryption: {0}")]
    Crypto(#[from] crypto::CryptoError),
    /// The RAM store refused an operation (memory limits, sizes).
    #[error("RAM store: {0}")]
    Store(#[from] crate::block::backend::Error),
    /// A checkpoint stopped (or did not start) so that the journal keeps
    /// room on a nearly full disk; the journal holds the data meanwhile.
    #[error("checkpoint postponed: {} free on the state disk, and {} is kept for the journal so that FLUSH keeps working; it resumes when there is room", crate::size::format_size(*free_bytes), crate::size::format_size(*reserve_bytes))]
    CheckpointPostponed { free_bytes: u64, reserve_bytes: u64 },
    /// The drive's engine stopped after an earlier failure it cannot
    /// recover from in place.
    #[error("invalid: {0}")]
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// Builds an `Error::Io` with the operation and file.
pub(crate) fn io_err(op: &'static str, path: String) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Io { op, path, source }
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
