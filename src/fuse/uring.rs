//! FUSE over io_uring (kernel 6.14+ built with CONFIG_FUSE_IO_URING, with
//! the fuse module's `enable_uring` parameter on): requests reach the
//! daemon through ring entries instead of `read` on `/dev/fuse`, and one
//! submission both answers a request and takes the next.
//!
//! ```text
//!  task on CPU c ──► kernel queue c ──► a free ring entry of queue c
//!                                        (header 288 B + payload 1 MiB, ours,
//!                                         registered with FUSE_IO_URING_CMD_REGISTER)
//!                                              │ CQE: the request is in the entry
//!  thread fuse-NAME-uC, pinned to CPU c, ◄─────┘
//!  its own io_uring (SQE128)  ── DriveFs::handle ── reply written into the entry
//!                                              │ SQE COMMIT_AND_FETCH (commit_id)
//!                                              └► the entry waits for the next request
//! ```
//!
//! The kernel wants one queue per *possible* CPU (`fuse_uring_create`:
//! `num_possible_cpus()`) and turns the ring on only when every queue has
//! an entry waiting; it hands a request to the queue of the CPU its
//! submitter runs on, so each queue's thread is pinned to that CPU. INIT,
//! FORGET and INTERRUPT still come through `read` on `/dev/fuse`
//! (`fuse_io_uring_ops`): `session` keeps one classic reader for them.
//!
//! `RAMD_FUSE_URING_PIN=0` leaves the threads unpinned (for measuring).
//!
//! Layouts are in `proto` (`RingHeader`, `uring_cmd`), checked against
//! `include/uapi/linux/fuse.h` 7.42 by its tests.
//!
//! Crate: `io-uring` (tokio-rs), the maintained plain binding of
//! io_uring_setup/io_uring_enter and the ring memory, with no runtime.
//!
//! Invariants:
//! - An entry's buffers belong to the kernel from the submission that
//!   names them (REGISTER or COMMIT_AND_FETCH) until that command's CQE;
//!   only then does the thread read or write them. They are freed only
//!   when the kernel holds none of them (`in_kernel == 0`); otherwise they
//!   are leaked, never freed under the kernel.
//! - Every command is submitted by the queue's own thread, so the kernel's
//!   task work (which copies requests into the entries,
//!   `fuse_uring_send_in_task`) runs in that thread.
//! - A thread returns once the kernel has completed all its entries:
//!   unmounting (or the daemon's death) tears the ring down and completes
//!   each with ENOTCONN, so nothing waits on the daemon.
//! - The INIT reply offers FUSE_OVER_IO_URING only after every queue's
//!   ring is set up ([`prepare`]); from that reply on the kernel holds new
//!   requests until the ring is ready, so a failed registration must
//!   reach the kernel (which then falls back to `/dev/fuse`): see
//!   [`refuse`].

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use io_uring::{cqueue, opcode, squeue, types, IoUring};

use super::fs::{DriveFs, Reply, Scratch, Sink, MAX_IO_BYTES};
use super::proto::{self, RingHeader};

/// Ring entries in all queues together; each has a payload buffer of
/// 1 MiB (virtual until a large request touches it).
const ENTRY_BUDGET: usize = 64;
/// Entries per queue, whatever the CPU count.
const MIN_ENTRIES: usize = 2;
const MAX_ENTRIES: usize = 16;
/// How long a queue thread may take to set up or to register.
const STEP_TIMEOUT: Duration = Duration::from_secs(5);
/// Unexpected COMMIT_AND_FETCH failures after which an entry is dropped
/// rather than registered again.
const MAX_REREGISTER: u32 = 16;
/// The SQE's `len` (io_uring_sqe offset 24): iovecs of a REGISTER
/// (`FUSE_URING_IOV_SEGS`: header and payload).
const SQE_LEN_OFFSET: usize = 24;
const URING_IOV_SEGS: u32 = 2;
const POSSIBLE_CPUS: &str = "/sys/devices/system/cpu/possible";

/// Why FUSE over io_uring is not used for a mount.
#[derive(Debug, thiserror::Error)]
pub enum UringError {
    /// The possible-CPU list (one queue each) cannot be read.
    #[error("cannot read {POSSIBLE_CPUS}: {0}")]
    Cpus(#[source] io::Error),
    /// The possible-CPU list does not parse.
    #[error("cannot parse {POSSIBLE_CPUS}: '{0}'")]
    CpuList(String),
    /// A queue's io_uring (or its entries' memory) cannot be set up.
    #[error("queue {qid}: cannot set up its io_uring: {source}")]
    Setup { qid: u16, source: io::Error },
    /// A queue thread cannot be started.
    #[error("cannot start a queue thread: {0}")]
    Thread(#[source] io::Error),
    /// The kernel refused to register a ring entry.
    #[error("queue {qid}: the kernel refused a ring entry: {source}")]
    Register { qid: u16, source: io::Error },
    /// A queue thread did not report in time (or ended).
    #[error("queue {qid} did not report within {}s", STEP_TIMEOUT.as_secs())]
    Silent { qid: u16 },
}

/// The queue count the kernel expects: one per possible CPU.
pub fn queue_count() -> Result<usize, UringError> {
    let text = std::fs::read_to_string(POSSIBLE_CPUS).map_err(UringError::Cpus)?;
    parse_cpu_count(&text).ok_or_else(|| UringError::CpuList(text.trim().to_owned()))
}

/// The CPU count of a kernel CPU list ("0-3,8-11" has 12 CPUs); None
/// unless it is exactly CPUs 0..N (the kernel's queue ids are CPU ids).
fn parse_cpu_count(list: &str) -> Option<usize> {
    let mut next = 0usize;
    for part in list.trim().split(',') {
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo.parse::<usize>().ok()?, hi.parse::<usize>().ok()?),
            None => {
                let c = part.parse::<usize>().ok()?;
                (c, c)
            }
        };
        if lo != next || hi < lo {
            return None;
        }
        next = hi + 1;
    }
    (next > 0 && next <= u16::MAX as usize).then_some(next)
}

/// Entries per queue for `queues` queues.
fn entries_per_queue(queues: usize) -> usize {
    (ENTRY_BUDGET / queues.max(1)).clamp(MIN_ENTRIES, MAX_ENTRIES)
}

/// Queue threads with their rings set up, waiting for the INIT reply.
pub struct Prepared {
    queues: Vec<Pending>,
}

struct Pending {
    qid: u16,
    /// Dropped unsent: the thread returns without registering.
    go: Sender<()>,
    registered: Receiver<Result<(), UringError>>,
    thread: JoinHandle<io::Result<()>>,
}

/// Starts one queue thread per descriptor in `fds` (one per possible CPU,
/// each a clone of the session's `/dev/fuse`), each pinned to its CPU with
/// its ring and entries set up. Nothing is registered yet.
pub fn prepare(fs: &Arc<DriveFs>, fds: Vec<OwnedFd>, name: &str) -> Result<Prepared, UringError> {
    let depth = entries_per_queue(fds.len());
    let mut queues = Vec::with_capacity(fds.len());
    let mut first_error = None;
    for (qid, fd) in fds.into_iter().enumerate() {
        let qid = qid as u16;
        let (ready_tx, ready_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel();
        let (reg_tx, reg_rx) = mpsc::channel();
        let fs = fs.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("fuse-{name}-u{qid}"))
            .spawn(move || queue_main(&fs, fd, qid, depth, ready_tx, go_rx, reg_tx));
        let thread = match spawned {
            Ok(t) => t,
            Err(e) => {
                first_error = Some(UringError::Thread(e));
                break;
            }
        };
        let ready = match ready_rx.recv_timeout(STEP_TIMEOUT) {
            Ok(r) => r,
            Err(_) => Err(UringError::Silent { qid }),
        };
        queues.push(Pending {
            qid,
            go: go_tx,
            registered: reg_rx,
            thread,
        });
        if let Err(e) = ready {
            first_error = Some(e);
            break;
        }
    }
    match first_error {
        None => Ok(Prepared { queues }),
        Some(e) => {
            // Dropping `go` unsent ends every thread before it registers.
            for q in queues {
                drop(q.go);
                let _ = q.thread.join();
            }
            Err(e)
        }
    }
}

impl Prepared {
    /// After the INIT reply that offered FUSE_OVER_IO_URING: every queue
    /// registers its entries. Returns the threads (each ends with the
    /// mount, serving whatever it registered meanwhile) and the queue
    /// count, or the first failure.
    pub fn register(self) -> (Vec<JoinHandle<io::Result<()>>>, Result<usize, UringError>) {
        let n = self.queues.len();
        for q in &self.queues {
            let _ = q.go.send(());
        }
        let mut result = Ok(n);
        let mut threads = Vec::with_capacity(n);
        for q in self.queues {
            let r = match q.registered.recv_timeout(STEP_TIMEOUT) {
                Ok(r) => r,
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                    Err(UringError::Silent { qid: q.qid })
                }
            };
            if let (Err(e), Ok(_)) = (r, &result) {
                result = Err(e);
            }
            threads.push(q.thread);
        }
        (threads, result)
    }
}

/// Makes the kernel give up FUSE over io_uring on `dev`'s connection: a
/// REGISTER for a queue that does not exist fails, and a failed REGISTER
/// clears the connection's io_uring mode and wakes the requests waiting
/// for the ring (`fuse_uring_cmd`). A ring already complete keeps
/// serving. Used when some queue failed to register or to report.
pub fn refuse(dev: BorrowedFd<'_>) -> io::Result<()> {
    let mut ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(2)?;
    let mut iov = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; 2];
    let sqe = register_sqe(dev.as_raw_fd(), u16::MAX, iov.as_mut_ptr(), 0);
    // SAFETY: the SQE names `iov`, which lives until the command has
    // completed (submit_and_wait below; the kernel fails it at once).
    unsafe { ring.submission().push(&sqe) }
        .map_err(|_| io::Error::from_raw_os_error(libc::EBUSY))?;
    ring.submit_and_wait(1)?;
    Ok(())
}

/// A REGISTER command for the entry whose iovecs are at `iov`.
fn register_sqe(fd: i32, qid: u16, iov: *mut libc::iovec, user_data: u64) -> squeue::Entry128 {
    let sqe = opcode::UringCmd80::new(types::Fd(fd), proto::URING_CMD_REGISTER)
        .cmd(proto::uring_cmd(0, qid))
        .addr(Some(iov as u64))
        .build()
        .user_data(user_data);
    with_len(sqe, URING_IOV_SEGS)
}

/// Sets the SQE's `len`, which `UringCmd80` has no setter for (io-uring
/// 0.7) and REGISTER needs (the iovec count, `fuse_uring_get_iovec_from_sqe`).
fn with_len(sqe: squeue::Entry128, len: u32) -> squeue::Entry128 {
    const _: () = assert!(std::mem::size_of::<squeue::Entry128>() == 128);
    // SAFETY: Entry128 is #[repr(C)] (Entry(io_uring_sqe), [u8; 64]) and
    // exactly 128 bytes (asserted above); io_uring_sqe's `len` is the u32
    // at offset 24 (linux/io_uring.h; checked by a test against the
    // crate's own setter). Every byte pattern is a valid SQE value: it is
    // plain data.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    raw[SQE_LEN_OFFSET..SQE_LEN_OFFSET + 4].copy_from_slice(&len.to_ne_bytes());
    // SAFETY: as above; only the len bytes changed.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

/// Pins the calling thread to `cpu` (best effort: an offline CPU cannot
/// be pinned to, and gets no requests either).
fn pin_to_cpu(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
        return;
    }
    // SAFETY: `cpu` is within the set (checked above).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: the set is a live, initialised cpu_set_t of the size given.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    if r != 0 {
        tracing::debug!(
            cpu,
            "cannot pin a FUSE ring queue: {}",
            io::Error::last_os_error()
        );
    }
}

/// A queue thread: set up, wait for the INIT reply, register, serve.
fn queue_main(
    fs: &DriveFs,
    fd: OwnedFd,
    qid: u16,
    depth: usize,
    ready: Sender<Result<(), UringError>>,
    go: Receiver<()>,
    registered: Sender<Result<(), UringError>>,
) -> io::Result<()> {
    if std::env::var("RAMD_FUSE_URING_PIN").map_or(true, |v| v != "0") {
        pin_to_cpu(qid as usize);
    }
    let mut q = match RingQueue::new(fd, qid, depth, fs) {
        Ok(q) => q,
        Err(source) => {
            let _ = ready.send(Err(UringError::Setup { qid, source }));
            return Ok(());
        }
    };
    let _ = ready.send(Ok(()));
    if go.recv().is_err() {
        return Ok(()); // the classic path was chosen
    }
    let _ = registered.send(q.register_all());
    q.run(fs)
}

/// Where an entry stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not with the kernel (before registering, or retired).
    Idle,
    /// REGISTER submitted: a CQE brings a request, or the refusal.
    Registering,
    /// COMMIT_AND_FETCH submitted: a CQE brings the next request.
    Fetching,
}

/// One ring entry: its buffers, shared with the kernel (see the module
/// invariants), and the iovecs REGISTER names.
struct RingEntry {
    /// From `Box::into_raw`; freed in `Drop` unless leaked.
    header: *mut RingHeader,
    /// From `Box::<[u8]>::into_raw`: `payload_len` bytes.
    payload: *mut u8,
    payload_len: usize,
    /// [header, payload]; boxed so its address stays put.
    iov: Box<[libc::iovec; 2]>,
    state: State,
    reregistered: u32,
}

// SAFETY: the raw pointers are owned allocations of the entry (no other
// Rust reference to them exists); the entry moves with its thread's queue.
unsafe impl Send for RingEntry {}

impl RingEntry {
    fn new(payload_len: usize) -> RingEntry {
        let header = Box::into_raw(Box::new(RingHeader::zeroed()));
        let payload = Box::into_raw(vec![0u8; payload_len].into_boxed_slice()).cast::<u8>();
        let iov = Box::new([
            libc::iovec {
                iov_base: header.cast(),
                iov_len: std::mem::size_of::<RingHeader>(),
            },
            libc::iovec {
                iov_base: payload.cast(),
                iov_len: payload_len,
            },
        ]);
        RingEntry {
            header,
            payload,
            payload_len,
            iov,
            state: State::Idle,
            reregistered: 0,
        }
    }
}

impl Drop for RingEntry {
    fn drop(&mut self) {
        // SAFETY: both pointers came from Box::into_raw in `new` with these
        // types and sizes, and are freed only here, once. RingQueue leaks
        // entries the kernel may still hold instead of dropping them.
        unsafe {
            drop(Box::from_raw(self.header));
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.payload,
                self.payload_len,
            )));
        }
    }
}

/// One queue: its ring, entries and reply scratch, owned by its thread.
struct RingQueue {
    qid: u16,
    /// Declared before `entries`: the ring is closed before the buffers go.
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    /// This queue's clone of the session's `/dev/fuse` descriptor.
    fd: OwnedFd,
    entries: Vec<RingEntry>,
    scratch: Scratch,
    /// Entries whose command the kernel holds (no CQE yet).
    in_kernel: usize,
    /// Completions taken from the CQ, not handled yet: (entry, result).
    done: Vec<(usize, i32)>,
}

impl RingQueue {
    fn new(fd: OwnedFd, qid: u16, depth: usize, fs: &DriveFs) -> io::Result<RingQueue> {
        // Task work (the kernel copying requests in) runs when this thread
        // waits for completions, not by interrupting it.
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .build(depth as u32)
            .or_else(|_| {
                IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(depth as u32)
            })?;
        let entries = (0..depth)
            .map(|_| RingEntry::new(MAX_IO_BYTES as usize))
            .collect();
        Ok(RingQueue {
            qid,
            ring,
            fd,
            entries,
            scratch: Scratch {
                body: Vec::with_capacity(4096),
                rec: fs.export().metrics.as_ref().map(|m| m.connection()),
            },
            in_kernel: 0,
            done: Vec::with_capacity(depth),
        })
    }

    /// Submits a command for entry `idx`.
    fn push(&mut self, idx: usize, sqe: &squeue::Entry128, state: State) {
        // SAFETY: the SQE names this entry's buffers and iovecs, which stay
        // allocated while the kernel holds them (module invariants). The SQ
        // has a slot: it holds `depth` entries and each entry has at most
        // one command queued, and every push is followed by a submit.
        let pushed = unsafe { self.ring.submission().push(sqe) };
        assert!(pushed.is_ok(), "SQ full: one command per entry at most");
        self.entries[idx].state = state;
        self.in_kernel += 1;
    }

    fn register(&mut self, idx: usize) {
        let iov = self.entries[idx].iov.as_mut_ptr();
        let sqe = register_sqe(self.fd.as_raw_fd(), self.qid, iov, idx as u64);
        self.push(idx, &sqe, State::Registering);
    }

    /// Registers every entry; the error is the kernel's refusal of one
    /// (refusals come back at submission). Requests that arrived already
    /// stay in `done` for `run`.
    fn register_all(&mut self) -> Result<(), UringError> {
        for idx in 0..self.entries.len() {
            self.register(idx);
        }
        if let Err(source) = self.ring.submit() {
            return Err(UringError::Register {
                qid: self.qid,
                source,
            });
        }
        self.reap();
        let refused = self
            .done
            .iter()
            .find(|&&(idx, res)| res < 0 && self.entries[idx].state == State::Registering);
        match refused {
            Some(&(_, res)) => Err(UringError::Register {
                qid: self.qid,
                source: io::Error::from_raw_os_error(-res),
            }),
            None => Ok(()),
        }
    }

    /// Moves the CQ's completions into `done`.
    fn reap(&mut self) {
        for cqe in self.ring.completion() {
            self.done.push((cqe.user_data() as usize, cqe.result()));
        }
    }

    /// Serves until the kernel has completed every entry (the mount is
    /// gone), or the ring fails.
    fn run(mut self, fs: &DriveFs) -> io::Result<()> {
        loop {
            let done = std::mem::take(&mut self.done);
            for &(idx, res) in &done {
                self.complete(idx, res, fs);
            }
            self.done = done;
            self.done.clear();
            if self.in_kernel == 0 {
                return Ok(());
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY)) => {}
                Err(e) => return Err(e),
            }
            self.reap();
        }
    }

    /// Handles the completion of entry `idx`'s command.
    fn complete(&mut self, idx: usize, res: i32, fs: &DriveFs) {
        let Some(entry) = self.entries.get_mut(idx) else {
            tracing::error!(qid = self.qid, idx, "completion for no ring entry");
            return;
        };
        let state = std::mem::replace(&mut entry.state, State::Idle);
        self.in_kernel -= 1;
        if res >= 0 {
            let sqe = self.serve(idx, fs);
            self.push(idx, &sqe, State::Fetching);
            return;
        }
        match -res {
            // Unmounted, aborted, or the ring is going away.
            libc::ENOTCONN | libc::ENODEV | libc::ECONNABORTED | libc::ECANCELED => {}
            // A refused registration, reported by register_all.
            _ if state == State::Registering => {}
            errno => {
                let entry = &mut self.entries[idx];
                entry.reregistered += 1;
                tracing::warn!(
                    qid = self.qid,
                    "FUSE ring commit failed: {}{}",
                    io::Error::from_raw_os_error(errno),
                    if entry.reregistered <= MAX_REREGISTER {
                        "; registering the entry again"
                    } else {
                        "; dropping the entry"
                    }
                );
                if entry.reregistered <= MAX_REREGISTER {
                    self.register(idx);
                }
            }
        }
    }

    /// Answers the request in entry `idx`; returns its COMMIT_AND_FETCH.
    fn serve(&mut self, idx: usize, fs: &DriveFs) -> squeue::Entry128 {
        let e = &self.entries[idx];
        // SAFETY: the kernel completed this entry's command, so it does not
        // touch the buffers until we submit again (module invariants): the
        // header is ours to read and write, through this one reference.
        let header = unsafe { &mut *e.header };
        let in_len = (header.payload_sz() as usize).min(e.payload_len);
        // SAFETY: as above, the payload is ours; this shared view is used
        // only by requests that carry a payload (LOOKUP, WRITE), which never
        // write to it through the sink (only READ does).
        let payload_in = unsafe { std::slice::from_raw_parts(e.payload, in_len) };
        let mut sink = RingSink {
            buf: e.payload,
            cap: e.payload_len,
            sent: None,
        };
        let commit_id = header.commit_id();
        let (unique, reply) = match proto::decode_ring(&header.in_out, &header.op_in, payload_in) {
            Ok((h, op)) => (h.unique, fs.handle(&h, op, &mut self.scratch, &mut sink)),
            Err(err) => {
                tracing::warn!("malformed FUSE ring request: {err}");
                (commit_id, Reply::Error(libc::EINVAL))
            }
        };
        let (error, len) = match reply {
            Reply::None => sink.sent.map_or((libc::EIO, 0), |n| (0, n)),
            Reply::Error(errno) => (errno, 0),
            Reply::Body => {
                let body = IoSlice::new(&self.scratch.body);
                match sink.send_data(unique, &[body]) {
                    Ok(()) => (0, self.scratch.body.len()),
                    Err(_) => (libc::EIO, 0),
                }
            }
        };
        header.set_reply(unique, error, len);
        opcode::UringCmd80::new(
            types::Fd(self.fd.as_raw_fd()),
            proto::URING_CMD_COMMIT_AND_FETCH,
        )
        .cmd(proto::uring_cmd(commit_id, self.qid))
        .build()
        .user_data(idx as u64)
    }
}

impl Drop for RingQueue {
    fn drop(&mut self) {
        if self.in_kernel > 0 {
            // The kernel may still write into these buffers: never free them.
            std::mem::forget(std::mem::take(&mut self.entries));
        }
    }
}

/// Puts a reply body into the entry's payload buffer.
struct RingSink {
    buf: *mut u8,
    cap: usize,
    /// Bytes placed, once a reply was.
    sent: Option<usize>,
}

impl Sink for RingSink {
    fn send_data(&mut self, _unique: u64, data: &[IoSlice<'_>]) -> io::Result<()> {
        let total: usize = data.iter().map(|d| d.len()).sum();
        if total > self.cap {
            return Err(io::Error::from_raw_os_error(libc::EOVERFLOW));
        }
        let mut at = 0;
        for d in data {
            // SAFETY: `buf` has `cap` bytes, ours while the request is
            // served (RingQueue::serve); `at + d.len() <= total <= cap`; `d`
            // is the drive's memory or the scratch body, never the payload.
            unsafe { std::ptr::copy_nonoverlapping(d.as_ptr(), self.buf.add(at), d.len()) };
            at += d.len();
        }
        self.sent = Some(total);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_give_the_queue_count() {
        assert_eq!(parse_cpu_count("0-1\n"), Some(2));
        assert_eq!(parse_cpu_count("0"), Some(1));
        assert_eq!(parse_cpu_count("0-3,4-7"), Some(8));
        assert_eq!(parse_cpu_count("0,1,2"), Some(3));
        // Holes: queue ids would not be CPU ids.
        assert_eq!(parse_cpu_count("0-1,4-5"), None);
        assert_eq!(parse_cpu_count("1-3"), None);
        for bad in ["", "x", "3-1", "0-", "-1", "0--1"] {
            assert_eq!(parse_cpu_count(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn entries_per_queue_stays_within_bounds() {
        assert_eq!(entries_per_queue(1), MAX_ENTRIES);
        assert_eq!(entries_per_queue(2), MAX_ENTRIES);
        assert_eq!(entries_per_queue(8), 8);
        assert_eq!(entries_per_queue(4096), MIN_ENTRIES);
    }

    #[test]
    fn register_sqe_sets_len_and_the_command() {
        // The crate's own setter for `len` (Read's len) puts it where
        // with_len writes it: offset 24 of io_uring_sqe.
        let read = opcode::Read::new(types::Fd(3), std::ptr::null_mut(), 0x1234_5678).build();
        // SAFETY: Entry is #[repr(C)] around the 64-byte io_uring_sqe.
        let raw: [u8; 64] = unsafe { std::mem::transmute(read) };
        assert_eq!(
            &raw[SQE_LEN_OFFSET..SQE_LEN_OFFSET + 4],
            &0x1234_5678u32.to_ne_bytes()
        );

        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 2];
        let sqe = register_sqe(7, 1, iov.as_mut_ptr(), 9);
        assert_eq!(sqe.get_user_data(), 9);
        // SAFETY: as in with_len.
        let raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
        assert_eq!(
            raw[0] as u32,
            io_uring::opcode::UringCmd80::CODE as u32,
            "opcode"
        );
        assert_eq!(&raw[4..8], &7i32.to_ne_bytes(), "fd");
        assert_eq!(
            &raw[8..12],
            &proto::URING_CMD_REGISTER.to_ne_bytes(),
            "cmd_op"
        );
        assert_eq!(&raw[16..24], &(iov.as_ptr() as u64).to_ne_bytes(), "addr");
        assert_eq!(&raw[24..28], &2u32.to_ne_bytes(), "len");
        // The 80-byte command area starts at offset 48.
        assert_eq!(&raw[48..128], &proto::uring_cmd(0, 1)[..], "cmd");
    }

    #[test]
    fn ring_sink_places_slices_and_refuses_overflow() {
        let mut buf = vec![0u8; 8];
        let mut sink = RingSink {
            buf: buf.as_mut_ptr(),
            cap: buf.len(),
            sent: None,
        };
        sink.send_data(1, &[IoSlice::new(b"abc"), IoSlice::new(b"de")])
            .unwrap();
        assert_eq!(sink.sent, Some(5));
        assert!(sink.send_data(1, &[IoSlice::new(&[1; 9])]).is_err());
        assert_eq!(&buf[..5], b"abcde");
    }
}
