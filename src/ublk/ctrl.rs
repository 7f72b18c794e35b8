//! `/dev/ublk-control`: adding, starting, stopping, deleting and
//! recovering devices. Each command is one `IORING_OP_URING_CMD` on a
//! small SQE128 ring of its own (START_DEV and END_USER_RECOVERY complete
//! only once every queue has fetched its tags, so a command may wait;
//! separate rings let commands for different devices wait side by side).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;

use io_uring::{cqueue, opcode, squeue, types, IoUring};

use super::error::UblkError;
use super::proto::{self, CtrlCmd, DevInfo, Params, DEV_INFO_BYTES};

/// The control device's path.
pub const CONTROL: &str = "/dev/ublk-control";

/// An open `/dev/ublk-control`.
pub struct Control {
    file: File,
}

impl Control {
    /// Opens the control device, with a precise error when the module is
    /// not loaded or the caller may not use it.
    pub fn open() -> Result<Control, UblkError> {
        match OpenOptions::new().read(true).write(true).open(CONTROL) {
            Ok(file) => Ok(Control { file }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(UblkError::NoModule),
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                Err(UblkError::NotPermitted(e))
            }
            Err(e) => Err(UblkError::Control {
                what: "open /dev/ublk-control",
                source: e,
            }),
        }
    }

    /// Runs one control command and returns its result (>= 0).
    fn run(&self, what: &'static str, op: u32, cmd: CtrlCmd) -> Result<i32, UblkError> {
        let failed = |source| UblkError::Control { what, source };
        let mut ring: IoUring<squeue::Entry128, cqueue::Entry> =
            IoUring::builder().build(2).map_err(failed)?;
        let sqe = opcode::UringCmd80::new(types::Fd(self.file.as_raw_fd()), op)
            .cmd(cmd.encode())
            .build()
            .user_data(1);
        // SAFETY: the command's buffer (`cmd.addr`, when set) is owned by
        // the caller and outlives this call, which waits for the
        // completion before it returns.
        unsafe { ring.submission().push(&sqe) }
            .map_err(|_| failed(io::Error::other("submission queue full")))?;
        loop {
            match ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(failed(e)),
            }
            if let Some(cqe) = ring.completion().next() {
                let res = cqe.result();
                if res < 0 {
                    return Err(failed(io::Error::from_raw_os_error(-res)));
                }
                return Ok(res);
            }
        }
    }

    /// Adds a device: the kernel picks its id (returned in the info).
    pub fn add(&self, info: &DevInfo) -> Result<DevInfo, UblkError> {
        let mut buf = info.encode();
        self.run(
            "ADD_DEV",
            proto::ctrl::ADD_DEV,
            CtrlCmd {
                dev_id: info.dev_id,
                queue_id: u16::MAX,
                len: DEV_INFO_BYTES as u16,
                addr: buf.as_mut_ptr() as u64,
                ..CtrlCmd::default()
            },
        )?;
        Ok(DevInfo::decode(&buf))
    }

    /// The device's info (its state: live, quiesced after its server
    /// died, ...), or `Ok(None)` when there is no such device.
    pub fn info(&self, dev_id: u32) -> Result<Option<DevInfo>, UblkError> {
        let mut buf = [0u8; DEV_INFO_BYTES];
        let r = self.run(
            "GET_DEV_INFO",
            proto::ctrl::GET_DEV_INFO,
            CtrlCmd {
                dev_id,
                queue_id: u16::MAX,
                len: DEV_INFO_BYTES as u16,
                addr: buf.as_mut_ptr() as u64,
                ..CtrlCmd::default()
            },
        );
        match r {
            Ok(_) => Ok(Some(DevInfo::decode(&buf))),
            Err(UblkError::Control { source, .. })
                if source.raw_os_error() == Some(libc::ENODEV) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    pub fn set_params(&self, dev_id: u32, params: &Params) -> Result<(), UblkError> {
        let mut buf = params.encode();
        self.run(
            "SET_PARAMS",
            proto::ctrl::SET_PARAMS,
            CtrlCmd {
                dev_id,
                queue_id: u16::MAX,
                len: buf.len() as u16,
                addr: buf.as_mut_ptr() as u64,
                ..CtrlCmd::default()
            },
        )
        .map(drop)
    }

    /// A command naming the device and this process (START_DEV,
    /// END_USER_RECOVERY) or just the device.
    fn simple(&self, what: &'static str, op: u32, dev_id: u32, data: u64) -> Result<(), UblkError> {
        self.run(
            what,
            op,
            CtrlCmd {
                dev_id,
                queue_id: u16::MAX,
                data,
                ..CtrlCmd::default()
            },
        )
        .map(drop)
    }

    /// The driver's features (`flags::*` bits it supports): asked before
    /// a device is added, so only known flags are asked for.
    pub fn features(&self) -> Result<u64, UblkError> {
        let mut buf = [0u8; 8];
        self.run(
            "GET_FEATURES",
            proto::ctrl::GET_FEATURES,
            CtrlCmd {
                dev_id: u32::MAX,
                queue_id: u16::MAX,
                len: buf.len() as u16,
                addr: buf.as_mut_ptr() as u64,
                ..CtrlCmd::default()
            },
        )?;
        Ok(u64::from_le_bytes(buf))
    }

    /// Gives a live device a new size (`sectors` of 512 bytes): the kernel
    /// updates the disk's capacity and tells user space (a uevent), so
    /// `blockdev --getsize64` and filesystems see it at once. Needs a
    /// device added with `flags::UPDATE_SIZE`.
    pub fn update_size(&self, dev_id: u32, sectors: u64) -> Result<(), UblkError> {
        self.simple("UPDATE_SIZE", proto::ctrl::UPDATE_SIZE, dev_id, sectors)
    }

    /// Starts the device: returns once every queue has fetched its tags
    /// and /dev/ublkbN exists.
    pub fn start(&self, dev_id: u32) -> Result<(), UblkError> {
        let pid = std::process::id() as u64;
        self.simple("START_DEV", proto::ctrl::START_DEV, dev_id, pid)
    }

    /// Removes /dev/ublkbN (I/O still queued fails); the queues' fetches
    /// complete with `IO_RES_ABORT`.
    pub fn stop(&self, dev_id: u32) -> Result<(), UblkError> {
        self.simple("STOP_DEV", proto::ctrl::STOP_DEV, dev_id, 0)
    }

    /// Deletes the device; returns once its char device is released.
    pub fn delete(&self, dev_id: u32) -> Result<(), UblkError> {
        self.simple("DEL_DEV", proto::ctrl::DEL_DEV, dev_id, 0)
    }

    /// Starts recovering a quiesced device (EBUSY until the old server's
    /// char device is released and the device is quiesced).
    pub fn start_recovery(&self, dev_id: u32) -> Result<(), UblkError> {
        self.simple(
            "START_USER_RECOVERY",
            proto::ctrl::START_USER_RECOVERY,
            dev_id,
            0,
        )
    }

    /// Ends recovery: returns once every queue has fetched its tags; the
    /// held I/O is then served by this process.
    pub fn end_recovery(&self, dev_id: u32) -> Result<(), UblkError> {
        let pid = std::process::id() as u64;
        self.simple(
            "END_USER_RECOVERY",
            proto::ctrl::END_USER_RECOVERY,
            dev_id,
            pid,
        )
    }
}
