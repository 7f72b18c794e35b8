//! Directories in RAM with crash-safe sync back to disk.
pub mod meta;
pub mod mountinfo;
pub mod sync;
pub mod lock;
pub mod mounts;
pub mod guard;
pub mod state;
pub mod recovery;
pub mod manager;
pub mod schedule;
