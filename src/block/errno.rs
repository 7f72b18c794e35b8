//! The one errno table: every refusal and backend error becomes one
//! [`Errno`], and each frontend reports that its own way: `nbd()` on the
//! wire (the protocol's eight values, which are Linux's), `fuse()` in a
//! FUSE reply. The two columns differ only where a file has a better word
//! than a block device: a read-only drive is EPERM over NBD (the spec's
//! value) and EROFS through the FUSE file. `ublk()` is what a ublk COMMIT
//! carries: only the errnos the kernel's block layer turns into a status of
//! their own (`errno_to_blk_status`: ENOSPC, EOPNOTSUPP, ENOMEM); every
//! other one would become EIO there anyway, so it is EIO here.
//! `nvme()` is the NVMe status a completion carries, as the kernel's
//! `NVME_SC_*` values write it (status code type in bits 10:8, Do Not Retry
//! 0x4000): the codes Linux turns into the matching block status (write
//! protected, capacity exceeded, invalid field, invalid opcode), DNR set
//! where a retry cannot succeed, clear for transient conditions.

use crate::block::backend::Error;

/// An error as every frontend reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Errno {
    /// The drive is read-only.
    ReadOnly,
    Perm,
    Io,
    NoMem,
    Inval,
    NoSpace,
    Overflow,
    NotSup,
    Shutdown,
}

impl Errno {
    /// The errno a backend error is reported as.
    pub fn of(e: &Error) -> Errno {
        match e {
            Error::OutOfRange { .. } => Errno::Inval,
            Error::NoSpace(_) | Error::HostShort => Errno::NoSpace,
            Error::ReadOnly => Errno::ReadOnly,
            Error::Invalid(_) => Errno::Inval,
            Error::NotSupported(_) => Errno::NotSup,
            Error::Io(e) => match e.raw_os_error() {
                Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EFBIG) => Errno::NoSpace,
                Some(libc::EPERM) | Some(libc::EROFS) => Errno::Perm,
                _ => Errno::Io,
            },
        }
    }

    /// The errno a FUSE reply carries.
    pub fn fuse(self) -> i32 {
        match self {
            Errno::ReadOnly => libc::EROFS,
            Errno::Perm => libc::EPERM,
            Errno::Io => libc::EIO,
            Errno::NoMem => libc::ENOMEM,
            Errno::Inval => libc::EINVAL,
            Errno::NoSpace => libc::ENOSPC,
            Errno::Overflow => libc::EOVERFLOW,
            Errno::NotSup => libc::ENOTSUP,
            Errno::Shutdown => libc::ESHUTDOWN,
        }
    }

    /// The (negative) result of a ublk COMMIT_AND_FETCH_REQ.
    pub fn ublk(self) -> i32 {
        -match self {
            Errno::NoSpace => libc::ENOSPC,
            Errno::NotSup => libc::EOPNOTSUPP,
            Errno::NoMem => libc::ENOMEM,
            _ => libc::EIO,
        }
    }

    /// The NVMe status (`NVME_SC_*` form: SCT << 8 | SC, DNR 0x4000).
    pub fn nvme(self) -> u16 {
        const DNR: u16 = 0x4000;
        match self {
            Errno::ReadOnly => DNR | 0x020, // namespace is write protected
            Errno::Perm => DNR | 0x286,     // media: access denied
            Errno::Io => 0x006,             // internal error, may retry
            Errno::NoMem => 0x006,          // internal error, may retry
            Errno::Inval => DNR | 0x002,    // invalid field in command
            Errno::NoSpace => DNR | 0x081,  // capacity exceeded
            Errno::Overflow => DNR | 0x080, // LBA out of range
            Errno::NotSup => DNR | 0x001,   // invalid command opcode
            Errno::Shutdown => 0x082,       // namespace not ready, retry
        }
    }

    /// The NBD protocol's value (the spec defines eight, numbered as
    /// Linux's).
    pub fn nbd(self) -> u32 {
        match self {
            Errno::ReadOnly => libc::EPERM as u32,
            other => other.fuse() as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nbd_values_are_the_specs() {
        let spec = [
            (Errno::ReadOnly, 1),
            (Errno::Perm, 1),
            (Errno::Io, 5),
            (Errno::NoMem, 12),
            (Errno::Inval, 22),
            (Errno::NoSpace, 28),
            (Errno::Overflow, 75),
            (Errno::NotSup, 95),
            (Errno::Shutdown, 108),
        ];
        for (e, v) in spec {
            assert_eq!(e.nbd(), v, "{e:?}");
        }
    }

    #[test]
    fn io_errors_keep_their_kind() {
        let io = |n| Error::Io(std::io::Error::from_raw_os_error(n));
        assert_eq!(Errno::of(&io(libc::EDQUOT)), Errno::NoSpace);
        assert_eq!(Errno::of(&io(libc::EROFS)), Errno::Perm);
        assert_eq!(Errno::of(&Error::ReadOnly).fuse(), libc::EROFS);
        assert_eq!(Errno::of(&io(libc::EBADF)), Errno::Io);
        assert_eq!(Errno::of(&Error::NoSpace("x".into())), Errno::NoSpace);
    }

    #[test]
    fn nvme_statuses_are_the_kernels_codes() {
        assert_eq!(Errno::ReadOnly.nvme(), 0x4020);
        assert_eq!(Errno::NoSpace.nvme(), 0x4081);
        assert_eq!(Errno::Inval.nvme(), 0x4002);
        assert_eq!(Errno::NotSup.nvme(), 0x4001);
        // Transient conditions leave DNR clear so the host retries.
        for e in [Errno::Io, Errno::NoMem, Errno::Shutdown] {
            assert_eq!(e.nvme() & 0x4000, 0, "{e:?}");
        }
    }

    #[test]
    fn ublk_results_are_negative_block_layer_errnos() {
        assert_eq!(Errno::NoSpace.ublk(), -libc::ENOSPC);
        assert_eq!(Errno::NotSup.ublk(), -libc::EOPNOTSUPP);
        assert_eq!(Errno::ReadOnly.ublk(), -libc::EIO);
        assert_eq!(Errno::Inval.ublk(), -libc::EIO);
    }
}
