//! `/metrics` for attachments: which path each FUSE mount uses.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `ramd_attachment_queues` | gauge | `drive`, `mountpoint`, `path` (fuse-classic, fuse-uring) |
//!
//! The value is the number of queue threads (classic) or rings (io_uring)
//! serving the mount; one series per attachment. Its I/O is counted with
//! the drive's (`ramd_drive_requests_total` and the rest).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::gauge::ConstGauge;

use super::AttachmentInfo;
use crate::metrics::prometheus::family;

/// The attachments at the moment of the scrape.
#[derive(Debug)]
pub struct AttachCollector(pub Vec<AttachmentInfo>);

impl Collector for AttachCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let series = self
            .0
            .iter()
            .map(|a| {
                let labels = vec![
                    ("drive", a.drive.clone()),
                    ("mountpoint", a.mountpoint.display().to_string()),
                    ("path", a.path.kind().to_owned()),
                ];
                (labels, ConstGauge::new(a.path.queues() as i64))
            })
            .collect();
        family(
            &mut enc,
            "ramd_attachment_queues",
            "Threads (fuse-classic) or rings (fuse-uring) serving a FUSE attachment",
            None,
            series,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuse::session::Path;
    use crate::metrics::prometheus::{encode_with, DaemonSample};

    #[test]
    fn each_attachment_says_its_path() {
        let a = AttachmentInfo {
            id: 1,
            drive: "ram0".into(),
            mountpoint: "/mnt/x".into(),
            file: "/mnt/x/ram0".into(),
            path: Path::Uring { queues: 2 },
        };
        let sample = DaemonSample {
            budget_used_bytes: 0,
            budget_limit_bytes: 0,
            uptime_seconds: 0.0,
            metrics_enabled: true,
            connection_buffer_bytes: 0,
            drives: vec![],
        };
        let text = encode_with(sample, vec![Box::new(AttachCollector(vec![a]))]);
        assert!(
            text.contains(
                "ramd_attachment_queues{drive=\"ram0\",mountpoint=\"/mnt/x\",path=\"fuse-uring\"} 2"
            ),
            "{text}"
        );
    }
}
