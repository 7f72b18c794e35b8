//! What each refusal of an operation on caches is, with the facts its
//! message is made of. [`super::CachesError`] groups them by what the API
//! answers (its code and HTTP status); the messages say what to do next.
//! The refusals every kind shares (bad name, name taken, not found, over
//! the budget, in use by clients or attachments) are the ledger's.

use crate::cache::{BackingErrorKind, CacheError};
use crate::size::format_size;

/// Why a backing cannot be cached.
#[derive(Debug, thiserror::Error)]
pub enum BackingRefused {
    /// It could not be opened (`message`: the cache engine's reason).
    #[error("backing {spec}: {message}; {}", open_hint(*kind))]
    Open {
        spec: String,
        message: String,
        kind: BackingErrorKind,
    },
    /// Another cache caches it already.
    #[error("backing {backing} is already cached by '{other}': two caches over one disk would overwrite each other's data")]
    Shared { backing: String, other: String },
    /// It holds nothing.
    #[error("backing {backing} is empty (size 0): nothing to cache")]
    Empty { backing: String },
    /// Dirty data a killed serving process kept for it is not written
    /// back yet (`kept.rs`).
    #[error(transparent)]
    KeptWaits(#[from] super::kept::KeptWaits),
}

impl BackingRefused {
    /// What kind of refusal it is (the API answers by it).
    pub fn kind(&self) -> BackingErrorKind {
        match self {
            BackingRefused::Open { kind, .. } => *kind,
            BackingRefused::Shared { .. } => BackingErrorKind::Busy,
            BackingRefused::Empty { .. } => BackingErrorKind::Invalid,
            BackingRefused::KeptWaits(_) => BackingErrorKind::Unreachable,
        }
    }
}

/// What to do about a backing that could not be opened.
fn open_hint(kind: BackingErrorKind) -> &'static str {
    match kind {
        BackingErrorKind::Invalid => {
            "give an existing file, a block device, or an NBD URI: nbd://HOST[:PORT]/EXPORT, nbd+unix:///EXPORT?socket=PATH, or nbds:// / nbds+unix:// with tls-certificates=DIR (docs/cache.md)"
        }
        BackingErrorKind::Busy => "unmount it or stop the program that holds it, then try again",
        BackingErrorKind::Unreachable => {
            "check that the server runs and is reachable, then try again"
        }
    }
}

/// A delete found dirty data its backing cannot take, so nothing was
/// deleted (`error`: why the write-back failed).
#[derive(Debug, thiserror::Error)]
#[error("cache '{name}' holds {} of dirty data that cannot be written back to {backing} ({error}); nothing was deleted and the cache {}", format_size(*dirty_bytes), dirty_next_steps(name, *serves_again))]
pub struct DirtyData {
    pub name: String,
    pub backing: String,
    pub dirty_bytes: u64,
    pub error: String,
    /// The failure came after the cache stopped serving (it serves again);
    /// false: before (it never stopped).
    pub serves_again: bool,
}

fn dirty_next_steps(name: &str, serves_again: bool) -> String {
    if serves_again {
        "serves again. Fix the backing and delete again, or delete with force to DROP that data"
            .to_owned()
    } else {
        format!("keeps serving and retrying. Fix the backing and delete again, or delete with force (ramd cache delete {name} --force) to DROP that data")
    }
}

/// The cache is busy being created or deleted.
#[derive(Debug, thiserror::Error)]
pub enum Busy {
    /// Deleted while its backing was being opened.
    #[error("cache '{name}' was deleted while its backing was being opened")]
    DeletedWhileOpening { name: String },
    /// Its backing is being opened.
    #[error(
        "cache '{name}' is being created (its backing is being opened); try again in a moment"
    )]
    Creating { name: String },
    /// A delete runs already.
    #[error("cache '{name}' is being deleted already")]
    Deleting { name: String },
    /// Its state changed while the delete wrote back.
    #[error("cache '{name}' changed while being deleted; try again")]
    Changed { name: String },
}

/// A sync could not write back or flush the backing; the dirty data stays
/// in RAM and is retried in the background.
#[derive(Debug, thiserror::Error)]
#[error("cache '{name}': syncing to {backing} failed: {source}; the dirty data ({}) stays in RAM and is retried in the background (ramd cache info {name} shows the backing's state)", format_size(*dirty_bytes))]
pub struct BackingFailed {
    pub name: String,
    pub backing: String,
    pub dirty_bytes: u64,
    pub source: crate::block::backend::Error,
}

/// The cache's backing is not open (yet).
#[derive(Debug, thiserror::Error)]
pub enum Unavailable {
    /// Its backing could not be opened (`error`: why, as last seen).
    #[error("cache '{name}' is unavailable: its backing {backing} could not be opened ({error}); it is retried in the background")]
    NotOpened {
        name: String,
        backing: String,
        error: String,
    },
    /// It is opening or closing.
    #[error("cache '{name}' is {state}")]
    State { name: String, state: &'static str },
    /// An attach of a cache that does not serve.
    #[error(
        "cache '{name}' is {state}: it can be attached once it serves (ramd cache info {name})"
    )]
    NotAttachable { name: String, state: &'static str },
}

/// The OS or a lower layer refused a resource (memory map, thread).
#[derive(Debug, thiserror::Error)]
pub enum Setup {
    /// The cache engine refused.
    #[error(transparent)]
    Cache(#[from] CacheError),
}
