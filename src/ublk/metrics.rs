//! `/metrics` for ublk devices.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `ramd_ublk_queues` | gauge | `drive`, `device` (/dev/ublkbN), `recovered` (true once taken over from an earlier ramd) |
//!
//! The value is the number of hardware queues (one thread and io_uring
//! each) serving the device; one series per device. Its I/O is counted
//! with the drive's (`ramd_drive_requests_total` and the rest).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::gauge::ConstGauge;

use super::DeviceInfo;
use crate::metrics::prometheus::family;

/// The devices at the moment of the scrape.
#[derive(Debug)]
pub struct UblkCollector(pub Vec<DeviceInfo>);

impl Collector for UblkCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let series = self
            .0
            .iter()
            .map(|d| {
                let labels = vec![
                    ("drive", d.drive.clone()),
                    ("device", d.block_device().display().to_string()),
                    ("recovered", d.recovered.to_string()),
                ];
                (labels, ConstGauge::new(i64::from(d.queues)))
            })
            .collect();
        family(
            &mut enc,
            "ramd_ublk_queues",
            "Hardware queues (a thread and an io_uring each) serving a ublk device",
            None,
            series,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::prometheus::{encode_with, DaemonSample};

    #[test]
    fn each_device_is_a_series() {
        let d = DeviceInfo {
            id: 3,
            drive: "db".into(),
            dev_id: 0,
            queues: 2,
            depth: 128,
            recovered: true,
            resizable: false,
        };
        let sample = DaemonSample {
            budget_used_bytes: 0,
            budget_limit_bytes: 0,
            uptime_seconds: 0.0,
            metrics_enabled: true,
            connection_buffer_bytes: 0,
            drives: vec![],
        };
        let text = encode_with(sample, vec![Box::new(UblkCollector(vec![d]))]);
        assert!(
            text.contains(
                "ramd_ublk_queues{drive=\"db\",device=\"/dev/ublkb0\",recovered=\"true\"} 2"
            ),
            "{text}"
        );
    }
}
