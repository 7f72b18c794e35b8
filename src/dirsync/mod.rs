//! Directories in RAM with crash-safe sync back to disk.
pub mod meta;
pub mod mountinfo;
pub mod sync;
