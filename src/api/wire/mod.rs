//! The JSON of API v1: serde types shared by the server and the client.
//!
//! Invariant: serde types only. No file here imports another module of the
//! crate (nor axum, hyper or tokio), so the client and the command line
//! that build on these types link nothing of the daemon, and a shape
//! changes only by an edit here, checked against docs/openapi.yaml by the
//! API tests. The server converts its internal types into these (see
//! `api::server::dir_wire`, `api::server::counters`).
//!
//! One file per resource, as in `api::server`: `drives`, `persistence`
//! (sync, restore, a drive's `persist`), `health`, `stats`, `attachments`,
//! `caches`, `dirs`, `tls`, `tokens`, `bench` (`ramd bench`'s report), `dashboard` (links, whoami, events), and `error` (the one error body); `values` holds
//! sizes, durations and counters as several resources spell them. Request
//! bodies reject unknown fields, so a typo is an error.

pub mod attachments;
pub mod bench;
pub mod caches;
pub mod dashboard;
pub mod dirs;
pub mod drives;
pub mod error;
pub mod health;
pub mod persistence;
pub mod snapshots;
pub mod stats;
pub mod tls;
pub mod tokens;
pub mod values;
