//! Exports: the drives the frontends serve (NBD listeners, FUSE files),
//! looked up by name when a client connects or a file is attached.
//!
//! The table is read at handshake/attach time only (an `RwLock` is fine
//! there); the data path holds an `Arc<Export>` and touches only its
//! atomics. An export's backend is always wrapped in the [`ReadOnly`]
//! layer, whose switch is the export's read-only state: every frontend
//! reads it into `block::Limits`, and the layer refuses changes itself.
//! What an export means on one frontend's wire (NBD transmission flags)
//! lives with that frontend.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

use super::cut::{Cut, CutError, CutLayer};
use super::read_only::ReadOnly;
use crate::block::backend::Backend;
use crate::metrics::DriveMetrics;

/// One NBD export: a named backend plus its live state.
pub struct Export {
    /// The export name clients ask for (the drive name).
    pub name: String,
    /// Free text shown by `nbdinfo --list` and NBD_INFO_DESCRIPTION.
    pub description: String,
    /// Where the bytes live: the [`ReadOnly`] layer over the [`CutLayer`]
    /// over the drive.
    pub backend: Arc<dyn Backend>,
    /// The point-in-time layer, for snapshot pushes ([`Export::begin_cut`]).
    cut: Arc<CutLayer>,
    /// The same layer, for its switch: changes fail with EPERM while it is
    /// on, so `ramd lock` takes effect on open connections at once.
    read_only: Arc<ReadOnly>,
    /// Connections in the transmission phase on this export.
    connections: AtomicUsize,
    /// Where connections record their requests; None when metrics are off
    /// (the data path then skips recording and reads no clock).
    pub metrics: Option<Arc<DriveMetrics>>,
    /// Set when the drive is deleted: connections that finish their
    /// handshake afterwards leave at once instead of serving a dead drive.
    closed: AtomicBool,
    /// Set for a drive that cannot serve yet (restoring, failed): the
    /// handshake refuses the export with the text it returns, which says
    /// why and what to do.
    unavailable: Option<Unavailable>,
    /// For a drive whose data does not outlive the process: random bytes
    /// drawn when it is created, so identities derived from them (NVMe
    /// namespace NGUID/UUID) differ when it comes back empty after a
    /// restart, and a host that reconnects sees a new namespace instead of
    /// silently reading zeroes where its data was; for a RAM drive in a
    /// memfd a supervisor keeps, derived from that memfd instead (the data
    /// outlives the process, so the identity does). None: the data lasts
    /// (persistent drives, caches), so the identity does too.
    pub incarnation: Option<[u8; 16]>,
}

/// Says why an export cannot be served right now (see
/// [`Export::with_unavailable`]).
pub type Unavailable = Box<dyn Fn() -> String + Send + Sync>;

impl Export {
    pub fn new(name: &str, description: &str, backend: Arc<dyn Backend>, read_only: bool) -> Self {
        let cut = Arc::new(CutLayer::new(backend));
        let read_only = Arc::new(ReadOnly::new(cut.clone(), read_only));
        Export {
            name: name.to_owned(),
            description: description.to_owned(),
            backend: read_only.clone(),
            cut,
            read_only,
            connections: AtomicUsize::new(0),
            metrics: None,
            closed: AtomicBool::new(false),
            unavailable: None,
            incarnation: None,
        }
    }

    /// Marks the export's data as lasting only as long as the process
    /// (see `incarnation`).
    pub fn with_volatile_identity(mut self) -> Self {
        use ring::rand::SecureRandom;
        let mut b = [0u8; 16];
        // A failing system generator leaves the bytes zero: the identity
        // is then the same at every creation (what it was before this).
        let _ = ring::rand::SystemRandom::new().fill(&mut b);
        self.incarnation = Some(b);
        self
    }

    /// Marks the export's data as lasting as long as the memfd whose
    /// inode is `inode` (a RAM drive a supervisor keeps, `store::memfd`):
    /// the identity follows that memory across restarts of the process,
    /// and differs for a new memfd or after a reboot (the boot id is part
    /// of it, inode numbers are not unique across boots).
    pub fn with_memfd_identity(mut self, inode: u64) -> Self {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(b"ramd memfd drive identity\0");
        ctx.update(boot.trim().as_bytes());
        ctx.update(&inode.to_le_bytes());
        let mut b = [0u8; 16];
        b.copy_from_slice(&ctx.finish().as_ref()[..16]);
        self.incarnation = Some(b);
        self
    }

    /// Marks the export as listed but not served: option negotiation
    /// refuses it (NBD_REP_ERR_UNKNOWN) with `why()`'s text.
    pub fn with_unavailable(mut self, why: Unavailable) -> Self {
        self.unavailable = Some(why);
        self
    }

    /// Whether the export cannot be served now (no text made: for the
    /// data path).
    pub fn is_unavailable(&self) -> bool {
        self.unavailable.is_some()
    }

    /// Why the export cannot be served now, or None when it can.
    pub fn unavailable(&self) -> Option<String> {
        self.unavailable.as_ref().map(|f| f())
    }

    /// Marks the export as gone (see `ShutdownHandle::close_export`).
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    /// True once `close` was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Records every connection's requests into `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<DriveMetrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Opens a point-in-time cut of the drive as clients see it (see
    /// `block::cut`): a snapshot push reads it while clients go on.
    pub fn begin_cut(&self, chunk_bytes: u64) -> Result<Cut, CutError> {
        self.cut.begin(chunk_bytes)
    }

    /// True while a cut is open (a push is reading the drive).
    pub fn is_cut_open(&self) -> bool {
        self.cut.is_cut_open()
    }

    pub fn is_read_only(&self) -> bool {
        self.read_only.is_on()
    }

    pub fn set_read_only(&self, ro: bool) {
        self.read_only.set(ro);
    }

    /// Open transmission-phase connections.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }

    /// Counts a connection until the guard drops.
    pub fn connect(self: &Arc<Self>) -> ConnectionGuard {
        self.connections.fetch_add(1, Ordering::Relaxed);
        ConnectionGuard(self.clone())
    }
}

/// Decrements the export's connection count on drop.
pub struct ConnectionGuard(Arc<Export>);

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The exports of a server, by name. The first export added is the default
/// one, served to clients that ask for the empty name "".
#[derive(Default)]
pub struct ExportTable {
    inner: RwLock<Table>,
}

#[derive(Default)]
struct Table {
    by_name: BTreeMap<String, Arc<Export>>,
    default: Option<String>,
}

impl ExportTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds an export; false when the name is taken.
    pub fn insert(&self, export: Arc<Export>) -> bool {
        let mut t = self.inner.write();
        if t.by_name.contains_key(&export.name) {
            return false;
        }
        if t.default.is_none() {
            t.default = Some(export.name.clone());
        }
        t.by_name.insert(export.name.clone(), export);
        true
    }

    /// Removes an export (open connections keep their `Arc` until they end).
    pub fn remove(&self, name: &str) -> Option<Arc<Export>> {
        let mut t = self.inner.write();
        let e = t.by_name.remove(name);
        if t.default.as_deref() == Some(name) {
            t.default = t.by_name.keys().next().cloned();
        }
        e
    }

    /// Looks up a name; "" is the default export.
    pub fn get(&self, name: &str) -> Option<Arc<Export>> {
        let t = self.inner.read();
        let name = if name.is_empty() {
            t.default.as_deref()?
        } else {
            name
        };
        t.by_name.get(name).cloned()
    }

    /// Every export, sorted by name.
    pub fn list(&self) -> Vec<Arc<Export>> {
        self.inner.read().by_name.values().cloned().collect()
    }

    /// Names, for error messages.
    pub fn names(&self) -> Vec<String> {
        self.inner.read().by_name.keys().cloned().collect()
    }
}
