//! The daemon's file descriptors: the limit raised at start, and how it
//! is shared between the listeners so that no listener's clients can
//! take the descriptors another one needs.
//!
//! ```text
//! RLIMIT_NOFILE soft ──► raised to the hard limit (at most 1 Mi; ramd uses epoll and
//!                        io_uring, never select(), so a high limit costs nothing)
//! limit L ──► kept back: max(256, L/8)  the unix API, drives' files, memfds, logs
//!         ──► NBD: max_connections x 2  (a socket and a wake-up descriptor each)
//!                  at most half of the rest when web listeners exist
//!         ──► each web listener (--api-listen, --http): what is left / their
//!                  number, at most MAX_WEB_CONNECTIONS, at least MIN_WEB_CONNECTIONS
//! ```
//!
//! Every listener bounds its connections by its share (`nbd::server`,
//! `api::server::conns`), so the unix API and NBD keep descriptors however
//! many web connections arrive; when the limit cannot give NBD what
//! `max_connections` asks, the start says so and NBD gets what fits.

/// Most connections one web listener keeps, whatever the limit.
pub const MAX_WEB_CONNECTIONS: usize = 1024;
/// Fewest connections a web listener is given.
pub const MIN_WEB_CONNECTIONS: usize = 16;
/// Highest soft limit asked for.
const MAX_LIMIT: u64 = 1 << 20;
/// Descriptors one NBD connection may use.
const PER_NBD_CONNECTION: u64 = 2;

/// How the descriptors are shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// The soft limit.
    pub limit: u64,
    /// Kept for everything that is not a client connection.
    pub reserved: u64,
    /// NBD connections at once.
    pub nbd: usize,
    /// Connections at once on each web listener.
    pub web: usize,
}

impl Plan {
    /// The shares of `limit` for NBD asking for `nbd_wanted` connections
    /// and `web_listeners` web listeners (module docs).
    pub fn new(limit: u64, nbd_wanted: usize, web_listeners: usize) -> Plan {
        let reserved = (limit / 8).max(256);
        let avail = limit.saturating_sub(reserved);
        let nbd_room = if web_listeners > 0 { avail / 2 } else { avail };
        let nbd = (nbd_wanted as u64)
            .min(nbd_room / PER_NBD_CONNECTION)
            .max(1);
        let left = avail.saturating_sub(nbd * PER_NBD_CONNECTION);
        let web = (left / web_listeners.max(1) as u64)
            .clamp(MIN_WEB_CONNECTIONS as u64, MAX_WEB_CONNECTIONS as u64);
        Plan {
            limit,
            reserved,
            nbd: nbd as usize,
            web: web as usize,
        }
    }
}

/// Raises the soft descriptor limit to the hard one (at most 1 Mi) and
/// returns the soft limit in force.
pub fn raise_limit() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into `r`, which we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return 1024;
    }
    let want = r.rlim_max.min(MAX_LIMIT);
    if want > r.rlim_cur {
        let raised = libc::rlimit {
            rlim_cur: want,
            rlim_max: r.rlim_max,
        };
        // SAFETY: setrlimit reads one valid rlimit we own; lowering or
        // raising the soft limit up to the hard one needs no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return want;
        }
    }
    r.rlim_cur
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_high_limit_gives_everyone_what_they_ask() {
        let p = Plan::new(1 << 20, 256, 2);
        assert_eq!((p.nbd, p.web), (256, MAX_WEB_CONNECTIONS));
        assert_eq!(p.reserved, 1 << 17);
    }

    #[test]
    fn a_low_limit_is_shared_and_keeps_a_reserve() {
        let p = Plan::new(1024, 256, 2);
        assert_eq!(p.reserved, 256);
        assert_eq!(p.nbd, 192, "half of the 768 left, two descriptors each");
        assert_eq!(p.web, 192);
        let used = p.reserved + p.nbd as u64 * PER_NBD_CONNECTION + 2 * p.web as u64;
        assert!(used <= p.limit, "{used} > {}", p.limit);
        // Without web listeners NBD may take all that is left.
        assert_eq!(Plan::new(1024, 256, 0).nbd, 256);
        // A tiny limit still lets each listener work.
        let tiny = Plan::new(260, 256, 1);
        assert!(tiny.nbd >= 1 && tiny.web == MIN_WEB_CONNECTIONS);
    }

    #[test]
    fn the_limit_is_raised_once_and_stays() {
        let first = raise_limit();
        assert!(first >= 1024);
        assert_eq!(raise_limit(), first);
    }
}
