//! The kernel's NVMe/TCP initiator against `ramd daemon --nvme-listen`, in
//! one guest boot (scripts/guest.sh): nvme discover/connect/id-ctrl/id-ns/
//! smart-log, ext4 with checksummed files and fsck, fio verify at QD32 over
//! 2 jobs, fstrim freeing memory, a read-only drive, a drive created,
//! resized and deleted while connected, a host NQN off the allow-list (and
//! one taken off it while connected: its controller closes), and
//! kill -9 of ramd with the host reconnecting to a persistent drive. The
//! script is tests/guest-scripts/nvme.sh, runnable by hand with guest.sh.

mod common;

use common::guest;

const SCRIPT: &str = include_str!("guest-scripts/nvme.sh");

#[test]
fn kernel_nvme_tcp_initiator_against_ramds_target() {
    if !guest::require_guest() {
        return;
    }
    guest::run_to_end(SCRIPT, "all nvme checks passed");
}
