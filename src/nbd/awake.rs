//! Keeping idle CPUs out of their halt while a client waits on us request
//! by request (QD1).
//!
//! A client with one request in flight blocks after each send, so its CPU
//! goes idle and, on a VM, halts. Our reply then has to wake a halted vCPU,
//! which the host does on its own schedule: on our 2-vCPU VM that wake-up
//! is most of a QD1 round trip (fio 4 KiB QD1 writes: p50 21 us; with the
//! idle CPU kept busy, 6 us). A connection's own polling (`poller.rs`)
//! already keeps *its* CPU awake; this keeps the others awake: one thread
//! per CPU, pinned there, spinning at `SCHED_IDLE` priority while any
//! connection is in a QD1 stream. (Pinned, because an unpinned idle-class
//! thread stays queued behind the polling connection: the scheduler does
//! not pull it to a CPU that idles only for microseconds at a time.)
//!
//! Why it takes nothing from anyone:
//! - `SCHED_IDLE` runs only on a CPU with nothing else to run and is
//!   preempted the moment a normal thread wakes there; the scheduler also
//!   counts such a CPU as idle when it places a waking thread, so the
//!   client lands on it at once. If the policy cannot be set, the thread
//!   does not spin at all.
//! - **It never competes with the thread that serves the request.** The
//!   spinner of the CPU a holder polls on stands aside (sleeps in 50 us
//!   steps) while that holder polls: the polling keeps that CPU awake
//!   anyway, and a runnable spinner beside the serving thread delayed it:
//!   with every spinner spinning, 1 request in 300 waited over 1 ms
//!   *inside ramd* (between reading the request and writing its reply,
//!   from ramd's own request-duration histogram), QD1 p99.9 3.2-4.2 ms;
//!   with this rule 1 in 50,000, p99.9 113-122 us (`bench/qd1-steal.sh`).
//! - It spins only between `Hold::new` and the hold's drop: a connection
//!   holds while its polls keep catching the client's next request, and
//!   lets go at the first poll that runs out, when polling goes quiet,
//!   while the client pipelines (`poller.rs`) and when it ends. Otherwise
//!   the thread is parked.
//! - The spin is plain loads, no `pause`: a hypervisor with pause-loop
//!   exiting would take a `pause` loop for a lock waiter and deschedule the
//!   vCPU, which is what we are trying to avoid.
//!
//! Cost: while a QD1 client runs, the CPU time the client's CPU would have
//! spent halted shows as ramd's (on 2 vCPUs, up to one more core). How much
//! it buys depends on how the host wakes halted vCPUs: on the VM where it
//! was built it took QD1 p50 from 21 to 6 us; on today's host, where polling
//! alone gives 12-17 us, it buys nothing measurable (bench/RESULTS.md). So
//! it is opt-in (`keep_cpu_awake = true` in the config, `--keep-cpu-awake
//! true`) and needs polling (`poll_us` > 0). Only where the daemon may run
//! on 2 to `MAX_CPUS` CPUs: on a larger machine keeping every idle CPU
//! awake would burn far more than the one the client runs on.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::thread::Thread;

/// Connections in a QD1 stream right now.
static HOLDERS: AtomicUsize = AtomicUsize::new(0);
/// Holders polling on each CPU (by CPU number, the first 64): that CPU's
/// spinner stands aside, since the polling thread keeps its CPU awake
/// itself and a spinner there would only compete with it.
static POLLING_ON: [AtomicUsize; 64] = [const { AtomicUsize::new(0) }; 64];
/// The spinning threads, started on first use; empty if they cannot run.
static SPINNERS: OnceLock<Vec<Thread>> = OnceLock::new();
/// Most CPUs the daemon may use for keep-awake to run.
pub const MAX_CPUS: usize = 4;

/// While alive, the daemon keeps its idle CPUs awake, except the one the
/// holder polls on.
pub struct Hold {
    /// The CPU the holder polls on (None: unknown, or past the first 64).
    cpu: Option<usize>,
}

impl Hold {
    /// Starts keeping the idle CPUs awake (starting the threads on first
    /// use). Returns None where that is not possible: fewer than 2 or more
    /// than `MAX_CPUS` CPUs, or no `SCHED_IDLE`.
    pub fn new() -> Option<Hold> {
        let spinners = SPINNERS.get_or_init(start);
        if spinners.is_empty() {
            return None;
        }
        // SAFETY: sched_getcpu has no preconditions; -1 on failure.
        let cpu = usize::try_from(unsafe { libc::sched_getcpu() })
            .ok()
            .filter(|&c| c < POLLING_ON.len());
        if let Some(c) = cpu {
            POLLING_ON[c].fetch_add(1, Ordering::AcqRel);
        }
        if HOLDERS.fetch_add(1, Ordering::AcqRel) == 0 {
            for t in spinners {
                t.unpark();
            }
        }
        Some(Hold { cpu })
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        HOLDERS.fetch_sub(1, Ordering::AcqRel);
        if let Some(c) = self.cpu {
            POLLING_ON[c].fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// True where keep-awake can run here (starting its threads if needed).
pub fn available() -> bool {
    !SPINNERS.get_or_init(start).is_empty()
}

/// One spinner per CPU the process may run on (none outside 2..=MAX_CPUS).
fn start() -> Vec<Thread> {
    let cpus = allowed_cpus();
    if !(2..=MAX_CPUS).contains(&cpus.len()) {
        return Vec::new();
    }
    let mut threads = Vec::new();
    for cpu in cpus {
        let (tx, rx) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name(format!("keep-awake-{cpu}"))
            .spawn(move || {
                let ready = pin_to(cpu) && set_idle_policy();
                let _ = tx.send(ready);
                if ready {
                    spin(cpu);
                }
            });
        match spawned {
            Ok(handle) if rx.recv() == Ok(true) => threads.push(handle.thread().clone()),
            Ok(_) => tracing::debug!("keep-awake: no idle-class spinner on CPU {cpu}"),
            Err(e) => tracing::debug!("keep-awake: {e}"),
        }
    }
    threads
}

/// The CPUs this process may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: an all-zero cpu_set_t is a valid empty set; the kernel fills
    // at most size_of::<cpu_set_t>() bytes of it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// Pins the calling thread to `cpu`.
fn pin_to(cpu: usize) -> bool {
    // SAFETY: as in `allowed_cpus`; `cpu` < CPU_SETSIZE (it came from a set).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

/// Puts the calling thread in the `SCHED_IDLE` class.
fn set_idle_policy() -> bool {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param
    // for SCHED_IDLE (priority 0). No memory is shared with the kernel
    // beyond the call.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) == 0 }
}

/// The spinner of `cpu`: spins while anyone holds, except while a holder
/// polls on this very CPU, when it sleeps in short steps instead (a
/// runnable spinner beside the serving thread measurably delayed requests
/// inside ramd by milliseconds; bench/qd1-steal.sh).
fn spin(cpu: usize) -> ! {
    let mine = POLLING_ON.get(cpu);
    loop {
        while HOLDERS.load(Ordering::Acquire) == 0 {
            // An unpark between the load and the park is remembered.
            std::thread::park();
        }
        // Plain loads until nobody holds (see the module docs: no `pause`).
        while HOLDERS.load(Ordering::Relaxed) != 0 {
            if mine.is_some_and(|m| m.load(Ordering::Relaxed) != 0) {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
            std::sync::atomic::compiler_fence(Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (name, scheduling policy, allowed CPUs) of this process's threads.
    fn threads() -> Vec<(String, u32, String)> {
        let mut out = Vec::new();
        for task in std::fs::read_dir("/proc/self/task").unwrap() {
            let dir = task.unwrap().path();
            let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
            // Fields after the ")" that closes the name: state is field 3,
            // so policy (field 41) is the 39th from there.
            let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
            let policy = rest.split_whitespace().nth(38).and_then(|p| p.parse().ok());
            let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
            let cpus = status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .unwrap_or("")
                .trim()
                .to_string();
            out.push((name.trim().to_string(), policy.unwrap_or(u32::MAX), cpus));
        }
        out
    }

    #[test]
    fn spinners_are_idle_class_and_one_per_cpu() {
        let cpus = allowed_cpus();
        let hold = Hold::new();
        assert_eq!(hold.is_some(), (2..=MAX_CPUS).contains(&cpus.len()));
        if hold.is_none() {
            eprintln!("{} CPUs: keep-awake is off here, as documented", cpus.len());
            return;
        }
        let spinners: Vec<_> = threads()
            .into_iter()
            .filter(|(name, _, _)| name.starts_with("keep-awake-"))
            .collect();
        assert_eq!(spinners.len(), cpus.len(), "{spinners:?}");
        for (name, policy, allowed) in &spinners {
            assert_eq!(*policy, libc::SCHED_IDLE as u32, "{name} is not SCHED_IDLE");
            let cpu = name.trim_start_matches("keep-awake-");
            assert_eq!(allowed, cpu, "{name} is not pinned to its CPU");
        }
        assert!(HOLDERS.load(Ordering::Acquire) >= 1);
    }
}
