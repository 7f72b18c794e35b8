//! FUSE attachments (`ramd attach`) kept across restarts of the serving
//! process (issue 31, docs/restart.md).
//!
//! Under a supervisor (or systemd's descriptor store) every new
//! attachment's session goes to the keeper as `attach/MOUNTPOINT`: every
//! queue's `/dev/fuse` descriptor (the kernel ends the requests of a
//! descriptor closed for good, not of one a keeper still holds) and how
//! to recognise the mount. When the serving process dies the mount stays
//! connected and its I/O waits; the next process, once the drives (and
//! caches) are back, resumes each session whose mount is still there
//! (`fuse::session::resume`: the kernel is asked to send again what the
//! dead process had read and not answered, `FUSE_NOTIFY_RESEND`, Linux
//! 6.9+). An upgrade leaves the mounts for the next process the same way.
//! A detach forgets the entry; one whose mount is gone, or whose drive is
//! not there any more, is forgotten at start (its descriptors closed: the
//! kernel then ends the session).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::fuse::{Attachable, AttachmentInfo, Attachments, KeptSession, SessionKeeper};
use crate::handover::serving::{self, Entry, ATTACH_PREFIX};

/// The blob's layout version.
const BLOB_VERSION: u32 = 1;

/// What a kept session's entry says of its attachment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Blob {
    version: u32,
    drive: String,
    mountpoint: PathBuf,
    mount_id: Option<u64>,
    dev: Option<u64>,
}

/// The entry's key: the mount's id and the mountpoint (an attachment
/// made over a kept one at the same place has its own).
fn key(mountpoint: &Path, mount_id: Option<u64>) -> String {
    format!(
        "{ATTACH_PREFIX}{}/{}",
        mount_id.unwrap_or(0),
        mountpoint.display()
    )
}

/// Sends sessions to the keeper.
struct Keeper;

impl SessionKeeper for Keeper {
    fn keep(&self, info: &AttachmentInfo, session: &KeptSession) {
        let Some(s) = serving::get() else { return };
        let blob = Blob {
            version: BLOB_VERSION,
            drive: info.drive.clone(),
            mountpoint: info.mountpoint.clone(),
            mount_id: session.mount_id,
            dev: session.dev,
        };
        let bytes = match serde_json::to_vec(&blob) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(drive = %info.drive, "the attachment at {} cannot be kept (a restart would end it): {e}", info.mountpoint.display());
                return;
            }
        };
        let fds: Vec<_> = session.fds.iter().map(std::os::fd::AsFd::as_fd).collect();
        if let Err(e) = s.put(&key(&info.mountpoint, session.mount_id), &bytes, &fds) {
            tracing::error!(drive = %info.drive, "the keeper could not be told about the attachment at {} (a restart would end it): {e}", info.mountpoint.display());
        }
    }

    fn forget(&self, mountpoint: &Path, mount_id: Option<u64>) {
        if let Some(s) = serving::get() {
            let _ = s.forget(&key(mountpoint, mount_id));
        }
    }
}

/// The daemon's attachments: under a keeper, keeping their sessions.
pub fn attachments() -> Attachments {
    let a = Attachments::new();
    if serving::get().is_some() {
        a.set_keeper(Arc::new(Keeper));
    }
    a
}

/// Why a kept session is not served again.
#[derive(Debug, thiserror::Error)]
enum ResumeError {
    #[error("its settings are not readable: {0}")]
    Blob(#[from] serde_json::Error),
    #[error("its settings are version {0}, this ramd reads version {BLOB_VERSION}")]
    Version(u32),
    #[error("drive '{0}' is not there")]
    NoDrive(String),
    #[error("{0} is not mounted any more")]
    Unmounted(PathBuf),
    #[error(transparent)]
    Attach(crate::fuse::AttachError),
}

/// Resumes every kept session whose mount and drive are still there
/// (`lookup` finds a drive or cache by name, waiting for a restore);
/// forgets the others.
pub fn resume(attachments: &Attachments, lookup: &dyn Fn(&str) -> Option<Arc<dyn Attachable>>) {
    let Some(serving) = serving::get() else {
        return;
    };
    for entry in serving.take_kept(ATTACH_PREFIX) {
        let key = entry.key.clone();
        if let Err(why) = resume_one(attachments, lookup, entry) {
            tracing::warn!(entry = %key, "an attachment kept across the restart is not served again: {why}");
            let _ = serving.forget(&key);
        }
    }
}

fn resume_one(
    attachments: &Attachments,
    lookup: &dyn Fn(&str) -> Option<Arc<dyn Attachable>>,
    entry: Entry,
) -> Result<(), ResumeError> {
    let blob: Blob = serde_json::from_slice(&entry.blob)?;
    if blob.version != BLOB_VERSION {
        return Err(ResumeError::Version(blob.version));
    }
    let Some(drive) = lookup(&blob.drive) else {
        // Nothing will serve the mount again: it goes, not left ENOTCONN.
        attachments.drop_kept_mount(&blob.drive, &blob.mountpoint, blob.mount_id);
        return Err(ResumeError::NoDrive(blob.drive));
    };
    let session = KeptSession {
        fds: entry.fds,
        mount_id: blob.mount_id,
        dev: blob.dev,
    };
    match attachments.resume(drive, &blob.mountpoint, session) {
        Ok(_) => Ok(()),
        Err(crate::fuse::AttachError::NotFound(_)) => Err(ResumeError::Unmounted(blob.mountpoint)),
        Err(e @ crate::fuse::AttachError::AlreadyAttached(_)) => Err(ResumeError::Attach(e)),
        Err(e) => {
            attachments.drop_kept_mount(&blob.drive, &blob.mountpoint, blob.mount_id);
            Err(ResumeError::Attach(e))
        }
    }
}
