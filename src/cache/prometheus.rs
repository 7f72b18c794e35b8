//! Prometheus families for caches (pure: samples in, a collector out;
//! `GET /metrics` adds it to the daemon's).
//!
//! Every series has a `cache` label. From [`CacheStats::metrics`], each
//! number as `ramd_cache_<name>` (counters end in `_total`):
//!
//! | metric | type |
//! |---|---|
//! | `ramd_cache_size_bytes`, `ramd_cache_capacity_bytes`, `ramd_cache_resident_bytes`, `ramd_cache_dirty_bytes` | gauge |
//! | `ramd_cache_read_hits_total`, `ramd_cache_read_misses_total`, `ramd_cache_write_hits_total`, `ramd_cache_write_misses_total` | counter (blocks) |
//! | `ramd_cache_read_hit_ratio`, `ramd_cache_write_hit_ratio` | gauge (0-1) |
//! | `ramd_cache_evictions_total`, `ramd_cache_invalidations_total` | counter (blocks) |
//! | `ramd_cache_writeback_bytes_total` | counter |
//! | `ramd_cache_writeback_rate_bytes_per_second`, `ramd_cache_writeback_lag_ms` | gauge |
//! | `ramd_cache_bypassed_requests_total`, `ramd_cache_bypassed_bytes_total` | counter |
//! | `ramd_cache_backing_read_bytes_total`, `ramd_cache_backing_write_bytes_total` | counter |
//! | `ramd_cache_backing_failing` | gauge (0/1) |
//! | `ramd_cache_backing_{read,write,flush}_errors_total`, `ramd_cache_backing_retries_total` | counter |
//!
//! And: `ramd_caches` (gauge), `ramd_cache_up` (1 serving, 0 while its
//! backing could not be opened), `ramd_cache_connections`, and the NBD
//! request families drives have (`ramd_cache_requests_total`,
//! `ramd_cache_io_bytes_total`, `ramd_cache_errors_total`,
//! `ramd_cache_connections_opened_total`,
//! `ramd_cache_request_duration_seconds`).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use super::stats::{CacheStats, MetricKind};
use crate::metrics::prometheus::{family, request_families, Labels};
use crate::metrics::Totals;

/// One cache at the moment of the scrape.
#[derive(Debug, Clone)]
pub struct CacheSample {
    pub name: String,
    /// None while the backing is not open (nothing to count yet).
    pub stats: Option<CacheStats>,
    /// Open NBD connections.
    pub connections: u64,
    /// The export's request counters; None when metrics are off.
    pub totals: Option<Totals>,
}

/// The caches at the moment of the scrape.
#[derive(Debug)]
pub struct CacheCollector(pub Vec<CacheSample>);

fn label(c: &CacheSample) -> Labels {
    vec![("cache", c.name.clone())]
}

impl Collector for CacheCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let caches = &self.0;
        let g = |v: u64| ConstGauge::new(v as i64);
        family(
            &mut enc,
            "ramd_caches",
            "RAM caches the daemon has",
            None,
            vec![(vec![], g(caches.len() as u64))],
        )?;
        family(
            &mut enc,
            "ramd_cache_up",
            "1 while the cache serves, 0 while its backing could not be opened",
            None,
            caches
                .iter()
                .map(|c| (label(c), g(c.stats.is_some() as u64)))
                .collect(),
        )?;
        family(
            &mut enc,
            "ramd_cache_connections",
            "Open NBD connections",
            None,
            caches
                .iter()
                .map(|c| (label(c), g(c.connections)))
                .collect(),
        )?;
        let open: Vec<(&CacheSample, Vec<super::stats::Metric>)> = caches
            .iter()
            .filter_map(|c| c.stats.as_ref().map(|s| (c, s.metrics())))
            .collect();
        if let Some((_, first)) = open.first() {
            for (i, m) in first.iter().enumerate() {
                let name = format!("ramd_cache_{}", m.name);
                match m.kind {
                    MetricKind::Counter => family(
                        &mut enc,
                        name.trim_end_matches("_total"),
                        m.help,
                        None,
                        open.iter()
                            .map(|(c, ms)| (label(c), ConstCounter::new(ms[i].value as u64)))
                            .collect(),
                    )?,
                    // Ratios are fractions; every other gauge counts
                    // something whole.
                    MetricKind::Gauge if m.name.ends_with("_ratio") => family(
                        &mut enc,
                        &name,
                        m.help,
                        None,
                        open.iter()
                            .map(|(c, ms)| (label(c), ConstGauge::new(ms[i].value)))
                            .collect(),
                    )?,
                    MetricKind::Gauge => family(
                        &mut enc,
                        &name,
                        m.help,
                        None,
                        open.iter()
                            .map(|(c, ms)| (label(c), g(ms[i].value as u64)))
                            .collect(),
                    )?,
                }
            }
        }
        let recorded: Vec<(String, &Totals)> = caches
            .iter()
            .filter_map(|c| c.totals.as_ref().map(|t| (c.name.clone(), t)))
            .collect();
        request_families(&mut enc, "ramd_cache", "cache", &recorded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{HealthSnapshot, Mode, PolicyKind};
    use prometheus_client::registry::Registry;

    fn stats() -> CacheStats {
        CacheStats {
            mode: Mode::WriteBack,
            policy: PolicyKind::S3Fifo,
            block_bytes: 4096,
            size_bytes: 1 << 30,
            capacity_bytes: 1 << 20,
            resident_bytes: 8192,
            memory_bytes: 12288,
            dirty_bytes: 4096,
            read_hits: 3,
            read_misses: 1,
            write_hits: 0,
            write_misses: 2,
            evictions: 0,
            invalidations: 0,
            writeback_bytes: 0,
            writeback_rate_bytes_per_s: 0,
            writeback_lag_ms: 15,
            flusher_scans: 0,
            bypassed_requests: 0,
            bypassed_bytes: 0,
            backing_read_bytes: 4096,
            backing_write_bytes: 0,
            given_back_bytes: 0,
            backing: HealthSnapshot {
                failing: true,
                write_errors: 2,
                ..Default::default()
            },
        }
    }

    #[test]
    fn every_number_with_a_cache_label() {
        let mut t = Totals::default();
        t.ops[crate::metrics::Op::Read as usize] = 7;
        let samples = vec![
            CacheSample {
                name: "db".into(),
                stats: Some(stats()),
                connections: 2,
                totals: Some(t),
            },
            CacheSample {
                name: "later".into(),
                stats: None,
                connections: 0,
                totals: None,
            },
        ];
        let mut r = Registry::default();
        r.register_collector(Box::new(CacheCollector(samples)));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        for want in [
            "ramd_caches 2\n",
            "ramd_cache_up{cache=\"db\"} 1\n",
            "ramd_cache_up{cache=\"later\"} 0\n",
            "ramd_cache_connections{cache=\"db\"} 2\n",
            "ramd_cache_read_hits_total{cache=\"db\"} 3\n",
            "ramd_cache_read_hit_ratio{cache=\"db\"} 0.75\n",
            "ramd_cache_dirty_bytes{cache=\"db\"} 4096\n",
            "ramd_cache_backing_failing{cache=\"db\"} 1\n",
            "ramd_cache_backing_write_errors_total{cache=\"db\"} 2\n",
            "ramd_cache_writeback_lag_ms{cache=\"db\"} 15\n",
            "ramd_cache_requests_total{cache=\"db\",op=\"read\"} 7\n",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        assert!(!text.contains("read_hits_total_total"), "{text}");
        assert_eq!(text.matches("# TYPE ramd_cache_read_hits ").count(), 1);
    }
}
