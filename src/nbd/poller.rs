//! The adaptive waiting strategy (the default; `wait.rs` has the trait and
//! the blocking one).
//!
//! A connection thread that blocks on its socket costs two things on a VM:
//! its vCPU may halt, and waking it again takes tens of microseconds; and
//! the client pays for the wake-up itself, inside its `send` (an IPI to our
//! vCPU, a VM exit). So when the socket is empty the poller picks the
//! cheapest way to wait for what the client does next:
//!
//! ```text
//!   socket empty ──► request-reply client (QD1)?
//!        │             yes: poll up to poll_us (optionally keeping the
//!        │                  other CPUs awake, awake.rs), then block
//!        ▼ no, pipelining (a batch of several in the last PIPELINE_READS)
//!   client still holds >= NAP_BACKLOG_BYTES of our replies unread?
//!        │             yes: nap on a timer first, then take what came
//!        │                  (up to NAP_MAX naps): it is busy and sends as
//!        │                  it reads, a timer wakes us without costing it
//!        │                  a thing, and what piles up meanwhile is read
//!        │                  and answered as one batch
//!        ▼ no
//!   take what is there; else poll up to poll_us, then block
//! ```
//!
//! Why nap first for a busy pipelining client: a thread faster than its
//! client that reads as soon as anything is there reads a few requests at a
//! time, and both sides then contend for the socket's receive-queue locks
//! on every read. Napping for a share of the time the client needs to read
//! its backlog lets requests pile up, so one read carries dozens. A nap
//! lasts 1/NAP_DRAIN_SHARE of that time, at the pace the client has been
//! reading (`drain`, measured over earlier naps), within
//! NAP_MIN_US..NAP_MAX_US; the backlog (`SIOCOUTQ`) is asked for only when
//! the replies sent since the last look could have made it deep.
//!
//! Why polling stops: polls that run out MISS_STREAK times in a row mean an
//! idle client, and QUICK_STREAK polls in a row answered within QUICK_US
//! mean one that does not wait for our replies; either way the next
//! QUIET_READS reads block at once, since a spinning thread would take the
//! CPU that a client on the same small machine needs.
//!
//! Invariant: a request-reply client's request is never left waiting for a
//! timer: naps happen only while the client holds a backlog of replies, so
//! it is busy reading them whatever we do. Measured figures for each
//! constant are in bench/RESULTS.md and bench/HISTORY.md.

use std::io;
use std::time::{Duration, Instant};

use super::awake;
use super::transport::Transport;
use super::wait::{block, Wait};

/// A poll answered this fast means the client did not wait for our reply.
/// A QD1 client whose CPU is kept awake (`awake.rs`) answers in 4-6 us,
/// so the line sits below that.
const QUICK_US: u64 = 3;
/// Quick polls in a row that quiet polling (`caught_request_reply`).
const QUICK_STREAK: u32 = 8;
/// Polls in a row that caught nothing before polling goes quiet.
const MISS_STREAK: u32 = 4;
/// Reads that block at once after a streak of empty polls.
const QUIET_READS: u32 = 512;
/// Reads a pipelining client stays marked as one after its last batch of
/// several requests.
const PIPELINE_READS: u32 = 512;
/// Unread reply bytes that make a client busy enough to nap for: about 32
/// 4 KiB reads, 60-130 us of work for a fio/libnbd client, against a nap
/// of NAP_MIN_US or more plus the timer's wake-up. Fixed, not scaled to
/// the reply size: a client that only writes (16-byte replies) is polled
/// for, never napped for, since a small backlog drains in microseconds.
const NAP_BACKLOG_BYTES: usize = 128 * 1024;
/// The shortest nap, and the first one's length while the client's reading
/// pace is unknown. 5 us lost a fifth of QD64x2 (the naps then outnumber
/// the requests).
const NAP_MIN_US: f64 = 10.0;
/// The longest nap: longer ones let a deep-queue client run low on
/// replies to read; the drain-paced naps reach it only while the backlog
/// is deep.
const NAP_MAX_US: f64 = 100.0;
/// A nap lasts this fraction (1/N) of the time the client needs to read
/// what it holds: short enough that the client never runs out of replies
/// to read (1/2 and 1/4 let it run low at QD128), long enough that one
/// read then carries many requests.
const NAP_DRAIN_SHARE: f64 = 8.0;
/// Naps in a row before the poller gives up on a client that holds a
/// backlog but sends nothing (stopped, or not reading).
const NAP_MAX: u32 = 64;
/// Timer slack of connection threads: the kernel's default of 50 us would
/// stretch a 10 us nap sixfold.
const TIMER_SLACK_NS: libc::c_ulong = 1_000;

pub(super) struct Poller {
    poll_us: u32,
    /// Keep the other CPUs awake while the client runs at QD1 (`awake.rs`).
    keep_cpu_awake: bool,
    /// Held while polls keep catching the client's next request.
    awake: Option<awake::Hold>,
    /// Consecutive request-reply polls answered within `QUICK_US`.
    quick_streak: u32,
    /// Consecutive polls that ran out without a request.
    miss_streak: u32,
    /// Reads left before polling is tried again.
    quiet: u32,
    /// Reads left in pipelining mode.
    pipelining: u32,
    /// How fast the client reads our replies, in bytes per microsecond, a
    /// moving average over naps; 0 until the first nap has measured it.
    drain: f64,
    /// At most this many bytes of our replies are unread by the client:
    /// the last backlog measured plus every reply sent since. While it is
    /// below NAP_BACKLOG_BYTES the backlog is not worth a syscall to ask.
    held_bound: usize,
}

impl Poller {
    pub(super) fn new(poll_us: u32, keep_cpu_awake: bool) -> Self {
        if poll_us > 0 {
            // SAFETY: PR_SET_TIMERSLACK takes one integer and changes only
            // the calling (connection) thread.
            unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, TIMER_SLACK_NS) };
        }
        Poller {
            poll_us,
            keep_cpu_awake,
            awake: None,
            quick_streak: 0,
            miss_streak: 0,
            quiet: 0,
            pipelining: 0,
            drain: 0.0,
            held_bound: 0,
        }
    }
}

impl Wait for Poller {
    fn read<S: Transport>(
        &mut self,
        stream: &mut S,
        buf: &mut [u8],
        batch: usize,
        sent: usize,
    ) -> io::Result<usize> {
        self.held_bound = self.held_bound.saturating_add(sent);
        if batch > 1 {
            self.pipelining = PIPELINE_READS;
        }
        if self.quiet > 0 {
            self.quiet -= 1;
            self.awake = None;
            return block(stream, buf);
        }
        if self.pipelining > 0 {
            self.pipelining -= 1;
            self.awake = None;
            if let Some(n) = self.nap(stream, buf)? {
                return Ok(n);
            }
            if let Some(n) = stream.read_now(buf)? {
                return Ok(n);
            }
        }
        if let Some(n) = self.poll(stream, buf)? {
            return Ok(n);
        }
        block(stream, buf)
    }
}

impl Poller {
    /// Tries non-blocking reads for up to `poll_us`; `sched_yield` between
    /// tries lets any other runnable thread on this CPU (the client itself,
    /// on a small machine) go first.
    fn poll<S: Transport>(&mut self, stream: &mut S, buf: &mut [u8]) -> io::Result<Option<usize>> {
        let start = Instant::now();
        let limit = Duration::from_micros(self.poll_us as u64);
        loop {
            if let Some(n) = stream.read_now(buf)? {
                self.miss_streak = 0;
                if self.pipelining == 0 {
                    self.caught_request_reply(start.elapsed());
                }
                return Ok(Some(n));
            }
            if start.elapsed() >= limit {
                self.awake = None;
                self.miss_streak += 1;
                if self.miss_streak >= MISS_STREAK {
                    self.miss_streak = 0;
                    self.quiet = QUIET_READS;
                }
                return Ok(None);
            }
            std::thread::yield_now();
        }
    }

    /// Naps while the client still holds at least NAP_BACKLOG_BYTES of our
    /// replies: it is busy, it sends as it reads them, and a timer wakes us
    /// without the client paying for it. After each nap, takes whatever
    /// arrived meanwhile. None once the backlog is small (the client is
    /// about to run dry: look now), unknown (TCP), or NAP_MAX naps brought
    /// nothing.
    fn nap<S: Transport>(&mut self, stream: &mut S, buf: &mut [u8]) -> io::Result<Option<usize>> {
        if self.held_bound < NAP_BACKLOG_BYTES {
            return Ok(None);
        }
        let Some(mut held) = stream.unread_by_peer() else {
            // Unknown (TCP): asked again only after as many replies more.
            self.held_bound = 0;
            return Ok(None);
        };
        self.held_bound = held;
        for _ in 0..NAP_MAX {
            if held < NAP_BACKLOG_BYTES {
                return Ok(None);
            }
            let started = Instant::now();
            std::thread::sleep(self.nap_length(held));
            let slept_us = started.elapsed().as_secs_f64() * 1e6;
            let Some(now) = stream.unread_by_peer() else {
                self.held_bound = 0;
                return Ok(None);
            };
            self.held_bound = now;
            self.note_drain(held, now, slept_us);
            if let Some(n) = stream.read_now(buf)? {
                return Ok(Some(n));
            }
            held = now;
        }
        Ok(None)
    }

    /// How long to nap while the client holds `held` bytes of replies.
    fn nap_length(&self, held: usize) -> Duration {
        let us = if self.drain > 0.0 {
            (held as f64 / self.drain / NAP_DRAIN_SHARE).clamp(NAP_MIN_US, NAP_MAX_US)
        } else {
            NAP_MIN_US
        };
        Duration::from_nanos((us * 1000.0) as u64)
    }

    /// The client read `before - after` bytes of replies in `slept_us`.
    /// A nap after which it holds nothing says only that it read at least
    /// that fast, so it is not counted.
    fn note_drain(&mut self, before: usize, after: usize, slept_us: f64) {
        if after == 0 || after > before || slept_us <= 0.0 {
            return;
        }
        let sample = (before - after) as f64 / slept_us;
        self.drain = if self.drain == 0.0 {
            sample
        } else {
            self.drain + (sample - self.drain) / 4.0
        };
    }

    /// A poll outside pipelining mode caught a request after `waited`:
    /// the client answered our reply (QD1: keep its CPU awake if asked
    /// to), or it did not wait for one. A streak of those quiets polling
    /// for a while rather than switching to pipelining mode: a QD1 client
    /// whose CPU is kept awake often answers that fast too, and pipelining
    /// mode (polls without keep-awake) would cost it far more than a quiet
    /// spell does.
    fn caught_request_reply(&mut self, waited: Duration) {
        if waited < Duration::from_micros(QUICK_US) {
            self.quick_streak += 1;
            if self.quick_streak >= QUICK_STREAK {
                self.quick_streak = 0;
                self.quiet = QUIET_READS;
                self.awake = None;
                return;
            }
        } else {
            self.quick_streak = 0;
        }
        if self.keep_cpu_awake && self.awake.is_none() {
            // A client in a request-reply loop: keep a CPU for it awake
            // while the loop lasts.
            self.awake = awake::Hold::new();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::collections::VecDeque;
    use std::io::{IoSlice, Read, Write};

    use super::*;

    /// A stream whose non-blocking reads answer from a script (`true`: a
    /// byte is there), whose blocking reads always return one byte, and
    /// whose peer holds `unread` bytes of our replies (None: unknown).
    struct Scripted {
        polls: VecDeque<bool>,
        blocking_reads: usize,
        nonblocking_reads: usize,
        unread: Option<usize>,
        unread_asked: Cell<usize>,
    }

    impl Scripted {
        fn new(script: &[bool]) -> Self {
            Scripted {
                polls: script.iter().copied().collect(),
                blocking_reads: 0,
                nonblocking_reads: 0,
                unread: None,
                unread_asked: Cell::new(0),
            }
        }
    }

    impl Read for Scripted {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.blocking_reads += 1;
            buf[0] = 0;
            Ok(1)
        }
    }

    impl Write for Scripted {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Transport for Scripted {
        fn read_now(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
            self.nonblocking_reads += 1;
            // Past the script's end the client never answers a poll.
            if self.polls.pop_front().unwrap_or(false) {
                buf[0] = 0;
                Ok(Some(1))
            } else {
                Ok(None)
            }
        }
        fn wait_readable(&self) -> io::Result<()> {
            Ok(())
        }
        fn wait_writable(&self) -> io::Result<()> {
            Ok(())
        }
        fn send_now(&mut self, _bufs: &[IoSlice<'_>]) -> io::Result<usize> {
            Ok(0)
        }
        fn unread_by_peer(&self) -> Option<usize> {
            self.unread_asked.set(self.unread_asked.get() + 1);
            self.unread
        }
    }

    /// Polls that catch nothing, MISS_STREAK in a row, quiet polling: the
    /// next reads block at once, without a single non-blocking try.
    #[test]
    fn empty_polls_in_a_row_quiet_polling() {
        // A poll window of 1 us: each empty poll ends after a try or two.
        let mut p = Poller::new(1, false);
        let mut s = Scripted::new(&[]);
        let mut buf = [0u8; 16];
        for _ in 0..MISS_STREAK {
            assert_eq!(p.read(&mut s, &mut buf, 1, 0).unwrap(), 1);
        }
        assert_eq!(s.blocking_reads, MISS_STREAK as usize);
        assert_eq!(p.quiet, QUIET_READS, "polling did not pause");
        let tries = s.nonblocking_reads;
        for _ in 0..10 {
            p.read(&mut s, &mut buf, 1, 0).unwrap();
        }
        assert_eq!(s.nonblocking_reads, tries, "a quiet poller still polled");
        assert_eq!(p.quiet, QUIET_READS - 10);
    }

    /// A poll that catches a request resets the streak of empty ones: a
    /// client that answers most polls (QD1) keeps being polled.
    #[test]
    fn a_caught_request_resets_the_miss_streak() {
        let mut p = Poller::new(1, false);
        let mut buf = [0u8; 16];
        // Fewer rounds than QUICK_STREAK: quick hits alone change nothing.
        for round in 0..QUICK_STREAK - 1 {
            let mut empty = Scripted::new(&[]);
            for _ in 0..MISS_STREAK - 1 {
                p.read(&mut empty, &mut buf, 1, 0).unwrap();
            }
            assert_eq!(p.quiet, 0, "round {round}: quiet before the streak");
            let mut hit = Scripted::new(&[true]);
            p.read(&mut hit, &mut buf, 1, 0).unwrap();
            assert_eq!(hit.blocking_reads, 0, "the hit was not caught by polling");
            assert_eq!(p.miss_streak, 0);
            assert_eq!(p.quiet, 0);
            assert_eq!(p.pipelining, 0);
        }
    }

    /// A caught poll (a client in a request-reply loop) keeps a CPU awake
    /// for the client until a poll runs out or a batch shows pipelining.
    #[test]
    fn caught_polls_keep_a_cpu_awake_until_the_loop_ends() {
        let here = awake::available();
        let mut p = Poller::new(50, true);
        let mut buf = [0u8; 16];
        p.read(&mut Scripted::new(&[true]), &mut buf, 1, 0).unwrap();
        assert_eq!(p.awake.is_some(), here, "a caught poll did not hold");
        let mut quiet = Poller::new(50, false);
        quiet
            .read(&mut Scripted::new(&[true]), &mut buf, 1, 0)
            .unwrap();
        assert!(quiet.awake.is_none(), "held with keep-awake off");
        // The client went quiet: the poll ran out.
        p.read(&mut Scripted::new(&[]), &mut buf, 1, 0).unwrap();
        assert!(p.awake.is_none(), "still held after an empty poll");
        // Back in the loop, then a batch of several: a pipelining client.
        p.read(&mut Scripted::new(&[true]), &mut buf, 1, 0).unwrap();
        assert_eq!(p.awake.is_some(), here);
        p.read(&mut Scripted::new(&[true]), &mut buf, 3, 0).unwrap();
        assert!(p.awake.is_none(), "still held while pipelining");
    }

    /// Polls answered at once, QUICK_STREAK in a row, quiet polling too
    /// (a read may take longer than QUICK_US on a loaded machine, which
    /// only restarts the streak).
    #[test]
    fn quick_answers_in_a_row_quiet_polling() {
        let mut p = Poller::new(50, true);
        let mut buf = [0u8; 16];
        let mut reads = 0;
        while p.quiet == 0 && reads < 10_000 {
            p.read(&mut Scripted::new(&[true]), &mut buf, 1, 0).unwrap();
            reads += 1;
        }
        assert_eq!(p.quiet, QUIET_READS, "no quiet after {reads} quick answers");
        assert!(reads >= QUICK_STREAK, "quiet after {reads}");
        assert!(p.awake.is_none(), "still held while quiet");
        let mut s = Scripted::new(&[true]);
        p.read(&mut s, &mut buf, 1, 0).unwrap();
        assert_eq!((s.nonblocking_reads, s.blocking_reads), (0, 1));
    }

    /// A batch of several requests marks a pipelining client for the next
    /// PIPELINE_READS reads: bytes already there are taken without a wait,
    /// and polls that catch requests hold no CPU awake.
    #[test]
    fn a_multi_request_batch_marks_a_pipelining_client() {
        let mut p = Poller::new(50, true);
        let mut s = Scripted::new(&[true, false, false, true]);
        let mut buf = [0u8; 16];
        p.read(&mut s, &mut buf, 3, 0).unwrap();
        assert_eq!((s.nonblocking_reads, s.blocking_reads), (1, 0));
        assert_eq!(p.pipelining, PIPELINE_READS - 1);
        // Empty, with nothing known of the client's backlog: poll.
        p.read(&mut s, &mut buf, 1, 0).unwrap();
        assert_eq!(s.blocking_reads, 0, "the poll did not catch the request");
        assert!(p.awake.is_none(), "a pipelining client held a CPU awake");
        assert_eq!(p.pipelining, PIPELINE_READS - 2);
    }

    /// A pipelining client that still holds a backlog of our replies is
    /// napped for, not polled for: the naps end when its request arrives,
    /// and each checks the backlog again.
    #[test]
    fn a_busy_client_is_napped_for() {
        let mut p = Poller::new(50, false);
        p.pipelining = PIPELINE_READS;
        let mut buf = [0u8; 16];
        // Nothing after three naps, the request after the fourth.
        let mut s = Scripted::new(&[false, false, false, true]);
        s.unread = Some(NAP_BACKLOG_BYTES);
        p.read(&mut s, &mut buf, 1, NAP_BACKLOG_BYTES).unwrap();
        assert_eq!(s.blocking_reads, 0);
        assert_eq!(s.nonblocking_reads, 4, "one look after each nap");
        assert_eq!(
            s.unread_asked.get(),
            5,
            "one backlog check, then one per nap"
        );
        assert_eq!(p.miss_streak, 0);
    }

    /// Requests already there wait for a nap while the client is busy: the
    /// first look comes after it, so what piles up meanwhile is one batch.
    #[test]
    fn a_busy_client_gets_a_nap_before_the_first_look() {
        let mut p = Poller::new(50, false);
        p.pipelining = PIPELINE_READS;
        let mut buf = [0u8; 16];
        let mut s = Scripted::new(&[true]);
        s.unread = Some(4 * NAP_BACKLOG_BYTES);
        let started = Instant::now();
        p.read(&mut s, &mut buf, 1, 4 * NAP_BACKLOG_BYTES).unwrap();
        assert!(started.elapsed() >= Duration::from_micros(NAP_MIN_US as u64));
        assert_eq!((s.nonblocking_reads, s.blocking_reads), (1, 0));
        assert_eq!(s.unread_asked.get(), 2, "before and after the nap");
    }

    /// The backlog is asked for only while the replies sent since it was
    /// last measured could have made it NAP_BACKLOG_BYTES: a client at a
    /// low queue depth costs no syscall for it.
    #[test]
    fn a_backlog_that_cannot_be_deep_is_not_asked_for() {
        let mut p = Poller::new(50, false);
        p.pipelining = PIPELINE_READS;
        let mut buf = [0u8; 16];
        let mut s = Scripted::new(&[true, true, true]);
        s.unread = Some(1000);
        // 3/4 of the threshold sent: it cannot be deep yet.
        p.read(&mut s, &mut buf, 2, NAP_BACKLOG_BYTES * 3 / 4)
            .unwrap();
        assert_eq!(s.unread_asked.get(), 0);
        // Another 1/4: now it could be; the kernel says 1000 bytes, so
        // the bound starts again from there, and the request is taken at once.
        p.read(&mut s, &mut buf, 2, NAP_BACKLOG_BYTES / 4).unwrap();
        assert_eq!(s.unread_asked.get(), 1);
        assert_eq!(p.held_bound, 1000);
        p.read(&mut s, &mut buf, 2, NAP_BACKLOG_BYTES / 2).unwrap();
        assert_eq!(s.unread_asked.get(), 1);
        assert_eq!(s.nonblocking_reads, 3);
    }

    /// Naps last a share of the time the client needs for its backlog at
    /// its measured pace, within the bounds; the shortest while the pace
    /// is unknown.
    #[test]
    fn naps_follow_the_clients_pace() {
        let mut p = Poller::new(50, false);
        let us = |p: &Poller, held: usize| p.nap_length(held).as_secs_f64() * 1e6;
        assert_eq!(us(&p, 1 << 20), NAP_MIN_US, "pace unknown");
        // 1 byte per us: 256 KiB would take 262144 us to read.
        p.drain = 1.0;
        assert_eq!(us(&p, 256 * 1024), NAP_MAX_US);
        // 1000 bytes per us: 400 KB take 400 us, an eighth of that is 50.
        p.drain = 1000.0;
        assert!((us(&p, 400_000) - 400.0 / NAP_DRAIN_SHARE).abs() < 0.01);
        // A fast reader with little left: the shortest nap.
        p.drain = 1e6;
        assert_eq!(us(&p, NAP_BACKLOG_BYTES), NAP_MIN_US);
    }

    /// The pace is a moving average of what the client read per nap; naps
    /// after which it held nothing (it may have read faster) and readings
    /// that grew are left out.
    #[test]
    fn the_pace_is_measured_over_naps() {
        let mut p = Poller::new(50, false);
        p.note_drain(200_000, 0, 20.0);
        assert_eq!(p.drain, 0.0, "emptied: only a lower bound");
        p.note_drain(200_000, 180_000, 20.0);
        assert_eq!(p.drain, 1000.0, "the first sample is taken as it is");
        p.note_drain(200_000, 160_000, 20.0);
        assert_eq!(p.drain, 1250.0, "a quarter of the way to 2000");
        p.note_drain(100_000, 150_000, 20.0);
        assert_eq!(p.drain, 1250.0, "a backlog that grew says nothing");
    }

    /// A small backlog (a client about to run dry) or an unknown one (TCP)
    /// gets a poll, not a nap.
    #[test]
    fn a_client_near_the_end_of_its_replies_is_polled_for() {
        for unread in [None, Some(0), Some(NAP_BACKLOG_BYTES - 1)] {
            let mut p = Poller::new(50, false);
            p.pipelining = PIPELINE_READS;
            let mut buf = [0u8; 16];
            let mut s = Scripted::new(&[false, true]);
            s.unread = unread;
            p.read(&mut s, &mut buf, 1, NAP_BACKLOG_BYTES).unwrap();
            assert_eq!(s.unread_asked.get(), 1, "{unread:?}");
            assert_eq!(s.nonblocking_reads, 2, "{unread:?}: not caught by the poll");
            assert_eq!(s.blocking_reads, 0, "{unread:?}");
        }
    }

    /// A client that holds a backlog but never sends (stopped, or not
    /// reading) gets NAP_MAX naps, one poll, then a blocking read.
    #[test]
    fn naps_for_a_silent_client_end() {
        let mut p = Poller::new(1, false);
        p.pipelining = PIPELINE_READS;
        let mut buf = [0u8; 16];
        let mut s = Scripted::new(&[]);
        s.unread = Some(usize::MAX);
        p.read(&mut s, &mut buf, 1, usize::MAX).unwrap();
        assert_eq!(s.unread_asked.get(), 1 + NAP_MAX as usize);
        assert_eq!(s.blocking_reads, 1);
        assert_eq!(p.miss_streak, 1, "the poll after the naps ran out");
    }

    /// The blocking strategy (`poll_us = 0`) blocks at once, whatever the
    /// client does.
    #[test]
    fn no_polling_blocks_at_once() {
        let mut p = super::super::wait::Blocking;
        let mut buf = [0u8; 16];
        for batch in [1, 3] {
            let mut s = Scripted::new(&[true]);
            s.unread = Some(usize::MAX);
            p.read(&mut s, &mut buf, batch, usize::MAX).unwrap();
            assert_eq!((s.nonblocking_reads, s.blocking_reads), (0, 1));
            assert_eq!(s.unread_asked.get(), 0);
        }
    }
}
