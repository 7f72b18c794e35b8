//! ramd as a systemd service with a file-descriptor store (docs/restart.md,
//! contrib/systemd/ramd.service.d/fdstore.conf.example), under this
//! host's real systemd running as PID 1 of a PID namespace in the guest of
//! scripts/guest.sh: a plain and a compressed RAM drive survive kill -9 of
//! the service (systemd restarts it and passes the stored descriptors
//! back) and `systemctl restart`; a stop releases them. The script is
//! tests/guest-scripts/systemd_fdstore.sh, runnable by hand with guest.sh.

mod common;

use common::guest;

const SCRIPT: &str = include_str!("guest-scripts/systemd_fdstore.sh");

#[test]
fn ram_drives_survive_kill_9_and_restart_in_systemds_descriptor_store() {
    if !guest::require_guest() {
        return;
    }
    guest::run_to_end(SCRIPT, "all systemd checks passed");
}
