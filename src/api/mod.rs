//! REST API v1 over the daemon's unix socket: `wire` (the JSON bodies),
//! `server` (axum handlers, routes, error mapping) and `client` (the
//! blocking client the CLI uses).

pub mod client;
pub mod server;
pub mod wire;

pub use server::serve;
