//! Directories in RAM with crash-safe sync back to disk.
pub mod guard;
pub mod lock;
pub mod manager;
pub mod meta;
pub mod mountinfo;
pub mod mounts;
pub mod recovery;
pub mod schedule;
pub mod state;
pub mod sync;
