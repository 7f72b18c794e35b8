//! The caches' side of memory pressure: `control::pressure` asks the
//! caches for memory while the host is short; each serving cache gives
//! back clean memory in turn (`cache::Cache::give_back`) until the amount
//! asked for is met. Caches that are not serving hold no slot memory.

use super::Caches;
use crate::control::pressure::GiveBack;

impl GiveBack for Caches {
    fn give_back(&self, bytes: u64) -> u64 {
        let mut given = 0;
        for entry in self.list() {
            if given >= bytes {
                break;
            }
            if let Some(live) = entry.live() {
                given += live.cache.give_back(bytes - given);
            }
        }
        given
    }
}
