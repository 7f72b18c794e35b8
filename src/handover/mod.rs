//! Hand-over of descriptors between ramd's serving process and whoever
//! keeps them while it restarts (issue 31; design in docs/restart.md).
//!
//! Only the record format exists so far ([`wire`]): the supervisor that
//! holds the descriptors and the serving side that registers and adopts
//! them are the next steps. The format is pure (no I/O) so that both
//! sides, and a future `ramd upgrade` to another binary, agree on one
//! versioned definition, tested on its own.

pub mod wire;
