//! The fallback load generator for files and block devices: pread/pwrite,
//! one I/O in flight per job (fio's `psync`), used when io_uring is not
//! available (an old kernel, a seccomp filter). The report says so: at a
//! depth above 1 it measures less than the test asks.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::Instant;

use super::{AlignedBuf, EngineError, Live, Offsets, Until, Workload};
use crate::bench::latency::Recorder;

/// Runs the workload on `file` until `until`, one I/O at a time.
pub fn run(
    file: &File,
    w: &Workload,
    seed: u64,
    until: Until<'_>,
    live: &Live,
    rec: &mut Recorder,
) -> Result<(), EngineError> {
    let mut buf = AlignedBuf::new(w.block_bytes as usize, seed ^ 0xb0f);
    let mut offsets = Offsets::new(w, seed);
    let mut start = Instant::now();
    while !until.reached(start) {
        let (offset, read) = offsets.draw();
        let done = if read {
            file.read_exact_at(buf.as_mut_slice(), offset)
        } else {
            file.write_all_at(buf.as_slice(), offset)
        };
        let end = Instant::now();
        if let Err(e) = done {
            rec.errors += 1;
            let what = if read { "pread" } else { "pwrite" };
            return Err(EngineError::io(format!("{what} at offset {offset}"))(e));
        }
        let ns = end.saturating_duration_since(start).as_nanos() as u64;
        let dir = if read { &mut rec.read } else { &mut rec.write };
        dir.record(ns, w.block_bytes);
        live.add(1);
        start = end;
    }
    Ok(())
}
