//! ramd: RAM drives served over NBD.
//!
//! # Map of the modules
//!
//! ```text
//!  client (qemu, nbdinfo, fio, kernel) ── unix socket / TCP
//!        │
//!  nbd::server   accept, connection cap, one thread per connection, shutdown
//!  nbd::handshake  options: GO / INFO / LIST / EXPORT_NAME / meta contexts
//!  nbd::conn     transmission loop: parse every buffered request, validate
//!        │       once, run inline, batch the replies into one write
//!  nbd::proto    pure wire format (no I/O): parsers and encoders
//!        │
//!  backend::Backend   the data-path trait (read/write/zero/trim/flush/extents)
//!        │
//!  store::RamStore    sparse pages in an mmap, per-64 KiB-chunk locks,
//!                     allocated/dirty bitmaps, memory budgets
//!  cache::Cache       (or) RAM blocks in front of a slower backing: a file,
//!                     a block device, or an NBD export via nbd::client
//! ```
//!
//! A request flows: socket bytes → `proto::parse_request` → `conn` validate →
//! `Backend` call → reply encoded into the connection's output buffer → one
//! `write` per batch.

pub mod backend;
pub mod cache;
pub mod nbd;
pub mod paths;
pub mod size;
pub mod store;
