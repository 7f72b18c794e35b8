//! The guest-kernel harness itself (scripts/guest.sh, tests/common/guest.rs),
//! in one boot: the block drivers this machine's kernel lacks load and make
//! their devices, a filesystem works on a kernel RAM disk, the binary under
//! test runs in the guest, files come back through the results share, and
//! the script's exit code comes back through the harness.

mod common;

use common::guest;

const SCRIPT: &str = r#"
set -euo pipefail
# The modules the guest tests need; brd with a 64 MiB /dev/ram0.
modprobe brd rd_nr=1 rd_size=65536
for m in ublk_drv nbd nvme-tcp nvmet nvmet-tcp null_blk raid1 loop; do
    modprobe "$m"
done
for dev in /dev/ublk-control /dev/loop-control; do
    test -c "$dev" || { echo "no $dev" >&2; exit 1; }
done
for dev in /dev/nbd0 /dev/ram0 /dev/nullb0; do
    test -b "$dev" || { echo "no $dev" >&2; exit 1; }
done
test -d /sys/kernel/config/nvmet || { echo "no nvmet in configfs" >&2; exit 1; }
echo "devices: ok"

# ext4 on the kernel's RAM disk: write, read back after a remount, fsck.
mkfs.ext4 -q -F /dev/ram0
mkdir -p /mnt/ram
mount /dev/ram0 /mnt/ram
head -c 8M /dev/urandom >/mnt/ram/data
sum=$(sha256sum </mnt/ram/data)
umount /mnt/ram
mount -o ro /dev/ram0 /mnt/ram
test "$(sha256sum </mnt/ram/data)" = "$sum"
umount /mnt/ram
e2fsck -fn /dev/ram0 >/dev/null
echo "ext4 on ram0: ok"

# The guest's environment.
test "$(id -u)" = 0
test "$(hostname)" = ramd-guest
test "$HOME" = /root && touch /root/x /tmp/x
test -f Cargo.toml # the repository is the working directory
ip -o link show lo | grep -q 'state UNKNOWN\|UP'
echo "kernel $(uname -r)"

# The binary under test, from the host's build.
"$RAMD" --version
echo "artifact from the guest" >"$GUEST_RESULTS/artifact"
echo "to stderr" >&2

# A failing command's exit code is the script's.
sh -c 'exit 7'
"#;

#[test]
fn guest_kernel_has_the_block_drivers_and_runs_ramd() {
    if !guest::require_guest() {
        return;
    }
    let out = guest::run(SCRIPT);
    assert_eq!(
        out.code, 7,
        "the script should end with `exit 7` after its checks: {out}"
    );
    for line in ["devices: ok", "ext4 on ram0: ok", "kernel 6.12.", "ramd "] {
        assert!(
            out.stdout.contains(line),
            "guest stdout lacks {line:?}: {out}"
        );
    }
    assert!(out.stderr.contains("to stderr"), "guest stderr: {out}");
    assert_eq!(
        out.file("artifact").as_deref(),
        Some("artifact from the guest\n"),
        "a file left in $GUEST_RESULTS: {out}"
    );
    assert!(
        out.dmesg.contains("brd: module loaded"),
        "dmesg came back: {out}"
    );
}
