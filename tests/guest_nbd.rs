//! The kernel NBD client against `ramd daemon`, in one guest boot
//! (scripts/guest.sh): what docs/attach.md sections 2 and 3 tell users
//! (nbd-client over the unix socket, over TCP, with -C 4; qemu-nbd), ext4
//! with a checksummed file tree and fsck each time, and what /dev/nbdX does
//! when ramd is killed with SIGKILL and started again (with nbd-client's
//! netlink default and with -persist -nonetlink). The script is
//! tests/guest-scripts/nbd_client.sh, runnable by hand with guest.sh.

mod common;

use common::guest;

const SCRIPT: &str = include_str!("guest-scripts/nbd_client.sh");

#[test]
fn kernel_nbd_client_over_unix_and_tcp_and_across_a_ramd_crash() {
    if !guest::require_guest() {
        return;
    }
    // What the kernel decided, for the test log (docs/attach.md says it).
    guest::run_to_end(SCRIPT, "all nbd-client checks passed");
}
