//! Why a ublk attach, detach or recovery failed.

use std::io;

/// Why a ublk attach, detach or recovery failed.
#[derive(Debug, thiserror::Error)]
pub enum UblkError {
    /// /dev/ublk-control is missing.
    #[error("the ublk driver is not loaded (no /dev/ublk-control): run `modprobe ublk_drv` as root (Linux 6.0+, CONFIG_BLK_DEV_UBLK), or use `ramd attach NAME MOUNTPOINT` (FUSE + loop), which needs no module")]
    NoModule,
    /// /dev/ublk-control exists but this user may not use it.
    #[error("cannot open /dev/ublk-control: {0}; ublk devices need root (run the daemon as root), unless udev rules give users the control device for unprivileged devices")]
    NotPermitted(#[source] io::Error),
    /// A control command failed.
    #[error("ublk {what} failed: {source}")]
    Control {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// The device's char device could not be opened or served.
    #[error("ublk device {dev}: {source}")]
    Device {
        dev: String,
        #[source]
        source: io::Error,
    },
    /// The drive is already a ublk device.
    #[error("drive '{drive}' is already attached as {device}; run `ramd detach {drive}` first")]
    AlreadyAttached { drive: String, device: String },
    /// No ublk device has this id.
    #[error("no ublk attachment {0} (see `ramd attach --list`)")]
    NotFound(u64),
    /// The device is mounted, held or open.
    #[error("{device} is in use ({why}); unmount it and close it first, or detach with --force (I/O on it then fails)")]
    Busy { device: String, why: String },
    /// The drive serves nothing now.
    #[error("'{0}' is not serving now")]
    NotServing(String),
}
