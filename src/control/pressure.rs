//! The memory-pressure watcher: once a second it reads how much memory the
//! host (and the daemon's memory cgroup, when it has a limit) still has,
//! and the kernel's pressure stall information, and caps the daemon-wide
//! budget so that drives never take the host's last
//! `pressure_min_available` bytes: new pages get ENOSPC instead of the
//! host swapping or the OOM killer picking a process, which would most
//! likely be ramd, the biggest one. The cap is a byte count (what is in
//! use plus the room above the reserve), so a client writing at memory
//! speed is stopped at it, not a second later at the next reading.
//!
//! When is memory short (all thresholds configurable, `[daemon]`):
//! - available memory below `pressure_min_available` (default: the larger
//!   of 256 MiB and 2% of MemTotal). Available is the smaller of the
//!   host's `MemAvailable` and, inside a memory cgroup with a limit, that
//!   limit minus the cgroup's usage (less its inactive file pages, which
//!   the kernel reclaims first): a daemon in a 2 GiB cgroup on a 24 GiB
//!   host is short at 2 GiB, not 24.
//! - or `full avg10` of /proc/pressure/memory at or above
//!   `pressure_full_avg10` percent (default 10: a tenth of the last ten
//!   seconds every task was stalled on memory).
//!
//! It recovers (hysteresis, so it does not flap) when available memory is
//! above 1.5x the threshold and `full avg10` below half of its threshold.
//! Each change is logged once (WARN when it starts, INFO when it ends);
//! the state, the readings and the counters are in `ramd info` (health)
//! and /metrics.
//!
//! While memory is short, the caches give back clean memory first
//! ([`GiveBack`]): each reading asks them for what recovery needs
//! (1.5x the reserve minus what is available, at least
//! [`MIN_GIVE_BACK_BYTES`] when only stalls count), taken from empty slots
//! and clean blocks in eviction order; their data is on the backing, so
//! nothing is lost, only hit ratio. The amount is logged (at most every 10
//! seconds), counted in `ramd_memory_pressure_given_back_bytes_total` and
//! per cache in `ramd_cache_given_back_bytes_total`. Then `lz4+zstd`
//! drives are hurried: their recompression workers sweep at once and
//! recompress every page lz4 holds, in use or not (at their usual CPU
//! budget; the memory comes back as the sweep goes, counted in the drive's
//! `recompress_saved_bytes` and `urgent_sweeps`).
//!
//! Invariant: the watcher flips the budget's refusing switch and asks
//! caches for clean memory; it never frees dirty cache blocks or drive
//! pages, so every byte a client wrote stays intact.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::store::budget::MemoryBudget;

/// How often the host is read.
pub const INTERVAL: Duration = Duration::from_secs(1);
/// Default `pressure_full_avg10`, in percent.
pub const DEFAULT_FULL_AVG10_PCT: f64 = 10.0;
/// Smallest default `pressure_min_available`.
pub const MIN_DEFAULT_AVAILABLE_BYTES: u64 = 256 << 20;
/// What caches are asked to give back per reading while memory is short
/// with room left (stalls only), or the least they are asked for.
pub const MIN_GIVE_BACK_BYTES: u64 = 64 << 20;

/// Whatever can give memory back while the host is short (the caches'
/// clean blocks).
pub trait GiveBack: Send + Sync {
    /// Gives back up to `bytes`; returns what was given back.
    fn give_back(&self, bytes: u64) -> u64;
}

/// What the caches are asked to give back for a reading while short: what
/// recovery needs (1.5x the reserve, the hysteresis' exit) minus what is
/// available, at least [`MIN_GIVE_BACK_BYTES`].
pub fn give_back_target(r: &Reading, t: &Thresholds) -> u64 {
    let exit = t
        .min_available_bytes
        .saturating_add(t.min_available_bytes / 2);
    exit.saturating_sub(r.available_bytes)
        .max(MIN_GIVE_BACK_BYTES)
}

/// The thresholds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    /// Short of memory below this many available bytes.
    pub min_available_bytes: u64,
    /// Short of memory at or above this `full avg10` (percent).
    pub full_avg10_pct: f64,
}

impl Thresholds {
    /// The defaults for a host with `mem_total_bytes` of RAM.
    pub fn defaults(mem_total_bytes: u64) -> Thresholds {
        Thresholds {
            min_available_bytes: (mem_total_bytes / 50).max(MIN_DEFAULT_AVAILABLE_BYTES),
            full_avg10_pct: DEFAULT_FULL_AVG10_PCT,
        }
    }
}

/// One reading of the host.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Reading {
    /// The smaller of MemAvailable and the cgroup's room.
    pub available_bytes: u64,
    /// `some avg10` of /proc/pressure/memory (None: no PSI on this kernel).
    pub some_avg10_pct: Option<f64>,
    /// `full avg10`.
    pub full_avg10_pct: Option<f64>,
    /// The memory cgroup's limit, when it has one.
    pub cgroup_limit_bytes: Option<u64>,
}

/// Whether a reading means pressure, given the current state (hysteresis).
pub fn short_of_memory(r: &Reading, t: &Thresholds, now_short: bool) -> bool {
    let full = r.full_avg10_pct.unwrap_or(0.0);
    if now_short {
        let room = r.available_bytes as f64 >= t.min_available_bytes as f64 * 1.5;
        !(room && full < t.full_avg10_pct / 2.0)
    } else {
        r.available_bytes < t.min_available_bytes || full >= t.full_avg10_pct
    }
}

/// The budget's host cap for a reading: what drives hold plus the room
/// above the reserve; only what they hold while memory is short (stalls
/// count as short even with room left).
pub fn host_cap(used_bytes: u64, r: &Reading, t: &Thresholds, short: bool) -> u64 {
    if short {
        return used_bytes;
    }
    used_bytes.saturating_add(r.available_bytes.saturating_sub(t.min_available_bytes))
}

/// `(some avg10, full avg10)` from /proc/pressure/memory's text.
pub fn parse_psi(text: &str) -> (Option<f64>, Option<f64>) {
    let avg10 = |kind: &str| {
        text.lines()
            .find(|l| l.starts_with(kind))?
            .split_whitespace()
            .find_map(|f| f.strip_prefix("avg10="))?
            .parse()
            .ok()
    };
    (avg10("some "), avg10("full "))
}

/// A `Name:   N kB` field of /proc/meminfo, in bytes.
pub fn meminfo_field(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| {
        l.strip_prefix(name)
            .is_some_and(|rest| rest.starts_with(':'))
    })?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The memory cgroup directory of this process: v2's unified one, or v1's
/// `memory` controller. None when neither is mounted where expected.
pub fn own_memory_cgroup(proc_self_cgroup: &str, root: &Path) -> Option<PathBuf> {
    for line in proc_self_cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        let rel = path.trim_start_matches('/');
        let v1 = controllers.split(',').any(|c| c == "memory");
        let dir = if v1 {
            root.join("memory").join(rel)
        } else if controllers.is_empty() {
            let unified = if root.join("unified").is_dir() {
                root.join("unified")
            } else {
                root.to_path_buf()
            };
            unified.join(rel)
        } else {
            continue;
        };
        if v1 || dir.join("memory.max").exists() {
            return Some(dir);
        }
    }
    None
}

/// Room left in a memory cgroup `(limit, limit - usage)`, when it has a
/// limit (v1 `memory.limit_in_bytes`, v2 `memory.max`).
pub fn cgroup_room(dir: &Path) -> Option<(u64, u64)> {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
    let stat = read("memory.stat").unwrap_or_default();
    let stat_field = |name: &str| -> u64 {
        stat.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or(0)
    };
    let (limit, usage, inactive_file) = if let Some(max) = read("memory.max") {
        let limit: u64 = max.trim().parse().ok()?; // "max": no limit
        let usage: u64 = read("memory.current")?.trim().parse().ok()?;
        (limit, usage, stat_field("inactive_file"))
    } else {
        let limit: u64 = read("memory.limit_in_bytes")?.trim().parse().ok()?;
        let usage: u64 = read("memory.usage_in_bytes")?.trim().parse().ok()?;
        (limit, usage, stat_field("total_inactive_file"))
    };
    // v1 writes a huge page-rounded i64::MAX for "no limit".
    if limit >= 1 << 60 {
        return None;
    }
    Some((
        limit,
        limit.saturating_sub(usage.saturating_sub(inactive_file)),
    ))
}

/// Reads the host now.
pub fn read_host(cgroup: Option<&Path>) -> Reading {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let host = meminfo_field(&meminfo, "MemAvailable")
        .or_else(|| meminfo_field(&meminfo, "MemFree"))
        .unwrap_or(u64::MAX);
    let psi = std::fs::read_to_string("/proc/pressure/memory").unwrap_or_default();
    let (some, full) = parse_psi(&psi);
    let cg = cgroup.and_then(cgroup_room);
    Reading {
        available_bytes: cg.map_or(host, |(_, room)| room.min(host)),
        some_avg10_pct: some,
        full_avg10_pct: full,
        cgroup_limit_bytes: cg.map(|(limit, _)| limit),
    }
}

/// What the watcher saw and did, for `ramd info` and /metrics.
#[derive(Default)]
pub struct Pressure {
    short: AtomicBool,
    /// Times memory ran short since the start.
    episodes: AtomicU64,
    last: Mutex<Reading>,
    thresholds: Mutex<Option<Thresholds>>,
    /// Asked for memory while short, in order; added once the caches and
    /// drives exist (the watcher starts before them).
    give_back: Mutex<Vec<Arc<dyn GiveBack>>>,
    /// Bytes the caches gave back since the start.
    given_back_bytes: AtomicU64,
}

impl std::fmt::Debug for Pressure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pressure")
            .field("status", &self.status())
            .finish_non_exhaustive()
    }
}

/// A copy of [`Pressure`]'s state.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PressureStatus {
    pub short: bool,
    pub episodes: u64,
    pub reading: Reading,
    pub thresholds: Option<Thresholds>,
    /// Bytes the caches gave back while memory was short.
    pub given_back_bytes: u64,
}

impl Pressure {
    pub fn status(&self) -> PressureStatus {
        PressureStatus {
            short: self.short.load(Ordering::Relaxed),
            episodes: self.episodes.load(Ordering::Relaxed),
            reading: *self.last.lock(),
            thresholds: *self.thresholds.lock(),
            given_back_bytes: self.given_back_bytes.load(Ordering::Relaxed),
        }
    }

    /// One more that gives memory back while it is short, asked after
    /// those added before it (the caches, then the drives).
    pub fn add_give_back(&self, g: Arc<dyn GiveBack>) {
        self.give_back.lock().push(g);
    }

    /// Asks for memory back while short; logs (rate-limited) what came.
    fn relieve(&self, r: &Reading, t: &Thresholds) {
        static GAVE: crate::ratelog::RateLimit = crate::ratelog::RateLimit::per_10s();
        let all = self.give_back.lock().clone();
        let target = give_back_target(r, t);
        let mut given = 0;
        for g in all {
            given += g.give_back(target.saturating_sub(given));
        }
        if given == 0 {
            return;
        }
        self.given_back_bytes.fetch_add(given, Ordering::Relaxed);
        if let Some(more) = GAVE.admit() {
            tracing::info!(
                given_back_bytes = given,
                available_bytes = r.available_bytes,
                "host memory is short: caches gave back clean blocks{more}"
            );
        }
    }

    /// Takes one reading into account: caps `budget` (see the module docs)
    /// and logs a change of state.
    pub fn step(&self, r: Reading, t: &Thresholds, budget: &MemoryBudget) {
        *self.last.lock() = r;
        *self.thresholds.lock() = Some(*t);
        let was = self.short.load(Ordering::Relaxed);
        let now = short_of_memory(&r, t, was);
        if now {
            self.relieve(&r, t);
        }
        budget.set_host_cap_bytes(host_cap(budget.used_bytes(), &r, t, now));
        budget.set_host_short(now);
        if now == was {
            return;
        }
        self.short.store(now, Ordering::Relaxed);
        if now {
            self.episodes.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                available_bytes = r.available_bytes,
                min_available_bytes = t.min_available_bytes,
                full_avg10_pct = r.full_avg10_pct,
                "host memory is short: new drive pages are refused (ENOSPC) until it recovers"
            );
        } else {
            tracing::info!(
                available_bytes = r.available_bytes,
                "host memory recovered: new drive pages are allowed again"
            );
        }
    }
}

/// Starts the watcher thread; it runs until `stop` is set.
pub fn spawn(
    pressure: Arc<Pressure>,
    thresholds: Thresholds,
    budget: Arc<MemoryBudget>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("ramd-pressure".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                // Looked up at every reading: a service manager may move
                // the daemon into a cgroup after it started.
                let cgroup = std::fs::read_to_string("/proc/self/cgroup")
                    .ok()
                    .and_then(|t| own_memory_cgroup(&t, Path::new("/sys/fs/cgroup")));
                pressure.step(read_host(cgroup.as_deref()), &thresholds, &budget);
                std::thread::sleep(INTERVAL);
            }
        })
}

/// The watcher's figures for /metrics: `ramd_memory_pressure` (1 while
/// short), `ramd_memory_available_bytes`, the threshold, PSI `full avg10`,
/// and the counters of episodes and refused page allocations.
#[derive(Debug)]
pub struct PressureCollector {
    pub status: PressureStatus,
    pub refused_allocations: u64,
}

impl prometheus_client::collector::Collector for PressureCollector {
    fn encode(&self, mut enc: prometheus_client::encoding::DescriptorEncoder) -> std::fmt::Result {
        use crate::metrics::prometheus::family;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        use prometheus_client::registry::Unit;
        let s = &self.status;
        let one = |v: i64| vec![(vec![], ConstGauge::new(v))];
        let min = s.thresholds.map_or(0, |t| t.min_available_bytes);
        family(
            &mut enc,
            "ramd_memory_pressure",
            "1 while host memory is short and new drive pages get ENOSPC",
            None,
            one(s.short as i64),
        )?;
        family(
            &mut enc,
            "ramd_memory_available",
            "The smaller of MemAvailable and the memory cgroup's room",
            Some(Unit::Bytes),
            one(s.reading.available_bytes as i64),
        )?;
        family(
            &mut enc,
            "ramd_memory_pressure_min_available",
            "Memory is short below this",
            Some(Unit::Bytes),
            one(min as i64),
        )?;
        if let Some(full) = s.reading.full_avg10_pct {
            let series = vec![(vec![], ConstGauge::new(full))];
            family(
                &mut enc,
                "ramd_memory_psi_full_avg10",
                "full avg10 of /proc/pressure/memory, percent",
                None,
                series,
            )?;
        }
        let count = |v: u64| vec![(vec![], ConstCounter::new(v))];
        family(
            &mut enc,
            "ramd_memory_pressure_episodes",
            "Times host memory ran short",
            None,
            count(s.episodes),
        )?;
        family(
            &mut enc,
            "ramd_memory_pressure_refused_allocations",
            "New drive pages refused while memory was short",
            None,
            count(self.refused_allocations),
        )?;
        family(
            &mut enc,
            "ramd_memory_pressure_given_back",
            "Cache memory given back to the host while memory was short",
            Some(Unit::Bytes),
            count(s.given_back_bytes),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psi_and_meminfo_parse() {
        let psi = "some avg10=1.50 avg60=0.20 avg300=0.00 total=3\nfull avg10=12.25 avg60=0.00 avg300=0.00 total=1\n";
        assert_eq!(parse_psi(psi), (Some(1.5), Some(12.25)));
        assert_eq!(parse_psi(""), (None, None));
        let mi = "MemTotal:       24000000 kB\nMemAvailable:    1000 kB\nMemAvailableX: 5 kB\n";
        assert_eq!(meminfo_field(mi, "MemAvailable"), Some(1000 * 1024));
        assert_eq!(meminfo_field(mi, "Cached"), None);
    }

    #[test]
    fn pressure_has_hysteresis() {
        let t = Thresholds {
            min_available_bytes: 1000,
            full_avg10_pct: 10.0,
        };
        let r = |avail, full| Reading {
            available_bytes: avail,
            full_avg10_pct: Some(full),
            ..Reading::default()
        };
        assert!(!short_of_memory(&r(1000, 0.0), &t, false));
        assert!(short_of_memory(&r(999, 0.0), &t, false));
        assert!(short_of_memory(&r(5000, 10.0), &t, false));
        // Recovering needs 1.5x the room and half the stall.
        assert!(short_of_memory(&r(1200, 0.0), &t, true));
        assert!(short_of_memory(&r(2000, 6.0), &t, true));
        assert!(!short_of_memory(&r(1500, 4.0), &t, true));
    }

    #[test]
    fn step_flips_the_budget_and_counts_episodes() {
        let b = MemoryBudget::new(u64::MAX);
        let p = Pressure::default();
        let t = Thresholds {
            min_available_bytes: 1000,
            full_avg10_pct: 10.0,
        };
        let low = Reading {
            available_bytes: 10,
            ..Reading::default()
        };
        let high = Reading {
            available_bytes: 1 << 30,
            ..Reading::default()
        };
        p.step(low, &t, &b);
        assert!(b.is_host_capped(1) && !b.try_reserve(1));
        assert_eq!(b.refused_under_pressure(), 1);
        p.step(low, &t, &b);
        p.step(high, &t, &b);
        assert!(!b.is_host_capped(1) && b.try_reserve(1));
        assert_eq!(p.status().episodes, 1);
        // Not short, but only 500 bytes above the reserve: 500 more fit.
        let near = Reading {
            available_bytes: 1500,
            ..Reading::default()
        };
        p.step(near, &t, &b);
        assert!(!p.status().short);
        assert!(b.try_reserve(500));
        assert!(!b.try_reserve(1));
        assert_eq!(b.refused_under_pressure(), 2);
    }

    #[test]
    fn cgroup_paths_for_v1_and_v2() {
        let root = Path::new("/nonexistent-root");
        let v1 = "12:memory:/ramd-test\n0::/user.slice\n";
        assert_eq!(
            own_memory_cgroup(v1, root),
            Some(root.join("memory").join("ramd-test"))
        );
        assert_eq!(own_memory_cgroup("0::/x\n", root), None);
    }

    #[test]
    fn cgroup_room_reads_v1_files() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("memory.limit_in_bytes"), "1000000\n").unwrap();
        std::fs::write(d.path().join("memory.usage_in_bytes"), "600000\n").unwrap();
        std::fs::write(
            d.path().join("memory.stat"),
            "cache 5\ntotal_inactive_file 100000\n",
        )
        .unwrap();
        assert_eq!(cgroup_room(d.path()), Some((1_000_000, 500_000)));
        std::fs::write(
            d.path().join("memory.limit_in_bytes"),
            "9223372036854771712\n",
        )
        .unwrap();
        assert_eq!(cgroup_room(d.path()), None);
    }
}
