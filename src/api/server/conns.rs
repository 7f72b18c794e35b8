//! Which web connections (`--api-listen`, `--http`) a listener keeps:
//! bounds per address and in all, a share kept for authenticated
//! clients, and who gives way to a newcomer (`tcp` applies them; no I/O
//! here).
//!
//! ```text
//! accept from ADDR ──► ADDR holds per_address already ──► its oldest unauthenticated
//!                      │                                 connection is closed (none: refused)
//!                      ├► unauthenticated share full ──► the oldest unauthenticated connection
//!                      │                                 of the address holding the most closes
//!                      ├► all slots full ──► the oldest unauthenticated one closes (none: refused)
//!                      └► admitted, unauthenticated until a request on it passes `auth`
//! ```
//!
//! Why: a connection costs a file descriptor and a task from its first
//! byte, before anyone knows whether it carries a token. Bounding
//! connections that never authenticated to a share of the slots, taking
//! slots back from the heaviest address first, and keeping the rest for
//! connections that authenticated means 400 idle sockets (or a slow TLS
//! handshake flood from many addresses) cannot lock out a client with a
//! token; the per-address bound keeps one address from holding the
//! authenticated share too. The listener's total comes from the
//! process's descriptor limit (`control::fds`), so the unix API and NBD
//! always keep descriptors of their own.
//!
//! Invariants: an entry exists exactly while its [`ConnGuard`] lives and
//! has not been evicted; an evicted connection's `closed` is notified
//! once (its task drops the socket); counts are taken under one lock.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

/// A listener's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most connections at once.
    pub total: usize,
    /// Most connections from one IP address.
    pub per_address: usize,
    /// Most connections that have not (yet) authenticated.
    pub unauthenticated: usize,
}

impl Limits {
    /// The bounds of a listener allowed `total` connections: half of
    /// them for connections without a token yet, an eighth (8 to 64)
    /// per address (a browser opens 6 per host, plus event streams).
    pub fn for_total(total: usize) -> Limits {
        let total = total.max(2);
        Limits {
            total,
            per_address: (total / 8).clamp(8, 64).min(total),
            unauthenticated: (total / 2).max(1),
        }
    }
}

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Its address holds `per_address` authenticated connections.
    #[error("{0} connections from this address are open already (the per-address limit)")]
    PerAddress(usize),
    /// Every slot holds an authenticated connection.
    #[error("all {0} connections are in use by authenticated clients")]
    Full(usize),
}

/// What one connection shares with its requests.
#[derive(Debug)]
pub struct ConnState {
    pub addr: IpAddr,
    authenticated: AtomicBool,
    /// Requests being handled on it now (idle deadlines wait for 0).
    busy: AtomicUsize,
    /// Notified when the connection is evicted.
    pub closed: Notify,
}

impl ConnState {
    /// Counts the connection as authenticated from now on (a request on
    /// it passed `auth`).
    pub fn mark_authenticated(&self) {
        self.authenticated.store(true, Ordering::Relaxed);
    }

    pub fn is_authenticated(&self) -> bool {
        self.authenticated.load(Ordering::Relaxed)
    }

    /// True while a request on it is being handled.
    pub fn is_busy(&self) -> bool {
        self.busy.load(Ordering::Relaxed) > 0
    }

    /// A connection from `addr` outside any table (unit tests).
    #[cfg(test)]
    pub fn for_tests(addr: IpAddr) -> ConnState {
        ConnState {
            addr,
            authenticated: AtomicBool::new(false),
            busy: AtomicUsize::new(0),
            closed: Notify::new(),
        }
    }

    /// Counts a request in flight until the guard drops.
    pub fn busy_guard(self: &Arc<Self>) -> BusyGuard {
        self.busy.fetch_add(1, Ordering::Relaxed);
        BusyGuard(self.clone())
    }
}

/// A request in flight on a connection (see [`ConnState::busy_guard`]).
pub struct BusyGuard(Arc<ConnState>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The connections of one listener.
#[derive(Debug)]
pub struct ConnTable {
    limits: Limits,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    next_id: u64,
    /// By id, so oldest first.
    conns: BTreeMap<u64, Arc<ConnState>>,
}

/// A connection's place in its table, given back on drop.
#[derive(Debug)]
pub struct ConnGuard {
    table: Arc<ConnTable>,
    id: u64,
    pub state: Arc<ConnState>,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.table.inner.lock().conns.remove(&self.id);
    }
}

impl ConnTable {
    pub fn new(limits: Limits) -> Arc<ConnTable> {
        Arc::new(ConnTable {
            limits,
            inner: Mutex::default(),
        })
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Connections open now: (all, unauthenticated).
    pub fn counts(&self) -> (usize, usize) {
        let inner = self.inner.lock();
        let unauth = inner.conns.values().filter(|c| !c.is_authenticated());
        (inner.conns.len(), unauth.count())
    }

    /// Admits a connection from `addr`, closing another if the rules say
    /// so (module docs).
    pub fn admit(self: &Arc<Self>, addr: IpAddr) -> Result<ConnGuard, Refused> {
        let mut inner = self.inner.lock();
        if let Some(victim) = self.victim(&inner, addr)? {
            if let Some(gone) = inner.conns.remove(&victim) {
                gone.closed.notify_one();
            }
        }
        let id = inner.next_id;
        inner.next_id += 1;
        let state = Arc::new(ConnState {
            addr,
            authenticated: AtomicBool::new(false),
            busy: AtomicUsize::new(0),
            closed: Notify::new(),
        });
        inner.conns.insert(id, state.clone());
        Ok(ConnGuard {
            table: self.clone(),
            id,
            state,
        })
    }

    /// The connection that must close for a newcomer from `addr`, if one
    /// must; refused when none may.
    fn victim(&self, inner: &Inner, addr: IpAddr) -> Result<Option<u64>, Refused> {
        let l = self.limits;
        let oldest_unauth = |from: Option<IpAddr>| {
            inner
                .conns
                .iter()
                .find(|(_, c)| !c.is_authenticated() && from.map_or(true, |a| c.addr == a))
                .map(|(id, _)| *id)
        };
        let from_addr = inner.conns.values().filter(|c| c.addr == addr).count();
        if from_addr >= l.per_address {
            return oldest_unauth(Some(addr))
                .map(Some)
                .ok_or(Refused::PerAddress(l.per_address));
        }
        let unauth = inner.conns.values().filter(|c| !c.is_authenticated());
        if unauth.count() >= l.unauthenticated {
            return Ok(heaviest_unauthenticated(inner).and_then(|a| oldest_unauth(Some(a))));
        }
        if inner.conns.len() >= l.total {
            return oldest_unauth(None).map(Some).ok_or(Refused::Full(l.total));
        }
        Ok(None)
    }
}

/// The address holding the most unauthenticated connections (ties: the
/// one whose oldest such connection is oldest).
fn heaviest_unauthenticated(inner: &Inner) -> Option<IpAddr> {
    let mut per: BTreeMap<IpAddr, (usize, u64)> = BTreeMap::new();
    for (id, c) in inner.conns.iter().filter(|(_, c)| !c.is_authenticated()) {
        let e = per.entry(c.addr).or_insert((0, *id));
        e.0 += 1;
    }
    per.into_iter()
        .max_by(|(_, (n1, id1)), (_, (n2, id2))| n1.cmp(n2).then(id2.cmp(id1)))
        .map(|(a, _)| a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, last))
    }

    #[test]
    fn limits_scale_with_the_total() {
        let l = Limits::for_total(1024);
        assert_eq!((l.total, l.per_address, l.unauthenticated), (1024, 64, 512));
        let l = Limits::for_total(16);
        assert_eq!((l.per_address, l.unauthenticated), (8, 8));
    }

    #[test]
    fn one_address_flooding_evicts_its_own_oldest() {
        let t = ConnTable::new(Limits::for_total(64));
        let good = t.admit(ip(1)).unwrap();
        good.state.mark_authenticated();
        let mut flood: Vec<ConnGuard> = (0..8).map(|_| t.admit(ip(2)).unwrap()).collect();
        let ninth = t.admit(ip(2)).unwrap();
        assert!(flood.len() == 8 && t.counts() == (9, 8));
        // The oldest of the flood was told to close; the good one was not.
        let first = flood.remove(0);
        assert!(futures::FutureExt::now_or_never(first.state.closed.notified()).is_some());
        assert!(futures::FutureExt::now_or_never(good.state.closed.notified()).is_none());
        drop(first); // its entry went at eviction; dropping changes nothing
        assert_eq!(t.counts(), (9, 8));
        drop(ninth);
    }

    #[test]
    fn authenticated_connections_keep_their_share() {
        let t = ConnTable::new(Limits::for_total(16));
        let authed: Vec<ConnGuard> = (0..8)
            .map(|i| {
                let g = t.admit(ip(100 + i)).unwrap();
                g.state.mark_authenticated();
                g
            })
            .collect();
        // Many addresses without tokens take turns in the other half.
        let mut flood = Vec::new();
        for i in 0..40 {
            flood.push(t.admit(ip(i % 20)).unwrap());
        }
        assert_eq!(t.counts(), (16, 8));
        for g in &authed {
            assert!(futures::FutureExt::now_or_never(g.state.closed.notified()).is_none());
        }
        // A newcomer still gets in (an old unauthenticated one gives way).
        let newcomer = t.admit(ip(200)).unwrap();
        newcomer.state.mark_authenticated();
        assert_eq!(t.counts().0, 16);
    }

    #[test]
    fn a_full_table_of_authenticated_connections_refuses() {
        let t = ConnTable::new(Limits::for_total(16));
        let _all: Vec<ConnGuard> = (0..16)
            .map(|i| {
                let g = t.admit(ip(i)).unwrap();
                g.state.mark_authenticated();
                g
            })
            .collect();
        assert_eq!(t.admit(ip(99)).unwrap_err(), Refused::Full(16));
        let t = ConnTable::new(Limits::for_total(64));
        let _mine: Vec<ConnGuard> = (0..8)
            .map(|_| {
                let g = t.admit(ip(1)).unwrap();
                g.state.mark_authenticated();
                g
            })
            .collect();
        assert_eq!(t.admit(ip(1)).unwrap_err(), Refused::PerAddress(8));
    }

    #[test]
    fn the_heaviest_address_gives_way_first() {
        let t = ConnTable::new(Limits::for_total(16));
        let light = t.admit(ip(1)).unwrap();
        let heavy: Vec<ConnGuard> = (0..7).map(|_| t.admit(ip(2)).unwrap()).collect();
        let _n = t.admit(ip(3)).unwrap();
        assert!(futures::FutureExt::now_or_never(light.state.closed.notified()).is_none());
        assert!(futures::FutureExt::now_or_never(heavy[0].state.closed.notified()).is_some());
    }
}
