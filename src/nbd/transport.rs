//! The byte stream a connection runs on: [`Transport`], what the
//! transmission loop and the poller need of it (try a read, wait for room,
//! gathered sends), and [`Stream`], the accepted unix or TCP socket that
//! implements it. A TLS session (`tls::TlsStream`) is one more kind of
//! stream, over a `Stream`.
//!
//! Invariant: every blocking wait for room to send honours the socket's
//! send timeout (the server's reply timeout), so a client that stops
//! reading cannot hold a connection thread forever; waits for the client's
//! next request have no limit (idle clients are fine).

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// A connection's byte stream, able to try a read without blocking.
pub trait Transport: Read + Write {
    /// Reads what is available now; `Ok(None)` when nothing is.
    fn read_now(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>>;
    /// Blocks until there is something to read, or the peer has hung up.
    fn wait_readable(&self) -> io::Result<()>;
    /// Blocks until the stream can take more bytes.
    fn wait_writable(&self) -> io::Result<()>;
    /// Sends what the stream takes now of `bufs` (gathered in order)
    /// without blocking; 0 when it takes nothing.
    fn send_now(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize>;
    /// Bytes we sent that the peer has not read yet, where the transport
    /// can tell (unix sockets); None elsewhere.
    fn unread_by_peer(&self) -> Option<usize> {
        None
    }
}

/// A socket whose blocking reads and writes can time out.
pub trait SocketTimeouts {
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()>;
    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()>;
}

/// A connected client socket of either kind.
pub enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    pub(super) fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
        })
    }
    pub(super) fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.shutdown(how),
            Stream::Tcp(s) => s.shutdown(how),
        }
    }
    pub(super) fn fd(&self) -> RawFd {
        match self {
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Tcp(s) => s.as_raw_fd(),
        }
    }
    /// The socket's send timeout (SO_SNDTIMEO), which waits for room to
    /// send honour too.
    fn write_timeout(&self) -> io::Result<Option<Duration>> {
        match self {
            Stream::Unix(s) => s.write_timeout(),
            Stream::Tcp(s) => s.write_timeout(),
        }
    }
}

impl SocketTimeouts for Stream {
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_read_timeout(t),
            Stream::Tcp(s) => s.set_read_timeout(t),
        }
    }
    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_write_timeout(t),
            Stream::Tcp(s) => s.set_write_timeout(t),
        }
    }
}

impl Transport for Stream {
    fn read_now(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        // SAFETY: `buf` is a valid, exclusively borrowed buffer of
        // `buf.len()` bytes and the fd is open for the life of `self`.
        let n = unsafe {
            libc::recv(
                self.fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n >= 0 {
            return Ok(Some(n as usize));
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
            _ => Err(e),
        }
    }

    fn unread_by_peer(&self) -> Option<usize> {
        let Stream::Unix(s) = self else { return None };
        let mut bytes: libc::c_int = 0;
        // SAFETY: SIOCOUTQ (TIOCOUTQ) writes one c_int; the fd is open.
        let rc = unsafe { libc::ioctl(s.as_raw_fd(), libc::TIOCOUTQ, &mut bytes) };
        (rc == 0).then_some(bytes.max(0) as usize)
    }

    fn wait_readable(&self) -> io::Result<()> {
        wait_fd(self.fd(), libc::POLLIN, None)
    }

    fn wait_writable(&self) -> io::Result<()> {
        wait_fd(self.fd(), libc::POLLOUT, self.write_timeout()?)
    }

    fn send_now(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        send_now_fd(self.fd(), bufs)
    }
}

/// Sends what the socket `fd` takes now of `bufs` (gathered in order)
/// without blocking; 0 when it takes nothing. Shared with the NVMe/TCP
/// target's direct reads.
pub(crate) fn send_now_fd(fd: RawFd, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
    // SAFETY: a zeroed msghdr is valid (no name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    // IoSlice is ABI-compatible with iovec (guaranteed by std on Unix);
    // sendmsg only reads the buffers.
    msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = bufs.len().min(1024) as _;
    loop {
        // SAFETY: `msg` points at `bufs`, valid for the call; the fd is open.
        let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock => return Ok(0),
            io::ErrorKind::Interrupted => continue,
            _ => return Err(e),
        }
    }
}

/// Blocks until `fd` reports `events` (or an error or hang-up, which the
/// next read or write then reports); fails with `TimedOut` after `timeout`.
pub(crate) fn wait_fd(
    fd: RawFd,
    events: libc::c_short,
    timeout: Option<Duration>,
) -> io::Result<()> {
    let mut pfd = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    let timeout_ms = timeout.map_or(-1, |t| t.as_millis().clamp(1, i32::MAX as u128) as i32);
    loop {
        // SAFETY: one valid pollfd for the duration of the call.
        let rc = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        if rc == 0 {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client took none of our replies within the reply timeout",
            ));
        }
        if rc > 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

impl Read for Stream {
    #[inline]
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    #[inline]
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// `unread_by_peer` counts what the peer of a unix socket has not read
    /// yet (the poller's backlog), and says nothing for TCP.
    #[test]
    fn unread_by_peer_counts_what_the_peer_holds() {
        let (ours, mut peer) = UnixStream::pair().unwrap();
        let mut ours = Stream::Unix(ours);
        assert_eq!(ours.unread_by_peer(), Some(0));
        let reply = vec![7u8; 64 * 1024];
        ours.write_all(&reply).unwrap();
        let held = ours.unread_by_peer().unwrap();
        // Charged with the socket buffers' overhead, so at least the bytes.
        assert!(held >= reply.len(), "{held} < {}", reply.len());
        let mut got = vec![0u8; reply.len()];
        peer.read_exact(&mut got).unwrap();
        assert_eq!(got, reply);
        assert_eq!(ours.unread_by_peer(), Some(0));

        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let tcp = Stream::Tcp(TcpStream::connect(listener.local_addr().unwrap()).unwrap());
        assert_eq!(tcp.unread_by_peer(), None);
    }
}
