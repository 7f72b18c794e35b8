//! The NBD server: `proto` (pure wire format), `handshake` (option phase),
//! `conn` (transmission loop), `poller` (how a connection waits for its
//! client), `export` (what is served), `server`
//! (listeners, connection threads, shutdown), and `client` (a blocking
//! client, for caches whose backing is an NBD export).

pub mod awake;
pub mod client;
pub mod conn;
mod deadline;
pub mod export;
pub mod handshake;
mod poller;
pub mod proto;
pub mod server;
pub mod transport;
mod wait;

pub use export::{Export, ExportTable};
pub use server::{Server, ServerConfig, ShutdownHandle};
