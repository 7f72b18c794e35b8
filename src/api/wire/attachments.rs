//! `/v1/attachments`: drives exposed as files through FUSE.
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
    /// Absolute path of an existing directory: empty, not a mount point,
    /// not `/`.
    pub mountpoint: String,
    /// Attach over a non-empty directory or a mount point anyway (never
    /// over `/`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force: bool,
}

/// An attachment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachmentInfo {
    pub id: u64,
    pub drive: String,
    pub mountpoint: String,
    /// The file to hand to losetup.
    pub file: String,
    /// How the kernel's requests reach the drive: "fuse-classic" (threads
    /// on /dev/fuse) or "fuse-uring" (FUSE over io_uring).
    pub path: String,
    /// Queue threads (classic) or rings (io_uring) serving the mount.
    pub queues: u32,
}

/// `GET /v1/attachments`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AttachmentList {
    pub attachments: Vec<AttachmentInfo>,
}
