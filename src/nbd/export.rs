//! What an export means on the NBD wire: its transmission flags. The
//! export itself ([`Export`], [`ExportTable`]) is frontend-neutral and
//! lives in `block::export`.

use super::proto::*;
use crate::block::Export;

impl Export {
    /// Transmission flags for this export as it is now. DF is offered only
    /// when structured replies were negotiated (the spec requires it clear
    /// otherwise).
    pub fn transmission_flags(&self, structured: bool) -> u16 {
        let caps = self.backend.capabilities();
        let mut f = TFLAG_HAS_FLAGS;
        if structured {
            f |= TFLAG_SEND_DF;
        }
        // A read-only export offers no way to change data (the requests
        // would only earn EPERM): no FUA, TRIM or WRITE_ZEROES.
        let writable = !self.is_read_only();
        if !writable {
            f |= TFLAG_READ_ONLY;
        }
        if caps.can_flush {
            f |= TFLAG_SEND_FLUSH;
        }
        if caps.can_fua && writable {
            f |= TFLAG_SEND_FUA;
        }
        if caps.can_trim && writable {
            f |= TFLAG_SEND_TRIM;
        }
        if caps.can_zero && writable {
            f |= TFLAG_SEND_WRITE_ZEROES;
            if caps.can_fast_zero {
                f |= TFLAG_SEND_FAST_ZERO;
            }
        }
        if caps.can_multi_conn {
            f |= TFLAG_CAN_MULTI_CONN;
        }
        if caps.can_cache {
            f |= TFLAG_SEND_CACHE;
        }
        f
    }
}
