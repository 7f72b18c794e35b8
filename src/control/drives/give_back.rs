//! The drives' side of memory pressure: while the host is short,
//! `control::pressure` hurries the recompression of every `lz4+zstd`
//! drive (its worker sweeps at once and recompresses every page lz4 holds,
//! in use or not). The memory comes back as the workers go, not in this
//! call, so it reports nothing given back; the drives' figures
//! (`recompress_saved_bytes`, `urgent_sweeps`) say what it did.

use super::Drives;
use crate::control::pressure::GiveBack;
use crate::ratelog::RateLimit;

impl GiveBack for Drives {
    fn give_back(&self, _bytes: u64) -> u64 {
        let hurried: Vec<String> = self
            .list()
            .iter()
            .filter(|d| d.compressed().is_some_and(|c| c.hurry_recompression()))
            .map(|d| d.name.clone())
            .collect();
        static HURRIED: RateLimit = RateLimit::per_10s();
        if !hurried.is_empty() {
            if let Some(more) = HURRIED.admit() {
                tracing::info!(
                    "host memory is short: recompressing every page of {} with zstd now{more}",
                    hurried.join(", ")
                );
            }
        }
        0
    }
}
