//! Issue 31, stage 1: a drive's memory survives kill -9 of the process
//! that serves it, with every acknowledged write, when someone else keeps
//! its memfd. This test plays the keeper (what the supervisor will be):
//! it holds the memfd and starts a writer process after another (this
//! test binary again, `writer_child`), each adopting the memfd
//! (`RamStore::adopt`), checking it, then writing under four threads and
//! acknowledging each write on stdout after `write` returned, until the
//! test kills it with SIGKILL at a random moment.
//!
//! The oracle, after every kill, on the keeper's own adoption: each page
//! belongs to one writer thread, whose writes fill it with 8-byte words
//! `page << 32 | seq`, `seq` rising (a new writer continues above the
//! highest word it finds). An acknowledged write covered the whole page,
//! so every word of a page whose last acknowledged write is `s` holds at
//! least `s`; more only from writes never acknowledged (at most one in
//! flight per thread per writer, possibly torn: never reported written),
//! so at most `s + cycles`. Anything else (an older value, zeroes after
//! an acknowledgement, another page's words) is a lost write.
//!
//! Not covered here (no supervisor yet): listeners, NBD clients, the
//! supervisor's own death. `RAMD_RESTART_CYCLES=N` sets the number of
//! kills (default 10; 200+ is the long mode).

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ramd::block::backend::Backend;
use ramd::store::{KeptMemory, MemoryBudget, RamStore, SegmentKeeper, StoreOptions, PAGE_BYTES};

/// Two segments: pages on both sides of a segment boundary are written.
const SIZE: u64 = 128 << 20;
/// Pages the writers use (spread over the drive by `page_offset`).
const PAGES: u64 = 2048;
const THREADS: u64 = 4;
const CHILD_ENV: &str = "RAMD_RESTART_CHILD";

fn page_offset(page: u64) -> u64 {
    // Spread the pages over the whole drive, both segments included.
    page * (SIZE / PAGES / PAGE_BYTES) * PAGE_BYTES
}

fn opts() -> StoreOptions {
    StoreOptions {
        prefault: false,
        shared_memory: true,
        ..StoreOptions::default()
    }
}

/// The seqs a page's words hold (the page's number checked).
fn page_seqs(s: &RamStore, page: u64) -> Result<Vec<u64>, String> {
    let mut buf = vec![0u8; PAGE_BYTES as usize];
    s.read(page_offset(page), &mut buf).unwrap();
    buf.chunks(8)
        .map(|w| {
            let w = u64::from_le_bytes(w.try_into().unwrap());
            match (w >> 32, w & 0xffff_ffff) {
                (_, 0) if w == 0 => Ok(0),
                (p, seq) if p == page => Ok(seq),
                _ => Err(format!("page {page} holds a foreign word {w:#x}")),
            }
        })
        .collect()
}

/// The writer process: adopts the memfd on its stdin, then writes and
/// acknowledges until killed.
#[test]
fn writer_child() {
    if std::env::var(CHILD_ENV).is_err() {
        return; // Only as the test's child.
    }
    // SAFETY: the keeper passed the memfd as our stdin; nothing else uses
    // fd 0 in this process.
    let fd = unsafe { OwnedFd::from_raw_fd(libc::dup(0)) };
    let budget = Arc::new(MemoryBudget::new(u64::MAX));
    let kept = KeptMemory {
        memfd: fd,
        ledger: None,
    };
    let s = Arc::new(RamStore::adopt(SIZE, kept, opts(), budget).expect("adopt"));
    std::thread::scope(|sc| {
        for t in 0..THREADS {
            let s = s.clone();
            sc.spawn(move || {
                let mine: Vec<u64> = (0..PAGES).filter(|p| p % THREADS == t).collect();
                // Continue from what memory holds (at most one write lost).
                let mut seq: HashMap<u64, u64> = mine
                    .iter()
                    .map(|&p| (p, page_seqs(&s, p).unwrap().into_iter().max().unwrap()))
                    .collect();
                let mut x = (t + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ std::process::id() as u64;
                loop {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let page = mine[(x % mine.len() as u64) as usize];
                    let next = seq[&page] + 1;
                    let word = (page << 32 | next).to_le_bytes();
                    let data: Vec<u8> = word.iter().copied().cycle().take(4096).collect();
                    s.write(page_offset(page), &data, false).unwrap();
                    seq.insert(page, next);
                    println!("A {page} {next}");
                }
            });
        }
    });
}

/// Holds a duplicate of the memfd, as the supervisor will.
#[derive(Default)]
struct Keeper(std::sync::Mutex<Option<OwnedFd>>);

impl SegmentKeeper for Keeper {
    fn keep(&self, size_bytes: u64, fds: &[std::os::fd::BorrowedFd<'_>]) {
        assert_eq!(size_bytes, SIZE);
        *self.0.lock().unwrap() = Some(fds[0].try_clone_to_owned().unwrap());
    }
}

/// Checks every page against the acknowledged seqs (module docs).
fn check(s: &RamStore, acked: &HashMap<u64, u64>, cycle: usize) {
    for page in 0..PAGES {
        let a = acked.get(&page).copied().unwrap_or(0);
        let seqs = page_seqs(s, page).unwrap_or_else(|e| panic!("cycle {cycle}: {e}"));
        if let Some(bad) = seqs.iter().find(|&&q| q < a) {
            panic!(
                "cycle {cycle}: page {page} acknowledged at seq {a} holds seq {bad}: a lost write"
            );
        }
        if let Some(bad) = seqs.iter().find(|&&q| q > a + cycle as u64 + 1) {
            panic!(
                "cycle {cycle}: page {page} acknowledged at seq {a} holds seq {bad}, never written"
            );
        }
    }
}

#[test]
fn kill_9_of_the_writer_loses_no_acknowledged_write() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let cycles: usize = std::env::var("RAMD_RESTART_CYCLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let budget = Arc::new(MemoryBudget::new(u64::MAX));
    let keeper = Arc::new(Keeper::default());
    {
        let s = RamStore::with_options(SIZE, opts(), budget.clone()).unwrap();
        s.set_keeper(keeper.clone());
    }
    let memfd = keeper.0.lock().unwrap().take().expect("the store's memfd");
    let mut acked: HashMap<u64, u64> = HashMap::new();
    let mut total = 0usize;
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for cycle in 0..cycles {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["writer_child", "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, "1")
            .stdin(Stdio::from(memfd.try_clone().unwrap()))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the writer");
        let out = BufReader::new(child.stdout.take().unwrap());
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Kill after 20-150 acknowledgements into this run, or at a
        // deadline if the writer is slow to start.
        let kill_after = 20 + (x % 130) as usize;
        let deadline = Instant::now() + Duration::from_secs(30);
        let (mut seen, mut killed) = (0usize, false);
        for line in out.lines() {
            let line = line.expect("read the writer's output");
            let Some(rest) = line.strip_prefix("A ") else {
                continue; // The test harness's own lines.
            };
            let (p, q) = rest.split_once(' ').expect("A PAGE SEQ");
            let (p, q): (u64, u64) = (p.parse().unwrap(), q.parse().unwrap());
            let prev = acked.insert(p, q).unwrap_or(0);
            assert!(
                q > prev,
                "cycle {cycle}: page {p} acknowledged {q} after {prev}"
            );
            seen += 1;
            if !killed && (seen >= kill_after || Instant::now() > deadline) {
                // SAFETY: kill(2) on our own child's pid.
                unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGKILL) };
                killed = true;
            }
        }
        let status = child.wait().unwrap();
        assert!(
            killed,
            "cycle {cycle}: the writer ended by itself: {status:?}"
        );
        total += seen;
        let kept = KeptMemory {
            memfd: memfd.try_clone().unwrap(),
            ledger: None,
        };
        let s = RamStore::adopt(SIZE, kept, opts(), budget.clone()).expect("adopt after the kill");
        check(&s, &acked, cycle);
    }
    assert!(total >= cycles * 20, "only {total} acknowledged writes");
    eprintln!(
        "{cycles} kills, {total} acknowledged writes, all read back (memfd fd {})",
        memfd.as_raw_fd()
    );
}
