//! Directories in RAM with crash-safe sync back to disk (issue 6).
//!
//! A managed directory PATH is covered by a tmpfs holding a copy of it (or an
//! overlay with the on-disk directory below a tmpfs upper), so programs see
//! the same path at RAM speed. The on-disk copy stays under the mount and is
//! reached through a private bind mount; syncs update it in place so that at
//! every instant each file is either its previous or its new version. See
//! docs/dirs.md for the user-facing story.
//!
//! # Map
//!
//! ```text
//!  manager    add / sync / remove / list / recover_all / shutdown: the API the
//!     │       daemon, CLI and REST routes call; one op mutex per directory
//!     ├── guard      checks before add; usage levels 80/95/full with hysteresis
//!     │     └── holders     processes using a directory, from /proc (pure decision)
//!     ├── lock       flock on the on-disk directory inode (one daemon per dir)
//!     ├── mounts     tmpfs, overlay, private bind views, read-only remount
//!     │     └── mountinfo   /proc/self/mountinfo parser (pure)
//!     ├── recovery   start-up situations (pure classify) and dated recovery copies
//!     ├── state      the state file: versioned, checksummed, atomic (pure codec)
//!     └── sync       the sync engine: compare, temporaries, barriers, renames,
//!           └── meta     deletes last; metadata, xattrs, sparse data copy
//!  schedule   per-directory intervals (pure Scheduler) and the SyncWorker thread
//!  metrics    Prometheus families of a listing (pure)
//! ```
//!
//! Pure parts (mountinfo, state codec, recovery::classify, guard levels,
//! Scheduler) have unit tests; the rest is tested as root with real mounts
//! in tests/dirsync.rs, including kill -9 in the middle of syncs.

pub mod guard;
pub mod holders;
pub mod lock;
pub mod manager;
pub mod meta;
pub mod metrics;
pub mod mountinfo;
pub mod mounts;
pub mod recovery;
pub mod schedule;
pub mod state;
pub mod sync;
