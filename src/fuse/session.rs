//! A mount's FUSE session: the threads serving it, on one of two paths
//! (`Path`), chosen by `start` when it answers the kernel's INIT.
//!
//! Classic: several queue threads, each reading requests from its own
//! clone of the `/dev/fuse` descriptor and answering them inline from the
//! drive, as an NBD connection thread does.
//!
//! ```text
//!  kernel ── one request queue per mount ──┬─► fd 0 ─ thread fuse-NAME-0 ─┐
//!                                          ├─► fd 1 ─ thread fuse-NAME-1 ─┼─► DriveFs::handle ─► drive
//!                                          └─► ...  (FUSE_DEV_IOC_CLONE)  ┘
//! ```
//!
//! io_uring (`uring`): one ring queue per CPU, thread `fuse-NAME-uC`, and
//! one classic reader `fuse-NAME-0` for what never goes through the ring
//! (FORGET, INTERRUPT). Used when the kernel offers it in INIT, the
//! environment allows it (`RAMD_FUSE_URING` not `0`/`off`) and every ring
//! registers; otherwise the classic path, with one log line saying why.
//!
//! Invariants:
//! - A reply goes to the descriptor its request was read from (the kernel
//!   keeps the request on that descriptor's processing list), in one
//!   `writev`: header and body together.
//! - Every thread returns once the mount is gone: reads then fail with
//!   ENODEV (ring commands with ENOTCONN). Nothing here waits for the
//!   daemon's locks, so unmounting (or the daemon's death, which closes
//!   every descriptor and aborts the connection) never hangs the host.
//! - No allocation per request: each thread owns its read buffer (the
//!   largest request: 1 MiB of WRITE data plus headers) and reply buffer.
//!
//! Why cloned descriptors and not one thread: with one reader, a loop
//! device's queue of direct I/O waits behind every single request's
//! round trip; with a reader per CPU the kernel hands the next request to
//! an idle thread while another copies a megabyte.

use std::io::{self, IoSlice};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::fs::{DriveFs, Reply, Scratch, Sink};
use super::proto::{self, Op};
use super::uring;

/// `FUSE_DEV_IOC_CLONE` = `_IOR(229, 0, uint32_t)` (linux/fuse.h).
const FUSE_DEV_IOC_CLONE: libc::c_ulong = 0x8004_e500;
/// Read buffer: the largest WRITE plus its headers, and at least what the
/// kernel demands of any reader.
const READ_BUFFER_BYTES: usize = super::fs::MAX_IO_BYTES as usize + 4096;

/// How a mount is served, as `ramd attach`, listings and /metrics report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// Queue threads reading and writing `/dev/fuse`, each on its own
    /// descriptor.
    Classic { queues: usize },
    /// FUSE over io_uring: one ring per CPU (kernel 6.14+ with the fuse
    /// module's `enable_uring` on).
    Uring { queues: usize },
}

impl Path {
    /// The short name: "fuse-classic" or "fuse-uring".
    pub fn kind(&self) -> &'static str {
        match self {
            Path::Classic { .. } => "fuse-classic",
            Path::Uring { .. } => "fuse-uring",
        }
    }
    pub fn queues(&self) -> usize {
        match *self {
            Path::Classic { queues } | Path::Uring { queues } => queues,
        }
    }
}

impl std::fmt::Display for Path {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({} queues)", self.kind(), self.queues())
    }
}

/// The queue count: `RAMD_FUSE_QUEUES` when set (1-64, for measuring),
/// else one per CPU and at least two (one thread can copy a large request
/// while another takes the next).
pub fn default_queues() -> usize {
    let env = std::env::var("RAMD_FUSE_QUEUES").ok();
    if let Some(n) = env.and_then(|v| v.parse::<usize>().ok()) {
        return n.clamp(1, 64);
    }
    std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 16))
}

/// Starts the threads serving the session on `dev` (the descriptor the
/// mount was made with). Returns their handles (each returns when the
/// mount goes away) and the path the mount uses.
///
/// The kernel queued INIT while mounting: it is answered here, and the
/// answer picks the path. FUSE over io_uring when the kernel offers it
/// (the fuse module's `enable_uring`), `RAMD_FUSE_URING` is not `0`/`off`
/// and every queue's ring is set up and registered (`uring`), with one
/// classic reader left for INIT, FORGET and INTERRUPT; otherwise classic
/// queue threads only. A failure on the way is logged in one line and
/// falls back to the classic path, with the mount intact.
///
/// With `kept` (a session a supervisor keeps across a kill of this
/// process: [`resume`]) the classic path is used and a duplicate of every
/// queue's descriptor goes into `kept`.
pub fn start(
    fs: Arc<DriveFs>,
    dev: OwnedFd,
    name: &str,
    kept: Option<&mut Vec<OwnedFd>>,
) -> io::Result<(Vec<JoinHandle<io::Result<()>>>, Path)> {
    let queues = default_queues();
    let mut lead = Queue::new(dev, &fs);
    let mut prepared = None;
    if kept.is_some() {
        // No ring: a ring's state cannot be handed to another process.
        if readable_within(lead.fd.as_fd(), INIT_WAIT_MS)? {
            if let Some(n) = lead.read()? {
                lead.serve(&fs, n)?;
            }
        }
        let threads = start_classic(fs, lead, queues, name, kept)?;
        let path = Path::Classic { queues };
        tracing::info!(drive = name, "FUSE session: {path} (kept across restarts)");
        return Ok((threads, path));
    }
    if readable_within(lead.fd.as_fd(), INIT_WAIT_MS)? {
        if let Some(n) = lead.read()? {
            match proto::decode(&lead.buf[..n]) {
                Ok((
                    h,
                    Op::Init {
                        major,
                        max_readahead,
                        flags,
                        ..
                    },
                )) => {
                    prepared =
                        lead.answer_init(&fs, h.unique, major, max_readahead, flags, name)?;
                }
                // Not INIT (or no INIT in time): the classic threads serve
                // everything, INIT included, as they always could.
                _ => {
                    lead.serve(&fs, n)?;
                }
            }
        }
    }
    let mut threads = Vec::new();
    let path = match prepared {
        None => Path::Classic { queues },
        Some(prepared) => {
            let (ring_threads, registered) = prepared.register();
            threads.extend(ring_threads);
            match registered {
                Ok(rings) => Path::Uring { queues: rings },
                Err(e) => {
                    tracing::warn!(
                        drive = name,
                        "FUSE over io_uring not used: {e}; serving through /dev/fuse"
                    );
                    if let Err(e) = uring::refuse(lead.fd.as_fd()) {
                        tracing::error!(drive = name, "cannot turn the FUSE ring off: {e}");
                    }
                    Path::Classic { queues }
                }
            }
        }
    };
    let readers = match path {
        // INIT is done; FORGET and INTERRUPT are all that read() brings.
        Path::Uring { .. } => 1,
        Path::Classic { .. } => queues,
    };
    threads.extend(start_classic(fs, lead, readers, name, None)?);
    tracing::info!(drive = name, "FUSE session: {path}");
    Ok((threads, path))
}

/// `FUSE_NOTIFY_RESEND` (linux/fuse.h, 6.9+): the kernel queues again the
/// requests a dead server had read and not answered.
const FUSE_NOTIFY_RESEND: i32 = 7;

/// Set when this process stops for an upgrade with its sessions kept:
/// queue threads answer nothing more (a request read now stays on its
/// descriptor's processing list, which the keeper holds, and the next
/// process has the kernel send it again) while the drives close.
static FROZEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Stops every queue thread of this process from answering (see
/// [`FROZEN`]); for an upgrade, before the drives and caches close.
pub fn freeze() {
    FROZEN.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Serves a session another process started and a supervisor kept
/// ([`start`] with `kept`): the kernel is asked to send again what the
/// dead process had read but not answered, then a queue thread per kept
/// descriptor serves, as before. Without resend (kernels before 6.9)
/// those requests stay unanswered (their I/O hangs; logged).
pub fn resume(
    fs: Arc<DriveFs>,
    fds: Vec<OwnedFd>,
    name: &str,
) -> io::Result<(Vec<JoinHandle<io::Result<()>>>, Path)> {
    let lead = fds
        .first()
        .ok_or_else(|| io::Error::other("a kept FUSE session without its descriptors"))?;
    let mut head = [0u8; 16];
    head[..4].copy_from_slice(&16u32.to_ne_bytes());
    head[4..8].copy_from_slice(&FUSE_NOTIFY_RESEND.to_ne_bytes());
    if let Err(e) = rustix::io::write(lead, &head) {
        tracing::warn!(drive = name, "the kernel did not take FUSE_NOTIFY_RESEND ({e}; Linux 6.9+): requests in flight when the last process died stay unanswered");
    }
    let queues = fds.len();
    let mut threads = Vec::with_capacity(queues);
    for (i, fd) in fds.into_iter().enumerate() {
        let q = Queue::new(fd, &fs);
        let fs = fs.clone();
        let t = std::thread::Builder::new()
            .name(format!("fuse-{name}-{i}"))
            .spawn(move || q.run(&fs))?;
        threads.push(t);
    }
    let path = Path::Classic { queues };
    tracing::info!(drive = name, "FUSE session resumed: {path}");
    Ok((threads, path))
}

/// How long `start` waits for the kernel's INIT (queued by the mount).
const INIT_WAIT_MS: i32 = 5000;

/// True when `RAMD_FUSE_URING` allows FUSE over io_uring (unset: yes).
fn uring_allowed() -> bool {
    std::env::var("RAMD_FUSE_URING")
        .map(|v| {
            !matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "0" | "off" | "no" | "false"
            )
        })
        .unwrap_or(true)
}

/// Waits until `fd` has something to read; false after `timeout_ms`.
fn readable_within(fd: BorrowedFd<'_>, timeout_ms: i32) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: `p` is one live pollfd for the duration of the call.
        let r = unsafe { libc::poll(&mut p, 1, timeout_ms) };
        if r >= 0 {
            return Ok(r > 0);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// Starts `queues` classic queue threads: `lead` (on the session's own
/// descriptor) and clones.
fn start_classic(
    fs: Arc<DriveFs>,
    lead: Queue,
    queues: usize,
    name: &str,
    kept: Option<&mut Vec<OwnedFd>>,
) -> io::Result<Vec<JoinHandle<io::Result<()>>>> {
    let mut all = Vec::with_capacity(queues);
    for _ in 1..queues.max(1) {
        all.push(Queue::new(clone_fd(lead.fd.as_fd())?, &fs));
    }
    all.insert(0, lead);
    if let Some(kept) = kept {
        for q in &all {
            kept.push(q.fd.try_clone()?);
        }
    }
    let mut threads = Vec::with_capacity(all.len());
    for (i, q) in all.into_iter().enumerate() {
        let fs = fs.clone();
        let t = std::thread::Builder::new()
            .name(format!("fuse-{name}-{i}"))
            .spawn(move || q.run(&fs))?;
        threads.push(t);
    }
    Ok(threads)
}

/// Opens a new `/dev/fuse` descriptor attached to `dev`'s session.
fn clone_fd(dev: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let fd = rustix::fs::open(
        "/dev/fuse",
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    let session: u32 = dev.as_raw_fd() as u32;
    // SAFETY: FUSE_DEV_IOC_CLONE reads one u32 (the session's descriptor)
    // through the pointer, which points at a live u32 for the call.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), FUSE_DEV_IOC_CLONE, &session as *const u32) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// One queue thread's state.
struct Queue {
    fd: OwnedFd,
    buf: Vec<u8>,
    scratch: Scratch,
}

impl Queue {
    fn new(fd: OwnedFd, fs: &DriveFs) -> Queue {
        Queue {
            fd,
            buf: vec![0u8; READ_BUFFER_BYTES.max(proto::MIN_READ_BUFFER_BYTES)],
            scratch: Scratch {
                body: Vec::with_capacity(4096),
                rec: fs.export().metrics.as_ref().map(|m| m.connection()),
            },
        }
    }

    /// Serves requests until the mount is gone (Ok) or the device fails.
    fn run(mut self, fs: &DriveFs) -> io::Result<()> {
        while let Some(n) = self.read()? {
            if FROZEN.load(std::sync::atomic::Ordering::SeqCst) {
                return Ok(());
            }
            if !self.serve(fs, n)? {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Reads one request into `buf`: its length, or None once the mount
    /// is gone (or the connection was aborted).
    fn read(&mut self) -> io::Result<Option<usize>> {
        loop {
            match rustix::io::read(&self.fd, &mut self.buf) {
                Ok(n) => return Ok(Some(n)),
                // Interrupted before we read it, or a signal: try again.
                Err(
                    rustix::io::Errno::NOENT | rustix::io::Errno::INTR | rustix::io::Errno::AGAIN,
                ) => continue,
                Err(rustix::io::Errno::NODEV) => return Ok(None),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Answers INIT, offering FUSE over io_uring when the kernel does, it
    /// is allowed, and every queue's ring is set up; returns the rings
    /// then (to register once this reply is in).
    fn answer_init(
        &mut self,
        fs: &Arc<DriveFs>,
        unique: u64,
        major: u32,
        max_readahead: u32,
        offered: u64,
        name: &str,
    ) -> io::Result<Option<uring::Prepared>> {
        let prepared = if major != proto::VERSION.0 {
            None
        } else if !uring_allowed() {
            tracing::info!(
                drive = name,
                "FUSE over io_uring not used: RAMD_FUSE_URING is off"
            );
            None
        } else if offered & proto::OVER_IO_URING == 0 {
            tracing::info!(
                drive = name,
                "FUSE over io_uring not used: the kernel does not offer it (needs 6.14+ and the fuse module's enable_uring)"
            );
            None
        } else {
            let rings = uring::queue_count().and_then(|n| {
                let fds = (0..n)
                    .map(|_| clone_fd(self.fd.as_fd()))
                    .collect::<io::Result<Vec<_>>>()
                    .map_err(|source| uring::UringError::Setup { qid: 0, source })?;
                uring::prepare(fs, fds, name)
            });
            match rings {
                Ok(p) => Some(p),
                Err(e) => {
                    tracing::warn!(
                        drive = name,
                        "FUSE over io_uring not used: {e}; serving through /dev/fuse"
                    );
                    None
                }
            }
        };
        let extra = if prepared.is_some() {
            offered & (proto::INIT_EXT | proto::OVER_IO_URING)
        } else {
            0
        };
        let reply = init(&mut self.scratch.body, major, max_readahead, offered, extra);
        debug_assert_eq!(reply, Reply::Body);
        send(&self.fd, unique, 0, &[IoSlice::new(&self.scratch.body)])?;
        Ok(prepared)
    }

    /// Answers the request in `buf[..n]`; false after DESTROY.
    fn serve(&mut self, fs: &DriveFs, n: usize) -> io::Result<bool> {
        let (header, op) = match proto::decode(&self.buf[..n]) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("malformed FUSE request: {e}");
                // Answer it if the header is readable, so nothing waits.
                if n >= proto::IN_HEADER_BYTES {
                    let unique = u64::from_ne_bytes(self.buf[8..16].try_into().expect("8"));
                    send(&self.fd, unique, libc::EINVAL, &[])?;
                }
                return Ok(true);
            }
        };
        let unique = header.unique;
        let reply = match op {
            Op::Init {
                major,
                max_readahead,
                flags,
                ..
            } => init(&mut self.scratch.body, major, max_readahead, flags, 0),
            Op::Destroy => {
                send(&self.fd, unique, 0, &[])?;
                return Ok(false);
            }
            op => {
                let mut sink = FdSink(self.fd.as_fd());
                fs.handle(&header, op, &mut self.scratch, &mut sink)
            }
        };
        match reply {
            Reply::None => {}
            Reply::Error(errno) => send(&self.fd, unique, errno, &[])?,
            Reply::Body => send(&self.fd, unique, 0, &[IoSlice::new(&self.scratch.body)])?,
        }
        Ok(true)
    }
}

/// The INIT reply, with `extra` flags beyond the filesystem's terms. A
/// kernel speaking another major version gets only our version (it then
/// retries or gives up, as the protocol says).
fn init(body: &mut Vec<u8>, major: u32, max_readahead: u32, offered: u64, extra: u64) -> Reply {
    body.clear();
    if major != proto::VERSION.0 {
        proto::init_out(
            body,
            &proto::InitReply {
                flags: 0,
                max_readahead: 0,
                max_write: 4096,
                max_pages: 1,
                max_background: 1,
            },
        );
        body.truncate(8);
        return Reply::Body;
    }
    let mut terms = DriveFs::init_terms(offered, max_readahead);
    terms.flags |= extra;
    proto::init_out(body, &terms);
    Reply::Body
}

/// Writes a reply (header + `parts`) to the device in one `writev`.
/// ENOENT means the request was interrupted and forgotten by the kernel:
/// not an error of ours.
fn send(fd: &OwnedFd, unique: u64, errno: i32, parts: &[IoSlice<'_>]) -> io::Result<()> {
    send_fd(fd.as_fd(), unique, errno, parts)
}

fn send_fd(fd: BorrowedFd<'_>, unique: u64, errno: i32, parts: &[IoSlice<'_>]) -> io::Result<()> {
    let body_len: usize = if errno == 0 {
        parts.iter().map(|p| p.len()).sum()
    } else {
        0
    };
    let header = proto::out_header(unique, errno, body_len);
    let parts = if errno == 0 { parts } else { &[] };
    // The header and up to STACK_SLICES parts go out from the stack; only
    // a READ whose bytes lie in many pieces of the drive needs a Vec.
    let mut stack = [IoSlice::new(&[]); STACK_SLICES + 1];
    let mut heap = Vec::new();
    let iov: &[IoSlice<'_>] = if parts.len() <= STACK_SLICES {
        stack[0] = IoSlice::new(&header);
        stack[1..=parts.len()].copy_from_slice(parts);
        &stack[..=parts.len()]
    } else {
        heap.push(IoSlice::new(&header));
        heap.extend_from_slice(parts);
        &heap
    };
    match rustix::io::writev(fd, iov) {
        Ok(_) | Err(rustix::io::Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Reply parts sent without allocating.
const STACK_SLICES: usize = 8;

/// Sends READ data straight from the drive's memory.
struct FdSink<'a>(BorrowedFd<'a>);

impl Sink for FdSink<'_> {
    fn send_data(&mut self, unique: u64, data: &[IoSlice<'_>]) -> io::Result<()> {
        send_fd(self.0, unique, 0, data)
    }
}
