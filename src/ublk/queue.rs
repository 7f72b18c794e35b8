//! One ublk hardware queue: a thread with its own io_uring on
//! `/dev/ublkcN`, serving the queue's tags from the drive.
//!
//! ```text
//!  FETCH_REQ(tag) x depth ─► kernel fills descriptor[tag] (mmap'd, read-only)
//!        ▲                    and, for a WRITE, copies the data into buf[tag]
//!        │                           │ CQE res=0
//!  COMMIT_AND_FETCH_REQ(tag, result) ◄┘ block::validate → Backend call
//!        (for a READ the kernel copies buf[tag] into the request's pages)
//! ```
//!
//! Invariants: a tag's buffer is touched by this thread only between the
//! CQE that hands the tag over and the COMMIT that hands it back, and the
//! kernel touches it only in between the other way round; the thread
//! leaves once every tag's command has completed with `IO_RES_ABORT` (the
//! device was stopped), or, after [`Queue::stop`], when no completion
//! arrived for [`STOP_GRACE`] (dropping the ring cancels what is left).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use io_uring::{opcode, types, IoUring};

use super::proto::{self, IoCmd, IoDesc, IO_DESC_BYTES};
use crate::block::{self, Command, Export};
use crate::metrics::{ConnRecorder, Op as MetricOp};

/// How long a stopping queue waits for its aborted fetches.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// What a queue thread needs.
pub struct Queue {
    pub q_id: u16,
    pub depth: u16,
    pub max_io_bytes: u32,
    /// `/dev/ublkcN`, shared by the device's queues.
    pub char_dev: Arc<File>,
    pub export: Arc<Export>,
    /// Set by detach after STOP_DEV: leave even if the kernel never
    /// aborts the fetches.
    pub stopping: Arc<AtomicBool>,
}

impl Queue {
    /// Starts the queue's thread; it sends on `ready` once its fetches
    /// are submitted (or why it could not).
    pub fn spawn(self, ready: mpsc::Sender<io::Result<()>>) -> io::Result<JoinHandle<()>> {
        let name = format!("ublk-{}-{}", self.export.name, self.q_id);
        std::thread::Builder::new().name(name).spawn(move || {
            if let Err(e) = self.run(&ready) {
                let _ = ready.send(Err(e));
            }
        })
    }

    fn run(&self, ready: &mpsc::Sender<io::Result<()>>) -> io::Result<()> {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let descs = Descriptors::map(&self.char_dev, self.q_id, self.depth, page)?;
        let buf_bytes = self.max_io_bytes as usize;
        // Zeroed pages the kernel maps lazily: a tag's buffer costs memory
        // only once a request that large used it.
        let mut bufs = vec![0u8; self.depth as usize * buf_bytes];
        let base = bufs.as_mut_ptr();
        let mut ring = IoUring::new(u32::from(self.depth).next_power_of_two())?;
        let fd = types::Fd(self.char_dev.as_raw_fd());
        let cmd = |op: u32, tag: u16, result: i32| {
            let addr = base as u64 + tag as u64 * buf_bytes as u64;
            opcode::UringCmd16::new(fd, op)
                .cmd(
                    IoCmd {
                        q_id: self.q_id,
                        tag,
                        result,
                        addr,
                    }
                    .encode(),
                )
                .build()
                .user_data(tag as u64)
        };
        for tag in 0..self.depth {
            let sqe = cmd(proto::io::FETCH_REQ, tag, 0);
            // SAFETY: the tag's buffer lives in `bufs`, which outlives the
            // ring (dropped first, at the end of this function, which
            // cancels commands still in flight).
            unsafe { ring.submission().push(&sqe) }.map_err(io::Error::other)?;
        }
        ring.submit()?;
        let _ = ready.send(Ok(()));

        let mut rec = self.export.metrics.as_ref().map(|m| m.connection());
        let mut live = self.depth as usize;
        let mut stop_seen: Option<Instant> = None;
        let mut done: Vec<(u16, i32)> = Vec::with_capacity(self.depth as usize);
        let ts = types::Timespec::new().sec(1);
        while live > 0 {
            let args = types::SubmitArgs::new().timespec(&ts);
            match ring.submitter().submit_with_args(1, &args) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ETIME) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
            done.clear();
            done.extend(
                ring.completion()
                    .map(|c| (c.user_data() as u16, c.result())),
            );
            if done.is_empty() && self.stopping.load(Ordering::Acquire) {
                let since = *stop_seen.get_or_insert_with(Instant::now);
                if since.elapsed() >= STOP_GRACE {
                    tracing::warn!(
                        drive = %self.export.name,
                        queue = self.q_id,
                        "{live} fetches still pending {STOP_GRACE:?} after STOP_DEV; leaving"
                    );
                    break;
                }
            }
            for &(tag, res) in &done {
                if res != proto::IO_RES_OK {
                    // IO_RES_ABORT: the device is going away; anything
                    // else (NEED_GET_DATA is never asked for) ends the
                    // tag too.
                    if res != proto::IO_RES_ABORT {
                        tracing::warn!(drive = %self.export.name, tag, res, "ublk fetch failed");
                    }
                    live -= 1;
                    continue;
                }
                let desc = descs.get(tag);
                // SAFETY: the kernel handed the tag over (CQE res=0) and
                // does not touch its buffer until the commit below; the
                // range lies within `bufs` (tag < depth).
                let buf = unsafe {
                    std::slice::from_raw_parts_mut(base.add(tag as usize * buf_bytes), buf_bytes)
                };
                let result = serve(&self.export, desc, buf, &mut rec);
                let sqe = cmd(proto::io::COMMIT_AND_FETCH_REQ, tag, result);
                // SAFETY: as for the fetches; at most one command per tag
                // is in flight, so the queue (depth entries) has room.
                unsafe { ring.submission().push(&sqe) }.map_err(io::Error::other)?;
            }
        }
        drop(ring);
        drop(bufs);
        Ok(())
    }
}

/// Runs one request on the drive; returns the COMMIT result: bytes done,
/// or a negative errno from the one table (`block::Errno::ublk`).
fn serve(export: &Export, desc: IoDesc, buf: &mut [u8], rec: &mut Option<ConnRecorder>) -> i32 {
    let started = Instant::now();
    let Some(req) = desc.request() else {
        return block::Errno::NotSup.ublk();
    };
    let backend = &*export.backend;
    let limits = block::Limits {
        size: backend.size(),
        read_only: export.is_read_only(),
        max_len: buf.len() as u64,
    };
    let op = match req.command {
        Command::Read => MetricOp::Read,
        Command::Write => MetricOp::Write,
        Command::Flush => MetricOp::Flush,
        Command::Trim => MetricOp::Trim,
        _ => MetricOp::WriteZeroes,
    };
    let len = req.len as usize;
    let result: Result<(), block::Errno> = match block::validate(req, &limits) {
        Err(refusal) => Err(refusal.errno()),
        Ok(_) => match req.command {
            Command::Read => backend.read(req.offset, &mut buf[..len]),
            Command::Write => backend.write(req.offset, &buf[..len], desc.fua()),
            Command::Flush => backend.flush(),
            Command::Trim => backend.trim(req.offset, req.len),
            _ => backend.write_zeroes(req.offset, req.len, !desc.no_unmap()),
        }
        .map_err(|e| block::Errno::of(&e)),
    };
    let bytes = match req.command {
        Command::Read | Command::Write => len as u64,
        _ => req.len,
    };
    if let Some(rec) = rec.as_mut() {
        let r = result.map_err(|e| e.nbd());
        rec.record(op, if r.is_ok() { bytes } else { 0 }, r, started);
    }
    match result {
        Ok(()) if matches!(req.command, Command::Read | Command::Write) => len as i32,
        Ok(()) => 0,
        Err(e) => e.ublk(),
    }
}

/// A queue's descriptor array, mapped read-only from `/dev/ublkcN`.
struct Descriptors {
    ptr: *const u8,
    bytes: usize,
    depth: u16,
}

impl Descriptors {
    fn map(char_dev: &File, q_id: u16, depth: u16, page: usize) -> io::Result<Descriptors> {
        let bytes = proto::desc_mmap_bytes(depth, page);
        let offset = proto::desc_mmap_offset(q_id, page);
        // SAFETY: a fresh shared read-only mapping of the char device at
        // the kernel's offset for this queue; unmapped in Drop.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                char_dev.as_raw_fd(),
                offset as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Descriptors {
            ptr: ptr as *const u8,
            bytes,
            depth,
        })
    }

    /// Tag `tag`'s descriptor, copied out (the kernel wrote it before the
    /// CQE that handed the tag over, and rewrites it only after our
    /// commit).
    fn get(&self, tag: u16) -> IoDesc {
        assert!(tag < self.depth, "tag {tag} beyond the queue depth");
        let mut b = [0u8; IO_DESC_BYTES];
        // SAFETY: tag < depth, so the 24 bytes lie within the mapping;
        // volatile because the kernel writes the mapping.
        unsafe {
            let src = self.ptr.add(tag as usize * IO_DESC_BYTES);
            for (i, byte) in b.iter_mut().enumerate() {
                *byte = std::ptr::read_volatile(src.add(i));
            }
        }
        IoDesc::decode(&b)
    }
}

impl Drop for Descriptors {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.bytes) };
    }
}
