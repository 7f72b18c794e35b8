//! Hand-over records on a `SOCK_SEQPACKET` unix socket: one record per
//! message, its descriptors attached with `SCM_RIGHTS` (the I/O beside
//! the pure format of [`super::wire`]).
//!
//! Invariants: a message is a whole record or nothing (SEQPACKET keeps
//! message boundaries, and a message cut short by a too small buffer,
//! `MSG_TRUNC`, or with fewer descriptors than its record says,
//! `MSG_CTRUNC` or a count mismatch, is refused, never paired with the
//! wrong files); received descriptors are close-on-exec.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use super::wire::{Kind, Record, WireError, MAX_BLOB_BYTES, MAX_FDS, MAX_KEY_BYTES};

/// Why a record could not be sent or received.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("hand-over socket: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Wire(#[from] WireError),
    /// The message or its descriptors were cut short.
    #[error("a hand-over message was cut short ({what}): refused")]
    Truncated { what: &'static str },
    /// The record says one number of descriptors, the message had another.
    #[error("a hand-over record says {said} descriptors, its message carried {got}: refused")]
    FdCount { said: u32, got: usize },
}

/// Largest message: a record with the longest key and blob.
const MAX_MESSAGE: usize = 15 + MAX_KEY_BYTES + 4 + MAX_BLOB_BYTES;

/// Sends one record with `fds` attached.
pub fn send(
    sock: BorrowedFd<'_>,
    kind: Kind,
    key: &str,
    blob: &[u8],
    fds: &[BorrowedFd<'_>],
) -> Result<(), LinkError> {
    let record = Record {
        kind,
        key: key.to_owned(),
        blob: blob.to_vec(),
        fd_count: fds.len() as u32,
    };
    let bytes = record.encode()?;
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len().max(1)))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(LinkError::Truncated {
            what: "descriptor buffer",
        });
    }
    let sent = loop {
        match sendmsg(
            sock,
            &[IoSlice::new(&bytes)],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Err(rustix::io::Errno::INTR) => continue,
            r => break r.map_err(std::io::Error::from)?,
        }
    };
    if sent != bytes.len() {
        return Err(LinkError::Truncated { what: "send" });
    }
    Ok(())
}

/// Receives one record and its descriptors; None when the other side
/// has closed its end (every record it sent before was received first).
pub fn recv(sock: BorrowedFd<'_>) -> Result<Option<(Record, Vec<OwnedFd>)>, LinkError> {
    let mut buf = vec![0u8; MAX_MESSAGE];
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS as usize))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = loop {
        match recvmsg(
            sock,
            &mut [IoSliceMut::new(&mut buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Err(rustix::io::Errno::INTR) => continue,
            r => break r.map_err(std::io::Error::from)?,
        }
    };
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = m {
            fds.extend(rights);
        }
    }
    if got.bytes == 0 && fds.is_empty() {
        return Ok(None);
    }
    if got.flags.contains(rustix::net::ReturnFlags::TRUNC) {
        return Err(LinkError::Truncated { what: "message" });
    }
    if got.flags.contains(rustix::net::ReturnFlags::CTRUNC) {
        return Err(LinkError::Truncated {
            what: "descriptors",
        });
    }
    let record = Record::decode(&buf[..got.bytes])?;
    if record.fd_count as usize != fds.len() {
        return Err(LinkError::FdCount {
            said: record.fd_count,
            got: fds.len(),
        });
    }
    Ok(Some((record, fds)))
}

/// A connected pair of SEQPACKET sockets, both close-on-exec.
pub fn pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    use rustix::net::{socketpair, AddressFamily, SocketFlags, SocketType};
    Ok(socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?)
}

/// Borrows every descriptor of `fds`.
pub fn borrow_all(fds: &[OwnedFd]) -> Vec<BorrowedFd<'_>> {
    fds.iter().map(|f| f.as_fd()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};

    #[test]
    fn records_and_descriptors_cross_and_eof_ends() {
        let (a, b) = pair().unwrap();
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(b"kept bytes").unwrap();
        let fd: OwnedFd = f.into();
        send(a.as_fd(), Kind::Put, "drive/db", b"{}", &[fd.as_fd()]).unwrap();
        send(a.as_fd(), Kind::Ready, "", b"", &[]).unwrap();
        let (r, mut fds) = recv(b.as_fd()).unwrap().unwrap();
        assert_eq!(
            (r.kind, r.key.as_str(), r.blob.as_slice()),
            (Kind::Put, "drive/db", &b"{}"[..])
        );
        let mut f = std::fs::File::from(fds.pop().unwrap());
        f.rewind().unwrap();
        let mut s = String::new();
        f.read_to_string(&mut s).unwrap();
        assert_eq!(s, "kept bytes");
        let (r, fds) = recv(b.as_fd()).unwrap().unwrap();
        assert_eq!((r.kind, fds.len()), (Kind::Ready, 0));
        drop(a);
        assert!(recv(b.as_fd()).unwrap().is_none());
    }

    #[test]
    fn a_count_that_does_not_match_is_refused() {
        let (a, b) = pair().unwrap();
        // A record that says one descriptor, sent with none.
        let bytes = Record {
            kind: Kind::Put,
            key: "drive/x".into(),
            blob: vec![],
            fd_count: 1,
        }
        .encode()
        .unwrap();
        rustix::net::send(&a, &bytes, SendFlags::empty()).unwrap();
        assert!(matches!(
            recv(b.as_fd()),
            Err(LinkError::FdCount { said: 1, got: 0 })
        ));
    }
}
