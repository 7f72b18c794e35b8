//! What each refusal of an operation on caches is, with the facts its
//! message is made of. [`super::CachesError`] groups them by what the API
//! answers (its code and HTTP status); the messages say what to do next.
//! The refusals every kind shares (bad name, name taken, not found, over
//! the budget, in use by clients or attachments) are the ledger's.

use crate::cache::CacheError;
use crate::size::format_size;

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
    pub source: crate::backend::Error,
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
