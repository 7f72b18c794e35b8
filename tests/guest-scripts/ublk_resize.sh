#!/usr/bin/env bash
# `ramd resize` reaching a live /dev/ublkbN (UBLK_F_UPDATE_SIZE, Linux
# 6.16+), in the second guest (RAMD_GUEST_NEXT=1: Debian unstable's
# kernel): ext4 mounted on the device, the drive grown, the device's size
# follows at once, resize2fs grows the mounted filesystem, every file
# intact; a drive shrunk (--force) shrinks its device too. Run by
# tests/guest_ublk_next.rs; by hand:
#
#   RAMD_GUEST_NEXT=1 scripts/guest.sh run -e RAMD=$PWD/target/debug/ramd tests/guest-scripts/ublk_resize.sh
set -euo pipefail

RAMD=${RAMD:-$PWD/target/debug/ramd}
ok() { echo "ok: $*"; }
fail() {
    echo "FAILED: $*" >&2
    echo "--- ramd log ---" >&2
    cat /tmp/ramd.log >&2 || true
    exit 1
}

echo "kernel $(uname -r)"
modprobe ublk_drv || fail "modprobe ublk_drv"
"$RAMD" daemon --no-config --drive db=64M --drive small=64M >>/tmp/ramd.log 2>&1 &
ramd_pid=$!
for i in $(seq 600); do
    "$RAMD" list >/dev/null 2>&1 && break
    kill -0 "$ramd_pid" 2>/dev/null || fail "ramd exited at start"
    sleep 0.1
done

dev=$("$RAMD" attach db --ublk)
[ "$(blockdev --getsize64 "$dev")" = $((64 << 20)) ] || fail "initial size of $dev"
mkfs.ext4 -q -F "$dev" || fail "mkfs.ext4"
mkdir -p /mnt/db
mount "$dev" /mnt/db
head -c 20M /dev/urandom >/mnt/db/data
sum=$(sha256sum </mnt/db/data)
sync

"$RAMD" resize db 128M >/tmp/resize.out 2>&1 || { cat /tmp/resize.out; fail "ramd resize db 128M"; }
grep -q "$dev now has $((128 << 20)) bytes" /tmp/resize.out || { cat /tmp/resize.out; fail "resize did not say the device grew"; }
[ "$(blockdev --getsize64 "$dev")" = $((128 << 20)) ] || fail "$dev is $(blockdev --getsize64 "$dev") bytes after the resize"
ok "ramd resize db 128M: $dev is 128 MiB at once"
resize2fs "$dev" >/tmp/resize2fs.out 2>&1 || { cat /tmp/resize2fs.out; fail "online resize2fs"; }
blocks=$(df -k --output=size /mnt/db | tail -1 | tr -d ' ')
[ "$blocks" -gt $((100 << 10)) ] || fail "the mounted ext4 did not grow: $blocks KiB"
ok "online resize2fs grew the mounted ext4 to $blocks KiB"
head -c 40M /dev/urandom >/mnt/db/more || fail "writing into the grown space"
[ "$(sha256sum </mnt/db/data)" = "$sum" ] || fail "data changed across the resize"
umount /mnt/db
fsck.ext4 -fn "$dev" >/tmp/fsck.out 2>&1 || { cat /tmp/fsck.out; fail "fsck after the resize"; }
ok "files intact, fsck clean"

sdev=$("$RAMD" attach small --ublk)
"$RAMD" resize small 32M --force >/tmp/shrink.out 2>&1 || { cat /tmp/shrink.out; fail "ramd resize small 32M --force"; }
[ "$(blockdev --getsize64 "$sdev")" = $((32 << 20)) ] || fail "$sdev is $(blockdev --getsize64 "$sdev") bytes after the shrink"
ok "a shrunk drive's device shrinks too"
"$RAMD" detach db >/dev/null && "$RAMD" detach small >/dev/null || fail "detach"
kill "$ramd_pid"
wait "$ramd_pid" 2>/dev/null || true
echo "all ublk resize checks passed"
