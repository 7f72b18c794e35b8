//! `ramd daemon --supervise` under the kernel's own clients, in one guest
//! boot (scripts/guest.sh): the serving process killed with SIGKILL while
//! a ublk device (ext4 mounted, fio with verify writing) and an NVMe/TCP
//! host (ext4 mounted) use RAM drives, and `ramd upgrade` to another binary
//! during fio on the ublk device; the device is taken over, the host
//! reconnects to the same namespace, every file matches its checksum and
//! fsck is clean; and a persistent drive (ext4 over ublk, nothing synced
//! since its creation) across a kill, then restored by an unsupervised
//! daemon from its state directory alone; a compressed drive (ext4 over
//! ublk) across a kill. The script is tests/guest-scripts/supervise.sh,
//! runnable by hand with guest.sh.

mod common;

use common::guest;

const SCRIPT: &str = include_str!("guest-scripts/supervise.sh");

#[test]
fn ublk_and_nvme_clients_survive_kill_9_of_the_serving_process() {
    if !guest::require_guest() {
        return;
    }
    guest::run_to_end(SCRIPT, "all supervise checks passed");
}
