//! What a compressed drive reports: zram's `mm_stat` as a plain struct,
//! for the control plane to expose.

/// A compressed drive's memory figures at one moment (each shard is read
/// under its lock in turn, so concurrent writes may skew the sums by a
/// few pages).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompressedStats {
    /// Logical bytes of every page that is not a hole (4 KiB per page,
    /// same-filled pages included): zram's `orig_data_size`.
    pub orig_data_bytes: u64,
    /// Sum of the stored objects' lengths (raw pages count 4 KiB each):
    /// zram's `compr_data_size`.
    pub compr_data_bytes: u64,
    /// Bytes of arena pages held (size classes, raw pages and the few free
    /// pages kept for reuse): what the drive's limit and the daemon's
    /// budget are charged (zram's `mem_used_total`).
    pub slab_bytes: u64,
    /// Bytes of page tables and the classes' and arena's bookkeeping (not
    /// charged).
    pub metadata_bytes: u64,
    /// Same-filled pages, zero pages included (no bytes stored).
    pub same_pages: u64,
    /// Pages that did not compress to 4032 bytes or less, kept raw.
    pub huge_pages: u64,
    /// Pages kept compressed.
    pub compressed_pages: u64,
    /// Pages size classes gave back as they shrank (each one a compaction
    /// run: frees move objects so the classes stay dense).
    pub compact_runs: u64,
    /// Objects compaction moved.
    pub compact_moved_objects: u64,
    /// Bytes of the pages compaction gave back.
    pub compact_freed_bytes: u64,
    /// Pages held compressed by the drive's second codec
    /// (`lz4+zstd`: recompressed idle pages; part of `compressed_pages`).
    pub recompressed_pages: u64,
    /// Pages recompression tried (recompressed, or kept as they were).
    pub recompress_attempts: u64,
    /// Bytes recompression took off the objects it replaced.
    pub recompress_saved_bytes: u64,
    /// CPU time recompression spent, in milliseconds.
    pub recompress_cpu_ms: u64,
    /// Sweeps the worker made of every page because host memory was short.
    pub urgent_sweeps: u64,
}

impl CompressedStats {
    /// Everything held: arena pages plus metadata (zram's
    /// `mem_used_total` plus its table).
    pub fn mem_used_bytes(&self) -> u64 {
        self.slab_bytes + self.metadata_bytes
    }

    /// Bytes of the pages held that hold no object (rounding up to a size
    /// class, each class's part-filled last page, free pages kept for
    /// reuse): fragmentation.
    pub fn slack_bytes(&self) -> u64 {
        self.slab_bytes.saturating_sub(self.compr_data_bytes)
    }

    /// Logical bytes per byte of memory used (metadata included); 0 when
    /// the drive holds nothing.
    pub fn ratio(&self) -> f64 {
        match self.mem_used_bytes() {
            0 => 0.0,
            used => self.orig_data_bytes as f64 / used as f64,
        }
    }

    /// Adds another shard's figures.
    pub fn add(&mut self, o: &CompressedStats) {
        self.orig_data_bytes += o.orig_data_bytes;
        self.compr_data_bytes += o.compr_data_bytes;
        self.slab_bytes += o.slab_bytes;
        self.metadata_bytes += o.metadata_bytes;
        self.same_pages += o.same_pages;
        self.huge_pages += o.huge_pages;
        self.compressed_pages += o.compressed_pages;
        self.compact_runs += o.compact_runs;
        self.compact_moved_objects += o.compact_moved_objects;
        self.compact_freed_bytes += o.compact_freed_bytes;
        self.recompressed_pages += o.recompressed_pages;
        self.recompress_attempts += o.recompress_attempts;
        self.recompress_saved_bytes += o.recompress_saved_bytes;
        self.recompress_cpu_ms += o.recompress_cpu_ms;
        self.urgent_sweeps += o.urgent_sweeps;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_and_slack() {
        let s = CompressedStats {
            orig_data_bytes: 8 * 4096,
            compr_data_bytes: 6000,
            slab_bytes: 8192,
            metadata_bytes: 8192,
            ..CompressedStats::default()
        };
        assert_eq!(s.ratio(), 2.0);
        assert_eq!(s.slack_bytes(), 2192);
        assert_eq!(CompressedStats::default().ratio(), 0.0);
    }
}
