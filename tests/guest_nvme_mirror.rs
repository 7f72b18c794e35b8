//! A RAM drive mirrored across two hosts with the kernel's md RAID1 over
//! NVMe/TCP, in one guest boot (scripts/guest.sh): two ramd daemons (two
//! ports) stand for two hosts, the host connects to a drive on each and
//! builds `mdadm --level=1 --bitmap=internal` over them, the second leg
//! `--write-mostly`; ext4 with checksummed files; kill -9 of one daemon
//! (I/O goes on degraded once ctrl-loss-tmo expires), the daemon back
//! with an empty drive, the leg added and fully resynced, and every
//! checksum and fsck read from that leg alone; then the other leg back
//! with `--re-add` (a partial resync through the bitmap) and read alone.
//! The script is tests/guest-scripts/nvme_mirror.sh, runnable by hand with
//! guest.sh; the recipe it follows is docs/nvme.md "Mirroring across
//! hosts".

mod common;

use common::guest;

const SCRIPT: &str = include_str!("guest-scripts/nvme_mirror.sh");

#[test]
fn md_raid1_over_two_daemons_survives_losing_one() {
    if !guest::require_guest() {
        return;
    }
    guest::run_to_end(SCRIPT, "all nvme mirror checks passed");
}
