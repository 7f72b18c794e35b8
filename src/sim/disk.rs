//! A simulated disk for crash tests: a [`Storage`] in memory that enforces
//! the durability contract of `storage.rs` adversarially, in the spirit of
//! TigerBeetle's storage simulator.
//!
//! ```text
//!  per file:  durable bytes ── + pending ops (writes, set_len, punch) ──► current bytes
//!                                 each op: kept or lost at a crash;      (what reads see)
//!                                 the op in flight at the crash: torn
//!  namespace: durable names  ── + pending creates/renames/removes (a prefix survives)
//! ```
//!
//! - Every operation counts one step. `crash_at(n)` makes step `n` the
//!   crash: a write in flight there is torn (a random prefix of it lands in
//!   the pending set), and every later operation fails, as if the process
//!   had died.
//! - [`SimDisk::after_crash`] builds the disk a restarted process sees: for
//!   each file its durable bytes plus a random subset of its pending ops
//!   (applied in order), and the durable namespace plus a random prefix of
//!   the pending directory operations.
//! - Faults: with a chosen probability a write fails with ENOSPC or EIO
//!   (nothing lands), and a `sync_data` fails with EIO; the writes that
//!   failed sync covered are then *doomed*: they stay readable but never
//!   become durable (Linux's behaviour after a failed fsync).
//!
//! Deterministic: all randomness comes from the seed.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;

use parking_lot::Mutex;

use super::Rng;
use crate::persist::storage::{Storage, StorageFile};

/// Faults injected into operations that do not crash.
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    /// Probability that a write fails (nothing lands).
    pub write_error: f64,
    /// Probability that a `sync_data` or `sync_dir` fails.
    pub sync_error: f64,
    /// Failed writes report ENOSPC (disk full) instead of EIO.
    pub enospc: bool,
}

#[derive(Debug, Clone)]
enum FileOp {
    Write { offset: u64, data: Vec<u8> },
    SetLen(u64),
    Punch { offset: u64, len: u64 },
}

impl FileOp {
    fn apply(&self, bytes: &mut Vec<u8>) {
        match self {
            FileOp::Write { offset, data } => {
                let end = *offset as usize + data.len();
                if bytes.len() < end {
                    bytes.resize(end, 0);
                }
                bytes[*offset as usize..end].copy_from_slice(data);
            }
            FileOp::SetLen(len) => bytes.resize(*len as usize, 0),
            FileOp::Punch { offset, len } => {
                let end = ((offset + len) as usize).min(bytes.len());
                if (*offset as usize) < end {
                    bytes[*offset as usize..end].fill(0);
                }
            }
        }
    }
}

#[derive(Debug, Clone, Default)]
struct SimFile {
    /// What survives a crash for sure.
    durable: Vec<u8>,
    /// What reads return.
    current: Vec<u8>,
    /// Ops since the last successful sync; `true` = doomed (a failed sync
    /// covered it: it will never become durable).
    pending: Vec<(FileOp, bool)>,
}

#[derive(Debug, Clone)]
enum DirOp {
    Link(String, u64),
    Unlink(String),
}

#[derive(Debug)]
struct Inner {
    files: HashMap<u64, SimFile>,
    next_id: u64,
    /// Names as the running process sees them.
    names: HashMap<String, u64>,
    /// Names that survive a crash for sure.
    durable_names: HashMap<String, u64>,
    /// Directory operations since the last successful `sync_dir`.
    dir_pending: Vec<DirOp>,
    /// Operations counted so far.
    steps: u64,
    /// The step that crashes, if any.
    crash_at: Option<u64>,
    /// Set once the crash happened: every operation fails.
    crashed: bool,
    faults: Faults,
    rng: Rng,
}

/// The simulated disk: one state directory. Cloning shares the disk.
#[derive(Clone)]
pub struct SimDisk {
    inner: Arc<Mutex<Inner>>,
}

fn crashed_error() -> io::Error {
    io::Error::other("simulated crash: the process is dead")
}

impl Inner {
    /// Counts one step; Err when the disk has crashed (or crashes now, in
    /// which case `tear` decides what part of the op in flight lands).
    fn step(&mut self) -> io::Result<bool> {
        if self.crashed {
            return Err(crashed_error());
        }
        self.steps += 1;
        if self.crash_at == Some(self.steps) {
            self.crashed = true;
            return Ok(true);
        }
        Ok(false)
    }

    fn fault(&mut self, p: f64) -> bool {
        p > 0.0 && self.rng.chance(p)
    }

    fn write_error(&self) -> io::Error {
        if self.faults.enospc {
            io::Error::from_raw_os_error(libc::ENOSPC)
        } else {
            io::Error::from_raw_os_error(libc::EIO)
        }
    }
}

impl SimDisk {
    /// An empty disk with randomness from `seed`.
    pub fn new(seed: u64) -> SimDisk {
        SimDisk {
            inner: Arc::new(Mutex::new(Inner {
                files: HashMap::new(),
                next_id: 1,
                names: HashMap::new(),
                durable_names: HashMap::new(),
                dir_pending: Vec::new(),
                steps: 0,
                crash_at: None,
                crashed: false,
                faults: Faults::default(),
                rng: Rng::seed(seed),
            })),
        }
    }

    /// Makes operation number `step` (counting from 1) crash the process.
    pub fn crash_at(&self, step: u64) {
        self.inner.lock().crash_at = Some(step);
    }

    /// Crashes now: every later operation fails.
    pub fn crash_now(&self) {
        self.inner.lock().crashed = true;
    }

    /// Operations counted so far.
    pub fn steps(&self) -> u64 {
        self.inner.lock().steps
    }

    /// True once the crash happened.
    pub fn has_crashed(&self) -> bool {
        self.inner.lock().crashed
    }

    /// Sets the injected faults.
    pub fn set_faults(&self, faults: Faults) {
        self.inner.lock().faults = faults;
    }

    /// The disk a restarted process finds after a crash now (or after the
    /// crash that already happened): durable state plus a random subset of
    /// what was pending, decided by `seed`. `keep` is the probability that
    /// each pending op survives.
    pub fn after_crash(&self, seed: u64, keep: f64) -> SimDisk {
        let inner = self.inner.lock();
        let mut rng = Rng::seed(seed);
        let mut files = HashMap::new();
        for (&id, f) in &inner.files {
            let mut bytes = f.durable.clone();
            for (op, doomed) in &f.pending {
                if !doomed && rng.chance(keep) {
                    op.apply(&mut bytes);
                }
            }
            files.insert(
                id,
                SimFile {
                    durable: bytes.clone(),
                    current: bytes,
                    pending: Vec::new(),
                },
            );
        }
        let mut names = inner.durable_names.clone();
        let survive = rng.below(inner.dir_pending.len() as u64 + 1) as usize;
        for op in &inner.dir_pending[..survive] {
            match op {
                DirOp::Link(n, id) => {
                    names.insert(n.clone(), *id);
                }
                DirOp::Unlink(n) => {
                    names.remove(n);
                }
            }
        }
        SimDisk {
            inner: Arc::new(Mutex::new(Inner {
                files,
                next_id: inner.next_id,
                durable_names: names.clone(),
                names,
                dir_pending: Vec::new(),
                steps: 0,
                crash_at: None,
                crashed: false,
                faults: Faults::default(),
                rng: Rng::seed(seed ^ 0xA5A5),
            })),
        }
    }

    /// The current bytes of `name` (for tests that inspect or damage files).
    pub fn contents(&self, name: &str) -> Option<Vec<u8>> {
        let inner = self.inner.lock();
        let id = inner.names.get(name)?;
        Some(inner.files[id].current.clone())
    }

    /// Replaces the bytes of `name`, durably (for corruption tests).
    pub fn set_contents(&self, name: &str, bytes: Vec<u8>) {
        let mut inner = self.inner.lock();
        let id = inner.names[name];
        let f = inner.files.get_mut(&id).expect("named file exists");
        f.durable = bytes.clone();
        f.current = bytes;
        f.pending.clear();
    }
}

impl Storage for SimDisk {
    type File = SimFileHandle;

    fn open(&self, name: &str, create: bool) -> io::Result<SimFileHandle> {
        let mut inner = self.inner.lock();
        inner.step()?;
        let id = match inner.names.get(name) {
            Some(&id) => id,
            None if create => {
                let id = inner.next_id;
                inner.next_id += 1;
                inner.files.insert(id, SimFile::default());
                inner.names.insert(name.to_string(), id);
                inner.dir_pending.push(DirOp::Link(name.to_string(), id));
                id
            }
            None => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("sim: no file {name}"),
                ))
            }
        };
        Ok(SimFileHandle {
            disk: self.clone(),
            id,
        })
    }

    fn exists(&self, name: &str) -> io::Result<bool> {
        let inner = self.inner.lock();
        if inner.crashed {
            return Err(crashed_error());
        }
        Ok(inner.names.contains_key(name))
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let mut inner = self.inner.lock();
        inner.step()?;
        let Some(id) = inner.names.remove(from) else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("sim: no file {from}"),
            ));
        };
        inner.names.insert(to.to_string(), id);
        inner.dir_pending.push(DirOp::Link(to.to_string(), id));
        inner.dir_pending.push(DirOp::Unlink(from.to_string()));
        Ok(())
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        let mut inner = self.inner.lock();
        inner.step()?;
        if inner.names.remove(name).is_some() {
            inner.dir_pending.push(DirOp::Unlink(name.to_string()));
        }
        Ok(())
    }

    fn sync_dir(&self) -> io::Result<()> {
        let mut inner = self.inner.lock();
        if inner.step()? {
            return Err(crashed_error());
        }
        let p = inner.faults.sync_error;
        if inner.fault(p) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        inner.durable_names = inner.names.clone();
        inner.dir_pending.clear();
        Ok(())
    }

    fn describe(&self, name: &str) -> String {
        format!("sim:{name}")
    }
}

/// An open file on a [`SimDisk`].
pub struct SimFileHandle {
    disk: SimDisk,
    id: u64,
}

impl SimFileHandle {
    /// Records `op`: applied to the current bytes, pending for durability.
    /// At the crash step a write is torn: a random prefix of it is pending.
    fn change(&self, op: FileOp) -> io::Result<()> {
        let mut inner = self.disk.inner.lock();
        let crash = inner.step()?;
        if crash {
            let torn = match op {
                FileOp::Write { offset, data } => {
                    let keep = inner.rng.below(data.len() as u64 + 1) as usize;
                    FileOp::Write {
                        offset,
                        data: data[..keep].to_vec(),
                    }
                }
                other => other,
            };
            let f = inner.files.get_mut(&self.id).expect("open file exists");
            torn.apply(&mut f.current);
            f.pending.push((torn, false));
            return Err(crashed_error());
        }
        if matches!(op, FileOp::Write { .. }) {
            let p = inner.faults.write_error;
            if inner.fault(p) {
                return Err(inner.write_error());
            }
        }
        let f = inner.files.get_mut(&self.id).expect("open file exists");
        op.apply(&mut f.current);
        f.pending.push((op, false));
        Ok(())
    }
}

impl StorageFile for SimFileHandle {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut inner = self.disk.inner.lock();
        if inner.step()? {
            return Err(crashed_error());
        }
        let f = &inner.files[&self.id];
        let start = (offset as usize).min(f.current.len());
        let n = buf.len().min(f.current.len() - start);
        buf[..n].copy_from_slice(&f.current[start..start + n]);
        Ok(n)
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.change(FileOp::Write {
            offset,
            data: data.to_vec(),
        })
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut inner = self.disk.inner.lock();
        if inner.step()? {
            return Err(crashed_error());
        }
        let p = inner.faults.sync_error;
        let failed = inner.fault(p);
        let f = inner.files.get_mut(&self.id).expect("open file exists");
        if failed {
            for (_, doomed) in f.pending.iter_mut() {
                *doomed = true;
            }
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        for (op, doomed) in f.pending.drain(..) {
            if !doomed {
                op.apply(&mut f.durable);
            }
        }
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        let inner = self.disk.inner.lock();
        if inner.crashed {
            return Err(crashed_error());
        }
        Ok(inner.files[&self.id].current.len() as u64)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.change(FileOp::SetLen(len))
    }

    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        self.change(FileOp::Punch { offset, len })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsynced_writes_may_vanish_synced_ones_stay() {
        let d = SimDisk::new(1);
        let f = d.open("a", true).unwrap();
        f.write_at(b"hello", 0).unwrap();
        f.sync_data().unwrap();
        d.sync_dir().unwrap();
        f.write_at(b"HELLO world", 0).unwrap();
        let lost = d.after_crash(7, 0.0);
        let g = lost.open("a", false).unwrap();
        let mut buf = vec![0; 16];
        let n = g.read_at(&mut buf, 0).unwrap();
        assert_eq!(&buf[..n], b"hello");
        let kept = d.after_crash(7, 1.0);
        let g = kept.open("a", false).unwrap();
        let n = g.read_at(&mut buf, 0).unwrap();
        assert_eq!(&buf[..n], b"HELLO world");
    }

    #[test]
    fn crash_tears_the_write_in_flight_and_kills_the_rest() {
        let d = SimDisk::new(3);
        let f = d.open("a", true).unwrap();
        d.crash_at(d.steps() + 1);
        assert!(f.write_at(&[1; 1000], 0).is_err());
        assert!(f.sync_data().is_err());
        assert!(d.open("b", true).is_err());
        let after = d.after_crash(1, 1.0);
        // The file was never made durable in the directory: it may be gone;
        // if it survived, it holds a prefix of the torn write.
        if let Ok(g) = after.open("a", false) {
            let n = g.len().unwrap() as usize;
            assert!(n <= 1000);
            let mut buf = vec![0; n];
            g.read_exact_at(&mut buf, 0).unwrap();
            assert!(buf.iter().all(|&b| b == 1));
        }
    }

    #[test]
    fn writes_covered_by_a_failed_sync_never_become_durable() {
        let d = SimDisk::new(5);
        let f = d.open("a", true).unwrap();
        d.sync_dir().unwrap();
        f.write_at(b"x", 0).unwrap();
        d.set_faults(Faults {
            sync_error: 1.0,
            ..Faults::default()
        });
        assert!(f.sync_data().is_err());
        d.set_faults(Faults::default());
        f.sync_data().unwrap();
        let after = d.after_crash(1, 1.0);
        assert_eq!(after.open("a", false).unwrap().len().unwrap(), 0);
    }

    #[test]
    fn renames_survive_only_after_sync_dir() {
        let d = SimDisk::new(9);
        let f = d.open("tmp", true).unwrap();
        f.write_at(b"new", 0).unwrap();
        f.sync_data().unwrap();
        d.rename("tmp", "meta").unwrap();
        d.sync_dir().unwrap();
        let after = d.after_crash(2, 0.0);
        assert!(after.exists("meta").unwrap());
        assert!(!after.exists("tmp").unwrap());
    }
}
