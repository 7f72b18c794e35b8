//! A TLS session over an accepted socket: [`TlsStream`], one more kind of
//! [`Transport`], so the handshake's later options and the transmission
//! loop run on it unchanged (monomorphised: plaintext connections keep
//! their own code and pay nothing for this one).
//!
//! Where bytes wait, and what each wait must look at first:
//!
//! ```text
//!  socket ──recv (256 KiB pieces)──▶ cipher ──read_tls (4 KiB)──▶ rustls
//!     ▲                                                  │ decrypt
//!     │                                        plaintext (counted)
//!  sendmsg ◀──write_tls── rustls record queue ◀──writer── our replies
//! ```
//!
//! - A read first takes the plaintext rustls holds, then the ciphertext in
//!   `cipher`, and only then the socket: `wait_readable` returns at once
//!   while either holds bytes, or a wait would sleep on data we already
//!   have.
//! - rustls takes at most 4 KiB per `read_tls`; reading the socket into
//!   `cipher` in large pieces keeps a 1 MiB WRITE at a few `recv`s.
//! - Replies are encrypted as they are handed over and sent with gathered
//!   `sendmsg`; any record still queued is sent before the stream waits
//!   for input (a blocking read flushes first; `wait_readable` also wakes
//!   when the socket has room while records are queued, and `read_now`
//!   sends them), so a reply never sits in the queue while we wait for
//!   the client.

use std::io::{self, IoSlice, Read, Write};
use std::sync::Arc;
use std::time::Duration;

use rustls::ServerConnection;

use super::super::deadline::Deadline;
use super::super::transport::{wait_fd, SocketTimeouts, Stream, Transport};
use super::identity;

/// Ciphertext read from the socket at once (at most).
const CIPHER_BYTES: usize = 256 * 1024;

/// Most TLS output queued before `send_now` takes no more plaintext: a
/// whole 1 MiB READ reply in one call, encrypted before it is sent.
const SEND_QUEUE_BYTES: usize = 1024 * 1024 + 64 * 1024;

/// Slices gathered into one TLS record while their total stays within a
/// record (16 KiB): a reply header and a 4 KiB block become one record,
/// not two. Longer slices are encrypted where they lie.
const RECORD_BYTES: usize = 16 * 1024;

/// An established server-side TLS session.
pub struct TlsStream {
    tls: ServerConnection,
    sock: Stream,
    /// Ciphertext read from the socket that rustls has not taken yet.
    cipher: Cipher,
    /// Decrypted bytes rustls holds that no read has taken yet.
    plaintext: usize,
    /// The client's certificate CN or first SAN (None: anonymous).
    identity: Option<String>,
}

/// Runs the TLS handshake on `sock` as the server, within `limit`.
/// Fails on an I/O error, a timeout, or a TLS error (a client certificate
/// that is missing, expired, revoked or signed by another CA); rustls has
/// then sent the client an alert saying so.
pub fn accept(
    mut sock: Stream,
    config: Arc<rustls::ServerConfig>,
    limit: Duration,
) -> io::Result<TlsStream> {
    let mut tls = ServerConnection::new(config).map_err(io::Error::other)?;
    tls.set_buffer_limit(Some(SEND_QUEUE_BYTES));
    {
        let mut io = Deadline::new(&mut sock, limit);
        while tls.is_handshaking() {
            tls.complete_io(&mut io)?;
        }
        while tls.wants_write() {
            tls.write_tls(&mut io)?;
        }
    }
    // The client may have sent its first option with its last handshake
    // message: rustls holds it already, decrypted.
    let state = tls
        .process_new_packets()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let identity = tls
        .peer_certificates()
        .and_then(|certs| certs.first())
        .and_then(|cert| identity::of_certificate(cert));
    Ok(TlsStream {
        tls,
        sock,
        cipher: Cipher::default(),
        plaintext: state.plaintext_bytes_to_read(),
        identity,
    })
}

impl TlsStream {
    /// The client's identity from its certificate; None when it showed none.
    pub fn identity(&self) -> Option<&str> {
        self.identity.as_deref()
    }

    /// The negotiated protocol version and cipher suite, for the log.
    pub fn describe(&self) -> String {
        let version = self
            .tls
            .protocol_version()
            .map(|v| format!("{v:?}"))
            .unwrap_or_default();
        let suite = self
            .tls
            .negotiated_cipher_suite()
            .map(|s| format!("{:?}", s.suite()))
            .unwrap_or_default();
        format!("{version} {suite}")
    }

    /// Ends the session cleanly (close_notify), best effort.
    pub fn close(&mut self) {
        self.tls.send_close_notify();
        let _ = self.flush_now();
    }

    /// Takes decrypted bytes rustls holds; `Some(0)` at end of stream
    /// (a close_notify, or the peer hanging up without one: NBD frames its
    /// own messages, so a cut is seen there).
    fn take_plaintext(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        if buf.is_empty() {
            return Ok(Some(0));
        }
        match self.tls.reader().read(buf) {
            Ok(n) => {
                self.plaintext = self.plaintext.saturating_sub(n);
                Ok(Some(n))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(Some(0)),
            Err(e) => Err(e),
        }
    }

    /// Gives rustls more ciphertext (blocking on the socket when `block`)
    /// and decrypts it; false when nothing could be had without blocking.
    fn pull(&mut self, block: bool) -> io::Result<bool> {
        let mut feed = Feed {
            cipher: &mut self.cipher,
            sock: &mut self.sock,
            block,
        };
        match self.tls.read_tls(&mut feed) {
            Ok(_) => {} // 0 is end of stream: the reader reports it
            Err(e) if !block && e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(e),
        }
        match self.tls.process_new_packets() {
            Ok(state) => {
                self.plaintext = state.plaintext_bytes_to_read();
                Ok(true)
            }
            Err(e) => {
                // Tell the client why (the alert rustls queued), best effort.
                let _ = self.flush_now();
                Err(io::Error::new(io::ErrorKind::InvalidData, e))
            }
        }
    }

    /// Sends what the socket takes now of the queued TLS records; true
    /// when none is left.
    fn flush_now(&mut self) -> io::Result<bool> {
        while self.tls.wants_write() {
            match self.tls.write_tls(&mut SendNow(&mut self.sock)) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Sends every queued record, waiting for room (within the socket's
    /// send timeout, as the socket's own writes do).
    fn flush_blocking(&mut self) -> io::Result<()> {
        while !self.flush_now()? {
            self.sock.wait_writable()?;
        }
        Ok(())
    }
}

impl Read for TlsStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if let Some(n) = self.take_plaintext(buf)? {
                return Ok(n);
            }
            // The client may be waiting for what we queued.
            self.flush_blocking()?;
            self.pull(true)?;
        }
    }
}

impl Write for TlsStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.flush_blocking()?;
        let n = self.tls.writer().write(buf)?;
        self.flush_blocking()?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.flush_blocking()
    }
}

impl SocketTimeouts for TlsStream {
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.sock.set_read_timeout(t)
    }
    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.sock.set_write_timeout(t)
    }
}

impl Transport for TlsStream {
    fn read_now(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            if let Some(n) = self.take_plaintext(buf)? {
                return Ok(Some(n));
            }
            self.flush_now()?;
            if !self.pull(false)? {
                return Ok(None);
            }
        }
    }

    fn wait_readable(&self) -> io::Result<()> {
        if self.plaintext > 0 || !self.cipher.is_empty() {
            return Ok(());
        }
        // With records queued, room to send them is a reason to wake too:
        // the caller's next `read_now` sends them.
        let events = if self.tls.wants_write() {
            libc::POLLIN | libc::POLLOUT
        } else {
            libc::POLLIN
        };
        wait_fd(self.sock.fd(), events, None)
    }

    fn wait_writable(&self) -> io::Result<()> {
        self.sock.wait_writable()
    }

    fn send_now(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        if !self.flush_now()? {
            return Ok(0);
        }
        let mut taken = 0;
        let mut i = 0;
        while i < bufs.len() {
            // A run of small slices that fits one record, or one slice.
            let mut j = i;
            let mut run = 0;
            while j < bufs.len() && run + bufs[j].len() <= RECORD_BYTES {
                run += bufs[j].len();
                j += 1;
            }
            let n = if j > i + 1 {
                self.tls.writer().write_vectored(&bufs[i..j])?
            } else {
                j = i + 1;
                run = bufs[i].len();
                self.tls.writer().write(&bufs[i])?
            };
            taken += n;
            if n < run {
                break; // the queue is full
            }
            i = j;
        }
        self.flush_now()?;
        Ok(taken)
    }

    fn unread_by_peer(&self) -> Option<usize> {
        self.sock.unread_by_peer()
    }
}

/// Ciphertext read ahead of rustls.
#[derive(Default)]
struct Cipher {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl Cipher {
    fn is_empty(&self) -> bool {
        self.start == self.end
    }
}

/// What `read_tls` reads from: `cipher` first, then the socket.
struct Feed<'a> {
    cipher: &'a mut Cipher,
    sock: &'a mut Stream,
    block: bool,
}

impl Read for Feed<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let c = &mut *self.cipher;
        if c.is_empty() {
            if c.buf.len() < CIPHER_BYTES {
                c.buf.resize(CIPHER_BYTES, 0);
            }
            let got = if self.block {
                loop {
                    match self.sock.read(&mut c.buf) {
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        r => break r?,
                    }
                }
            } else {
                match self.sock.read_now(&mut c.buf)? {
                    Some(n) => n,
                    None => return Err(io::ErrorKind::WouldBlock.into()),
                }
            };
            (c.start, c.end) = (0, got);
        }
        let n = buf.len().min(c.end - c.start);
        buf[..n].copy_from_slice(&c.buf[c.start..c.start + n]);
        c.start += n;
        Ok(n)
    }
}

/// The socket as `write_tls` sees it: gathered, never blocking
/// (`WouldBlock` when full).
struct SendNow<'a>(&'a mut Stream);

impl Write for SendNow<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self.0.send_now(bufs)? {
            0 if bufs.iter().any(|b| !b.is_empty()) => Err(io::ErrorKind::WouldBlock.into()),
            n => Ok(n),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
