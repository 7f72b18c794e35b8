//! Test support: deterministic doubles and the one seeded generator the
//! tests, simulators and examples share. Not part of the shipped daemon.
//!
//! ```text
//!  sim::Rng        SplitMix64: the only generator; every double and test
//!                  draws from one seeded from the test's printed seed
//!  sim::disk       SimDisk: a persist::Storage in memory that enforces the
//!                  durability contract adversarially (crashes, torn and
//!                  lost writes, ENOSPC/EIO, doomed writes after a failed sync)
//!  sim::fault      Faulty: a layer that fails requests touching a chosen
//!                  range with EIO, over any backend
//!  sim::mem        MemBacking: a cache backing in memory that fails on
//!                  demand and can lose unflushed writes at a "crash"
//!  sim::policy     a trace-driven comparison of the cache eviction policies
//!                  (cargo run --example cache-policies)
//! ```
//!
//! Invariants:
//! - Deterministic: all randomness comes from a seed through [`Rng`]; the
//!   same seed gives the same run, so a test that prints its seed replays.
//!   No clock, thread timing or OS randomness feeds a decision here.
//! - Compiled only for the library's own tests and with the `sim` cargo
//!   feature (`#[cfg(any(test, feature = "sim"))]` in lib.rs). The
//!   integration tests and examples get it through the package's
//!   dev-dependency on itself with `features = ["sim"]`; `cargo build`
//!   and the release binary leave it out. Nothing outside `sim` may
//!   depend on it.
//! - The doubles implement the same traits as the real thing
//!   ([`crate::persist::Storage`], [`crate::block::backend::Backend`]) and the
//!   policy simulator drives the live [`crate::cache::policy`] code, so a
//!   test exercises production code paths, not copies of them.

pub mod disk;
pub mod fault;
pub mod mem;
pub mod policy;
mod rng;

pub use disk::{Faults, SimDisk, SimFileHandle};
pub use fault::Faulty;
pub use mem::MemBacking;
pub use rng::Rng;
