//! The NBD server: `proto` (pure wire format, also used by the client in
//! `cache::backing::nbd_client`), `access` (per-export access rules),
//! `handshake` (option phase, with its
//! `deadline`), `conn` (transmission loop), `transport` (the socket
//! stream), `wait` and `poller` (how a connection waits for its client),
//! `awake` (opt-in keep-awake), `export` (an export's NBD transmission
//! flags; the export itself is `block::Export`) and `server`
//! (listeners, caps, connection threads, shutdown).

pub mod access;
pub mod awake;
pub mod conn;
mod deadline;
mod export;
pub mod handshake;
mod poller;
pub mod proto;
pub mod server;
pub mod tls;
pub mod transport;
mod wait;

pub use crate::block::{Export, ExportTable};
pub use server::{Server, ServerConfig, ShutdownHandle};
