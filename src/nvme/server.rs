//! The NVMe/TCP listener: accepts connections on every configured address
//! and gives each its own thread (`conn::serve`), as the NBD server does
//! and for the same reason: the data path is synchronous RAM work, and a
//! blocking read per batch is the cheapest wait.
//!
//! Admission: at most `max_connections` connections at once (further ones
//! are closed at accept), and at most a quarter of them from one IP
//! address, so one host cannot take every slot; a connection must send its
//! ICReq and Connect within `connect_timeout` (`conn.rs`), so idle sockets
//! cannot hold slots either.
//!
//! Shutdown: stop accepting, shut down every live socket, wait for every
//! connection thread to end. Every count is of the `live` map, whose entry
//! a connection's thread removes when it ends (a guard, so panics too).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use super::conn;
use super::target::Target;
use crate::handover::listeners as kept;

/// How often the accept loop looks at the shutdown flag.
const ACCEPT_TICK: Duration = Duration::from_millis(200);

/// A bound NVMe/TCP listener, ready to `run`.
pub struct NvmeServer {
    listeners: Vec<TcpListener>,
    shared: Arc<Shared>,
}

struct Shared {
    target: Arc<Target>,
    stop: AtomicBool,
    /// Live connections: their address and a handle to shut them down.
    live: Mutex<HashMap<u64, (IpAddr, TcpStream)>>,
    gone: Condvar,
    next_id: AtomicU64,
}

/// Stops a running server from another thread.
#[derive(Clone)]
pub struct NvmeShutdown(Arc<Shared>);

impl NvmeShutdown {
    pub fn shutdown(&self) {
        self.0.stop.store(true, Ordering::SeqCst);
        for (_, s) in self.0.live.lock().values() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Connections open now.
    pub fn connections(&self) -> usize {
        self.0.live.lock().len()
    }

    /// The target (its controllers, for tests and stats).
    pub fn target(&self) -> &Arc<Target> {
        &self.0.target
    }
}

impl NvmeServer {
    /// Binds every address of the target's config.
    pub fn bind(target: Arc<Target>) -> io::Result<NvmeServer> {
        let mut listeners = Vec::new();
        for a in &target.config.listen {
            let l = kept::kept_or_bind(&kept::key("nvme-tcp", a), None, || TcpListener::bind(a))?;
            l.set_nonblocking(true)?;
            listeners.push(l);
        }
        Ok(NvmeServer {
            listeners,
            shared: Arc::new(Shared {
                target,
                stop: AtomicBool::new(false),
                live: Mutex::new(HashMap::new()),
                gone: Condvar::new(),
                next_id: AtomicU64::new(0),
            }),
        })
    }

    /// The addresses bound (port 0 resolved).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect()
    }

    pub fn shutdown_handle(&self) -> NvmeShutdown {
        NvmeShutdown(self.shared.clone())
    }

    /// Accepts until shut down, then waits for every connection to end.
    pub fn run(self) -> io::Result<()> {
        let mut fds: Vec<libc::pollfd> = self
            .listeners
            .iter()
            .map(|l| libc::pollfd {
                fd: l.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        while !self.shared.stop.load(Ordering::SeqCst) {
            // SAFETY: `fds` is a live, correctly sized array of pollfd for
            // the duration of the call; the listeners outlive it.
            let n = unsafe {
                libc::poll(
                    fds.as_mut_ptr(),
                    fds.len() as libc::nfds_t,
                    ACCEPT_TICK.as_millis() as i32,
                )
            };
            if n <= 0 {
                continue;
            }
            for l in &self.listeners {
                while let Ok((s, peer)) = l.accept() {
                    self.admit(s, peer);
                }
            }
        }
        let mut live = self.shared.live.lock();
        while !live.is_empty() {
            self.shared.gone.wait(&mut live);
        }
        Ok(())
    }

    fn admit(&self, s: TcpStream, peer: SocketAddr) {
        let cfg = &self.shared.target.config;
        let ip = peer.ip().to_canonical();
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut live = self.shared.live.lock();
            let from_ip = live.values().filter(|(a, _)| *a == ip).count();
            let per_ip = (cfg.max_connections / 4).max(1);
            if live.len() >= cfg.max_connections || from_ip >= per_ip {
                tracing::warn!(%peer, "NVMe/TCP connection refused: too many connections");
                return;
            }
            let Ok(handle) = s.try_clone() else {
                return;
            };
            live.insert(id, (ip, handle));
        }
        if s.set_nonblocking(false).is_err() {
            self.shared.live.lock().remove(&id);
            return;
        }
        let shared = self.shared.clone();
        let spawned = std::thread::Builder::new()
            .name("nvme-conn".into())
            .spawn(move || {
                let _guard = Registered(shared.clone(), id);
                if let Err(e) = conn::serve(shared.target.clone(), s) {
                    tracing::debug!(%peer, "NVMe/TCP connection ended: {e}");
                }
            });
        if spawned.is_err() {
            self.shared.live.lock().remove(&id);
        }
    }
}

/// Removes a connection from `live` when its thread ends.
struct Registered(Arc<Shared>, u64);

impl Drop for Registered {
    fn drop(&mut self) {
        self.0.live.lock().remove(&self.1);
        self.0.gone.notify_all();
    }
}
