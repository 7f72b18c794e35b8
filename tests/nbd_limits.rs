//! What a hostile or broken client can make the NBD server hold or block:
//! connection buffers, handshake slots, connections of one address, the
//! server's own writes, the log.
//!
//! Its own test binary, because it reads process-wide figures (the
//! connection-buffer gauge, RSS) that other tests' connections would move;
//! the tests here take `SERIAL` so they do not move each other's either.

mod common;

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use common::nbdserver::{Drive, TestServer};
use common::{wait_until, WAIT_TIMEOUT};
use ramd::nbd::access::Reason;
use ramd::nbd::proto::*;
use ramd::nbd::ServerConfig;

const MIB: usize = 1 << 20;
/// Longest any single socket read or write may block. Generous: the
/// machine may be busy, and it only costs time when a test fails.
const IO_TIMEOUT: Duration = Duration::from_secs(60);

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A server (`common::nbdserver`) on its own thread with a 64 MiB drive
/// "ram0" and a read-only 64 MiB drive "ro".
fn start(tweak: impl FnOnce(&mut ServerConfig)) -> TestServer {
    TestServer::start(
        &[
            Drive::new("ram0", 64 << 20),
            Drive::new("ro", 64 << 20).read_only(),
        ],
        tweak,
    )
}

/// This file's connections to a test server.
trait Connect {
    fn connect(&self) -> UnixStream;
    /// A connection in the transmission phase on `export`.
    fn open(&self, export: &str) -> UnixStream;
}

impl Connect for TestServer {
    fn connect(&self) -> UnixStream {
        connect_at(&self.socket)
    }

    fn open(&self, export: &str) -> UnixStream {
        open_at(&self.socket, export)
    }
}

fn connect_at(socket: &Path) -> UnixStream {
    let s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    s
}

/// A connection in the transmission phase on `export`.
fn open_at(socket: &Path, export: &str) -> UnixStream {
    let mut s = connect_at(socket);
    choose(&mut s, export);
    s
}

/// A TCP connection to `to` from a socket bound to the address `from`
/// (std cannot bind before connecting; loopback routes 127.0.0.0/8, so
/// any 127.x address works as a source).
fn tcp_from(from: &str, to: SocketAddr) -> TcpStream {
    use std::os::fd::FromRawFd;
    let from: std::net::Ipv4Addr = from.parse().unwrap();
    let SocketAddr::V4(to) = to else {
        panic!("IPv4 only")
    };
    let sockaddr = |ip: std::net::Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a fresh socket owned by the TcpStream right away; bind and
    // connect read initialised sockaddr_in values of the length given.
    let s = unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {}", io::Error::last_os_error());
        let s = TcpStream::from_raw_fd(fd);
        let local = sockaddr(from, 0);
        let rc = libc::bind(fd, std::ptr::addr_of!(local).cast(), len);
        assert_eq!(rc, 0, "bind {from}: {}", io::Error::last_os_error());
        let remote = sockaddr(*to.ip(), to.port());
        let rc = libc::connect(fd, std::ptr::addr_of!(remote).cast(), len);
        assert_eq!(rc, 0, "connect {to}: {}", io::Error::last_os_error());
        s
    };
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    s
}

/// A TCP connection from `from` in the transmission phase on `export`.
fn open_tcp(from: &str, to: SocketAddr, export: &str) -> TcpStream {
    let mut s = tcp_from(from, to);
    choose(&mut s, export);
    s
}

/// Greets and chooses `export` with NBD_OPT_EXPORT_NAME.
fn choose<S: Read + Write>(s: &mut S, export: &str) {
    greet(s).expect("greeting");
    let mut opt = Vec::new();
    opt.extend_from_slice(&IHAVEOPT.to_be_bytes());
    opt.extend_from_slice(&OPT_EXPORT_NAME.to_be_bytes());
    opt.extend_from_slice(&(export.len() as u32).to_be_bytes());
    opt.extend_from_slice(export.as_bytes());
    s.write_all(&opt).unwrap();
    let mut reply = [0u8; 10]; // size, flags (no zeroes)
    s.read_exact(&mut reply).expect("export name reply");
}

/// Reads the greeting and sends fixed-newstyle, no-zeroes client flags.
fn greet<S: Read + Write>(s: &mut S) -> io::Result<()> {
    let mut greeting = [0u8; 18];
    s.read_exact(&mut greeting)?;
    s.write_all(&(CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES).to_be_bytes())
}

fn request(command: u16, flags: u16, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(28);
    b.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
    b.extend_from_slice(&flags.to_be_bytes());
    b.extend_from_slice(&command.to_be_bytes());
    b.extend_from_slice(&cookie.to_be_bytes());
    b.extend_from_slice(&offset.to_be_bytes());
    b.extend_from_slice(&len.to_be_bytes());
    b
}

/// Reads one simple reply: (cookie, errno).
fn simple_reply<S: Read>(s: &mut S) -> (u64, u32) {
    let mut r = [0u8; 16];
    s.read_exact(&mut r).expect("a reply");
    assert_eq!(
        u32::from_be_bytes(r[0..4].try_into().unwrap()),
        SIMPLE_REPLY_MAGIC
    );
    let errno = u32::from_be_bytes(r[4..8].try_into().unwrap());
    (u64::from_be_bytes(r[8..16].try_into().unwrap()), errno)
}

/// Reads a successful READ's simple reply and its `len` bytes of data.
fn read_reply<S: Read>(s: &mut S, cookie: u64, len: usize) -> Vec<u8> {
    assert_eq!(simple_reply(s), (cookie, 0));
    let mut data = vec![0u8; len];
    s.read_exact(&mut data).expect("READ data");
    data
}

/// Whether the server has closed `s` (or shut it down), within `within`,
/// seen without reading from it: a client that does not read keeps not
/// reading while this waits (reading would unblock the server's writes).
fn hung_up_within(s: &UnixStream, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        let mut p = libc::pollfd {
            fd: s.as_raw_fd(),
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one pollfd, a live local, for an open fd.
        let rc = unsafe { libc::poll(&mut p, 1, 100) };
        assert!(rc >= 0, "poll: {}", io::Error::last_os_error());
        if p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0 {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
    }
}

/// Bytes written to `s` that the server has not read yet (SIOCOUTQ).
fn unread_by_server(s: &UnixStream) -> usize {
    let mut queued: libc::c_int = 0;
    // SAFETY: TIOCOUTQ (SIOCOUTQ) stores one c_int through the pointer,
    // which points at a live local; the fd is open.
    let rc = unsafe { libc::ioctl(s.as_raw_fd(), libc::TIOCOUTQ, &mut queued) };
    assert_eq!(rc, 0, "SIOCOUTQ: {}", io::Error::last_os_error());
    queued as usize
}

/// Whether the server has closed `s` (reads until EOF or an error, within
/// `within`); false when it is still open after that.
fn closed_within(s: &mut UnixStream, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut buf = vec![0u8; 1 << 16];
    while Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return true,
        }
    }
    false
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// 64 connections each send the 28-byte header of a refused 32 MiB WRITE
/// and nothing more. The server must not gather (and zero) a 32 MiB input
/// buffer for each: it drains refused payloads through its normal buffer.
#[test]
fn refused_write_headers_do_not_make_connections_hold_their_payload() {
    let _serial = serial();
    let server = start(|_| {});
    let len = 32 * MIB as u32;
    let before_rss = rss_bytes();
    let before = ramd::nbd::conn::buffer_bytes();
    let mut conns = Vec::new();
    for i in 0..64u64 {
        // Read-only drive, an invalid flag, and past the end, in turn.
        let (export, flags, offset) = match i % 3 {
            0 => ("ro", 0, 0),
            1 => ("ram0", CMD_FLAG_DF | CMD_FLAG_NO_HOLE, 0),
            _ => ("ram0", 0, 60 << 20),
        };
        let mut s = server.open(export);
        s.write_all(&request(CMD_WRITE, flags, i, offset, len))
            .unwrap();
        conns.push(s);
    }
    // Every connection's thread has read its header (no reply comes before
    // the refused payload is drained, but the header leaving the socket
    // shows it)...
    wait_until("every header read by the server", WAIT_TIMEOUT, || {
        conns.iter().all(|s| unread_by_server(s) == 0)
    });
    // ...and had a moment to (wrongly) grow its buffer for the payload. A
    // head start only: a correct server passes however long it is.
    thread::sleep(Duration::from_millis(500));
    let held = ramd::nbd::conn::buffer_bytes() - before;
    let grown = rss_bytes().saturating_sub(before_rss);
    assert!(
        held < 64 * 4 * MIB as u64,
        "64 connections hold {} MiB of buffers",
        held >> 20
    );
    assert!(grown < 256 << 20, "RSS grew by {} MiB", grown >> 20);
    // The refusal comes once the payload was sent, and the connection
    // goes on.
    let mut s = conns.pop().unwrap();
    s.write_all(&vec![7u8; len as usize]).unwrap();
    // 63 % 3 == 0: the read-only drive.
    assert_eq!(simple_reply(&mut s), (63, EPERM));
    s.write_all(&request(CMD_READ, 0, 99, 0, 4096)).unwrap();
    read_reply(&mut s, 99, 4096);
    drop(conns);
    drop(s);
    wait_until("connection buffers given back", WAIT_TIMEOUT, || {
        ramd::nbd::conn::buffer_bytes() <= before
    });
}

/// The handshake has one deadline: a client that sends one byte at a time
/// is closed when it passes, however steady its trickle.
#[test]
fn a_trickling_handshake_is_closed_at_its_deadline() {
    let _serial = serial();
    let server = start(|c| c.handshake_timeout = Duration::from_secs(1));
    let mut s = server.connect();
    // Greeted, or (a machine so busy that this took the whole 1 s) already
    // closed at the deadline, which is what is under test.
    if greet(&mut s).is_err() {
        return;
    }
    let option = IHAVEOPT.to_be_bytes();
    let mut closed = false;
    // 5 s of one byte every 100 ms: each read is quick, the whole is not.
    for b in option.iter().cycle().take(50) {
        if s.write_all(&[*b]).is_err() {
            closed = true;
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    // Its deadline passed long before the trickle ended; a busy machine
    // may have delayed the server's thread, hence the generous bound.
    assert!(
        closed || closed_within(&mut s, WAIT_TIMEOUT),
        "the server kept a trickling handshake open past its deadline"
    );
}

/// A client that sends option after option and never reads the replies
/// fills its socket: the server's writes then time out with the handshake
/// deadline instead of blocking its thread forever.
#[test]
fn a_client_that_never_reads_option_replies_is_closed() {
    let _serial = serial();
    let server = start(|c| c.handshake_timeout = Duration::from_secs(1));
    let mut s = server.connect();
    // Greeted, or (a machine so busy that this took the whole 1 s) already
    // closed at the deadline, which is what is under test.
    if greet(&mut s).is_err() {
        return;
    }
    let mut list = Vec::new();
    list.extend_from_slice(&IHAVEOPT.to_be_bytes());
    list.extend_from_slice(&OPT_LIST.to_be_bytes());
    list.extend_from_slice(&0u32.to_be_bytes());
    let flood: Vec<u8> = list
        .iter()
        .copied()
        .cycle()
        .take(list.len() * 40_000)
        .collect();
    let mut w = s.try_clone().unwrap();
    w.set_write_timeout(Some(Duration::from_secs(3))).unwrap();
    // Stops when the socket is full and the server no longer reads.
    let _ = w.write_all(&flood);
    // Still reading nothing: the server's blocked write must time out.
    assert!(
        hung_up_within(&s, WAIT_TIMEOUT),
        "the server still holds a connection that never read its replies"
    );
}

/// Idle unfinished handshakes cannot keep a real client out: handshakes
/// have slots of their own, and a newcomer takes the place of the oldest
/// slow one.
#[test]
fn idle_handshakes_cannot_lock_out_a_real_client() {
    let _serial = serial();
    let server = start(|c| {
        c.max_connections = 16;
        c.max_handshakes = 4;
        c.handshake_timeout = Duration::from_secs(60);
    });
    let mut idle = Vec::new();
    for _ in 0..16 {
        let mut s = server.connect();
        // Greeted or closed at once; either way it then says nothing.
        let _ = greet(&mut s);
        idle.push(s);
    }
    // The behaviour under test: handshakes idle for longer than the
    // server's eviction age (1 s) make room. Sleeping longer on a busy
    // machine changes nothing.
    thread::sleep(Duration::from_millis(1200));
    let mut real = server.open("ram0");
    real.write_all(&request(CMD_READ, 0, 1, 0, 512)).unwrap();
    read_reply(&mut real, 1, 512);
    // Established clients are never evicted, whatever arrives after them.
    for _ in 0..8 {
        let mut s = server.connect();
        let _ = greet(&mut s);
        idle.push(s);
    }
    real.write_all(&request(CMD_READ, 0, 2, 0, 512)).unwrap();
    read_reply(&mut real, 2, 512);
}

/// One address cannot take every connection: past its limit, its
/// connections are closed at accept (before any greeting) while another
/// address still gets in; the refusals are counted; a slot comes back
/// when one of its connections ends. Unix-socket clients of the server's
/// own user are not counted.
#[test]
fn one_address_cannot_take_every_connection() {
    let _serial = serial();
    let server = start(|c| {
        c.tcp = vec!["127.0.0.1:0".parse().unwrap()];
        c.max_connections = 16;
        c.max_connections_per_address = Some(3);
    });
    let to = server.tcp[0];
    let refusals = server.shutdown.refusals();
    let mut held: Vec<TcpStream> = (0..3).map(|_| open_tcp("127.0.0.1", to, "ram0")).collect();
    // Closed at accept: no greeting, end of file (or a reset).
    let refused = |from: &str| {
        let mut s = tcp_from(from, to);
        let mut greeting = [0u8; 18];
        !matches!(s.read(&mut greeting), Ok(n) if n > 0)
    };
    assert!(
        refused("127.0.0.1"),
        "a 4th connection from 127.0.0.1 was greeted"
    );
    assert_eq!(refusals.get(Reason::PerAddressLimit), 1);
    let mut other = open_tcp("127.0.0.2", to, "ram0");
    other.write_all(&request(CMD_READ, 0, 1, 0, 512)).unwrap();
    read_reply(&mut other, 1, 512);
    // The held ones still work.
    for (i, s) in held.iter_mut().enumerate() {
        s.write_all(&request(CMD_READ, 0, i as u64, 0, 512))
            .unwrap();
        read_reply(s, i as u64, 512);
    }
    // The server's own user on the unix socket is not counted.
    let unix: Vec<UnixStream> = (0..4).map(|_| server.open("ram0")).collect();
    // A connection that ends gives its slot back.
    drop(held.pop());
    wait_until("a slot for 127.0.0.1 again", WAIT_TIMEOUT, || {
        greet(&mut tcp_from("127.0.0.1", to)).is_ok()
    });
    assert!(refusals.get(Reason::PerAddressLimit) >= 1);
    drop(unix);
}

/// A client that sends READs and never reads the replies is disconnected
/// after the reply timeout; other clients of the drive go on meanwhile.
#[test]
fn a_client_that_stops_reading_replies_is_disconnected() {
    let _serial = serial();
    let server = start(|c| c.reply_timeout = Duration::from_secs(1));
    let mut stuck = server.open("ram0");
    for i in 0..256 {
        stuck
            .write_all(&request(CMD_READ, 0, i, 0, MIB as u32))
            .unwrap();
    }
    let mut other = server.open("ram0");
    other.write_all(&request(CMD_READ, 0, 7, 0, 4096)).unwrap();
    read_reply(&mut other, 7, 4096);
    // Still reading nothing (that would let the server's writes go on).
    assert!(
        hung_up_within(&stuck, WAIT_TIMEOUT),
        "the server still serves a client that took no replies"
    );
}

/// After a burst of connections that each moved 1 MiB both ways, the
/// daemon gives their buffers back to the OS (RSS returns near its start).
#[test]
fn memory_of_a_connection_burst_is_given_back() {
    let _serial = serial();
    let server = start(|_| {});
    // Warm up: the drive's page and the server's first allocations.
    burst(&server, 1);
    let before = rss_bytes();
    for _ in 0..3 {
        burst(&server, 64);
    }
    wait_until("connections gone", WAIT_TIMEOUT, || {
        ramd::nbd::conn::buffer_bytes() == 0
    });
    let after = rss_bytes();
    let kept = after.saturating_sub(before);
    eprintln!(
        "RSS before {} MiB, after 3 bursts of 64 connections {} MiB",
        before >> 20,
        after >> 20
    );
    assert!(
        kept < 48 << 20,
        "the process kept {} MiB after the bursts",
        kept >> 20
    );
}

/// `n` concurrent connections, each writing and reading 1 MiB, then closing.
fn burst(server: &TestServer, n: usize) {
    let path: &Path = &server.socket;
    thread::scope(|scope| {
        for i in 0..n {
            scope.spawn(move || {
                let mut s = open_at(path, "ram0");
                let mut req = request(CMD_WRITE, 0, i as u64, 0, MIB as u32);
                req.extend(vec![i as u8; MIB]);
                s.write_all(&req).unwrap();
                assert_eq!(simple_reply(&mut s).1, 0);
                s.write_all(&request(CMD_READ, 0, 1, 0, MIB as u32))
                    .unwrap();
                assert_eq!(simple_reply(&mut s).1, 0);
                let mut data = vec![0u8; MIB];
                s.read_exact(&mut data).unwrap();
            });
        }
    });
}

/// A flood of connections over the cap writes one log line per 10 s, not
/// one per connection (the log is not a way to fill the disk).
#[test]
fn a_connection_flood_logs_one_line_per_interval() {
    let _serial = serial();
    let d = common::Daemon::launch(
        &[
            "serve".into(),
            "--max-connections".into(),
            "1".into(),
            "--drive".into(),
            "ram0=1M".into(),
        ],
        &[],
    );
    let mut held = open_at(d.socket(), "ram0");
    let started = Instant::now();
    for _ in 0..2000 {
        // Refused at accept: closed at once, or refused to connect.
        if let Ok(mut s) = UnixStream::connect(d.socket()) {
            let _ = s.read(&mut [0u8; 32]);
        }
    }
    // One line per 10 s the flood lasted: a busy machine may stretch it
    // past 10 s (2000 connections take well under one when idle).
    let intervals = 1 + started.elapsed().as_secs() / 10;
    held.write_all(&request(CMD_READ, 0, 5, 0, 512)).unwrap();
    read_reply(&mut held, 5, 512);
    let lines = || d.log().matches("connection refused").count();
    wait_until("a refused connection logged", WAIT_TIMEOUT, || lines() >= 1);
    let log = d.log();
    assert!(
        lines() as u64 <= intervals,
        "{} lines for 2000 refused connections over {intervals} intervals of 10 s:\n{log}",
        lines()
    );
}

/// The NBD socket is 0600 whatever the umask: only the daemon's user may
/// connect (a umask of 000 used to leave it 0777).
#[test]
fn the_nbd_socket_is_private_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    let _serial = serial();
    // SAFETY: umask only sets this process's file-creation mask; the tests
    // of this binary that create files run one at a time (`SERIAL`).
    let old = unsafe { libc::umask(0) };
    let server = start(|_| {});
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    let mode = std::fs::metadata(&server.socket)
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "NBD socket mode {mode:o}");
}
