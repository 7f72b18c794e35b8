//! What each refusal of the cache registry is, with the facts its message
//! is made of. [`super::CachesError`] groups them by what the API answers
//! (its code and HTTP status); the messages say what to do next.

use std::path::PathBuf;

use crate::cache::CacheError;
use crate::control::registry::error::{join_paths, plural};
use crate::control::registry::RegistryError;
use crate::size::format_size;

/// The name is taken.
#[derive(Debug, thiserror::Error)]
pub enum Exists {
    /// By a drive (drives and caches share NBD export names).
    #[error("a drive named '{name}' already exists (drives and caches share NBD export names); pick another name")]
    Drive { name: String },
    /// By another cache.
    #[error("a cache named '{name}' already exists; pick another name or delete it first (ramd cache delete {name})")]
    Cache { name: String },
    /// By a drive created while the backing was being opened.
    #[error("the name '{name}' was taken by a drive meanwhile; pick another name")]
    TakenMeanwhile { name: String },
}

/// The cache is in use, or busy being created or deleted.
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
    /// Attached at mountpoints (`force`: the delete was forced already).
    #[error("cache '{name}' is attached at {}; unmount what uses it and run `ramd detach MOUNTPOINT` first{}", join_paths(mountpoints), if *force { "" } else { " (or delete with force)" })]
    Attached {
        name: String,
        mountpoints: Vec<PathBuf>,
        force: bool,
    },
    /// NBD clients are connected.
    #[error("cache '{name}' has {connections} open NBD connection{}; disconnect the client{} or delete with force (ramd cache delete --force), which closes them", plural(*connections), plural(*connections))]
    Connections { name: String, connections: usize },
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

/// The OS or a lower layer refused a resource (memory map, thread, export).
#[derive(Debug, thiserror::Error)]
pub enum Setup {
    /// The cache engine refused.
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// The drive registry refused (other than over the budget).
    #[error(transparent)]
    Registry(#[from] Box<RegistryError>),
}
