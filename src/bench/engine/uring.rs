//! The file and block-device load generator: io_uring, `iodepth` reads or
//! writes in flight per ring (fio's `--ioengine=io_uring` without polling
//! modes), each with its own slot of one aligned buffer.
//!
//! ```text
//!  loop: push an SQE for every free slot (user_data = slot)
//!        io_uring_enter: submit them and wait for >= 1 completion
//!        reap every CQE: record, free the slot
//! ```
//!
//! Invariant: a slot's buffer belongs to the kernel from the push until
//! its completion is reaped, and the job never returns with I/O in
//! flight (an error stops new submissions, then the ring is drained), so
//! the buffer outlives every I/O that uses it.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::time::Instant;

use io_uring::{opcode, types, IoUring};

use super::{AlignedBuf, EngineError, Live, Offsets, Until, Workload};
use crate::bench::latency::Recorder;

/// A slot's I/O in flight.
#[derive(Clone, Copy)]
struct Slot {
    start: Instant,
    offset: u64,
    read: bool,
}

/// One job: its ring and buffers (the file is the caller's, opened per
/// job with the target's flags).
pub struct UringJob {
    ring: IoUring,
    depth: usize,
}

impl UringJob {
    /// A ring for `depth` I/Os; an error when the kernel has no io_uring
    /// (or forbids it), so the caller can fall back to `psync`.
    pub fn new(depth: u32) -> std::io::Result<UringJob> {
        let depth = depth.max(1);
        Ok(UringJob {
            ring: IoUring::new(depth.next_power_of_two())?,
            depth: depth as usize,
        })
    }

    /// Runs the workload on `file` until `until`.
    pub fn run(
        &mut self,
        file: &File,
        w: &Workload,
        seed: u64,
        until: Until<'_>,
        live: &Live,
        rec: &mut Recorder,
    ) -> Result<(), EngineError> {
        let bs = w.block_bytes as usize;
        let mut bufs = AlignedBuf::new(bs * self.depth, seed ^ 0xb0f);
        let base = bufs.as_mut_slice().as_mut_ptr();
        let mut offsets = Offsets::new(w, seed);
        let mut slots: Vec<Option<Slot>> = vec![None; self.depth];
        let mut free: Vec<usize> = (0..self.depth).rev().collect();
        let fd = types::Fd(file.as_raw_fd());
        let mut failure: Option<EngineError> = None;
        loop {
            let now = Instant::now();
            let stopping = failure.is_some() || until.reached(now);
            if !stopping {
                while let Some(i) = free.pop() {
                    let (offset, read) = offsets.draw();
                    // SAFETY: slot i's range [i*bs, (i+1)*bs) lies inside
                    // `bufs`, which outlives the I/O (module invariant).
                    let ptr = unsafe { base.add(i * bs) };
                    let sqe = if read {
                        opcode::Read::new(fd, ptr, bs as u32).offset(offset).build()
                    } else {
                        opcode::Write::new(fd, ptr, bs as u32)
                            .offset(offset)
                            .build()
                    };
                    // SAFETY: the SQE's buffer stays valid until its
                    // completion is reaped (module invariant); the ring
                    // has room for `depth` entries and at most `depth`
                    // are outstanding.
                    unsafe { self.ring.submission().push(&sqe.user_data(i as u64)) }
                        .expect("the ring holds every slot");
                    slots[i] = Some(Slot {
                        start: now,
                        offset,
                        read,
                    });
                }
            }
            if free.len() == self.depth {
                break;
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // The ring itself failed: I/O may still be in flight,
                    // so its buffers are leaked rather than freed under
                    // the kernel.
                    std::mem::forget(bufs);
                    return Err(EngineError::io("io_uring_enter")(e));
                }
            }
            let now = Instant::now();
            let mut completed = 0;
            for cqe in self.ring.completion() {
                let i = cqe.user_data() as usize;
                let slot = slots[i].take().expect("a completion for a slot in flight");
                free.push(i);
                let res = cqe.result();
                let what = if slot.read { "read" } else { "write" };
                if res < 0 {
                    rec.errors += 1;
                    failure.get_or_insert(EngineError::Io {
                        what: format!("{what} at offset {}", slot.offset),
                        source: std::io::Error::from_raw_os_error(-res),
                    });
                    continue;
                }
                if res as usize != bs {
                    rec.errors += 1;
                    failure.get_or_insert(EngineError::Short {
                        what,
                        offset: slot.offset,
                        got: res as usize,
                        want: bs,
                    });
                    continue;
                }
                let ns = now.saturating_duration_since(slot.start).as_nanos() as u64;
                let dir = if slot.read {
                    &mut rec.read
                } else {
                    &mut rec.write
                };
                dir.record(ns, w.block_bytes);
                completed += 1;
            }
            live.add(completed);
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
