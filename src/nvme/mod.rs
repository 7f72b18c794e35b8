//! NVMe/TCP target: ramd drives as NVMe over Fabrics subsystems, spoken
//! from userspace (issue 30). No Rust crate implements the target side, so
//! the protocol code is ours, pure and separate from I/O like `nbd::proto`.
//!
//! ```text
//!  pdu        the NVMe/TCP PDU codec: common header, framing checks,
//!             ICReq/ICResp, CapsuleCmd/Resp, H2C/C2H data, R2T, TermReq,
//!             CRC32C header and data digests
//!  sqe        64-byte SQEs and 16-byte CQEs, SGL data pointers, Fabrics
//!             Connect / Property Get/Set, Read/Write/Write Zeroes/DSM
//!             fields, status codes
//!  identify   Identify pages: controller, namespace, active namespace
//!             list, namespace identification descriptors
//!  log        log pages: error, SMART/health, changed namespaces, discovery
//!  names      subsystem NQNs and the stable namespace identifiers
//!
//!  target     shared state: settings, drives (the daemon's export table),
//!             access rules, controllers (created by admin Connect)
//!  server     the listener: admission caps, a thread per connection
//!  conn       one queue: ICReq, PDU receive state machine, R2T/H2C, C2H,
//!             replies batched per read, TermReq on malformed PDUs
//!  admin      Connect, Property Get/Set, Identify, features, log pages,
//!             keep-alive, asynchronous events
//!  io         Read/Write/Flush/Write Zeroes/DSM through block::validate
//!  state      what an admin queue keeps (CC/CSTS, KATO, AERs, last notices)
//! ```
//!
//! Invariants every part keeps: decoding bytes from a host never panics
//! and never allocates more than a limit the caller passes; encoders write
//! exactly the layouts of the NVMe Base 2.0, NVMe over Fabrics 1.1 and
//! NVMe/TCP 1.0 specifications (byte offsets checked against the Linux
//! kernel's `include/linux/nvme.h` and `nvme-tcp.h` in the tests).

mod admin;
mod conn;
pub mod identify;
mod io;
pub mod log;
pub mod names;
pub mod pdu;
pub mod server;
pub mod sqe;
mod state;
pub mod target;

pub use conn::ConnError;
pub use server::{NvmeServer, NvmeShutdown};
pub use target::{Target, TargetConfig};
