//! `ramd attach NAME --ublk` in one guest boot (scripts/guest.sh, whose
//! kernel has ublk_drv): ext4 with a checksummed file tree and fsck, fio
//! verify 4 KiB randrw at QD32 x 4 jobs, discard freeing the drive's
//! memory, a read-only drive refusing writes, detach refused while
//! mounted, and user recovery (kill -9 of ramd during fio on a mounted
//! persistent `durability=flush` drive; the restarted ramd resumes the
//! device, fsck is clean and every fsynced file intact), and `attach =
//! "ublk"` in the config attaching a drive at start. The script is
//! tests/guest-scripts/ublk.sh, runnable by hand with guest.sh.

mod common;

use common::guest;

const SCRIPT: &str = include_str!("guest-scripts/ublk.sh");

#[test]
fn ublk_device_serves_ext4_fio_discard_read_only_and_survives_kill_9() {
    if !guest::require_guest() {
        return;
    }
    guest::run_to_end(SCRIPT, "all ublk checks passed");
}
