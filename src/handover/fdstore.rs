//! The keeper under systemd: the unit's file-descriptor store
//! (`FileDescriptorStoreMax=`, sd_notify(3) `FDSTORE=1`) instead of a
//! supervisor process (docs/restart.md, contrib/systemd).
//!
//! When ramd runs as a systemd service whose unit allows a descriptor
//! store (systemd 254+ then sets `$FDSTORE` to its size) and no supervisor
//! started it, what the supervisor would keep (drives' memfds, listening
//! sockets, settings and counts: `serving.rs`) goes to systemd. systemd
//! holds the descriptors while the service is dead, across `Restart=`
//! restarts and `systemctl restart` (`FileDescriptorStorePreserve=restart`,
//! the default), and passes them back at the next start in `LISTEN_FDS` /
//! `LISTEN_FDNAMES`.
//!
//! ```text
//!  entry (key, blob, descriptors d1..dn)   stored as n + 1 descriptors:
//!    ramd.<id>.1 .. ramd.<id>.n            the entry's descriptors, in order
//!    ramd.<id>.0                           a small memfd: the key, n and the blob
//!  id: 16 hex digits of a hash of the key
//!  memfd: [magic | two slot headers (seq, len, hash)] [slot 0] [slot 1]
//! ```
//!
//! Invariants and why:
//! - descriptors go to systemd once per entry, the entry's own first and
//!   its blob memfd last, so the store holds an entry only when it is
//!   whole (a kill in between leaves descriptors without a blob, which
//!   the next start removes); a forget removes the blob memfd first;
//! - the store only holds descriptors, so the blob lives in a memfd that
//!   systemd holds too, and a later put of the key (settings, sizes,
//!   counts every second) rewrites it in place without a message: the
//!   older of two slots is written, then its header, newest sequence
//!   with a valid hash wins, so a kill in the middle of a write leaves
//!   the previous blob;
//! - a put with other descriptors under a key that has some (not done by
//!   the daemon: a drive's memfds live as long as its key) replaces the
//!   entry: removed, then stored anew;
//! - a new entry ends with `BARRIER=1`: systemd has processed it before
//!   the put returns, so before the drive is published (a message from a
//!   process killed before systemd read it might not be attributed);
//! - systemd silently drops descriptors beyond `FileDescriptorStoreMax=`,
//!   so the store counts them and refuses an entry that would not fit
//!   (the drive is then served but not kept, and the log says why);
//! - at start every `ramd.*` descriptor that is not part of a whole entry
//!   is removed from the store and closed, so nothing stale stays there
//!   under a name a later entry reuses.
//!
//! Dependency: sd-notify's `fdstore` feature (its `sendfd`) sends the
//! descriptors with `FDSTORE=1`; it is the crate the daemon already uses
//! for `READY=1`.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Mutex;

use sd_notify::NotifyState;

use crate::store::memfd;

/// Set by systemd (254+) to the unit's `FileDescriptorStoreMax=`.
pub const FDSTORE_ENV: &str = "FDSTORE";
/// "ramd_fs1": a blob memfd of this layout.
const MAGIC: u64 = u64::from_le_bytes(*b"ramd_fs1");
/// Bytes of a slot (the blobs are small JSON documents).
const SLOT_BYTES: u64 = 1 << 20;
/// Where slot `s` starts.
const fn slot_at(s: u64) -> u64 {
    4096 + s * SLOT_BYTES
}

/// FNV-1a, 64 bits: the entry ids and the slots' checks.
fn fnv(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in parts.iter().flat_map(|p| p.iter()) {
        h = (h ^ *b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The name prefix of a key's descriptors.
fn id_of(key: &str) -> String {
    format!("ramd.{:016x}", fnv(&[key.as_bytes()]))
}

/// A descriptor's identity (device, inode), to tell a new one from the
/// one stored.
fn ident(fd: BorrowedFd<'_>) -> io::Result<(u64, u64)> {
    let st = rustix::fs::fstat(fd)?;
    Ok((st.st_dev, st.st_ino))
}

/// An entry passed back at start: key, blob, descriptors.
pub type PassedBack = (String, Vec<u8>, Vec<OwnedFd>);

/// One stored entry.
struct Stored {
    id: String,
    blob: OwnedFd,
    /// Sequence number of the newest slot.
    seq: u64,
    fds: Vec<(u64, u64)>,
}

/// The store (see the module docs).
pub struct FdStore {
    entries: Mutex<HashMap<String, Stored>>,
    /// `FileDescriptorStoreMax=`.
    max: u64,
}

/// Why an entry could not be stored.
fn full(max: u64, used: u64, adding: usize) -> io::Error {
    io::Error::other(format!(
        "systemd's descriptor store is full ({used} of FileDescriptorStoreMax={max} in use, {adding} more needed): raise FileDescriptorStoreMax= in the unit"
    ))
}

/// Removes the stored descriptors named `name`.
fn remove_name(name: &str) {
    if let Err(e) = notify(
        &[NotifyState::FdStoreRemove, NotifyState::FdName(name)],
        &[],
    ) {
        tracing::warn!(name, "cannot remove a descriptor from systemd's store: {e}");
    }
}

/// Waits (5 s at most) until systemd has processed every message sent
/// before (sd_notify(3) `BARRIER=1`: it closes the pipe it was sent).
fn barrier() -> io::Result<()> {
    let mut ends = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into the array we own.
    if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both are fresh descriptors nobody else owns.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1])) };
    notify(&[NotifyState::Custom("BARRIER=1")], &[w.as_fd()])?;
    drop(w);
    let mut p = libc::pollfd {
        fd: r.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd we own, for a descriptor that stays open.
    match unsafe { libc::poll(&mut p, 1, 5000) } {
        n if n < 0 => Err(io::Error::last_os_error()),
        0 => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "systemd did not answer a BARRIER=1 within 5 s",
        )),
        _ => Ok(()),
    }
}

/// The unit's store size, when systemd gave this service one.
pub fn configured() -> Option<u64> {
    std::env::var(FDSTORE_ENV)
        .ok()?
        .parse()
        .ok()
        .filter(|&n| n > 0)
}

fn notify(state: &[NotifyState], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    sd_notify::notify_with_fds(false, state, fds)
}

/// Writes `content` as the blob memfd's next slot (after `seq`).
fn write_slot(fd: BorrowedFd<'_>, seq: u64, content: &[u8]) -> io::Result<()> {
    if content.len() as u64 > SLOT_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "an entry of {} bytes, more than the {SLOT_BYTES} a slot holds",
                content.len()
            ),
        ));
    }
    let next = seq + 1;
    let s = next % 2;
    rustix::io::pwrite(fd, content, slot_at(s)).map_err(io::Error::from)?;
    let len = content.len() as u64;
    let hash = fnv(&[&next.to_le_bytes(), &len.to_le_bytes(), content]);
    let mut head = [0u8; 24];
    head[..8].copy_from_slice(&next.to_le_bytes());
    head[8..16].copy_from_slice(&len.to_le_bytes());
    head[16..].copy_from_slice(&hash.to_le_bytes());
    rustix::io::pwrite(fd, &head, 8 + s * 24).map_err(io::Error::from)?;
    Ok(())
}

/// The newest valid slot's sequence and content.
fn read_slot(fd: BorrowedFd<'_>) -> Option<(u64, Vec<u8>)> {
    let mut head = [0u8; 56];
    rustix::io::pread(fd, &mut head, 0).ok()?;
    if u64::from_le_bytes(head[..8].try_into().ok()?) != MAGIC {
        return None;
    }
    let word = |at: usize| u64::from_le_bytes(head[at..at + 8].try_into().expect("8 bytes"));
    let mut best: Option<(u64, Vec<u8>)> = None;
    for s in 0..2u64 {
        let h = 8 + s as usize * 24;
        let (seq, len, hash) = (word(h), word(h + 8), word(h + 16));
        if seq == 0 || len > SLOT_BYTES || best.as_ref().is_some_and(|b| b.0 > seq) {
            continue;
        }
        let mut content = vec![0u8; len as usize];
        if rustix::io::pread(fd, &mut content, slot_at(s)).ok()? != len as usize {
            continue;
        }
        if fnv(&[&seq.to_le_bytes(), &len.to_le_bytes(), &content]) == hash {
            best = Some((seq, content));
        }
    }
    best
}

/// An entry's content: key, descriptor count, blob.
fn encode(key: &str, n: usize, blob: &[u8]) -> Vec<u8> {
    let mut c = Vec::with_capacity(8 + key.len() + blob.len());
    c.extend_from_slice(&(key.len() as u32).to_le_bytes());
    c.extend_from_slice(key.as_bytes());
    c.extend_from_slice(&(n as u32).to_le_bytes());
    c.extend_from_slice(blob);
    c
}

fn decode(c: &[u8]) -> Option<(String, usize, Vec<u8>)> {
    let kl = u32::from_le_bytes(c.get(..4)?.try_into().ok()?) as usize;
    let key = std::str::from_utf8(c.get(4..4 + kl)?).ok()?.to_owned();
    let n = u32::from_le_bytes(c.get(4 + kl..8 + kl)?.try_into().ok()?) as usize;
    Some((key, n, c.get(8 + kl..)?.to_vec()))
}

impl FdStore {
    /// Takes what systemd passed back at start (`LISTEN_FDS`, names
    /// `ramd.*`): the whole entries, handed back as a supervisor would;
    /// every other `ramd.*` descriptor (incomplete entries, duplicates) is
    /// removed from the store and closed. Descriptors of other names are
    /// left alone.
    pub fn from_env(max: u64) -> io::Result<(FdStore, Vec<PassedBack>)> {
        let mut groups: HashMap<String, HashMap<usize, OwnedFd>> = HashMap::new();
        let passed: Vec<_> = match sd_notify::listen_fds_with_names(true) {
            Ok(it) => it.collect(),
            Err(e) => {
                tracing::warn!(
                    "the descriptors systemd passed cannot be read ({e}): nothing kept is adopted"
                );
                Vec::new()
            }
        };
        let mut stray = std::collections::HashSet::new();
        for (raw, name) in passed {
            let Some((id, i)) = name
                .rsplit_once('.')
                .filter(|(id, _)| id.starts_with("ramd."))
            else {
                continue;
            };
            // SAFETY: systemd passed this descriptor to this process (the
            // LISTEN_PID check passed); nothing else owns it.
            let fd = unsafe { OwnedFd::from_raw_fd(raw) };
            rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::CLOEXEC)?;
            match i.parse::<usize>() {
                Ok(i) if !groups.get(id).is_some_and(|g| g.contains_key(&i)) => {
                    groups.entry(id.to_owned()).or_default().insert(i, fd);
                }
                // Two of one name, or no index: dropped from the store.
                _ => drop(stray.insert(name)),
            }
        }
        let mut entries = HashMap::new();
        let mut handed = Vec::new();
        for (id, mut fds) in groups {
            match Self::take_entry(&id, &mut fds) {
                Some((key, stored, entry)) => {
                    entries.insert(key, stored);
                    handed.push(entry);
                }
                None => {
                    tracing::warn!(entry = %id, "an incomplete entry in systemd's descriptor store (a start or a forget cut short): removed")
                }
            }
            // What no entry took (all of it, when incomplete).
            stray.extend(fds.into_keys().map(|i| format!("{id}.{i}")));
        }
        for name in &stray {
            remove_name(name);
        }
        let store = FdStore {
            entries: Mutex::new(entries),
            max,
        };
        Ok((store, handed))
    }

    /// An entry from its descriptors (index 0 the blob memfd).
    fn take_entry(
        id: &str,
        fds: &mut HashMap<usize, OwnedFd>,
    ) -> Option<(String, Stored, PassedBack)> {
        let (seq, content) = read_slot(fds.get(&0)?.as_fd())?;
        let (key, n, blob) = decode(&content)?;
        if id_of(&key) != id || (1..=n).any(|i| !fds.contains_key(&i)) {
            return None;
        }
        let blob_fd = fds.remove(&0)?;
        let own: Vec<OwnedFd> = (1..=n).filter_map(|i| fds.remove(&i)).collect();
        let idents = match own.iter().map(|f| ident(f.as_fd())).collect() {
            Ok(i) => i,
            Err(_) => {
                // Back in the map, to be removed with the strays.
                fds.insert(0, blob_fd);
                fds.extend(own.into_iter().enumerate().map(|(i, f)| (i + 1, f)));
                return None;
            }
        };
        let stored = Stored {
            id: id.to_owned(),
            blob: blob_fd,
            seq,
            fds: idents,
        };
        Some((key.clone(), stored, (key, blob, own)))
    }

    /// Keeps `fds` and `blob` under `key` (see the module docs).
    pub fn put(&self, key: &str, blob: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        let idents = fds
            .iter()
            .map(|f| ident(*f))
            .collect::<io::Result<Vec<_>>>()?;
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let content = encode(key, fds.len(), blob);
        if let Some(s) = entries.get_mut(key) {
            if s.fds == idents {
                write_slot(s.blob.as_fd(), s.seq, &content)?;
                s.seq += 1;
                return Ok(());
            }
            let old = entries.remove(key).expect("just found");
            Self::remove(&old);
        }
        let used: u64 = entries.values().map(|s| s.fds.len() as u64 + 1).sum();
        if used + fds.len() as u64 + 1 > self.max {
            return Err(full(self.max, used, fds.len() + 1));
        }
        let memfd = memfd::create_named(c"ramd-fdstore").map_err(io::Error::from)?;
        rustix::io::pwrite(memfd.as_fd(), &MAGIC.to_le_bytes(), 0)?;
        write_slot(memfd.as_fd(), 0, &content)?;
        let id = id_of(key);
        for (i, fd) in fds.iter().enumerate() {
            let name = format!("{id}.{}", i + 1);
            notify(&[NotifyState::FdStore, NotifyState::FdName(&name)], &[*fd])?;
        }
        let name = format!("{id}.0");
        notify(
            &[NotifyState::FdStore, NotifyState::FdName(&name)],
            &[memfd.as_fd()],
        )?;
        barrier()?;
        let stored = Stored {
            id,
            blob: memfd,
            seq: 1,
            fds: idents,
        };
        entries.insert(key.to_owned(), stored);
        Ok(())
    }

    /// Drops what is kept under `key` (nothing when nothing is); under
    /// the entries' lock, so a put of the key cannot come in between.
    pub fn forget(&self, key: &str) -> io::Result<()> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = entries.remove(key) {
            Self::remove(&s);
        }
        Ok(())
    }

    /// Removes an entry's descriptors from the store, its blob first.
    fn remove(s: &Stored) {
        for i in 0..=s.fds.len() {
            remove_name(&format!("{}.{i}", s.id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_are_rewritten_in_place_and_the_newest_whole_slot_wins() {
        let fd = memfd::create().unwrap();
        rustix::io::pwrite(fd.as_fd(), &MAGIC.to_le_bytes(), 0).unwrap();
        write_slot(fd.as_fd(), 0, &encode("drive/db", 2, b"{\"a\":1}")).unwrap();
        let (seq, c) = read_slot(fd.as_fd()).unwrap();
        assert_eq!(
            (seq, decode(&c).unwrap()),
            (1, ("drive/db".into(), 2, b"{\"a\":1}".to_vec()))
        );
        write_slot(fd.as_fd(), 1, &encode("drive/db", 2, b"{\"a\":2}")).unwrap();
        assert_eq!(
            decode(&read_slot(fd.as_fd()).unwrap().1).unwrap().2,
            b"{\"a\":2}"
        );
        // A write of slot 1 (seq 3) cut short: its header's hash does not
        // match the bytes, so seq 2 (slot 0) still wins.
        rustix::io::pwrite(fd.as_fd(), b"torn", slot_at(1)).unwrap();
        write_slot(fd.as_fd(), 2, &encode("drive/db", 2, b"{\"a\":3}")).unwrap();
        rustix::io::pwrite(fd.as_fd(), b"XX", slot_at(1) + 12).unwrap();
        let (seq, c) = read_slot(fd.as_fd()).unwrap();
        assert_eq!((seq, decode(&c).unwrap().2), (2, b"{\"a\":2}".to_vec()));
        assert_eq!(id_of("drive/db").len(), "ramd.".len() + 16);
    }
}
