//! The JSON of API v1: serde types only, shared by the server and the client.

pub mod caches;
pub mod dirs;
pub mod types;
pub mod values;
