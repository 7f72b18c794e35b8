//! `/metrics` families of compressed drives (pure: the daemon gathers a
//! [`CompressedSample`] per compressed drive, this encodes them). The
//! figures are zram's `mm_stat` (see `store::compressed::CompressedStats`).
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `ramd_drive_orig_data_bytes` | gauge | `drive` (logical bytes of pages that are not holes) |
//! | `ramd_drive_compressed_bytes` | gauge | `drive` (sum of the stored objects) |
//! | `ramd_drive_mem_used_bytes` | gauge | `drive` (pages + metadata) |
//! | `ramd_drive_compression_ratio` | gauge | `drive` (orig / mem used; 0 when empty) |
//! | `ramd_drive_same_pages`, `ramd_drive_huge_pages`, `ramd_drive_compressed_pages` | gauge | `drive` |
//! | `ramd_drive_compaction_runs_total`, `ramd_drive_compaction_moves_total` | counter | `drive` |
//! | `ramd_drive_compaction_freed_bytes_total` | counter | `drive` |
//! | `ramd_drive_recompressed_pages` | gauge | `drive` (pages the second codec of `lz4+zstd` holds) |
//! | `ramd_drive_recompress_saved_bytes_total` | counter | `drive` |

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;

use super::prometheus::{family, Labels};

/// One compressed drive at the moment of the scrape.
#[derive(Debug, Clone, Default)]
pub struct CompressedSample {
    pub name: String,
    pub orig_data_bytes: u64,
    pub compr_data_bytes: u64,
    pub mem_used_bytes: u64,
    pub same_pages: u64,
    pub huge_pages: u64,
    pub compressed_pages: u64,
    pub compact_runs: u64,
    pub compact_moved_objects: u64,
    pub compact_freed_bytes: u64,
    pub recompressed_pages: u64,
    pub recompress_saved_bytes: u64,
    pub ratio: f64,
}

/// The collector `/metrics` registers next to the drive families.
#[derive(Debug)]
pub struct CompressedCollector(pub Vec<CompressedSample>);

impl Collector for CompressedCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let label = |s: &CompressedSample| -> Labels { vec![("drive", s.name.clone())] };
        let gauge = |f: &dyn Fn(&CompressedSample) -> u64| -> Vec<(Labels, ConstGauge)> {
            self.0
                .iter()
                .map(|s| (label(s), ConstGauge::new(f(s) as i64)))
                .collect()
        };
        let counter = |f: &dyn Fn(&CompressedSample) -> u64| -> Vec<(Labels, ConstCounter<u64>)> {
            self.0
                .iter()
                .map(|s| (label(s), ConstCounter::new(f(s))))
                .collect()
        };
        let bytes = Some(Unit::Bytes);
        let e = &mut enc;
        family(
            e,
            "ramd_drive_orig_data",
            "Logical bytes of a compressed drive's pages that are not holes",
            bytes.clone(),
            gauge(&|s| s.orig_data_bytes),
        )?;
        family(
            e,
            "ramd_drive_compressed",
            "Bytes of a compressed drive's stored objects",
            bytes.clone(),
            gauge(&|s| s.compr_data_bytes),
        )?;
        family(
            e,
            "ramd_drive_mem_used",
            "Memory a compressed drive uses: pages held plus metadata",
            bytes.clone(),
            gauge(&|s| s.mem_used_bytes),
        )?;
        family(
            e,
            "ramd_drive_compression_ratio",
            "Logical bytes per byte of memory used (0 when empty)",
            None,
            self.0
                .iter()
                .map(|s| (label(s), ConstGauge::new(s.ratio)))
                .collect(),
        )?;
        family(
            e,
            "ramd_drive_same_pages",
            "Same-filled pages (zeroes included), stored as one word",
            None,
            gauge(&|s| s.same_pages),
        )?;
        family(
            e,
            "ramd_drive_huge_pages",
            "Pages that do not compress to 4032 bytes or less, kept raw",
            None,
            gauge(&|s| s.huge_pages),
        )?;
        family(
            e,
            "ramd_drive_compressed_pages",
            "Pages kept compressed",
            None,
            gauge(&|s| s.compressed_pages),
        )?;
        family(
            e,
            "ramd_drive_compaction_runs",
            "Pages compressed size classes gave back as they shrank (compaction)",
            None,
            counter(&|s| s.compact_runs),
        )?;
        family(
            e,
            "ramd_drive_compaction_moves",
            "Objects moved to keep the compressed size classes dense",
            None,
            counter(&|s| s.compact_moved_objects),
        )?;
        family(
            e,
            "ramd_drive_compaction_freed",
            "Bytes of the pages compaction gave back",
            bytes.clone(),
            counter(&|s| s.compact_freed_bytes),
        )?;
        family(
            e,
            "ramd_drive_recompressed_pages",
            "Idle pages recompressed with a compressed drive's second codec (lz4+zstd)",
            None,
            gauge(&|s| s.recompressed_pages),
        )?;
        family(
            e,
            "ramd_drive_recompress_saved",
            "Bytes recompressing idle pages took off their objects",
            bytes,
            counter(&|s| s.recompress_saved_bytes),
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::prometheus::{encode_with, DaemonSample};
    use super::*;

    fn daemon() -> DaemonSample {
        DaemonSample {
            budget_used_bytes: 0,
            budget_limit_bytes: 1 << 30,
            uptime_seconds: 1.0,
            metrics_enabled: true,
            connection_buffer_bytes: 0,
            drives: vec![],
        }
    }

    #[test]
    fn encodes_each_family_with_its_unit_and_type() {
        let s = CompressedSample {
            name: "z".into(),
            orig_data_bytes: 8 << 20,
            compr_data_bytes: 3 << 20,
            mem_used_bytes: 4 << 20,
            same_pages: 5,
            huge_pages: 7,
            compressed_pages: 9,
            compact_runs: 1,
            compact_moved_objects: 11,
            compact_freed_bytes: 4096,
            recompressed_pages: 3,
            recompress_saved_bytes: 1000,
            ratio: 2.0,
        };
        let text = encode_with(daemon(), vec![Box::new(CompressedCollector(vec![s]))]);
        for line in [
            "ramd_drive_orig_data_bytes{drive=\"z\"} 8388608\n",
            "ramd_drive_compressed_bytes{drive=\"z\"} 3145728\n",
            "ramd_drive_mem_used_bytes{drive=\"z\"} 4194304\n",
            "ramd_drive_compression_ratio{drive=\"z\"} 2.0\n",
            "ramd_drive_same_pages{drive=\"z\"} 5\n",
            "ramd_drive_huge_pages{drive=\"z\"} 7\n",
            "ramd_drive_compaction_moves_total{drive=\"z\"} 11\n",
            "ramd_drive_compaction_freed_bytes_total{drive=\"z\"} 4096\n",
            "ramd_drive_recompressed_pages{drive=\"z\"} 3\n",
            "ramd_drive_recompress_saved_bytes_total{drive=\"z\"} 1000\n",
            "# TYPE ramd_drive_compaction_runs counter\n",
        ] {
            assert!(text.contains(line), "{line} missing:\n{text}");
        }
        // No compressed drive: no family at all.
        let none = encode_with(daemon(), vec![Box::new(CompressedCollector(vec![]))]);
        assert!(!none.contains("compression_ratio"), "{none}");
    }
}
