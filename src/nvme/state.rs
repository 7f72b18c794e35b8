//! The state an admin queue keeps for its controller, apart from the code
//! that changes it (`admin.rs`), so the connection (`conn.rs`) can hold it
//! without the two files importing each other.

use std::time::{Duration, Instant};

/// Logical block size: 512 bytes (every host's default; any alignment is
/// fine for a RAM drive).
pub(super) const LBA_SHIFT: u8 = 9;

/// What the admin queue of a controller keeps.
pub(super) struct AdminState {
    /// Controller Configuration as the host last set it (Property Set).
    pub(super) cc: u32,
    /// Controller Status: ready follows CC.EN, shutdown completes at once.
    pub(super) csts: u32,
    /// Keep-alive timeout (Connect, or Set Features); zero: none.
    pub(super) kato: Duration,
    /// When the host last sent an admin command (keep-alive timer).
    pub(super) last_seen: Instant,
    /// Which notices the host enabled (Asynchronous Event Configuration).
    pub(super) aen_config: u32,
    /// Command ids of outstanding AERs, oldest first.
    pub(super) aers: Vec<u16>,
    /// What the host was last told: (present, blocks, read-only) of the
    /// drive, or a digest of the drive list for discovery.
    pub(super) told: (bool, u64, bool),
    pub(super) told_list: Vec<String>,
    /// A notice is due but no AER was outstanding.
    pub(super) event_due: Option<u64>,
    /// The namespace changed since the log was last read.
    pub(super) ns_changed: bool,
    /// The discovery log's generation counter (moves with the list).
    pub(super) genctr: u64,
    /// When the controller was created (SMART power-on hours).
    pub(super) started: Instant,
}
