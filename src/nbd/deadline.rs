//! One deadline for a whole exchange (the handshake): every read and write
//! through a [`Deadline`] gets the time that is left as its socket timeout,
//! so a client that trickles one byte at a time, or stops reading our
//! replies, is cut off when the deadline passes, not after a timeout per
//! read.
//!
//! Invariant: no read or write through a `Deadline` returns later than the
//! deadline plus one scheduling delay; past it, each fails with
//! `ErrorKind::TimedOut` and a message naming the limit.

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

pub use super::transport::SocketTimeouts;

/// `stream` with every read and write bounded by one deadline.
pub struct Deadline<'a, S> {
    stream: &'a mut S,
    until: Instant,
    limit: Duration,
}

impl<'a, S: SocketTimeouts> Deadline<'a, S> {
    /// Starts the clock: everything must be done within `limit` from now.
    pub fn new(stream: &'a mut S, limit: Duration) -> Self {
        Deadline {
            stream,
            until: Instant::now() + limit,
            limit,
        }
    }

    /// The time left, or the error to return once there is none.
    fn left(&self) -> io::Result<Duration> {
        let left = self.until.saturating_duration_since(Instant::now());
        // A zero timeout means "block forever" to the socket API.
        if left < Duration::from_millis(1) {
            return Err(self.expired());
        }
        Ok(left)
    }

    fn expired(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "the client did not finish its handshake within {} s",
                self.limit.as_secs_f64()
            ),
        )
    }

    /// Maps a socket timeout (EAGAIN on a blocking socket) to `expired`.
    fn timed(&self, r: io::Result<usize>) -> io::Result<usize> {
        match r {
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Err(self.expired())
            }
            r => r,
        }
    }
}

impl<S: SocketTimeouts + Read> Read for Deadline<'_, S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.set_read_timeout(Some(self.left()?))?;
        let r = self.stream.read(buf);
        self.timed(r)
    }
}

impl<S: SocketTimeouts + Write> Write for Deadline<'_, S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.set_write_timeout(Some(self.left()?))?;
        let r = self.stream.write(buf);
        self.timed(r)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    impl SocketTimeouts for UnixStream {
        fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
            UnixStream::set_read_timeout(self, t)
        }
        fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
            UnixStream::set_write_timeout(self, t)
        }
    }

    /// One byte every 25 ms, 40 in all, then the end of the stream: the
    /// 64 bytes asked for never come. Counted from the start of the clock,
    /// the 40 bytes take at least 0.975 s, so a deadline of 0.3 s passes
    /// first whatever the machine's load and the read fails with TimedOut;
    /// one that each byte extended would read on to the end of the stream
    /// (UnexpectedEof). No timing assertion needed.
    #[test]
    fn a_trickle_of_bytes_does_not_extend_the_deadline() {
        let (mut ours, mut theirs) = UnixStream::pair().unwrap();
        let mut d = Deadline::new(&mut ours, Duration::from_millis(300));
        let feeder = std::thread::spawn(move || {
            for _ in 0..40 {
                if theirs.write_all(b"x").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(25));
            }
        });
        let mut buf = [0u8; 64];
        let err = d
            .read_exact(&mut buf)
            .expect_err("64 bytes never come in time");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        assert!(err.to_string().contains("handshake within 0.3 s"), "{err}");
        feeder.join().unwrap();
    }

    #[test]
    fn writes_to_a_client_that_does_not_read_time_out() {
        let (mut ours, _theirs) = UnixStream::pair().unwrap();
        let mut d = Deadline::new(&mut ours, Duration::from_millis(200));
        let err = d
            .write_all(&vec![0u8; 64 << 20])
            .expect_err("the peer never reads");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }
}
