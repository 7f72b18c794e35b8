//! `/v1/attachments`: drives exposed as files through FUSE, or as ublk
//! block devices.
//!
//! Request bodies reject unknown fields, so a typo is an error, not a
//! silent no-op (and fields added later are refused by older daemons, not
//! ignored). docs/openapi.yaml describes the same shapes.

use serde::{Deserialize, Serialize};

/// `POST /v1/attachments`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateAttachment {
    pub drive: String,
    /// FUSE: absolute path of an existing directory: empty, not a mount
    /// point, not `/`. ublk: none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mountpoint: String,
    /// "fuse" (the default: a file under `mountpoint`) or "ublk" (a block
    /// device /dev/ublkbN).
    #[serde(default, skip_serializing_if = "AttachKind::is_fuse")]
    pub kind: AttachKind,
    /// Attach over a non-empty directory or a mount point anyway (never
    /// over `/`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force: bool,
}

/// How a drive is attached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttachKind {
    /// A file through FUSE (`ramd attach NAME MOUNTPOINT`).
    #[default]
    Fuse,
    /// A ublk block device (`ramd attach NAME --ublk`).
    Ublk,
}

impl AttachKind {
    pub fn is_fuse(&self) -> bool {
        *self == AttachKind::Fuse
    }
}

/// An attachment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachmentInfo {
    pub id: u64,
    pub drive: String,
    #[serde(default)]
    pub kind: AttachKind,
    /// FUSE: where the file is mounted; ublk: empty.
    pub mountpoint: String,
    /// FUSE: the file to hand to losetup; ublk: the block device.
    pub file: String,
    /// How the kernel's requests reach the drive: "fuse-classic" (threads
    /// on /dev/fuse), "fuse-uring" (FUSE over io_uring) or "ublk".
    pub path: String,
    /// Queue threads (classic) or rings (io_uring) serving the mount.
    pub queues: u32,
}

/// `GET /v1/attachments`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AttachmentList {
    pub attachments: Vec<AttachmentInfo>,
}
