//! Structured logs on stderr (tracing): text for people, JSON for shippers.
//!
//! Invariant: **logging never blocks, fails or panics the daemon.** A log
//! line is handed to one writer thread through a bounded queue and the
//! caller goes on; that thread writes to stderr and ignores every error.
//! So a broken pipe (`ramd daemon 2>&1 | tee log`, Ctrl-C ends `tee` too),
//! a closed stderr, a pipe nobody reads or a full disk under a redirected
//! file cost log lines, never a shutdown's saves. Lines that find the
//! queue full are dropped and counted ([`dropped_lines`]).
//!
//! Why not `tracing-appender`'s non-blocking writer: its guard reports a
//! slow or failed flush with `println!`/`eprintln!`, which panic on a dead
//! pipe: exactly the failure this module exists to survive. And tracing's
//! own fmt layer reports a failed write with `eprint!` unless told not to
//! (`log_internal_errors(false)`).

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::LogFormat;

/// Log lines that may wait for the writer thread; beyond, lines are dropped.
const QUEUE_LINES: usize = 4096;

/// The one queue to the writer thread, made by the first [`init`].
static SINK: OnceLock<Sink> = OnceLock::new();

struct Sink {
    tx: SyncSender<Vec<u8>>,
    /// Lines queued and not yet written (for [`flush`]).
    pending: AtomicUsize,
    dropped: AtomicU64,
}

/// Installs the global subscriber. `level` wins over RUST_LOG; the default
/// is `info`.
pub fn init(level: Option<&str>, format: LogFormat) {
    let spec = match level {
        Some(l) => l.to_owned(),
        None => std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
    };
    // fuser's own mount layer logs an unmount it retries after ours (which
    // already happened) as an error; ramd reports mounts itself.
    let filter = tracing_subscriber::EnvFilter::new(format!("{spec},fuser=warn,fuser::mnt=off"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(LineWriter::default)
        .log_internal_errors(false);
    // try_init: a second daemon in the same process (tests) keeps the first.
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder.json().with_ansi(false).try_init(),
    };
}

/// Waits (at most `limit`) until the queued lines are written: at exit,
/// so the last lines are not lost with the process. Gives up quietly when
/// stderr does not take them.
pub fn flush(limit: Duration) {
    let Some(sink) = SINK.get() else { return };
    let deadline = Instant::now() + limit;
    while sink.pending.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Log lines dropped because the writer thread could not keep up (stderr
/// blocked or gone).
pub fn dropped_lines() -> u64 {
    SINK.get().map_or(0, |s| s.dropped.load(Ordering::Relaxed))
}

/// The queue, with its writer thread started on first use; `None` if the
/// thread cannot start (then lines are dropped: logging never fails).
fn sink() -> Option<&'static Sink> {
    if let Some(s) = SINK.get() {
        return Some(s);
    }
    let (tx, rx) = sync_channel(QUEUE_LINES);
    let sink = Sink {
        tx,
        pending: AtomicUsize::new(0),
        dropped: AtomicU64::new(0),
    };
    if SINK.set(sink).is_err() {
        // Another thread won the race: its thread serves; ours never starts.
        return SINK.get();
    }
    std::thread::Builder::new()
        .name("log-writer".into())
        .spawn(move || write_lines(rx))
        .ok()?;
    SINK.get()
}

/// The writer thread: every line to stderr, every error ignored.
fn write_lines(rx: Receiver<Vec<u8>>) {
    let sink = SINK
        .get()
        .expect("the sink is set before its thread starts");
    for line in rx {
        let _ = std::io::stderr().write_all(&line);
        sink.pending.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One event's text, collected by tracing and queued whole when dropped.
#[derive(Default)]
struct LineWriter {
    buf: Vec<u8>,
}

impl Write for LineWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LineWriter {
    fn drop(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let Some(sink) = sink() else { return };
        sink.pending.fetch_add(1, Ordering::AcqRel);
        match sink.tx.try_send(std::mem::take(&mut self.buf)) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                sink.pending.fetch_sub(1, Ordering::AcqRel);
                sink.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
