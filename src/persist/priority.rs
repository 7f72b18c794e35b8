//! The CPU priority of background sync threads: lowered while they work so
//! that threads serving requests win the CPU, raised back when a client
//! waits on the sync (a FLUSH in `flush` mode).

/// Niceness of background sync threads: on a busy machine the threads
/// serving requests win the CPU over a background sync (a sync that loses
/// the CPU only takes longer; a request that loses it waits).
pub const SYNC_THREAD_NICE: i32 = 10;

/// Lowers the calling thread's CPU priority to [`SYNC_THREAD_NICE`]
/// (Linux schedules threads separately, so only this thread changes).
pub fn lower_thread_priority() {
    // SAFETY: gettid has no preconditions; setpriority on our own thread id
    // changes only its nice value and touches no memory. A failure (e.g. a
    // seccomp filter) leaves the priority as it was, which is harmless.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, SYNC_THREAD_NICE);
    }
}

/// Puts the calling thread back to normal CPU priority (nice 0), as far as
/// the process may (raising priority needs CAP_SYS_NICE or RLIMIT_NICE;
/// without, the thread stays where it is).
pub fn normal_thread_priority() {
    // SAFETY: as in `lower_thread_priority`.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 0);
    }
}
