//! Requests as every frontend decodes them, and the one place they are
//! checked before a backend runs them. Pure: no I/O.

use std::fmt;

use super::errno::Errno;

/// What a frontend asks of a drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Read,
    Write,
    Flush,
    Trim,
    WriteZeroes,
    Cache,
    BlockStatus,
    Disconnect,
}

impl Command {
    /// The name used in messages and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Command::Read => "read",
            Command::Write => "write",
            Command::Flush => "flush",
            Command::Trim => "trim",
            Command::WriteZeroes => "write_zeroes",
            Command::Cache => "cache",
            Command::BlockStatus => "block_status",
            Command::Disconnect => "disc",
        }
    }

    /// Changes the drive's contents (refused on a read-only drive).
    pub fn changes_data(self) -> bool {
        matches!(self, Command::Write | Command::Trim | Command::WriteZeroes)
    }

    /// Has an offset and length that must lie within the drive.
    fn has_range(self) -> bool {
        !matches!(self, Command::Flush | Command::Disconnect)
    }

    /// Past the end, the drive has no room for it (ENOSPC) rather than the
    /// request being invalid (EINVAL).
    fn needs_room(self) -> bool {
        matches!(self, Command::Write | Command::WriteZeroes)
    }
}

/// A request as decoded by a frontend, not yet checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub command: Command,
    pub offset: u64,
    pub len: u64,
}

/// What the drive allows right now, read by the frontend just before it
/// validates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The drive's current size in bytes.
    pub size: u64,
    /// Whether changes are refused.
    pub read_only: bool,
    /// The longest READ or WRITE the frontend takes (its buffer bound).
    pub max_len: u64,
}

/// A request `validate` accepted: its range lies within the drive and the
/// drive allows it. Only `validate` makes one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Valid(Request);

impl Valid {
    pub fn request(&self) -> &Request {
        &self.0
    }
}

/// Why `validate` refused a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    ReadOnly,
    TooLong {
        command: Command,
        len: u64,
        max: u64,
    },
    PastEnd {
        command: Command,
        offset: u64,
        len: u64,
        size: u64,
    },
    ZeroLength(Command),
}

impl Refusal {
    /// The errno every frontend reports for it.
    pub fn errno(&self) -> Errno {
        match self {
            Refusal::ReadOnly => Errno::ReadOnly,
            Refusal::TooLong { .. } | Refusal::ZeroLength(_) => Errno::Inval,
            Refusal::PastEnd { command, .. } if command.needs_room() => Errno::NoSpace,
            Refusal::PastEnd { .. } => Errno::Inval,
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::ReadOnly => write!(f, "the drive is read-only"),
            Refusal::TooLong { command, len, max } => write!(
                f,
                "{} of {len} bytes exceeds the maximum of {max} bytes; split the request",
                command.name()
            ),
            Refusal::PastEnd {
                command,
                offset,
                len,
                size,
            } => write!(
                f,
                "{} at offset {offset} length {len} is beyond the end of the drive ({size} bytes)",
                command.name()
            ),
            Refusal::ZeroLength(command) => write!(f, "{} of zero bytes", command.name()),
        }
    }
}

/// Checks `req` against `limits`: access, length, range. The one set of
/// rules for every frontend.
#[inline]
pub fn validate(req: Request, limits: &Limits) -> Result<Valid, Refusal> {
    if req.command.changes_data() && limits.read_only {
        return Err(Refusal::ReadOnly);
    }
    if matches!(req.command, Command::Read | Command::Write) && req.len > limits.max_len {
        return Err(Refusal::TooLong {
            command: req.command,
            len: req.len,
            max: limits.max_len,
        });
    }
    if !req.command.has_range() {
        return Ok(Valid(req));
    }
    if req.command == Command::BlockStatus && req.len == 0 {
        return Err(Refusal::ZeroLength(req.command));
    }
    let in_range = req
        .offset
        .checked_add(req.len)
        .is_some_and(|end| end <= limits.size);
    if !in_range {
        return Err(Refusal::PastEnd {
            command: req.command,
            offset: req.offset,
            len: req.len,
            size: limits.size,
        });
    }
    Ok(Valid(req))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        size: 1000,
        read_only: false,
        max_len: 100,
    };

    fn req(command: Command, offset: u64, len: u64) -> Request {
        Request {
            command,
            offset,
            len,
        }
    }

    #[test]
    fn in_range_requests_pass_up_to_the_end() {
        for c in [
            Command::Read,
            Command::Write,
            Command::Trim,
            Command::WriteZeroes,
            Command::Cache,
            Command::BlockStatus,
        ] {
            assert!(validate(req(c, 900, 100), &LIMITS).is_ok(), "{c:?}");
        }
        // Zero-length reads and writes are valid (and no-ops).
        assert!(validate(req(Command::Read, 1000, 0), &LIMITS).is_ok());
    }

    #[test]
    fn past_the_end_is_enospc_for_writes_and_einval_for_the_rest() {
        let cases = [
            (Command::Write, Errno::NoSpace),
            (Command::WriteZeroes, Errno::NoSpace),
            (Command::Read, Errno::Inval),
            (Command::Trim, Errno::Inval),
            (Command::Cache, Errno::Inval),
            (Command::BlockStatus, Errno::Inval),
        ];
        for (c, errno) in cases {
            let r = validate(req(c, 901, 100), &LIMITS).unwrap_err();
            assert_eq!(r.errno(), errno, "{c:?}");
            assert!(r.to_string().contains("beyond the end"), "{r}");
            // Offsets that overflow are past the end too.
            let r = validate(req(c, u64::MAX, 2), &LIMITS).unwrap_err();
            assert_eq!(r.errno(), errno, "{c:?}");
        }
    }

    #[test]
    fn read_only_refuses_changes_only() {
        let ro = Limits {
            read_only: true,
            ..LIMITS
        };
        for c in [Command::Write, Command::Trim, Command::WriteZeroes] {
            assert_eq!(validate(req(c, 0, 1), &ro), Err(Refusal::ReadOnly));
        }
        for c in [Command::Read, Command::Flush, Command::Cache] {
            assert!(validate(req(c, 0, 1), &ro).is_ok(), "{c:?}");
        }
        assert_eq!(Refusal::ReadOnly.errno().nbd(), libc::EPERM as u32);
        assert_eq!(Refusal::ReadOnly.errno().fuse(), libc::EROFS);
    }

    #[test]
    fn too_long_and_zero_length_block_status_are_einval() {
        let r = validate(req(Command::Write, 0, 101), &LIMITS).unwrap_err();
        assert_eq!(r.errno(), Errno::Inval);
        assert!(r.to_string().contains("split the request"), "{r}");
        // Trims and zeroes carry no payload: any length within the drive.
        assert!(validate(req(Command::Trim, 0, 1000), &LIMITS).is_ok());
        let r = validate(req(Command::BlockStatus, 0, 0), &LIMITS).unwrap_err();
        assert_eq!(r.errno(), Errno::Inval);
    }

    #[test]
    fn flush_and_disconnect_have_no_range() {
        for c in [Command::Flush, Command::Disconnect] {
            assert!(validate(req(c, u64::MAX, u64::MAX), &LIMITS).is_ok());
        }
    }
}
