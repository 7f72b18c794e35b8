//! The NBD server: `proto` (pure wire format), `handshake` (option phase),
//! `conn` (transmission loop), `export` (what is served), `server`
//! (listeners, connection threads, shutdown), and `client` (a blocking
//! client, for caches whose backing is an NBD export).

pub mod awake;
pub mod client;
pub mod conn;
pub mod export;
pub mod handshake;
pub mod proto;
pub mod server;

pub use export::{Export, ExportTable};
pub use server::{Server, ServerConfig, ShutdownHandle};
