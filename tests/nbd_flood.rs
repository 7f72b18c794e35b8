//! Clients that reconnect in a tight loop from a few addresses and never
//! finish their handshake cannot keep a client from another address out:
//! when every handshake slot is taken, the newcomer takes the slot of the
//! address holding the most (outside testing saw 19 of 29 good probes
//! refused while five loopback addresses took each freed slot first).
//!
//! Its own test binary: it fills the server's handshake slots, which any
//! other test's connections would compete for.

use std::io::{ErrorKind, Read};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::FromRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use ramd::block::backend::Backend;
use ramd::nbd::{Export, ExportTable, Server, ServerConfig};
use ramd::store::{MemoryBudget, RamStore};

/// A TCP connection to `to` from the loopback address `from`.
fn tcp_from(from: std::net::Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
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
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let s = TcpStream::from_raw_fd(fd);
        let local = sockaddr(from, 0);
        if libc::bind(fd, std::ptr::addr_of!(local).cast(), len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let remote = sockaddr(*to.ip(), to.port());
        if libc::connect(fd, std::ptr::addr_of!(remote).cast(), len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(s)
    }
}

/// True while the server has not closed `s` (it may have greeted it).
fn still_open(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return false,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
            Err(_) => return false,
        }
    }
}

/// One attacking address: keeps `n` connections open that never answer
/// the greeting, replacing each the server closes at once, until `stop`.
fn attacker(from: std::net::Ipv4Addr, to: SocketAddr, n: usize, stop: Arc<AtomicBool>) {
    let mut held: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
    while !stop.load(Ordering::Relaxed) {
        for slot in held.iter_mut() {
            if slot.as_mut().is_some_and(still_open) {
                continue;
            }
            *slot = tcp_from(from, to).ok().inspect(|s| {
                let _ = s.set_nonblocking(true);
            });
        }
        // Not a wait for anything: the attack's pace, a reconnect loop
        // that leaves the CPU to the server now and then.
        thread::sleep(Duration::from_millis(1));
    }
}

/// A good client: greeted within the deadline.
fn probe(to: SocketAddr) -> Result<(), String> {
    let mut s = tcp_from(std::net::Ipv4Addr::LOCALHOST, to).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut greeting = [0u8; 18];
    s.read_exact(&mut greeting)
        .map_err(|e| format!("no greeting: {e}"))?;
    if &greeting[..8] != b"NBDMAGIC" {
        return Err(format!("not a greeting: {greeting:?}"));
    }
    Ok(())
}

#[test]
fn reconnecting_attackers_on_five_addresses_cannot_lock_out_a_client() {
    let dir = tempfile::tempdir().unwrap();
    let exports = Arc::new(ExportTable::new());
    let store = RamStore::new(16 << 20, None, Arc::new(MemoryBudget::new(u64::MAX))).unwrap();
    let backend = Arc::new(store) as Arc<dyn Backend>;
    assert!(exports.insert(Arc::new(Export::new("ram0", "", backend, false))));
    let mut config = ServerConfig::new(dir.path().join("nbd.sock"));
    config.tcp = vec!["127.0.0.1:0".parse().unwrap()];
    config.handshake_timeout = Duration::from_secs(60);
    // The defaults: 256 connections, 64 handshake slots, 64 per address.
    let server = Server::bind(config, exports).unwrap();
    let to = server.tcp_addrs()[0];
    let shutdown = server.shutdown_handle();
    let run = thread::spawn(move || server.run());

    let stop = Arc::new(AtomicBool::new(false));
    let attackers: Vec<_> = (2..7u8)
        .map(|i| {
            let stop = stop.clone();
            let from = std::net::Ipv4Addr::new(127, 0, 0, i);
            thread::spawn(move || attacker(from, to, 20, stop))
        })
        .collect();
    // Until the attackers hold every slot: 100 connections wanted, 64
    // slots, so some of theirs are refused.
    let deadline = Instant::now() + Duration::from_secs(60);
    while shutdown.handshaking() < 64 {
        assert!(
            Instant::now() < deadline,
            "the attackers never filled the slots"
        );
        thread::sleep(Duration::from_millis(10));
    }
    let mut failed = Vec::new();
    for i in 0..30 {
        if let Err(e) = probe(to) {
            failed.push(format!("probe {i}: {e}"));
        }
    }
    stop.store(true, Ordering::Relaxed);
    for a in attackers {
        a.join().unwrap();
    }
    shutdown.shutdown();
    run.join().unwrap().unwrap();
    assert!(
        failed.is_empty(),
        "{} of 30 probes failed: {failed:?}",
        failed.len()
    );
}
