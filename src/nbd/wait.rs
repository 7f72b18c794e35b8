//! How a connection waits for its client's next bytes: one small trait,
//! [`Wait`], with two strategies.
//!
//! - [`Blocking`]: a blocking `read` (`poll_us = 0`). The thread sleeps in
//!   the kernel until bytes arrive; nothing is spent while a client is idle.
//! - [`Adaptive`](super::poller::Poller) (the default): polls briefly for a
//!   request-reply client's next request, naps on a timer while a
//!   pipelining client still holds a deep backlog of our replies, and
//!   blocks otherwise (see `poller.rs`).
//!
//! Invariant for every strategy: bytes the client has sent are never left
//! waiting for a timer when the strategy looks for them: a read returns
//! as soon as data is there, except during an adaptive nap, which is taken
//! only while the client has a backlog of replies to read anyway.

use std::io;

use super::transport::Transport;

/// A waiting strategy.
pub(super) trait Wait {
    /// Reads into `buf` after a batch of `batch` requests whose replies
    /// (and any before them not yet told) came to `sent` bytes; 0 at end
    /// of stream.
    fn read<S: Transport>(
        &mut self,
        stream: &mut S,
        buf: &mut [u8],
        batch: usize,
        sent: usize,
    ) -> io::Result<usize>;
}

/// Blocks in `read` at once.
pub(super) struct Blocking;

impl Wait for Blocking {
    fn read<S: Transport>(
        &mut self,
        stream: &mut S,
        buf: &mut [u8],
        _batch: usize,
        _sent: usize,
    ) -> io::Result<usize> {
        block(stream, buf)
    }
}

/// A blocking read, retried on EINTR.
pub(super) fn block<S: Transport>(stream: &mut S, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match stream.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}
