//! Hand-over of descriptors between ramd's serving process and whoever
//! keeps them while it restarts (issue 31; design in docs/restart.md).
//!
//! - [`wire`]: the versioned record format, pure (no I/O), so that both
//!   sides, and a future `ramd upgrade` to another binary, agree on one
//!   definition, tested on its own;
//! - [`link`]: records with their descriptors on a SEQPACKET socket;
//! - [`supervisor`]: `ramd daemon --supervise`, the keeper that restarts
//!   the serving process and hands everything back;
//! - [`serving`]: the serving process's end of the link;
//! - [`fdstore`]: systemd's descriptor store as the keeper instead of a
//!   supervisor (a service with `FileDescriptorStoreMax=`);
//! - [`listeners`]: listening sockets kept, taken back instead of bound.
//!
//! What the blobs mean (a drive's settings) is the daemon's business
//! (`control::kept`): nothing here knows a drive.

pub mod fdstore;
pub mod link;
pub mod listeners;
pub mod serving;
pub mod supervisor;
pub mod wire;
