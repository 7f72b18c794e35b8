//! `ramd resize` reaching a live ublk device, in the second guest (Debian
//! unstable's kernel: `UBLK_F_UPDATE_SIZE` is Linux 6.16+, the first
//! guest's 6.12 lacks it, where tests/guest-scripts/ublk.sh checks that
//! the device keeps its size and ramd says so). ext4 mounted on the
//! device, the drive grown, the device follows at once, an online
//! resize2fs, every file intact; a shrink shrinks the device. The script
//! is tests/guest-scripts/ublk_resize.sh, runnable by hand with guest.sh.

mod common;

use common::guest;

const SCRIPT: &str = include_str!("guest-scripts/ublk_resize.sh");

#[test]
fn resize_reaches_a_live_ublk_device_on_a_current_kernel() {
    if !guest::require_next_guest() {
        return;
    }
    let out = guest::run_next(SCRIPT).ok();
    assert!(
        out.stdout.contains("all ublk resize checks passed"),
        "the script ended early: {out}"
    );
}
