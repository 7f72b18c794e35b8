//! Recompression of idle pages (`--compress lz4+zstd[:LEVEL]`, zram's
//! `recomp_algorithm`): writes compress with LZ4, the fast codec, and a
//! background thread per drive recompresses the pages nobody has read or
//! written for a while with Zstandard, the dense one, under a CPU budget.
//!
//! # Why (measured, bench/RESULTS.md "Compressed drives")
//!
//! A 4 KiB zstd write is bound by zstd's own per-block work (match finding,
//! literal histograms, Huffman and FSE tables, rebuilt for every 4 KiB
//! block whatever the context): over NBD the daemon spent ~8.5 us of CPU
//! per zstd:3 write against ~3.0 for lz4 and ~2.3 for a plain drive, and
//! zstd:1 was no cheaper on such pages. Deferring zstd to idle pages keeps
//! writes at lz4's cost and, once the data rests, the memory at zstd's.
//!
//! # Which pages: a clock over the page tables
//!
//! Every read or write sets the page's ACCESSED flag (`table.rs`; a read
//! sets it under the shard's shared lock, with one atomic OR when it was
//! clear). The worker sweeps the drive group by group: it clears the flag
//! of an accessed page, and recompresses a page whose flag is still clear,
//! that is one not read or written for a whole sweep. A page whose
//! recompression would not free memory (zstd's object in the same or a
//! larger size class, or still over the raw threshold) is marked KEPT and
//! not tried again until it is written. Pages the second codec holds and
//! same-filled pages are skipped.
//!
//! # How one page is recompressed
//!
//! Under the shard's shared lock, the group's candidates are copied out
//! as stored (objects or raw pages); outside any lock they are decompressed
//! and compressed with zstd; then, under the shard's exclusive lock, a page
//! whose entry is still exactly what was copied (same object, flags and
//! all, so neither a write nor a read came in between) is placed with
//! codec 1 and no flags, through the same `Shard::place` as a write: the
//! new object is allocated before the old one is freed, so a page is never
//! lost, and a page for which no memory can be had is left as it was, to
//! be tried again (never squeezed into its old, larger slot). The contents
//! do not change, so nothing is marked dirty for persistence, and a sync
//! cut reads either representation (each object names its codec).
//!
//! # A full drive
//!
//! Recompression is worth most to a drive at its memory limit, and there
//! every new object needs a page the limit will not give: the smaller
//! class's page is needed before the larger class's last page empties. So
//! recompression may pass the drive's limit and the daemon budget by
//! [`OVERDRAFT_BYTES`] (1 MiB; the host cap too, since it frees memory).
//! Each recompressed page moves its object at least one size class down,
//! the larger class's last object fills the hole and its last page is
//! given back once empty, so the overdraft is repaid as the sweep goes on
//! and the drive ends below its limit with room for more data. Client
//! writes keep the strict limit: while the overdraft is in use they may
//! get ENOSPC, as they did at the full limit before.
//!
//! # Budget
//!
//! The worker measures its own CPU time (`CLOCK_THREAD_CPUTIME_ID`) and
//! sleeps after every 10 ms of work for as long as keeps it at
//! [`CPU_PCT`] percent of one core. A sweep that found nothing to do is
//! followed by a pause that doubles from 1 s up to 64 s (an idle drive
//! costs little), and shortens again once a sweep finds work.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::page::{self, Packed, PACK_BUF_BYTES, PAGE_BYTES};
use super::pool::class_for;
use super::shard::{Placing, Space, GROUP_PAGES};
use super::table::{self, Entry, ACCESSED, KEPT};
use super::{Inner, Overdraft, SHARDS};

/// The worker's share of one core, in percent.
pub const CPU_PCT: u64 = 25;
/// CPU time worked between two rests.
const SLICE_NS: u64 = 10_000_000;
/// How far a recompression may pass the drive's limit and the daemon
/// budget: the new objects' pages in the smaller classes, taken before the
/// old classes' pages empty (see the module docs).
pub const OVERDRAFT_BYTES: u64 = 1 << 20;
/// Pause after a sweep that found nothing, at first and at most.
const IDLE_MIN: Duration = Duration::from_secs(1);
const IDLE_MAX: Duration = Duration::from_secs(64);

/// What recompression did, for the stats.
#[derive(Debug, Default)]
pub struct Counters {
    /// Pages recompression tried.
    pub attempts: AtomicU64,
    /// Bytes of objects it saved (old length minus new).
    pub saved_bytes: AtomicU64,
    /// CPU time it spent, in nanoseconds.
    pub cpu_ns: AtomicU64,
    /// Held while a group is recompressed, so that `check` (which reads
    /// the shards and the pool one after another) never sees a page whose
    /// new object is allocated and old one not yet freed.
    pub busy: parking_lot::Mutex<()>,
    /// Live [`Paused`] guards: the worker leaves the drive alone meanwhile.
    pub paused: AtomicU64,
    /// Set by [`Worker::hurry`]: the next sweep takes every page, idle or
    /// not (host memory is short).
    pub urgent: AtomicBool,
    /// Sweeps made urgent that way.
    pub urgent_sweeps: AtomicU64,
}

/// While it lives, the background worker changes nothing (see
/// `CompressedStore::pause_recompression`).
pub struct Paused<'a>(&'a Counters);

impl<'a> Paused<'a> {
    /// Pauses the worker and waits for the group it may be working on.
    pub(super) fn new(c: &'a Counters) -> Self {
        c.paused.fetch_add(1, Relaxed);
        drop(c.busy.lock());
        Paused(c)
    }
}

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        self.0.paused.fetch_sub(1, Relaxed);
    }
}

/// The background thread of one drive; stopped and joined when dropped.
pub struct Worker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    /// Starts recompressing `inner`'s idle pages.
    pub fn start(inner: Arc<Inner>) -> io::Result<Worker> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("ramd-recompress".into())
            .spawn(move || run(&inner, &flag))?;
        Ok(Worker {
            stop,
            thread: Some(thread),
        })
    }
}

impl Worker {
    /// Host memory is short: the worker's next sweep (started now, at the
    /// same CPU budget) recompresses every page the first codec holds,
    /// accessed or not.
    pub fn hurry(&self, inner: &Inner) {
        inner.recomp.urgent.store(true, Relaxed);
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

/// This thread's CPU time in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass and nothing else.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn run(inner: &Inner, stop: &AtomicBool) {
    let mut idle = IDLE_MIN;
    let (mut mark, mut debt) = (thread_cpu_ns(), 0u64);
    while !stop.load(Relaxed) {
        let mut pace = || {
            let now = thread_cpu_ns();
            inner.recomp.cpu_ns.fetch_add(now - mark, Relaxed);
            debt += now - mark;
            mark = now;
            if debt >= SLICE_NS {
                let rest = debt * (100 - CPU_PCT) / CPU_PCT;
                std::thread::park_timeout(Duration::from_nanos(rest));
                debt = 0;
                mark = thread_cpu_ns();
            }
            !stop.load(Relaxed)
        };
        let urgent = inner.recomp.urgent.swap(false, Relaxed);
        if urgent {
            inner.recomp.urgent_sweeps.fetch_add(1, Relaxed);
        }
        let worked = inner.sweep(urgent, true, &mut pace).0;
        if worked {
            idle = IDLE_MIN;
            continue;
        }
        std::thread::park_timeout(idle);
        idle = (idle * 2).min(IDLE_MAX);
    }
}

/// A page the sweep may recompress: its local index, its entry as seen,
/// and its stored bytes in the scratch buffer.
struct Candidate {
    local: u32,
    bits: u64,
    at: usize,
    len: usize,
}

/// What a sweep keeps between groups.
#[derive(Default)]
struct Scratch {
    cands: Vec<Candidate>,
    bytes: Vec<u8>,
}

impl Inner {
    /// One sweep over the drive: with `all`, recompresses every page the
    /// first codec holds (not kept), accessed or not; else clears accessed
    /// flags and recompresses idle pages. `background` (the worker's) does
    /// nothing while recompression is paused. Calls `pace` after each
    /// group and stops when it returns false. Returns whether it did
    /// anything and the bytes saved.
    pub(super) fn sweep(
        &self,
        all: bool,
        background: bool,
        pace: &mut dyn FnMut() -> bool,
    ) -> (bool, u64) {
        let (mut worked, mut saved) = (false, 0);
        let mut scratch = Scratch::default();
        for si in 0..SHARDS {
            let groups = self.shard(si).read().table_len() / GROUP_PAGES as u32;
            for lg in 0..groups {
                let (w, s) = self.recompress_group(si, lg, all, background, &mut scratch);
                worked |= w;
                saved += s;
                if !pace() {
                    return (worked, saved);
                }
            }
        }
        (worked, saved)
    }

    /// Every page recompressed now (see `CompressedStore::recompress_all`).
    pub(super) fn recompress_sweep(&self, all: bool) -> u64 {
        let t = thread_cpu_ns();
        let saved = self.sweep(all, false, &mut || true).1;
        self.recomp.cpu_ns.fetch_add(thread_cpu_ns() - t, Relaxed);
        saved
    }

    /// Visits local group `lg` of shard `si` (see the module docs).
    fn recompress_group(
        &self,
        si: usize,
        lg: u32,
        all: bool,
        background: bool,
        sc: &mut Scratch,
    ) -> (bool, u64) {
        let _busy = self.recomp.busy.lock();
        if background && self.recomp.paused.load(Relaxed) > 0 {
            return (false, 0);
        }
        sc.cands.clear();
        sc.bytes.clear();
        let mut worked = false;
        {
            let shard = self.shard(si).read();
            for local in lg * GROUP_PAGES as u32..(lg + 1) * GROUP_PAGES as u32 {
                let bits = shard.bits(local);
                let flags = table::flags_of(bits);
                let entry = shard.decode(local, bits);
                let len = match entry {
                    Entry::Stored(o) if o.codec == 0 => o.len as usize,
                    Entry::Raw(_) => PAGE_BYTES,
                    _ => continue,
                };
                if flags & KEPT != 0 {
                    continue;
                }
                if flags & ACCESSED != 0 && !all {
                    worked |= shard.swap_flags(local, bits, flags & !ACCESSED);
                    continue;
                }
                let at = sc.bytes.len();
                match entry {
                    Entry::Stored(o) => self.pool.read(o.class as usize, o.id, len, |b| {
                        sc.bytes.extend_from_slice(b)
                    }),
                    // SAFETY: a raw page belongs to its entry alone, and
                    // we hold the shard's lock.
                    Entry::Raw(p) => sc.bytes.extend_from_slice(unsafe { p.bytes() }),
                    _ => unreachable!("only stored and raw pages are candidates"),
                }
                sc.cands.push(Candidate {
                    local,
                    bits,
                    at,
                    len,
                });
            }
        }
        let mut saved = 0;
        for c in &sc.cands {
            worked = true;
            saved += self.recompress_one(si, c, &sc.bytes[c.at..c.at + c.len]);
        }
        (worked, saved)
    }

    /// Recompresses one candidate whose stored bytes are `old`; returns the
    /// bytes saved.
    fn recompress_one(&self, si: usize, c: &Candidate, old: &[u8]) -> u64 {
        let second = self.algo.secondary().expect("a drive that recompresses");
        self.recomp.attempts.fetch_add(1, Relaxed);
        let mut pg = [0u8; PAGE_BYTES];
        if c.len == PAGE_BYTES {
            pg.copy_from_slice(old);
        } else if page::unpack(self.algo.primary(), old, &mut pg).is_err() {
            // A damaged object: reads report it; nothing to gain here.
            return 0;
        }
        let mut buf = [0u8; PACK_BUF_BYTES];
        // The classes objects take in this drive (a kept drive's end with
        // their id: `keep.rs`); no class, or not a smaller one: no gain.
        let kept = self.arena.keep().is_some();
        let gains = |n: usize| match (class_for(n, kept), class_for(c.len, kept)) {
            (Some(_), _) if c.len == PAGE_BYTES => true,
            (Some(new), Some(old)) => new < old,
            _ => false,
        };
        let n = match page::compress(second, &pg, &mut buf) {
            Ok(Packed::Compressed(n)) if gains(n) => n,
            _ => {
                self.shard(si).read().swap_flags(c.local, c.bits, KEPT);
                return 0;
            }
        };
        let mut shard = self.shard(si).write();
        if shard.bits(c.local) != c.bits {
            return 0;
        }
        let placing = Placing::new(Packed::Compressed(n), &buf[..], &pg, 1);
        let overdraft = Overdraft(&self.mem);
        let space = Space {
            pool: &self.pool,
            arena: &self.arena,
            charge: &overdraft,
        };
        match shard.place(c.local, placing, 0, &space) {
            Ok(()) => {
                let s = (c.len - n) as u64;
                self.recomp.saved_bytes.fetch_add(s, Relaxed);
                s
            }
            Err(_) => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Algorithm, CompressedStore, MemoryBudget};
    use crate::block::backend::Backend;
    use std::sync::Arc;

    const PAGE: u64 = 4096;

    /// Text from a small vocabulary: lz4 ~2x, zstd better.
    fn text(seed: u64) -> Vec<u8> {
        let words = [
            "alpha ", "beta ", "gamma ", "delta ", "ramd ", "page\n", "zram ",
        ];
        let mut x = seed | 1;
        let mut v = Vec::new();
        while v.len() < PAGE as usize {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            v.extend_from_slice(words[(x % 7) as usize].as_bytes());
            v.extend_from_slice(&x.to_le_bytes()[..(x % 3) as usize]);
        }
        v.truncate(PAGE as usize);
        v
    }

    fn store(limit: Option<u64>, algo: Algorithm) -> CompressedStore {
        CompressedStore::new(1 << 24, algo, limit, Arc::new(MemoryBudget::new(u64::MAX))).unwrap()
    }

    /// Writes `text` pages from page `from` on until a write is refused,
    /// recompressing everything after every `every` pages (0: never);
    /// returns the first page that did not fit.
    fn fill(s: &CompressedStore, from: u64, every: u64) -> u64 {
        let mut n = from;
        while s.write(n * PAGE, &text(n), false).is_ok() {
            n += 1;
            if every > 0 && n % every == 0 {
                s.recompress_all();
            }
        }
        n
    }

    /// The clock, one sweep at a time with the worker paused: written
    /// pages are accessed, so the first sweep only clears their marks; a
    /// page read again before the next sweep is spared by it, and taken by
    /// the one after once it stayed idle.
    #[test]
    fn a_sweep_takes_idle_pages_and_spares_the_ones_in_use() {
        let s = store(None, Algorithm::Lz4Zstd { level: 1 });
        let _paused = s.pause_recompression();
        for p in 0..64 {
            s.write(p * PAGE, &text(p), false).unwrap();
        }
        let sweep = || s.inner.sweep(false, false, &mut || true);
        let recompressed = || s.stats().recompressed_pages;
        sweep();
        assert_eq!(recompressed(), 0, "written pages are in use");
        let mut back = vec![0u8; PAGE as usize];
        s.read(0, &mut back).unwrap();
        sweep();
        assert_eq!(recompressed(), 63, "page 0 was read since the last sweep");
        sweep();
        assert_eq!(recompressed(), 64, "page 0 stayed idle for a sweep");
        s.read(0, &mut back).unwrap();
        assert_eq!(back, text(0));
        s.check().unwrap();
    }

    #[test]
    fn recompression_keeps_the_data_and_saves_memory() {
        let s = store(None, Algorithm::Lz4Zstd { level: 3 });
        // Only the explicit sweeps below recompress: the figures are exact.
        let _paused = s.pause_recompression();
        for p in 0..256 {
            s.write(p * PAGE, &text(p), false).unwrap();
        }
        // A page of noise: zstd cannot help it either, so it is kept.
        let noise: Vec<u8> = (0..PAGE).map(|i| ((i * 2654435761) >> 13) as u8).collect();
        s.write(300 * PAGE, &noise, false).unwrap();
        let before = s.stats();
        let saved = s.recompress_all().unwrap();
        let after = s.stats();
        assert!(saved > 0 && after.recompressed_pages > 200, "{after:?}");
        assert!(
            after.compr_data_bytes < before.compr_data_bytes,
            "{after:?}"
        );
        assert!(after.slab_bytes < before.slab_bytes, "{before:?} {after:?}");
        assert_eq!(after.orig_data_bytes, before.orig_data_bytes);
        assert!(after.recompress_attempts >= after.recompressed_pages);
        s.check().unwrap();
        let mut back = vec![0u8; PAGE as usize];
        for p in 0..256 {
            s.read(p * PAGE, &mut back).unwrap();
            assert!(back == text(p), "page {p}");
        }
        s.read(300 * PAGE, &mut back).unwrap();
        assert_eq!(back, noise);
        // Nothing left to do: kept and recompressed pages are not tried again.
        let attempts = s.stats().recompress_attempts;
        assert_eq!(s.recompress_all(), Some(0));
        assert_eq!(s.stats().recompress_attempts, attempts);
        // A write brings a page back to the first codec.
        s.write(5 * PAGE, &text(1000), false).unwrap();
        assert_eq!(s.stats().recompressed_pages, after.recompressed_pages - 1);
        s.check().unwrap();
        // A drive without a second codec has nothing to recompress.
        assert_eq!(store(None, Algorithm::Lz4).recompress_all(), None);
    }

    #[test]
    fn the_worker_recompresses_idle_pages_and_spares_busy_ones() {
        let s = store(None, Algorithm::Lz4Zstd { level: 1 });
        for p in 0..64 {
            s.write(p * PAGE, &text(p), false).unwrap();
        }
        let mut back = vec![0u8; PAGE as usize];
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        // Page 0 is read all along, so it never goes idle.
        while s.stats().recompressed_pages < 63 {
            s.read(0, &mut back).unwrap();
            assert!(std::time::Instant::now() < deadline, "{:?}", s.stats());
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        s.read(0, &mut back).unwrap();
        assert_eq!(back, text(0));
        // Page 0 too when this thread fell behind the worker for a sweep
        // (a busy machine): no more than every page either way.
        let st = s.stats();
        assert!(st.recompressed_pages <= 64, "{st:?}");
        s.check().unwrap();
    }

    /// Under memory pressure (`hurry`) the worker recompresses pages that
    /// are in use too: page 0, read all along, goes to zstd as well
    /// (`a_sweep_takes_idle_pages_and_spares_the_ones_in_use` shows that
    /// an ordinary sweep spares it, `an_urgent_sweep_takes_pages_in_use`
    /// that an urgent one does not, one sweep at a time).
    #[test]
    fn a_hurried_worker_recompresses_busy_pages_too() {
        let s = store(None, Algorithm::Lz4Zstd { level: 1 });
        for p in 0..64 {
            s.write(p * PAGE, &text(p), false).unwrap();
        }
        let mut back = vec![0u8; PAGE as usize];
        assert!(s.hurry_recompression());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        // Both: an ordinary sweep already under way when the worker was
        // hurried may take every page first, page 0 too if this thread
        // fell behind it (a busy machine); the urgent one follows it.
        while s.stats().recompressed_pages < 64 || s.stats().urgent_sweeps < 1 {
            s.read(0, &mut back).unwrap();
            assert!(std::time::Instant::now() < deadline, "{:?}", s.stats());
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // Read after the wait: the loop above may never have run its body
        // (the worker done first), and then `back` would still be zeroes.
        s.read(0, &mut back).unwrap();
        assert_eq!(back, text(0));
        s.check().unwrap();
        assert!(!store(None, Algorithm::Lz4).hurry_recompression());
    }

    /// An urgent sweep (`all`) takes every page the first codec holds,
    /// the ones just written or read included, in one go.
    #[test]
    fn an_urgent_sweep_takes_pages_in_use() {
        let s = store(None, Algorithm::Lz4Zstd { level: 1 });
        let _paused = s.pause_recompression();
        for p in 0..64 {
            s.write(p * PAGE, &text(p), false).unwrap();
        }
        let mut back = vec![0u8; PAGE as usize];
        s.read(0, &mut back).unwrap();
        s.inner.sweep(true, false, &mut || true);
        assert_eq!(s.stats().recompressed_pages, 64, "{:?}", s.stats());
        s.read(0, &mut back).unwrap();
        assert_eq!(back, text(0));
        s.check().unwrap();
    }

    /// A drive filled to its limit with lz4 takes more data once its pages
    /// are recompressed (through the overdraft), and ends within its limit.
    #[test]
    fn recompression_makes_room_in_a_full_drive() {
        let limit = 64 * PAGE;
        let s = store(Some(limit), Algorithm::Lz4Zstd { level: 3 });
        let _paused = s.pause_recompression();
        let full = fill(&s, 0, 0);
        s.recompress_all().unwrap();
        assert!(s.allocated_bytes() < limit, "{:?}", s.stats());
        let more = fill(&s, full, 0);
        assert!(more > full + full / 8, "{full} pages, then {more}");
        assert!(s.allocated_bytes() <= limit);
        s.check().unwrap();
        let mut back = vec![0u8; PAGE as usize];
        for p in 0..more {
            s.read(p * PAGE, &mut back).unwrap();
            assert!(back == text(p), "page {p}");
        }
    }

    /// A drive that recompresses as it fills (as the worker does while
    /// the drive has headroom) holds more than an lz4 drive of the same
    /// memory limit.
    #[test]
    fn recompression_makes_room_for_more_data() {
        let limit = 256 * PAGE;
        let lz4 = fill(&store(Some(limit), Algorithm::Lz4), 0, 0);
        let s = store(Some(limit), Algorithm::Lz4Zstd { level: 3 });
        let more = fill(&s, 0, 16);
        assert!(
            more > lz4 + lz4 / 8,
            "lz4 held {lz4} pages, lz4+zstd {more}"
        );
        s.check().unwrap();
        let mut back = vec![0u8; PAGE as usize];
        for p in 0..more {
            s.read(p * PAGE, &mut back).unwrap();
            assert!(back == text(p), "page {p}");
        }
    }
}
