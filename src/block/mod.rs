//! The data-path contract every frontend (NBD, FUSE attach) shares with the
//! engines behind it.
//!
//! ```text
//!  frontend (nbd::conn, fuse::fs)   decodes its wire format into a
//!        │                            block::Request
//!  block::validate                    the one set of rules: access, length,
//!        │                            range; a Valid request or a Refusal
//!  Backend (layers wrapping layers)   runs it
//!        │
//!  errors ─► block::Errno             the one table that turns refusals and
//!                                     backend errors into an errno, which
//!                                     each frontend then reports its way
//! ```
//!
//! Invariants:
//! - A backend only ever sees a request that `validate` accepted against
//!   the size and access the frontend read just before (backends still
//!   check ranges against their *current* size: a resize may race).
//! - The same condition gets the same errno over every frontend: a write
//!   past the end is ENOSPC whether it comes over NBD or through the FUSE
//!   file; a read past the end is EINVAL over NBD, and the FUSE file reads
//!   short at its end as files do (it never asks for bytes past it).
//!
//! The contract itself: [`backend::Backend`], the trait every engine
//! (store, persistent drive, cache, backings) implements, with its
//! [`backend::Caps`].
//!
//! The shared pieces: [`Export`] (what a frontend serves, by name),
//! [`Layer`] (a backend wrapping a backend, forwarding what it does not
//! change), the [`ReadOnly`] layer every export sits behind, and the
//! [`cut::CutLayer`] under it that gives a snapshot push a point-in-time
//! view of the drive while clients go on writing.
//!
//! What stays in a frontend: its own protocol rules (NBD flags, structured
//! replies, negotiated metadata contexts).

pub mod backend;
pub mod cut;
mod errno;
pub mod export;
pub mod layer;
pub mod read_only;
mod request;

pub use cut::{Cut, CutError};
pub use errno::Errno;
pub use export::{Export, ExportTable};
pub use layer::Layer;
pub use read_only::ReadOnly;
pub use request::{validate, Command, Limits, Refusal, Request, Valid};
