//! `ramd attach NAME --ublk`: a drive as a real block device `/dev/ublkbN`,
//! served by the daemon through the kernel's ublk driver (`ublk_drv`).
//!
//! ```text
//!  ramd attach db --ublk ──API──► Devices::attach
//!     ctrl: ADD_DEV (queues = CPUs, depth 128, 512 KiB I/O, USER_RECOVERY)
//!           SET_PARAMS (size, 512 B logical / 4 KiB physical blocks,
//!                       read-only, write cache + FUA, discard, write zeroes)
//!     queue threads "ublk-db-Q", one per CPU, each with its own io_uring on
//!           /dev/ublkcN: FETCH every tag, then COMMIT_AND_FETCH each request
//!           after block::validate and the drive's Backend (queue.rs)
//!     ctrl: START_DEV ──► /dev/ublkbN ──► mkfs, mount
//! ```
//!
//! The code is ours over `io-uring` (already a dependency), not the
//! `libublk` crate: the UAPI is a few structs (proto.rs, pure and tested),
//! and ramd needs its own threads, errno table, metrics and recovery
//! records, which libublk's executor and `UblkDev` lifecycle would wrap.
//!
//! # Copies, queues and depth
//!
//! - One hardware queue per CPU (the thread is the queue's only submitter,
//!   as the kernel requires: a queue is bound to the task that fetched its
//!   tags), depth 128 per queue (fio QD32 x 4 jobs fits in one queue),
//!   I/O of up to 512 KiB per request.
//! - Data moves in the driver's copy mode: the kernel copies a WRITE's
//!   pages into the tag's buffer before handing the tag over, and a READ's
//!   buffer into the request's pages at COMMIT, inside the commit syscall
//!   that is made anyway. The drive then copies once more (into or out of
//!   its pages), so a request costs two memcpys and no extra syscall.
//!   `UBLK_F_USER_COPY` would save the READ's second copy (a `pwritev` from
//!   the drive's pages straight to `/dev/ublkcN`) but costs a syscall per
//!   request, which on the VMs ramd targets costs more than a 4 KiB copy;
//!   zero copy (`UBLK_F_SUPPORT_ZERO_COPY`, 6.15+, and 6.16's automatic
//!   buffer registration) lends the request's pages to io_uring ops on
//!   *files*, which a RAM drive is not, and batched I/O commands are newer
//!   than the 6.12 kernel this is tested on. Revisit USER_COPY with the
//!   bench figures on a real host (bench/ublk.sh).
//!
//! # Recovery (`UBLK_F_USER_RECOVERY`)
//!
//! Every device is added with user recovery (with REISSUE: requests the
//! dead process had fetched but not completed are requeued for the next
//! one instead of failing with EIO), and a record of it (drive
//! name, device id) is written to `RUNTIME_DIR/ublk/` (a tmpfs: devices
//! and records both end with a reboot).
//!
//! ```text
//!   live ──(ramd killed: /dev/ublkcN released)──► quiesced (kernel holds I/O)
//!    ▲                                               │ new ramd finds the record,
//!    │                                               │ waits for the drive (a
//!    │                                               │ persistent drive restores)
//!    │      END_USER_RECOVERY (queues fetched)       ▼ START_USER_RECOVERY
//!    └───────────────────────────────────────── recovering
//! ```
//!
//! A persistent drive comes back with what was durable (with
//! `durability=flush`, everything a FLUSH or FUA write acknowledged), so a
//! filesystem mounted on the device stays mounted and its fsynced data is
//! intact. A volatile drive's data is gone with the process: serving an
//! empty drive under a mounted filesystem would corrupt it silently, so the
//! restarted ramd deletes such a device instead (held and new I/O fail with
//! EIO) and logs why. Detach and daemon shutdown stop and delete devices
//! (no recovery after a clean stop).
//!
//! # Invariants
//!
//! - Every request goes through `block::validate` against the drive's
//!   current size and read-only switch, and errors go through the one
//!   errno table (`block::Errno::ublk`).
//! - A device is listed (here and in its drive's `attachments`, which makes
//!   delete refuse) from START_DEV (or END_USER_RECOVERY) until its
//!   STOP_DEV; detach refuses while the block device is mounted, held or
//!   open unless forced.
//! - Non-root: `/dev/ublk-control` is root's unless the distribution's
//!   udev rules open it (`UBLK_F_UNPRIVILEGED_DEV`); ramd asks for
//!   privileged devices and says so when the control device is not
//!   usable.

mod ctrl;
mod error;
pub mod metrics;
pub mod proto;
mod queue;

pub use error::UblkError;

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::fuse::Attachable;
use ctrl::Control;
use proto::{flags, DevInfo, DevState, Params};

/// Tags per queue.
pub const QUEUE_DEPTH: u16 = 128;
/// The largest request, and each tag's buffer.
pub const MAX_IO_BYTES: u32 = 512 << 10;
/// How long attach waits for `/dev/ublkcN` to appear after ADD_DEV.
const CHAR_DEV_WAIT: Duration = Duration::from_secs(10);
/// How long recovery retries START_USER_RECOVERY while the kernel is still
/// quiescing the device (EBUSY).
const RECOVERY_WAIT: Duration = Duration::from_secs(30);

/// What `ramd resize` did to a drive's ublk device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resized {
    /// The kernel took the new size (`UBLK_F_UPDATE_SIZE`).
    Resized { device: String, size_bytes: u64 },
    /// The kernel cannot change a live device's size (before 6.16): it
    /// keeps the size it was created with until a detach and attach.
    KeptSize { device: String },
    /// The kernel refused the new size.
    Failed { device: String, error: String },
}

impl Resized {
    /// One line for the user (the API's notice, the CLI).
    pub fn notice(&self) -> String {
        match self {
            Resized::Resized { device, size_bytes } => {
                format!("{device} now has {size_bytes} bytes")
            }
            Resized::KeptSize { device } => format!(
                "{device} keeps its old size: this kernel cannot resize a live ublk device (UBLK_F_UPDATE_SIZE needs Linux 6.16+); `ramd detach` then `ramd attach --ublk` give it the new size (until then, I/O past the drive's new end fails)"
            ),
            Resized::Failed { device, error } => format!(
                "{device} keeps its old size: the kernel refused the new one ({error}); `ramd detach` and `ramd attach --ublk` give it the new size"
            ),
        }
    }
}

/// A live ublk attachment as listings show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub id: u64,
    pub drive: String,
    /// The kernel's device id (N in /dev/ublkbN).
    pub dev_id: u32,
    pub queues: u16,
    pub depth: u16,
    /// True once this process took over a device an earlier ramd served.
    pub recovered: bool,
    /// True when the kernel lets `ramd resize` reach the device
    /// (`UBLK_F_UPDATE_SIZE`, Linux 6.16+).
    pub resizable: bool,
}

impl DeviceInfo {
    /// `/dev/ublkbN`.
    pub fn block_device(&self) -> PathBuf {
        block_path(self.dev_id)
    }
}

fn block_path(dev_id: u32) -> PathBuf {
    PathBuf::from(format!("/dev/ublkb{dev_id}"))
}

fn char_path(dev_id: u32) -> PathBuf {
    PathBuf::from(format!("/dev/ublkc{dev_id}"))
}

struct Device {
    info: DeviceInfo,
    drive: Arc<dyn Attachable>,
    /// Tells the queue threads to leave even without aborted fetches.
    stopping: Arc<AtomicBool>,
    /// One per queue; each returns once its fetches are aborted.
    threads: Vec<JoinHandle<()>>,
}

/// What the runtime directory remembers of a device, for recovery.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct Record {
    drive: String,
    dev_id: u32,
}

/// Finds a drive for recovery: the drive, and whether its data outlived
/// the old process (persistent), or None.
pub type DriveLookup<'a> = dyn Fn(&str) -> Option<(Arc<dyn Attachable>, bool)> + 'a;

/// Every ublk device of the daemon.
pub struct Devices {
    inner: Mutex<BTreeMap<u64, Device>>,
    /// `RUNTIME_DIR/ublk`: one `N.json` record per device.
    records: PathBuf,
}

impl Devices {
    pub fn new(runtime_dir: &Path) -> Devices {
        Devices {
            inner: Mutex::new(BTreeMap::new()),
            records: runtime_dir.join("ublk"),
        }
    }

    pub fn list(&self) -> Vec<DeviceInfo> {
        self.inner.lock().values().map(|d| d.info.clone()).collect()
    }

    /// The device of `drive`, if it has one.
    pub fn find_drive(&self, drive: &str) -> Option<DeviceInfo> {
        self.inner
            .lock()
            .values()
            .find(|d| d.info.drive == drive)
            .map(|d| d.info.clone())
    }

    /// Tells the kernel that `drive` now holds `size_bytes` (after `ramd
    /// resize`): None when the drive has no device; else what became of
    /// its device.
    pub fn resize_drive(&self, drive: &str, size_bytes: u64) -> Option<Resized> {
        let dev = self.find_drive(drive)?;
        let device = dev.block_device().display().to_string();
        if !dev.resizable {
            return Some(Resized::KeptSize { device });
        }
        let sectors = size_bytes / 512;
        let done = Control::open().and_then(|c| c.update_size(dev.dev_id, sectors));
        Some(match done {
            Ok(()) => {
                tracing::info!(drive, device = %device, size_bytes, "ublk device resized");
                Resized::Resized { device, size_bytes }
            }
            Err(e) => {
                tracing::warn!(drive, device = %device, "ublk device not resized: {e}");
                Resized::Failed {
                    device,
                    error: e.to_string(),
                }
            }
        })
    }

    /// Makes `drive` a block device; `id` is its attachment id.
    pub fn attach(&self, drive: Arc<dyn Attachable>, id: u64) -> Result<DeviceInfo, UblkError> {
        if let Some(d) = self.find_drive(drive.name()) {
            return Err(UblkError::AlreadyAttached {
                drive: d.drive.clone(),
                device: d.block_device().display().to_string(),
            });
        }
        let export = drive
            .export()
            .ok_or_else(|| UblkError::NotServing(drive.name().to_owned()))?;
        let control = Control::open()?;
        // Ask for UPDATE_SIZE only where the driver has it (older drivers
        // refuse or drop flags they do not know).
        let resize_flag = control.features().map_or(0, |f| f & flags::UPDATE_SIZE);
        let queues = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(64) as u16;
        let info = control.add(&DevInfo {
            nr_hw_queues: queues,
            queue_depth: QUEUE_DEPTH,
            max_io_buf_bytes: MAX_IO_BYTES,
            dev_id: u32::MAX,
            ublksrv_pid: std::process::id() as i32,
            // REISSUE: requests the dead ramd had fetched but not
            // completed are handed to the new one instead of failing with
            // EIO (writes to RAM are idempotent, so a replay is safe).
            flags: flags::USER_RECOVERY
                | flags::USER_RECOVERY_REISSUE
                | flags::CMD_IOCTL_ENCODE
                | resize_flag,
            ..DevInfo::default()
        })?;
        let dev_id = info.dev_id;
        let started = (|| {
            let params = Params::for_drive(
                export.backend.size(),
                export.is_read_only(),
                info.max_io_buf_bytes.min(MAX_IO_BYTES),
            );
            control.set_params(dev_id, &params)?;
            let (stopping, threads) = self.start_queues(&info, &export)?;
            let undo = |threads: Vec<JoinHandle<()>>| {
                stopping.store(true, Ordering::Release);
                let _ = control.stop(dev_id);
                join(threads);
            };
            if let Err(e) = control.start(dev_id) {
                undo(threads);
                return Err(e);
            }
            if let Err(e) = self.write_record(&Record {
                drive: drive.name().to_owned(),
                dev_id,
            }) {
                tracing::warn!(drive = %drive.name(), "cannot record ublk device {dev_id} for recovery: {e}");
            }
            Ok((stopping, threads))
        })();
        let (stopping, threads) = match started {
            Ok(s) => s,
            Err(e) => {
                let _ = control.delete(dev_id);
                return Err(e);
            }
        };
        let info = DeviceInfo {
            id,
            drive: drive.name().to_owned(),
            dev_id,
            queues: info.nr_hw_queues,
            depth: info.queue_depth,
            recovered: false,
            resizable: info.flags & flags::UPDATE_SIZE != 0,
        };
        self.insert(info.clone(), drive, stopping, threads);
        tracing::info!(drive = %info.drive, device = %info.block_device().display(), "attached as a ublk device");
        Ok(info)
    }

    fn insert(
        &self,
        info: DeviceInfo,
        drive: Arc<dyn Attachable>,
        stopping: Arc<AtomicBool>,
        threads: Vec<JoinHandle<()>>,
    ) {
        drive.attached_at().lock().push(info.block_device());
        self.inner.lock().insert(
            info.id,
            Device {
                info,
                drive,
                stopping,
                threads,
            },
        );
    }

    /// Opens /dev/ublkcN and starts one thread per queue; returns once
    /// every queue has submitted its fetches.
    fn start_queues(
        &self,
        info: &DevInfo,
        export: &Arc<crate::block::Export>,
    ) -> Result<(Arc<AtomicBool>, Vec<JoinHandle<()>>), UblkError> {
        let dev_id = info.dev_id;
        let failed = |source| UblkError::Device {
            dev: char_path(dev_id).display().to_string(),
            source,
        };
        let char_dev = Arc::new(open_char_dev(dev_id).map_err(failed)?);
        let stopping = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let mut threads = Vec::new();
        let mut result = Ok(());
        for q_id in 0..info.nr_hw_queues {
            let q = queue::Queue {
                q_id,
                depth: info.queue_depth,
                max_io_bytes: info.max_io_buf_bytes.min(MAX_IO_BYTES),
                char_dev: char_dev.clone(),
                export: export.clone(),
                stopping: stopping.clone(),
            };
            match q.spawn(tx.clone()) {
                Ok(t) => threads.push(t),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        drop(tx);
        if result.is_ok() {
            for _ in 0..threads.len() {
                match rx.recv() {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        result = Err(e);
                        break;
                    }
                    Err(_) => {
                        result = Err(io::Error::other("a queue thread ended at start"));
                        break;
                    }
                }
            }
        }
        match result {
            Ok(()) => Ok((stopping, threads)),
            Err(e) => {
                // Threads that fetched leave when the char device goes:
                // nothing started the device, so closing it aborts them.
                stopping.store(true, Ordering::Release);
                drop(char_dev);
                join(threads);
                Err(failed(e))
            }
        }
    }

    /// Stops and deletes attachment `id`'s device. Unless `force`, refused
    /// while the block device is mounted, held or open.
    pub fn detach(&self, id: u64, force: bool) -> Result<DeviceInfo, UblkError> {
        let info = self
            .inner
            .lock()
            .get(&id)
            .map(|d| d.info.clone())
            .ok_or(UblkError::NotFound(id))?;
        if !force {
            if let Some(why) = in_use(&info.block_device()) {
                return Err(UblkError::Busy {
                    device: info.block_device().display().to_string(),
                    why,
                });
            }
        }
        let Some(d) = self.inner.lock().remove(&id) else {
            return Err(UblkError::NotFound(id));
        };
        self.stop_device(d)
    }

    fn stop_device(&self, mut d: Device) -> Result<DeviceInfo, UblkError> {
        let dev_id = d.info.dev_id;
        let bdev = d.info.block_device();
        d.drive.attached_at().lock().retain(|p| p != &bdev);
        let control = Control::open()?;
        let stopped = control.stop(dev_id);
        d.stopping.store(true, Ordering::Release);
        join(std::mem::take(&mut d.threads));
        stopped?;
        control.delete(dev_id)?;
        let _ = std::fs::remove_file(self.records.join(format!("{dev_id}.json")));
        tracing::info!(drive = %d.info.drive, device = %bdev.display(), "ublk device removed");
        Ok(d.info)
    }

    /// Removes every device of `drive` (a forced delete).
    pub fn detach_drive(&self, drive: &str) -> Result<Vec<DeviceInfo>, UblkError> {
        let ids: Vec<u64> = self
            .inner
            .lock()
            .values()
            .filter(|d| d.info.drive == drive)
            .map(|d| d.info.id)
            .collect();
        ids.into_iter().map(|id| self.detach(id, true)).collect()
    }

    /// At daemon exit: every device is stopped and deleted (a clean stop
    /// leaves nothing to recover).
    pub fn shutdown(&self) {
        let all: Vec<Device> = std::mem::take(&mut *self.inner.lock())
            .into_values()
            .collect();
        for d in all {
            let drive = d.info.drive.clone();
            if let Err(e) = self.stop_device(d) {
                tracing::error!(drive = %drive, "removing its ublk device: {e}");
            }
        }
    }

    fn write_record(&self, r: &Record) -> io::Result<()> {
        std::fs::create_dir_all(&self.records)?;
        let path = self.records.join(format!("{}.json", r.dev_id));
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec(r).map_err(io::Error::other)?)?;
        std::fs::rename(tmp, path)
    }

    fn records(&self) -> Vec<Record> {
        let Ok(dir) = std::fs::read_dir(&self.records) else {
            return Vec::new();
        };
        dir.filter_map(|e| e.ok())
            .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
            .filter_map(|e| serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok())
            .collect()
    }

    /// At start: takes over the devices an earlier ramd left quiesced.
    /// `drive(name)` waits until the drive of that name serves and says
    /// whether its data outlived the old process (a persistent drive), or
    /// returns None (no such drive). `next_id` numbers the attachments.
    pub fn recover(&self, drive: &DriveLookup<'_>, next_id: &dyn Fn() -> u64) {
        let records = self.records();
        if records.is_empty() {
            return;
        }
        let control = match Control::open() {
            Ok(c) => c,
            Err(e) => {
                tracing::error!("{} ublk device(s) to recover: {e}", records.len());
                return;
            }
        };
        for r in records {
            let record_file = self.records.join(format!("{}.json", r.dev_id));
            let dev = block_path(r.dev_id);
            match control.info(r.dev_id) {
                Ok(None) => {
                    let _ = std::fs::remove_file(&record_file);
                    continue;
                }
                Ok(Some(_)) => {}
                Err(e) => {
                    tracing::error!(drive = %r.drive, "ublk device {}: {e}", dev.display());
                    continue;
                }
            }
            let found = drive(&r.drive);
            let what = match &found {
                Some((_, true)) => "",
                Some((_, false)) => "a volatile drive",
                None => "no such drive now",
            };
            let Some((attachable, _)) = found.filter(|(_, persistent)| *persistent) else {
                tracing::error!(
                    drive = %r.drive,
                    "{}: the drive's data did not outlive the old ramd ({}); deleting the device so that \
                     held I/O fails instead of reading an empty drive",
                    dev.display(),
                    what
                );
                let _ = control.stop(r.dev_id);
                let _ = control.delete(r.dev_id);
                let _ = std::fs::remove_file(&record_file);
                continue;
            };
            match self.recover_one(&control, &r, attachable, next_id()) {
                Ok(info) => tracing::info!(
                    drive = %info.drive,
                    device = %dev.display(),
                    "ublk device recovered: held I/O resumes"
                ),
                Err(e) => tracing::error!(drive = %r.drive, "recovering {}: {e}", dev.display()),
            }
        }
    }

    /// quiesced → recovering → live, for one device.
    fn recover_one(
        &self,
        control: &Control,
        r: &Record,
        drive: Arc<dyn Attachable>,
        id: u64,
    ) -> Result<DeviceInfo, UblkError> {
        let export = drive
            .export()
            .ok_or_else(|| UblkError::NotServing(drive.name().to_owned()))?;
        // The kernel quiesces the device once the old server's char device
        // is released; START_USER_RECOVERY is EBUSY until then.
        let deadline = Instant::now() + RECOVERY_WAIT;
        let info = loop {
            let info = control.info(r.dev_id)?.ok_or(UblkError::Control {
                what: "GET_DEV_INFO",
                source: io::Error::from_raw_os_error(libc::ENODEV),
            })?;
            let quiesced = info.state() == DevState::Quiesced;
            if quiesced {
                match control.start_recovery(r.dev_id) {
                    Ok(()) => break info,
                    Err(UblkError::Control { source, .. })
                        if source.raw_os_error() == Some(libc::EBUSY)
                            && Instant::now() < deadline => {}
                    Err(e) => return Err(e),
                }
            } else if Instant::now() >= deadline {
                return Err(UblkError::Control {
                    what: "START_USER_RECOVERY",
                    source: io::Error::other(format!(
                        "the device is {:?}, not quiesced (is another ramd serving it?)",
                        info.state()
                    )),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let (stopping, threads) = self.start_queues(&info, &export)?;
        if let Err(e) = control.end_recovery(r.dev_id) {
            stopping.store(true, Ordering::Release);
            join(threads);
            return Err(e);
        }
        let info = DeviceInfo {
            id,
            drive: drive.name().to_owned(),
            dev_id: r.dev_id,
            queues: info.nr_hw_queues,
            depth: info.queue_depth,
            recovered: true,
            resizable: info.flags & flags::UPDATE_SIZE != 0,
        };
        self.insert(info.clone(), drive, stopping, threads);
        Ok(info)
    }
}

fn join(threads: Vec<JoinHandle<()>>) {
    for t in threads {
        if t.join().is_err() {
            tracing::error!("a ublk queue thread panicked");
        }
    }
}

/// Opens `/dev/ublkcN`, waiting for devtmpfs/udev to create it.
fn open_char_dev(dev_id: u32) -> io::Result<File> {
    let path = char_path(dev_id);
    let deadline = Instant::now() + CHAR_DEV_WAIT;
    loop {
        match OpenOptions::new().read(true).write(true).open(&path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            r => return r,
        }
    }
}

/// Why the block device is in use, or None: mounted or held (an
/// exclusive open fails), or open by a process (its /proc/PID/fd).
fn in_use(dev: &Path) -> Option<String> {
    match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(dev)
    {
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            return Some("mounted, or held by another device".into())
        }
        _ => {}
    }
    let me = std::process::id().to_string();
    let procs = std::fs::read_dir("/proc").ok()?;
    for p in procs.filter_map(|e| e.ok()) {
        let pid = p.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) || pid == me {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        for fd in fds.filter_map(|e| e.ok()) {
            if std::fs::read_link(fd.path()).is_ok_and(|t| t == dev) {
                let comm = std::fs::read_to_string(p.path().join("comm")).unwrap_or_default();
                return Some(format!("open by process {pid} ({})", comm.trim()));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_through_the_runtime_dir() {
        let dir = tempfile::tempdir().unwrap();
        let d = Devices::new(dir.path());
        assert!(d.records().is_empty());
        let r = Record {
            drive: "db".into(),
            dev_id: 3,
        };
        d.write_record(&r).unwrap();
        assert_eq!(d.records(), vec![r]);
        assert!(dir.path().join("ublk/3.json").exists());
    }

    #[test]
    fn a_missing_driver_says_modprobe() {
        let msg = UblkError::NoModule.to_string();
        assert!(msg.contains("modprobe ublk_drv"), "{msg}");
    }
}
