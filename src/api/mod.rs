//! REST API v1 over the daemon's unix socket, in three parts:
//!
//! ```text
//!   cli ──► client ──► wire ◄── server ──► control, store, dirsync, ...
//!           (hyper)   (serde)   (axum)
//! ```
//!
//! Invariants (scripts/arch_check.py, rule 4, enforces them):
//! - `wire` is the JSON and nothing else: serde types that import no other
//!   module of the crate but the pure helpers, so its shapes change only
//!   when someone edits them, never because an internal type did.
//! - `client` imports only `wire`: a client of the daemon is a client of
//!   its API, whatever the daemon is made of.
//! - `server` owns everything that knows the daemon: handlers, routes, the
//!   mapping of typed errors to HTTP statuses and codes (the one place
//!   errors become strings), and the conversions from internal types into
//!   `wire`.

pub mod client;
pub mod server;
pub mod wire;

/// Serves the API (`control::run` starts it); see [`server::serve`].
pub use server::serve;
