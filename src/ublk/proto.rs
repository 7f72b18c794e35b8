//! The ublk UAPI (linux `include/uapi/linux/ublk_cmd.h`, as in 6.12) as
//! plain Rust: control and I/O command payloads, the device info and
//! parameter structs, the I/O descriptor the kernel writes per tag, and the
//! mapping of a descriptor to a `block::Request`. Pure: no I/O, no unsafe.
//!
//! Every struct is encoded and decoded field by field into little-endian
//! byte arrays of the kernel's exact size (checked by the unit tests
//! against the sizes and offsets in the header), so nothing here depends on
//! `repr(C)` layout.

use crate::block::{Command, Request};

/// `_IOC` encoding of the ublk commands (`'u'` type, the payload's size).
const fn ioc(dir: u32, nr: u32, size: u32) -> u32 {
    (dir << 30) | (size << 16) | ((b'u' as u32) << 8) | nr
}
const IOC_READ: u32 = 2;
const IOC_WRITE: u32 = 1;
const fn ior(nr: u32, size: u32) -> u32 {
    ioc(IOC_READ, nr, size)
}
const fn iowr(nr: u32, size: u32) -> u32 {
    ioc(IOC_READ | IOC_WRITE, nr, size)
}

/// Size of `struct ublksrv_ctrl_cmd`.
pub const CTRL_CMD_BYTES: usize = 32;
/// Size of `struct ublksrv_io_cmd`.
pub const IO_CMD_BYTES: usize = 16;
/// Size of `struct ublksrv_io_desc`.
pub const IO_DESC_BYTES: usize = 24;
/// Size of `struct ublksrv_ctrl_dev_info`.
pub const DEV_INFO_BYTES: usize = 64;

/// Control commands (ioctl-encoded: `UBLK_F_CMD_IOCTL_ENCODE`).
pub mod ctrl {
    use crate::ublk::proto::{ior, iowr, CTRL_CMD_BYTES};
    const S: u32 = CTRL_CMD_BYTES as u32;
    pub const GET_DEV_INFO: u32 = ior(0x02, S);
    pub const ADD_DEV: u32 = iowr(0x04, S);
    pub const DEL_DEV: u32 = iowr(0x05, S);
    pub const START_DEV: u32 = iowr(0x06, S);
    pub const STOP_DEV: u32 = iowr(0x07, S);
    pub const SET_PARAMS: u32 = iowr(0x08, S);
    pub const GET_PARAMS: u32 = ior(0x09, S);
    pub const START_USER_RECOVERY: u32 = iowr(0x10, S);
    pub const END_USER_RECOVERY: u32 = iowr(0x11, S);
    pub const GET_FEATURES: u32 = ior(0x13, S);
    /// 6.16+ (devices added with `flags::UPDATE_SIZE`): `data[0]` is the
    /// new size in 512-byte sectors.
    pub const UPDATE_SIZE: u32 = iowr(0x15, S);
}

/// I/O commands on `/dev/ublkcN` (ioctl-encoded).
pub mod io {
    use crate::ublk::proto::{iowr, IO_CMD_BYTES};
    const S: u32 = IO_CMD_BYTES as u32;
    pub const FETCH_REQ: u32 = iowr(0x20, S);
    pub const COMMIT_AND_FETCH_REQ: u32 = iowr(0x21, S);
}

/// `res` of a completed FETCH/COMMIT_AND_FETCH: a request is waiting in
/// the tag's descriptor.
pub const IO_RES_OK: i32 = 0;
/// `res`: the kernel wants the buffer address first (NEED_GET_DATA; we do
/// not ask for it, so it never comes).
pub const IO_RES_NEED_GET_DATA: i32 = 1;
/// `res`: the queue is going away (stop, or the device is deleted).
pub const IO_RES_ABORT: i32 = -libc::ENODEV;

/// Feature flags (`ublksrv_ctrl_dev_info.flags`).
pub mod flags {
    pub const SUPPORT_ZERO_COPY: u64 = 1 << 0;
    pub const URING_CMD_COMP_IN_TASK: u64 = 1 << 1;
    pub const NEED_GET_DATA: u64 = 1 << 2;
    pub const USER_RECOVERY: u64 = 1 << 3;
    pub const USER_RECOVERY_REISSUE: u64 = 1 << 4;
    pub const UNPRIVILEGED_DEV: u64 = 1 << 5;
    pub const CMD_IOCTL_ENCODE: u64 = 1 << 6;
    pub const USER_COPY: u64 = 1 << 7;
    pub const ZONED: u64 = 1 << 8;
    /// 6.16+: `UBLK_F_UPDATE_SIZE` (UBLK_CMD_UPDATE_SIZE resizes a live
    /// device).
    pub const UPDATE_SIZE: u64 = 1 << 10;
}

/// Device states (`ublksrv_ctrl_dev_info.state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DevState {
    Dead,
    Live,
    /// Its server died; I/O is held until a new one recovers it.
    Quiesced,
    FailIo,
    Other(u16),
}

impl DevState {
    pub fn from_raw(v: u16) -> DevState {
        match v {
            0 => DevState::Dead,
            1 => DevState::Live,
            2 => DevState::Quiesced,
            3 => DevState::FailIo,
            n => DevState::Other(n),
        }
    }
}

/// `struct ublksrv_ctrl_cmd`: the 32 bytes of every control command.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CtrlCmd {
    pub dev_id: u32,
    pub queue_id: u16,
    /// Length of the buffer at `addr`.
    pub len: u16,
    pub addr: u64,
    pub data: u64,
    pub dev_path_len: u16,
}

impl CtrlCmd {
    /// The 80-byte SQE128 command area the control command travels in.
    pub fn encode(&self) -> [u8; 80] {
        let mut b = [0u8; 80];
        b[0..4].copy_from_slice(&self.dev_id.to_le_bytes());
        b[4..6].copy_from_slice(&self.queue_id.to_le_bytes());
        b[6..8].copy_from_slice(&self.len.to_le_bytes());
        b[8..16].copy_from_slice(&self.addr.to_le_bytes());
        b[16..24].copy_from_slice(&self.data.to_le_bytes());
        b[24..26].copy_from_slice(&self.dev_path_len.to_le_bytes());
        b
    }
}

/// `struct ublksrv_io_cmd`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoCmd {
    pub q_id: u16,
    pub tag: u16,
    /// For COMMIT: bytes done, or a negative errno.
    pub result: i32,
    /// The tag's buffer (copy mode: the kernel copies the request's data
    /// to or from it).
    pub addr: u64,
}

impl IoCmd {
    pub fn encode(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..2].copy_from_slice(&self.q_id.to_le_bytes());
        b[2..4].copy_from_slice(&self.tag.to_le_bytes());
        b[4..8].copy_from_slice(&self.result.to_le_bytes());
        b[8..16].copy_from_slice(&self.addr.to_le_bytes());
        b
    }
}

/// `struct ublksrv_ctrl_dev_info`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DevInfo {
    pub nr_hw_queues: u16,
    pub queue_depth: u16,
    pub state: u16,
    pub max_io_buf_bytes: u32,
    pub dev_id: u32,
    pub ublksrv_pid: i32,
    pub flags: u64,
    pub ublksrv_flags: u64,
    pub owner_uid: u32,
    pub owner_gid: u32,
}

impl DevInfo {
    pub fn encode(&self) -> [u8; DEV_INFO_BYTES] {
        let mut b = [0u8; DEV_INFO_BYTES];
        b[0..2].copy_from_slice(&self.nr_hw_queues.to_le_bytes());
        b[2..4].copy_from_slice(&self.queue_depth.to_le_bytes());
        b[4..6].copy_from_slice(&self.state.to_le_bytes());
        b[8..12].copy_from_slice(&self.max_io_buf_bytes.to_le_bytes());
        b[12..16].copy_from_slice(&self.dev_id.to_le_bytes());
        b[16..20].copy_from_slice(&self.ublksrv_pid.to_le_bytes());
        b[24..32].copy_from_slice(&self.flags.to_le_bytes());
        b[32..40].copy_from_slice(&self.ublksrv_flags.to_le_bytes());
        b[40..44].copy_from_slice(&self.owner_uid.to_le_bytes());
        b[44..48].copy_from_slice(&self.owner_gid.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; DEV_INFO_BYTES]) -> DevInfo {
        let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        DevInfo {
            nr_hw_queues: u16_at(0),
            queue_depth: u16_at(2),
            state: u16_at(4),
            max_io_buf_bytes: u32_at(8),
            dev_id: u32_at(12),
            ublksrv_pid: u32_at(16) as i32,
            flags: u64_at(24),
            ublksrv_flags: u64_at(32),
            owner_uid: u32_at(40),
            owner_gid: u32_at(44),
        }
    }

    pub fn state(&self) -> DevState {
        DevState::from_raw(self.state)
    }
}

/// Attribute bits of `ublk_param_basic.attrs`.
pub mod attr {
    pub const READ_ONLY: u32 = 1 << 0;
    pub const ROTATIONAL: u32 = 1 << 1;
    pub const VOLATILE_CACHE: u32 = 1 << 2;
    pub const FUA: u32 = 1 << 3;
}

/// Parameter types present (`ublk_params.types`).
pub const PARAM_TYPE_BASIC: u32 = 1 << 0;
pub const PARAM_TYPE_DISCARD: u32 = 1 << 1;

/// Bytes of `struct ublk_params` we send: the header, basic and discard
/// (the kernel takes a prefix: `len` says how much).
pub const PARAMS_BYTES: usize = 8 + 32 + 20;

/// The device's parameters: `ublk_param_basic` and `ublk_param_discard`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Params {
    pub attrs: u32,
    pub logical_bs_shift: u8,
    pub physical_bs_shift: u8,
    pub io_opt_shift: u8,
    pub io_min_shift: u8,
    pub max_sectors: u32,
    pub dev_sectors: u64,
    /// 0: no discard parameters (the device takes no DISCARD).
    pub discard_granularity: u32,
    pub max_discard_sectors: u32,
    pub max_write_zeroes_sectors: u32,
}

impl Params {
    /// What a drive of `size` bytes looks like as a ublk device: 512-byte
    /// logical blocks (any offset a filesystem may use), 4 KiB physical
    /// blocks (the store's page), requests up to `max_io_bytes`, a
    /// volatile write cache with FUA (so the kernel sends FLUSH and FUA:
    /// they carry the drive's durability promise), DISCARD and
    /// WRITE_ZEROES freeing whole pages.
    pub fn for_drive(size: u64, read_only: bool, max_io_bytes: u32) -> Params {
        let mut attrs = attr::VOLATILE_CACHE | attr::FUA;
        if read_only {
            attrs |= attr::READ_ONLY;
        }
        Params {
            attrs,
            logical_bs_shift: 9,
            physical_bs_shift: 12,
            io_opt_shift: 12,
            io_min_shift: 12,
            max_sectors: max_io_bytes >> 9,
            dev_sectors: size >> 9,
            discard_granularity: 4096,
            max_discard_sectors: u32::MAX >> 9,
            max_write_zeroes_sectors: u32::MAX >> 9,
        }
    }

    pub fn encode(&self) -> [u8; PARAMS_BYTES] {
        let mut b = [0u8; PARAMS_BYTES];
        let mut types = PARAM_TYPE_BASIC;
        if self.discard_granularity != 0 {
            types |= PARAM_TYPE_DISCARD;
        }
        b[0..4].copy_from_slice(&(PARAMS_BYTES as u32).to_le_bytes());
        b[4..8].copy_from_slice(&types.to_le_bytes());
        // basic at 8
        b[8..12].copy_from_slice(&self.attrs.to_le_bytes());
        b[12] = self.logical_bs_shift;
        b[13] = self.physical_bs_shift;
        b[14] = self.io_opt_shift;
        b[15] = self.io_min_shift;
        b[16..20].copy_from_slice(&self.max_sectors.to_le_bytes());
        // chunk_sectors 20..24 = 0
        b[24..32].copy_from_slice(&self.dev_sectors.to_le_bytes());
        // virt_boundary_mask 32..40 = 0
        // discard at 40
        // discard_alignment 40..44 = 0
        b[44..48].copy_from_slice(&self.discard_granularity.to_le_bytes());
        b[48..52].copy_from_slice(&self.max_discard_sectors.to_le_bytes());
        b[52..56].copy_from_slice(&self.max_write_zeroes_sectors.to_le_bytes());
        // One segment: the only kind the kernel takes so far.
        let segments: u16 = if self.discard_granularity != 0 { 1 } else { 0 };
        b[56..58].copy_from_slice(&segments.to_le_bytes());
        b
    }
}

/// Request ops (`ublksrv_io_desc.op_flags & 0xff`).
pub mod op {
    pub const READ: u8 = 0;
    pub const WRITE: u8 = 1;
    pub const FLUSH: u8 = 2;
    pub const DISCARD: u8 = 3;
    pub const WRITE_SAME: u8 = 4;
    pub const WRITE_ZEROES: u8 = 5;
}

/// Request flags (`ublksrv_io_desc.op_flags >> 8`, as their bits in
/// `op_flags`).
pub const IO_F_FUA: u32 = 1 << 13;
pub const IO_F_NOUNMAP: u32 = 1 << 15;

/// `struct ublksrv_io_desc`: what the kernel asks of one tag.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoDesc {
    pub op_flags: u32,
    pub nr_sectors: u32,
    pub start_sector: u64,
    pub addr: u64,
}

impl IoDesc {
    pub fn decode(b: &[u8; IO_DESC_BYTES]) -> IoDesc {
        IoDesc {
            op_flags: u32::from_le_bytes(b[0..4].try_into().expect("4 bytes")),
            nr_sectors: u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")),
            start_sector: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            addr: u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")),
        }
    }

    pub fn op(&self) -> u8 {
        (self.op_flags & 0xff) as u8
    }

    pub fn fua(&self) -> bool {
        self.op_flags & IO_F_FUA != 0
    }

    /// WRITE_ZEROES that must keep the range allocated.
    pub fn no_unmap(&self) -> bool {
        self.op_flags & IO_F_NOUNMAP != 0
    }

    /// The request as every frontend decodes it, or None for an op ramd
    /// does not serve (zoned ops, WRITE_SAME: the device never advertises
    /// them; answered EOPNOTSUPP).
    pub fn request(&self) -> Option<Request> {
        let command = match self.op() {
            op::READ => Command::Read,
            op::WRITE => Command::Write,
            op::FLUSH => Command::Flush,
            op::DISCARD => Command::Trim,
            op::WRITE_ZEROES => Command::WriteZeroes,
            _ => return None,
        };
        let (offset, len) = if command == Command::Flush {
            (0, 0)
        } else {
            (
                self.start_sector.checked_mul(512)?,
                u64::from(self.nr_sectors) * 512,
            )
        };
        Some(Request {
            command,
            offset,
            len,
        })
    }
}

/// Offset in `/dev/ublkcN` of queue `q`'s descriptor array (mmap it):
/// the kernel gives every queue a slot sized for the maximum depth.
pub fn desc_mmap_offset(q: u16, page: usize) -> u64 {
    let max_per_queue = (UBLK_MAX_QUEUE_DEPTH * IO_DESC_BYTES).div_ceil(page) * page;
    q as u64 * max_per_queue as u64
}

/// Bytes of one queue's descriptor array, rounded to pages.
pub fn desc_mmap_bytes(depth: u16, page: usize) -> usize {
    (depth as usize * IO_DESC_BYTES).div_ceil(page) * page
}

/// The kernel's limit on a queue's depth.
pub const UBLK_MAX_QUEUE_DEPTH: usize = 4096;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_numbers_are_the_kernels() {
        // Values from ublk_cmd.h as compiled (sizes 32 and 16).
        assert_eq!(ctrl::ADD_DEV, 0xc020_7504);
        assert_eq!(ctrl::GET_DEV_INFO, 0x8020_7502);
        assert_eq!(ctrl::START_USER_RECOVERY, 0xc020_7510);
        assert_eq!(ctrl::GET_FEATURES, 0x8020_7513);
        assert_eq!(ctrl::UPDATE_SIZE, 0xc020_7515);
        assert_eq!(io::FETCH_REQ, 0xc010_7520);
        assert_eq!(io::COMMIT_AND_FETCH_REQ, 0xc010_7521);
    }

    #[test]
    fn dev_info_round_trips_at_the_kernels_offsets() {
        let d = DevInfo {
            nr_hw_queues: 2,
            queue_depth: 128,
            state: 2,
            max_io_buf_bytes: 1 << 19,
            dev_id: 7,
            ublksrv_pid: 1234,
            flags: flags::USER_RECOVERY | flags::CMD_IOCTL_ENCODE,
            ublksrv_flags: 0,
            owner_uid: 1,
            owner_gid: 2,
        };
        let b = d.encode();
        assert_eq!(&b[12..16], &7u32.to_le_bytes());
        assert_eq!(&b[24..32], &(0x48u64).to_le_bytes());
        assert_eq!(DevInfo::decode(&b), d);
        assert_eq!(DevInfo::decode(&b).state(), DevState::Quiesced);
    }

    #[test]
    fn ctrl_and_io_commands_are_laid_out_as_the_kernel_reads_them() {
        let c = CtrlCmd {
            dev_id: u32::MAX,
            queue_id: u16::MAX,
            len: 64,
            addr: 0x1122_3344_5566_7788,
            data: 99,
            dev_path_len: 0,
        };
        let b = c.encode();
        assert_eq!(&b[0..4], &[0xff; 4]);
        assert_eq!(&b[6..8], &64u16.to_le_bytes());
        assert_eq!(&b[8..16], &0x1122_3344_5566_7788u64.to_le_bytes());
        assert_eq!(&b[16..24], &99u64.to_le_bytes());
        assert!(b[32..].iter().all(|&x| x == 0));
        let io = IoCmd {
            q_id: 1,
            tag: 3,
            result: -5,
            addr: 0x1000,
        }
        .encode();
        assert_eq!(
            &io[..],
            &[1, 0, 3, 0, 0xfb, 0xff, 0xff, 0xff, 0, 0x10, 0, 0, 0, 0, 0, 0]
        );
    }

    #[test]
    fn params_carry_size_blocks_and_discard() {
        let p = Params::for_drive(1 << 30, true, 1 << 19);
        let b = p.encode();
        assert_eq!(&b[0..4], &60u32.to_le_bytes());
        assert_eq!(&b[4..8], &3u32.to_le_bytes());
        assert_eq!(b[8] & attr::READ_ONLY as u8, 1);
        assert_eq!((b[12], b[13]), (9, 12));
        assert_eq!(&b[16..20], &1024u32.to_le_bytes());
        assert_eq!(&b[24..32], &(2u64 << 20).to_le_bytes());
        assert_eq!(&b[44..48], &4096u32.to_le_bytes());
        assert_eq!(&b[56..58], &1u16.to_le_bytes());
        let rw = Params::for_drive(4096, false, 1 << 19);
        assert_eq!(rw.attrs & attr::READ_ONLY, 0);
        assert_ne!(rw.attrs & attr::FUA, 0);
    }

    #[test]
    fn descriptors_become_block_requests() {
        let mut b = [0u8; IO_DESC_BYTES];
        b[0..4].copy_from_slice(&(u32::from(op::WRITE) | IO_F_FUA).to_le_bytes());
        b[4..8].copy_from_slice(&8u32.to_le_bytes());
        b[8..16].copy_from_slice(&16u64.to_le_bytes());
        let d = IoDesc::decode(&b);
        assert!(d.fua());
        assert_eq!(
            d.request(),
            Some(Request {
                command: Command::Write,
                offset: 8192,
                len: 4096
            })
        );
        let flush = IoDesc {
            op_flags: op::FLUSH.into(),
            start_sector: 5,
            nr_sectors: 5,
            addr: 0,
        };
        assert_eq!(flush.request().map(|r| (r.offset, r.len)), Some((0, 0)));
        let zeroes = IoDesc {
            op_flags: u32::from(op::WRITE_ZEROES) | IO_F_NOUNMAP,
            ..flush
        };
        assert!(zeroes.no_unmap());
        assert_eq!(zeroes.request().unwrap().command, Command::WriteZeroes);
        let same = IoDesc {
            op_flags: op::WRITE_SAME.into(),
            ..flush
        };
        assert_eq!(same.request(), None);
        // A start sector that overflows a byte offset is refused, not wrapped.
        let huge = IoDesc {
            op_flags: op::READ.into(),
            start_sector: u64::MAX / 2,
            ..flush
        };
        assert_eq!(huge.request(), None);
        assert_eq!(desc_mmap_offset(1, 4096), 24 * 4096);
    }
}
