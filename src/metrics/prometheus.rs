//! `/metrics`: a daemon sample encoded in the OpenMetrics text format
//! (which Prometheus scrapes natively) with the `prometheus-client` crate.
//!
//! Pure: the daemon gathers a [`DaemonSample`] (no lock held while encoding)
//! and [`encode`] turns it into text.
//!
//! Names (every drive metric has a `drive` label):
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `ramd_drive_requests_total` | counter | `op` |
//! | `ramd_drive_io_bytes_total` | counter | `op` |
//! | `ramd_drive_errors_total` | counter | `errno` |
//! | `ramd_drive_connections_opened_total` | counter | |
//! | `ramd_drive_connections` | gauge | |
//! | `ramd_drive_request_duration_seconds` | histogram | `op` (read, write, flush) |
//! | `ramd_drive_size_bytes`, `ramd_drive_allocated_bytes`, `ramd_drive_mem_limit_bytes` | gauge | |
//! | `ramd_drive_read_only` | gauge (0/1) | |
//! | `ramd_memory_budget_used_bytes`, `ramd_memory_budget_limit_bytes` | gauge | |
//! | `ramd_nbd_connection_buffers_bytes` | gauge | |
//! | `ramd_drives`, `ramd_uptime_seconds`, `ramd_metrics_enabled` | gauge | |

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use super::{Op, Timed, Totals, ERRNOS};

/// The content type of [`encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Histogram bucket bounds: powers of two from 1 us (1024 ns) to ~17 s.
pub(crate) const BOUNDS_POW2: std::ops::RangeInclusive<u32> = 10..=34;

/// One drive at the moment of the scrape.
#[derive(Debug, Clone)]
pub struct DriveSample {
    pub name: String,
    pub size_bytes: u64,
    pub allocated_bytes: u64,
    /// None when the drive has no memory limit of its own.
    pub mem_limit_bytes: Option<u64>,
    /// Open NBD connections plus FUSE attachments.
    pub connections: u64,
    pub read_only: bool,
    /// None when metrics recording is off.
    pub totals: Option<Totals>,
}

/// The daemon at the moment of the scrape.
#[derive(Debug, Clone)]
pub struct DaemonSample {
    pub budget_used_bytes: u64,
    pub budget_limit_bytes: u64,
    pub uptime_seconds: f64,
    pub metrics_enabled: bool,
    /// What NBD connections' buffers hold (`nbd::conn::buffer_bytes`).
    pub connection_buffer_bytes: u64,
    pub drives: Vec<DriveSample>,
}

/// Encodes a sample as OpenMetrics text (ends with `# EOF`).
pub fn encode(sample: DaemonSample) -> String {
    encode_with(sample, Vec::new())
}

/// [`encode`] plus other parts' families (caches, directories in RAM...).
pub fn encode_with(sample: DaemonSample, extra: Vec<Box<dyn Collector>>) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(SampleCollector(sample)));
    for c in extra {
        registry.register_collector(c);
    }
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry)
        .expect("encoding into a String cannot fail");
    out
}

#[derive(Debug)]
struct SampleCollector(DaemonSample);

pub(crate) type Labels = Vec<(&'static str, String)>;

fn drive_label(d: &DriveSample) -> Labels {
    vec![("drive", d.name.clone())]
}

/// Writes one family of gauges or counters: `(labels, value)` per series.
pub(crate) fn family<M: EncodeMetric>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    series: Vec<(Labels, M)>,
) -> std::fmt::Result {
    let Some(first) = series.first() else {
        return Ok(());
    };
    let ty: MetricType = first.1.metric_type();
    let mut m = enc.encode_descriptor(name, help, unit.as_ref(), ty)?;
    if let [(labels, metric)] = &series[..] {
        if labels.is_empty() {
            // A single unlabelled series: `name value`, not `name{} value`.
            return metric.encode(m);
        }
    }
    for (labels, metric) in &series {
        metric.encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

impl Collector for SampleCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let s = &self.0;
        let g = |v: u64| ConstGauge::new(v as i64);
        family(
            &mut enc,
            "ramd_memory_budget_used",
            "Memory all drives hold, charged to the daemon budget",
            Some(Unit::Bytes),
            vec![(vec![], g(s.budget_used_bytes))],
        )?;
        family(
            &mut enc,
            "ramd_memory_budget_limit",
            "The daemon memory budget (--mem-budget)",
            Some(Unit::Bytes),
            vec![(vec![], g(s.budget_limit_bytes))],
        )?;
        family(
            &mut enc,
            "ramd_nbd_connection_buffers",
            "Memory NBD connections' buffers hold (outside the drives' budget)",
            Some(Unit::Bytes),
            vec![(vec![], g(s.connection_buffer_bytes))],
        )?;
        family(
            &mut enc,
            "ramd_drives",
            "Drives the daemon serves",
            None,
            vec![(vec![], g(s.drives.len() as u64))],
        )?;
        family(
            &mut enc,
            "ramd_uptime",
            "Seconds since the daemon started",
            Some(Unit::Seconds),
            vec![(vec![], ConstGauge::new(s.uptime_seconds))],
        )?;
        family(
            &mut enc,
            "ramd_metrics_enabled",
            "1 when per-request metrics are recorded (--metrics)",
            None,
            vec![(vec![], g(s.metrics_enabled as u64))],
        )?;
        let per = |f: &dyn Fn(&DriveSample) -> u64| -> Vec<(Labels, ConstGauge)> {
            s.drives.iter().map(|d| (drive_label(d), g(f(d)))).collect()
        };
        family(
            &mut enc,
            "ramd_drive_size",
            "Drive size",
            Some(Unit::Bytes),
            per(&|d| d.size_bytes),
        )?;
        family(
            &mut enc,
            "ramd_drive_allocated",
            "Memory the drive holds (pages written and not trimmed)",
            Some(Unit::Bytes),
            per(&|d| d.allocated_bytes),
        )?;
        family(
            &mut enc,
            "ramd_drive_mem_limit",
            "The drive's own memory limit (drives without one are absent)",
            Some(Unit::Bytes),
            s.drives
                .iter()
                .filter_map(|d| d.mem_limit_bytes.map(|l| (drive_label(d), g(l))))
                .collect(),
        )?;
        family(
            &mut enc,
            "ramd_drive_read_only",
            "1 while the drive is locked read-only",
            None,
            per(&|d| d.read_only as u64),
        )?;
        family(
            &mut enc,
            "ramd_drive_connections",
            "Open NBD connections and FUSE attachments",
            None,
            per(&|d| d.connections),
        )?;
        let recorded: Vec<(String, &Totals)> = s
            .drives
            .iter()
            .filter_map(|d| d.totals.as_ref().map(|t| (d.name.clone(), t)))
            .collect();
        request_families(&mut enc, "ramd_drive", "drive", &recorded)?;
        Ok(())
    }
}

fn with_label(label: &'static str, name: &str, key: &'static str, value: &str) -> Labels {
    vec![(label, name.to_owned()), (key, value.to_owned())]
}

/// The request families of NBD exports, drives or caches alike:
/// `{prefix}_connections_opened_total`, `{prefix}_requests_total`,
/// `{prefix}_io_bytes_total`, `{prefix}_errors_total` and
/// `{prefix}_request_duration_seconds`, each series labelled
/// `label="name"`.
pub(crate) fn request_families(
    enc: &mut DescriptorEncoder,
    prefix: &str,
    label: &'static str,
    recorded: &[(String, &Totals)],
) -> std::fmt::Result {
    let c = ConstCounter::new;
    family(
        enc,
        &format!("{prefix}_connections_opened"),
        &format!("Connections and attachments opened since the {label} was created"),
        None,
        recorded
            .iter()
            .map(|(d, t)| (vec![(label, d.clone())], c(t.connections_total)))
            .collect(),
    )?;
    let by_op = |f: &dyn Fn(&Totals, Op) -> u64| -> Vec<(Labels, ConstCounter)> {
        recorded
            .iter()
            .flat_map(|(d, t)| {
                Op::ALL
                    .iter()
                    .map(move |&op| (with_label(label, d, "op", op.name()), c(f(t, op))))
            })
            .collect()
    };
    family(
        enc,
        &format!("{prefix}_requests"),
        "Requests handled, successful or not",
        None,
        by_op(&|t, op| t.ops(op)),
    )?;
    family(
        enc,
        &format!("{prefix}_io"),
        "Bytes of successful requests (trim, write_zeroes, cache: range length)",
        Some(Unit::Bytes),
        by_op(&|t, op| t.bytes(op)),
    )?;
    family(
        enc,
        &format!("{prefix}_errors"),
        "Failed requests by the errno sent to the client",
        None,
        recorded
            .iter()
            .flat_map(|(d, t)| {
                ERRNOS.iter().enumerate().map(move |(i, (_, name))| {
                    (with_label(label, d, "errno", name), c(t.errors[i]))
                })
            })
            .collect(),
    )?;
    if !recorded.is_empty() {
        let unit = Unit::Seconds;
        let name = format!("{prefix}_request_duration");
        let mut m = enc.encode_descriptor(
            &name,
            "Time from reading a request to sending its reply",
            Some(&unit),
            MetricType::Histogram,
        )?;
        let bounds_ns: Vec<u64> = BOUNDS_POW2.map(|p| (1u64 << p) - 1).collect();
        for (d, t) in recorded {
            for timed in Timed::ALL {
                let h = t.latency(timed);
                // The encoder wants per-bucket counts (it sums them).
                let cum = h.cumulative_at(&bounds_ns);
                let mut buckets: Vec<(f64, u64)> = Vec::with_capacity(bounds_ns.len() + 1);
                let mut prev = 0;
                for (&b, n) in bounds_ns.iter().zip(cum) {
                    buckets.push(((b + 1) as f64 / 1e9, n - prev));
                    prev = n;
                }
                buckets.push((f64::INFINITY, h.count() - prev));
                let labels = with_label(label, d, "op", timed.name());
                m.encode_family(&labels)?.encode_histogram::<Labels>(
                    h.sum_ns as f64 / 1e9,
                    h.count(),
                    &buckets,
                    None,
                )?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_every_family_once() {
        let mut t = Totals::default();
        t.ops[Op::Read as usize] = 3;
        t.bytes[Op::Read as usize] = 12288;
        t.latency[Timed::Read as usize].record_n(3000, 3);
        let d = DriveSample {
            name: "ram0".into(),
            size_bytes: 1 << 30,
            allocated_bytes: 4096,
            mem_limit_bytes: Some(1 << 20),
            connections: 1,
            read_only: false,
            totals: Some(t),
        };
        let text = encode(DaemonSample {
            budget_used_bytes: 4096,
            budget_limit_bytes: 1 << 32,
            uptime_seconds: 1.5,
            metrics_enabled: true,
            connection_buffer_bytes: 3 << 20,
            drives: vec![d],
        });
        assert!(
            text.contains("ramd_nbd_connection_buffers_bytes 3145728\n"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert!(text.contains("ramd_drive_requests_total{drive=\"ram0\",op=\"read\"} 3\n"));
        assert!(text.contains("ramd_drive_io_bytes_total{drive=\"ram0\",op=\"read\"} 12288\n"));
        assert!(text.contains("ramd_drive_mem_limit_bytes{drive=\"ram0\"} 1048576\n"));
        assert!(text
            .contains("ramd_drive_request_duration_seconds_count{drive=\"ram0\",op=\"read\"} 3\n"));
        // 3 us lies in the (2048 ns, 4096 ns] bucket.
        assert!(text.contains("ramd_drive_request_duration_seconds_bucket{le=\"0.000002048\",drive=\"ram0\",op=\"read\"} 0\n")
            || text.contains("le=\"2.048e-6\""), "{text}");
        assert_eq!(text.matches("# TYPE ramd_drive_requests ").count(), 1);
    }
}
