//! The target's shared state: its settings, the drives it serves (the
//! daemon's export table, shared with NBD), access rules, and the
//! controllers hosts have created.
//!
//! A controller is made by an admin-queue Connect (cntlid 0xFFFF: dynamic
//! model) and lives as long as that admin connection: when it ends, or its
//! keep-alive timer runs out, the controller is removed and the sockets of
//! its I/O queues are shut down, so the host sees every queue of it go and
//! reconnects as a whole. I/O-queue Connects name the controller by its
//! cntlid and must come from the same host NQN for the same subsystem.
//!
//! Locks: `controllers` (parking_lot, never held across I/O: a socket
//! shutdown does not block) is touched at connect, disconnect and queue
//! count changes only; the data path holds its own `Arc<Controller>`.
//! Order: `controllers`, then the access table's and the export table's
//! own locks (a Connect's grant and `recheck_access` both decide under
//! `controllers`).
//!
//! Access: an NVMe/TCP host is identified by its host NQN, looked up in
//! the same per-drive rules as NBD's certificate identities (`identities`,
//! `read_only_identities`, `networks`): list a host NQN there to allow it.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::log::ErrorLog;
use super::names;
use crate::block::{Export, ExportTable};
use crate::nbd::access::{AccessTable, Grant, Source};

/// Highest cntlid the dynamic model may hand out (0xFFF0.. are reserved).
const MAX_CNTLID: u16 = 0xFFEF;

/// How the target listens and what it allows.
#[derive(Debug, Clone)]
pub struct TargetConfig {
    /// TCP addresses to listen on.
    pub listen: Vec<SocketAddr>,
    /// This daemon's node id (part of every subsystem NQN, see `names`).
    pub node: String,
    /// Most connections (queues) served at once; more are closed at accept.
    pub max_connections: usize,
    /// A host must send its ICReq and Connect within this time.
    pub connect_timeout: Duration,
    /// A host that takes none of our bytes for this long is disconnected.
    pub reply_timeout: Duration,
    /// Most I/O queues one controller gets (Set Features, Number of Queues).
    pub max_io_queues: u16,
    /// Entries a queue may hold (MQES + 1, MAXCMD).
    pub queue_entries: u16,
    /// Bytes of in-capsule data an I/O command may carry.
    pub in_capsule_bytes: u32,
    /// Largest H2CData PDU payload (MAXH2CDATA).
    pub max_h2c_data: u32,
    /// Largest transfer of one command, as a power of two of 4 KiB (MDTS).
    pub mdts: u8,
    /// Bytes of write data one queue may hold while it waits for H2CData;
    /// further writes wait for their R2T.
    pub write_buffer_bytes: usize,
}

impl TargetConfig {
    pub fn new(listen: Vec<SocketAddr>, node: &str) -> TargetConfig {
        TargetConfig {
            listen,
            node: node.to_owned(),
            max_connections: 512,
            connect_timeout: Duration::from_secs(10),
            reply_timeout: Duration::from_secs(30),
            max_io_queues: 64,
            queue_entries: 1024,
            in_capsule_bytes: 16 * 1024,
            max_h2c_data: 128 * 1024,
            mdts: 8,
            write_buffer_bytes: 8 << 20,
        }
    }

    /// The largest data transfer of one command, in bytes.
    pub fn max_transfer(&self) -> u64 {
        4096u64 << self.mdts
    }
}

/// What a controller serves.
#[derive(Clone)]
pub enum Serves {
    /// The discovery subsystem: the list of drives, no namespaces.
    Discovery,
    /// A drive's subsystem (namespace 1 is the drive).
    Drive { name: String, read_only_host: bool },
}

/// One controller (see the module docs).
pub struct Controller {
    pub cntlid: u16,
    pub serves: Serves,
    pub subnqn: String,
    pub hostnqn: String,
    pub hostid: [u8; 16],
    /// Where the host connected from (its admin queue's peer), for
    /// rechecking its grant when the drive's access rules change.
    pub source: Source,
    /// I/O queues granted (Set Features, Number of Queues).
    pub io_queues: AtomicU16,
    /// Set when the controller is gone: its I/O queues stop.
    pub dead: AtomicBool,
    /// The I/O queues' sockets, shut down when the controller goes.
    io_sockets: Mutex<Vec<TcpStream>>,
    /// A copy of the admin queue's socket: shut down when the controller
    /// is removed from outside its admin connection (access revoked), so
    /// that connection ends at once instead of at its next tick.
    admin_socket: Option<TcpStream>,
    /// Its failed commands, from every queue (the Error Information log).
    pub errors: Mutex<ErrorLog>,
}

impl Controller {
    /// Adds an I/O queue's socket; false when the controller is gone.
    pub fn add_queue(&self, s: &TcpStream) -> bool {
        let mut q = self.io_sockets.lock();
        if self.dead.load(Ordering::SeqCst) {
            return false;
        }
        if let Ok(c) = s.try_clone() {
            q.push(c);
        }
        true
    }

    /// Forgets an I/O queue's socket when its connection ends: the copy
    /// kept here would otherwise hold the connection open (the host never
    /// sees it close) and its descriptor until the controller goes.
    pub fn remove_queue(&self, s: &TcpStream) {
        let Ok(peer) = s.peer_addr() else { return };
        self.io_sockets
            .lock()
            .retain(|c| c.peer_addr().is_ok_and(|p| p != peer));
    }
}

/// Why a Connect is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectRefusal {
    /// No such subsystem (or not for this host).
    UnknownSubsystem,
    /// The host NQN is not allowed.
    HostNotAllowed,
    /// No such controller for an I/O queue.
    UnknownController,
    /// No controller ids left.
    Busy,
    /// The drive is listed but cannot serve yet (restoring, failed): the
    /// host is told to try again (Controller Busy, no DNR), so a host
    /// reconnecting to a daemon that restarts waits for the restore.
    NotReady { why: String },
}

/// The shared state (see the module docs).
pub struct Target {
    pub config: TargetConfig,
    pub exports: Arc<ExportTable>,
    pub access: Arc<AccessTable>,
    controllers: Mutex<Controllers>,
}

#[derive(Default)]
struct Controllers {
    by_id: HashMap<u16, Arc<Controller>>,
    next: u16,
}

impl Target {
    pub fn new(
        config: TargetConfig,
        exports: Arc<ExportTable>,
        access: Arc<AccessTable>,
    ) -> Target {
        Target {
            config,
            exports,
            access,
            controllers: Mutex::new(Controllers::default()),
        }
    }

    /// The subsystem NQN of a drive.
    pub fn nqn(&self, drive: &str) -> String {
        names::subsystem_nqn(&self.config.node, drive)
    }

    /// What `hostnqn` from `source` may do with drive `name`.
    ///
    /// A controller keeps the grant it got at Connect; when the rules
    /// change, `recheck_access` removes the controllers that lost it.
    pub fn grant(&self, name: &str, hostnqn: &str, source: &Source) -> Grant {
        self.access.grant(name, Some(hostnqn), source)
    }

    /// The drive a subsystem NQN names, if it exists and is served.
    pub fn drive(&self, subnqn: &str) -> Option<Arc<Export>> {
        let name = names::drive_of(&self.config.node, subnqn)?;
        self.exports
            .get(name)
            .filter(|e| !e.is_closed() && e.name == name)
    }

    /// Creates a controller for an admin-queue Connect that came on
    /// `admin` from `source`.
    pub fn create_controller(
        &self,
        subnqn: &str,
        hostnqn: &str,
        hostid: [u8; 16],
        source: &Source,
        admin: &TcpStream,
    ) -> Result<Arc<Controller>, ConnectRefusal> {
        // The grant is decided under the controllers' lock, which
        // `recheck_access` also holds while it looks: a Connect decided on
        // rules just replaced is either seen by that recheck or decided
        // after it, on the new rules.
        let mut c = self.controllers.lock();
        let serves = if subnqn == names::DISCOVERY_NQN {
            Serves::Discovery
        } else {
            let e = self.drive(subnqn).ok_or(ConnectRefusal::UnknownSubsystem)?;
            if let Some(why) = e.unavailable() {
                return Err(ConnectRefusal::NotReady { why });
            }
            match self.grant(&e.name, hostnqn, source) {
                Grant::Denied => return Err(ConnectRefusal::HostNotAllowed),
                g => Serves::Drive {
                    name: e.name.clone(),
                    read_only_host: g == Grant::ReadOnly,
                },
            }
        };
        let cntlid = (0..MAX_CNTLID)
            .map(|i| (c.next.wrapping_add(i) % MAX_CNTLID) + 1)
            .find(|id| !c.by_id.contains_key(id))
            .ok_or(ConnectRefusal::Busy)?;
        c.next = cntlid;
        let ctrl = Arc::new(Controller {
            cntlid,
            serves,
            subnqn: subnqn.to_owned(),
            hostnqn: hostnqn.to_owned(),
            hostid,
            source: *source,
            io_queues: AtomicU16::new(self.config.max_io_queues),
            dead: AtomicBool::new(false),
            io_sockets: Mutex::new(Vec::new()),
            admin_socket: admin.try_clone().ok(),
            errors: Mutex::new(ErrorLog::default()),
        });
        c.by_id.insert(cntlid, ctrl.clone());
        Ok(ctrl)
    }

    /// The controller an I/O-queue Connect names.
    pub fn find_controller(
        &self,
        cntlid: u16,
        subnqn: &str,
        hostnqn: &str,
    ) -> Result<Arc<Controller>, ConnectRefusal> {
        let c = self.controllers.lock();
        match c.by_id.get(&cntlid) {
            Some(ctrl) if ctrl.subnqn == subnqn && ctrl.hostnqn == hostnqn => Ok(ctrl.clone()),
            _ => Err(ConnectRefusal::UnknownController),
        }
    }

    /// Removes a controller and shuts its I/O queues down.
    pub fn remove_controller(&self, ctrl: &Controller) {
        self.controllers.lock().by_id.remove(&ctrl.cntlid);
        let socks = {
            let mut q = ctrl.io_sockets.lock();
            ctrl.dead.store(true, Ordering::SeqCst);
            std::mem::take(&mut *q)
        };
        for s in socks.iter().chain(&ctrl.admin_socket) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    /// After drive `name`'s access rules changed: removes the controllers
    /// whose host the new rules refuse, or allow only reading where the
    /// controller was made for writing (its namespace was announced
    /// writable). Their queues' sockets are shut down: commands in flight
    /// are not answered, and the host's reconnect is refused. Returns how
    /// many controllers went.
    pub fn recheck_access(&self, name: &str) -> usize {
        let lost: Vec<Arc<Controller>> = self
            .controllers
            .lock()
            .by_id
            .values()
            .filter(|c| match &c.serves {
                Serves::Drive {
                    name: n,
                    read_only_host,
                } if n == name => match self.grant(name, &c.hostnqn, &c.source) {
                    Grant::Denied => true,
                    Grant::ReadOnly => !read_only_host,
                    Grant::ReadWrite => false,
                },
                _ => false,
            })
            .cloned()
            .collect();
        for c in &lost {
            tracing::info!(host = %c.hostnqn, drive = %name, cntlid = c.cntlid,
                "NVMe/TCP controller closed: the drive's new access rules no longer allow it");
            self.remove_controller(c);
        }
        lost.len()
    }

    /// The hosts connected to drive `name` now: each host NQN with its
    /// number of controllers (one per `nvme connect`), sorted.
    pub fn hosts_of(&self, name: &str) -> Vec<(String, usize)> {
        let mut hosts = std::collections::BTreeMap::<String, usize>::new();
        for c in self.controllers.lock().by_id.values() {
            if matches!(&c.serves, Serves::Drive { name: n, .. } if n == name)
                && !c.dead.load(Ordering::SeqCst)
            {
                *hosts.entry(c.hostnqn.clone()).or_default() += 1;
            }
        }
        hosts.into_iter().collect()
    }

    /// Controllers alive now.
    pub fn controllers(&self) -> usize {
        self.controllers.lock().by_id.len()
    }
}
