//! What a persistent drive promises about its data on disk
//! ([`Durability`]) and why a sync runs ([`SyncCause`]): plain values that
//! the drive, its scheduler and its status all name, kept apart from them
//! so none of those has to import another for them.

use std::str::FromStr;

/// The promise a drive makes about its data on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Saved only by explicit syncs and clean shutdown; FLUSH is a no-op.
    None,
    /// A whole point-in-time image at most one interval (plus one sync) old.
    #[default]
    Periodic,
    /// Periodic, and an acknowledged FLUSH/FUA covers every write
    /// acknowledged before it.
    Flush,
}

impl Durability {
    /// Lower-case name (as on the command line).
    pub fn as_str(self) -> &'static str {
        match self {
            Durability::None => "none",
            Durability::Periodic => "periodic",
            Durability::Flush => "flush",
        }
    }
    pub(super) fn from_u8(v: u8) -> Durability {
        match v {
            0 => Durability::None,
            1 => Durability::Periodic,
            _ => Durability::Flush,
        }
    }
    pub(super) fn to_u8(self) -> u8 {
        match self {
            Durability::None => 0,
            Durability::Periodic => 1,
            Durability::Flush => 2,
        }
    }
}

impl std::fmt::Display for Durability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A durability name that is none of `none`, `periodic`, `flush`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown durability '{0}': use none, periodic or flush")]
pub struct UnknownDurability(pub String);

impl FromStr for Durability {
    type Err = UnknownDurability;
    fn from_str(s: &str) -> std::result::Result<Durability, UnknownDurability> {
        match s {
            "none" => Ok(Durability::None),
            "periodic" => Ok(Durability::Periodic),
            "flush" => Ok(Durability::Flush),
            other => Err(UnknownDurability(other.to_owned())),
        }
    }
}

/// Why a sync runs (decides whether a checkpoint follows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncCause {
    /// A FLUSH or FUA write in `flush` mode.
    Flush,
    /// The background scheduler.
    Periodic,
    /// `ramd sync`.
    Manual,
    /// Clean shutdown.
    Shutdown,
}
