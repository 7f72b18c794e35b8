//! The file-level test: small files in a directory, the way a build or a
//! mail spool uses one (iozone's small-file runs, `fs_mark`):
//!
//! ```text
//!  loop: create + write + close BATCH files of `block_bytes`  (writes)
//!        open + read + close each of them                     (reads)
//!        unlink each of them                                  (other)
//! ```
//!
//! Every operation is timed on its own. No fsync, as a compiler does
//! none: on a disk directory the data and metadata stay in the page cache
//! until writeback, so this compares the filesystems' code paths more
//! than the devices (docs/bench.md says so). The files live in a scratch
//! directory the caller creates and removes.

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Instant;

use super::{AlignedBuf, EngineError, Live, Until, Workload};
use crate::bench::latency::Recorder;

/// Files per round (created, then read, then deleted).
const BATCH: usize = 256;

/// Runs rounds in `dir` until `until`; the last round always finishes
/// (its files are deleted), so the directory is left empty.
pub fn run(
    dir: &Path,
    w: &Workload,
    seed: u64,
    until: Until<'_>,
    live: &Live,
    rec: &mut Recorder,
) -> Result<(), EngineError> {
    let data = AlignedBuf::new(w.block_bytes as usize, seed);
    let mut back = vec![0u8; w.block_bytes as usize + 1];
    let mut round = 0u64;
    while !until.reached(Instant::now()) {
        let names: Vec<_> = (0..BATCH)
            .map(|i| dir.join(format!("f{}-{round}-{i}", w.job)))
            .collect();
        let result = one_round(&names, data.as_slice(), &mut back, rec);
        // Delete whatever this round created, even after a failure.
        for p in &names {
            let t = Instant::now();
            match std::fs::remove_file(p) {
                Ok(()) => {
                    let ns = t.elapsed().as_nanos() as u64;
                    rec.other.record(ns, 0);
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) if result.is_ok() => {
                    rec.errors += 1;
                    return Err(EngineError::io(format!("delete {}", p.display()))(e));
                }
                Err(_) => {}
            }
        }
        result?;
        live.add(3 * BATCH as u64);
        round += 1;
    }
    Ok(())
}

/// Creates and writes every file, then reads each back.
fn one_round(
    names: &[std::path::PathBuf],
    data: &[u8],
    back: &mut [u8],
    rec: &mut Recorder,
) -> Result<(), EngineError> {
    let len = data.len() as u64;
    for p in names {
        let t = Instant::now();
        File::create(p)
            .and_then(|mut f| f.write_all(data))
            .map_err(|e| fail(rec, "create", p, e))?;
        rec.write.record(t.elapsed().as_nanos() as u64, len);
    }
    for p in names {
        let t = Instant::now();
        let n = File::open(p)
            .and_then(|mut f| read_all(&mut f, back))
            .map_err(|e| fail(rec, "read", p, e))?;
        rec.read.record(t.elapsed().as_nanos() as u64, len);
        if n != data.len() {
            rec.errors += 1;
            return Err(EngineError::Short {
                what: "read of a small file",
                offset: 0,
                got: n,
                want: data.len(),
            });
        }
    }
    Ok(())
}

fn fail(rec: &mut Recorder, what: &str, p: &Path, e: std::io::Error) -> EngineError {
    rec.errors += 1;
    EngineError::io(format!("{what} {}", p.display()))(e)
}

/// Reads until EOF or `buf` is full; the bytes read.
fn read_all(f: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}
