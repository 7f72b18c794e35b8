//! ramd: RAM drives served over NBD.
//!
//! # Map of the modules
//!
//! ```text
//!  client (qemu, nbdinfo, fio, kernel) ── unix socket / TCP
//!        │
//!  nbd::server     accept, connection cap, handshake slots and deadline,
//!        │         one thread per connection, shutdown
//!  nbd::transport  the connection's byte stream (unix or TCP socket)
//!  nbd::handshake  options: GO / INFO / LIST / EXPORT_NAME / meta contexts
//!  nbd::conn       transmission loop: parse every buffered request, run it
//!        │         inline, batch the replies into one write; nbd::wait /
//!        │         nbd::poller decide how to wait for the next bytes
//!  nbd::proto      pure wire format (no I/O): parsers and encoders
//!        │
//!        │   fuse::session + fuse::fs (the FUSE file, one thread per CPU on
//!        │   its own /dev/fuse clone, or io_uring) is the other frontend
//!        ▼
//!  block::validate the one set of request rules for every frontend, and
//!        │         block::Errno, the one errno table they report from
//!  block::Export   what a frontend serves by name; its backend sits behind
//!        │         block::ReadOnly, the first layer (block::Layer: a backend
//!        │         wrapping a backend, forwarding what it does not change)
//!  block::backend::Backend  the data-path trait (read/write/zero/trim/flush/extents)
//!        │         and its Caps (what it can do, direct_io, piece size)
//!  store::RamStore    sparse pages in an mmap (anonymous, or one memfd per
//!                     drive that can outlive the process), per-64 KiB-chunk locks,
//!                     allocated/dirty bitmaps, memory budgets,
//!                     copy-on-write snapshots for syncs
//!        │
//!  persist::PersistentDrive  a RamStore plus its state directory: syncs
//!                     (journal, checkpoint), restore, durability modes;
//!                     generic over persist::Storage (real or simulated disk)
//!        │
//!  cache::Cache       (or) RAM blocks in front of a slower backing: a file,
//!                     a block device, or an NBD export via
//!                     cache::backing::nbd_client
//! ```
//!
//! Around it: `control` (start-up, config, the ledger that owns every
//! named object's name, budget promise and export, drives and caches in
//! their own files, persistent drives' state directories and restores,
//! shutdown; `control::run` wires it all), `api` (REST over a unix socket:
//! `api::wire` the JSON, `api::server` the handlers, `api::client` the
//! client `cli` uses; the client and `cli` see only `wire`), `fuse` (drives
//! as FUSE files: its own FUSE server, no libfuse), `metrics`
//! (per-connection counters that `nbd::conn` records into).
//!
//! `bench` is `ramd bench`: its load generators (NBD, io_uring, pread,
//! small files), fio's figures, the report and its SVG/HTML plots.
//!
//! `snapshot` pushes point-in-time images of drives to S3-compatible
//! object storage (chunked, deduplicated, compressed, optionally
//! encrypted) and restores them, verified.
//!
//! `handover` is the versioned record format in which the serving process
//! will hand its descriptors (drive memfds, listeners) to a keeper across
//! restarts (issue 31, docs/restart.md; the keeper is not built yet).
//!
//! Beside the block path, `dirsync` keeps directories in RAM (tmpfs or
//! overlay mounted over them) and syncs them back to disk crash-safely.
//!
//! A request flows: socket bytes → `proto::parse_request` → `conn` (NBD
//! rules: flags, negotiated options) → `block::validate` (access, length,
//! range) → `Backend` call → reply encoded into the connection's output
//! buffer → one `write` per batch. `ratelog` limits what clients can make
//! the daemon log.
//!
//! Test support: `sim` (the simulated disk, the in-memory cache backing,
//! the policy simulator and `sim::Rng`, the one seeded generator) is
//! compiled only for tests and with the `sim` cargo feature, which the
//! integration tests and examples turn on through the package's
//! dev-dependency on itself; the shipped library and binary leave it out.

pub mod api;
pub mod bench;
pub mod block;
pub mod cache;
pub mod cli;
pub mod control;
pub mod dirsync;
pub mod fuse;
pub mod handover;
pub mod metrics;
pub mod nbd;
pub mod nvme;
pub mod paths;
pub mod persist;
pub mod ratelog;
#[cfg(any(test, feature = "sim"))]
pub mod sim;
pub mod size;
pub mod snapshot;
pub mod store;
pub mod ublk;
