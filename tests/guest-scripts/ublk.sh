#!/usr/bin/env bash
# `ramd attach NAME --ublk` in the guest kernel of scripts/guest.sh (which
# has ublk_drv): ext4 with a checksummed file tree and fsck, fio verify
# (4 KiB random read/write, QD32, 4 jobs), discard giving memory back, a
# read-only drive refusing writes, detach refused while mounted, and user
# recovery: ramd killed with SIGKILL during fio on a mounted persistent
# (durability=flush) drive, restarted, the device resumed, fsck clean and
# every fsynced file intact; `ramd resize` saying the device keeps its
# size (6.12 has no UPDATE_SIZE; tests/guest_ublk_next.rs covers a kernel
# that does); `attach = "ublk"` in the config attaching a
# drive at start. tests/guest_ublk.rs runs it; by hand:
#
#   scripts/guest.sh run -e RAMD=$PWD/target/debug/ramd tests/guest-scripts/ublk.sh
#
# Every check prints "ok: ..." or stops the script with "FAILED: ...".
set -euo pipefail

RAMD=${RAMD:-$PWD/target/debug/ramd}
ramd_pid=

log() { echo "== $*"; }
ok() { echo "ok: $*"; }
fail() {
    echo "FAILED: $*" >&2
    echo "--- ramd log ---" >&2
    cat /tmp/ramd.log >&2 || true
    exit 1
}

log_has() { # PATTERN: waits up to 10 s for it in ramd's log (written by its own thread)
    local i
    for i in $(seq 100); do
        grep -q -- "$1" /tmp/ramd.log && return 0
        sleep 0.1
    done
    return 1
}

start_ramd() {
    "$RAMD" daemon --no-config --drive db=256M --drive ro=64M,read-only \
        --drive pdb=256M,persist,durability=flush >>/tmp/ramd.log 2>&1 &
    ramd_pid=$!
    local i
    for i in $(seq 600); do
        "$RAMD" list >/dev/null 2>&1 && return 0
        kill -0 "$ramd_pid" 2>/dev/null || fail "ramd exited at start"
        sleep 0.1
    done
    fail "ramd did not answer within 60 s"
}

make_tree() { # dir manifest
    local d=$1 i sub
    mkdir -p "$d/a/b" "$d/c"
    for i in $(seq 1 30); do
        case $((i % 3)) in 0) sub=a/b ;; 1) sub=c ;; *) sub=. ;; esac
        head -c $((i * 7919 % 150001 + 1)) /dev/urandom >"$d/$sub/f$i"
    done
    head -c 4M /dev/urandom >"$d/big"
    (cd "$d" && find . -type f ! -path './lost+found/*' ! -name 'load*' -print0 | sort -z | xargs -0 sha256sum) >"$2"
}

verify_tree() { # dir manifest what
    (cd "$1" && sha256sum -c --quiet "$2") || fail "$3: files differ from their checksums"
    ok "$3: $(wc -l <"$2") files match their checksums"
}

# shows PATTERN CMD...: CMD's whole output holds PATTERN. (Not `CMD | grep
# -q`: grep may close the pipe before CMD has written everything, and
# pipefail then takes CMD's SIGPIPE for a failure.)
shows() {
    local pattern=$1 out
    shift
    out=$("$@" 2>/dev/null) || return 1
    grep -q -- "$pattern" <<<"$out"
}

allocated() { # drive
    "$RAMD" info "$1" --json | sed -n 's/.*"allocated_bytes": *\([0-9]*\).*/\1/p' | head -1
}

modprobe ublk_drv || fail "modprobe ublk_drv"
start_ramd

log "attach db --ublk"
dev=$("$RAMD" attach db --ublk)
[ -b "$dev" ] || fail "'$dev' is not a block device"
case $dev in /dev/ublkb[0-9]*) ;; *) fail "attach printed '$dev', not /dev/ublkbN" ;; esac
ok "attach printed $dev"
shows "ublk" "$RAMD" attach --list || fail "attach --list does not show the device"
shows '"kind": *"ublk"' "$RAMD" attach --list --json || fail "attach --list --json has no ublk kind"
shows "$dev" "$RAMD" info db || fail "ramd info db does not show $dev"
ok "attach --list, --json and ramd info show $dev"
[ "$(blockdev --getsize64 "$dev")" = $((256 << 20)) ] || fail "size $(blockdev --getsize64 "$dev")"
[ "$(blockdev --getss "$dev")" = 512 ] || fail "logical block size"
[ "$(blockdev --getpbsz "$dev")" = 4096 ] || fail "physical block size"
ok "size 256 MiB, 512 B logical and 4 KiB physical blocks"
echo "observed: $(ls /sys/block/$(basename "$dev")/mq | wc -l) hardware queues, depth $(cat /sys/block/$(basename "$dev")/mq/0/nr_tags)"

log "ext4, a checksummed tree, fsck"
mkfs.ext4 -q -F "$dev" || fail "mkfs.ext4"
mkdir -p /mnt/db
mount "$dev" /mnt/db
make_tree /mnt/db /tmp/db.sha
sync
if "$RAMD" detach db 2>/tmp/detach.err; then fail "detach while mounted succeeded"; fi
grep -q "in use" /tmp/detach.err || fail "detach refusal says: $(cat /tmp/detach.err)"
ok "detach while mounted refused: $(head -c 160 /tmp/detach.err)"
umount /mnt/db
fsck.ext4 -fn "$dev" >/tmp/fsck.out 2>&1 || { cat /tmp/fsck.out; fail "fsck after unmount"; }
ok "fsck clean"
mount "$dev" /mnt/db
verify_tree /mnt/db /tmp/db.sha "db after remount"
umount /mnt/db

log "fio verify: 4 KiB randrw, QD32 x 4 jobs"
fio --name=verify --filename="$dev" --ioengine=libaio --direct=1 --rw=randrw --bs=4k \
    --iodepth=32 --numjobs=4 --size=16M --offset_increment=16M --verify=crc32c \
    --do_verify=1 --verify_fatal=1 --group_reporting --output=/tmp/fio.out ||
    { cat /tmp/fio.out; fail "fio verify"; }
grep -qi "err= 0" /tmp/fio.out || { cat /tmp/fio.out; fail "fio reported errors"; }
ok "fio verify passed ($(grep -o 'IOPS=[^,]*' /tmp/fio.out | tr '\n' ' '))"

log "discard frees memory"
before=$(allocated db)
blkdiscard "$dev" || fail "blkdiscard"
after=$(allocated db)
[ "$before" -gt $((32 << 20)) ] || fail "only $before bytes allocated before the discard"
[ "$after" -lt $((1 << 20)) ] || fail "$after bytes still allocated after blkdiscard (before: $before)"
ok "blkdiscard: allocated $before -> $after bytes"

log "a read-only drive"
rodev=$("$RAMD" attach ro --ublk)
[ "$(blockdev --getro "$rodev")" = 1 ] || fail "$rodev is not read-only"
if dd if=/dev/zero of="$rodev" bs=4k count=1 oflag=direct 2>/tmp/dd.err; then fail "a write to $rodev succeeded"; fi
ok "writes to $rodev refused: $(tail -1 /tmp/dd.err)"
dd if="$rodev" of=/dev/null bs=64k count=16 iflag=direct 2>/dev/null || fail "read of $rodev"
ok "reads of $rodev work"
"$RAMD" detach "$rodev" >/dev/null || fail "detach $rodev"

log "resize on a kernel without UBLK_F_UPDATE_SIZE (6.12)"
"$RAMD" resize db 320M >/tmp/resize.out 2>&1 || { cat /tmp/resize.out; fail "ramd resize db 320M"; }
grep -q "$dev keeps its old size" /tmp/resize.out || { cat /tmp/resize.out; fail "resize did not say the device keeps its size"; }
[ "$(blockdev --getsize64 "$dev")" = $((256 << 20)) ] || fail "$dev changed size on a kernel that cannot"
ok "ramd resize: $dev keeps 256 MiB and ramd says so"
"$RAMD" detach db >/dev/null || fail "detach db"
[ ! -e "$dev" ] || fail "$dev still exists after detach"
ok "detach removed the devices"

log "user recovery: kill -9 during fio on a mounted persistent drive"
pdev=$("$RAMD" attach pdb --ublk)
mkfs.ext4 -q -F "$pdev" || fail "mkfs.ext4 $pdev"
mkdir -p /mnt/p
mount "$pdev" /mnt/p
make_tree /mnt/p /tmp/p.sha
sync -f /mnt/p/big
sync
fio --name=load --directory=/mnt/p --ioengine=libaio --direct=1 --rw=randwrite --bs=4k \
    --iodepth=32 --size=32M --time_based --runtime=20 --fsync=64 --output=/tmp/fio-load.out &
fio_pid=$!
sleep 4
kill -KILL "$ramd_pid"
wait "$ramd_pid" 2>/dev/null || true
ok "ramd killed during fio"
sleep 1
[ -b "$pdev" ] || fail "$pdev vanished when ramd died"
ok "$pdev still present while ramd is down (I/O held)"
start_ramd
for i in $(seq 300); do
    shows "$pdev" "$RAMD" attach --list && break
    sleep 0.1
done
shows "$pdev" "$RAMD" attach --list || fail "the restarted ramd did not take $pdev over"
log_has "recovered" || fail "no recovery in the log"
ok "restarted ramd recovered $pdev"
wait "$fio_pid" || { cat /tmp/fio-load.out; fail "fio across the restart failed"; }
ok "fio finished across the restart ($(grep -o 'IOPS=[^,]*' /tmp/fio-load.out))"
verify_tree /mnt/p /tmp/p.sha "pdb after recovery"
umount /mnt/p
fsck.ext4 -fn "$pdev" >/tmp/fsck.out 2>&1 || { cat /tmp/fsck.out; fail "fsck after recovery"; }
ok "fsck clean after recovery"
"$RAMD" detach pdb >/dev/null || fail "detach pdb"
kill "$ramd_pid"
wait "$ramd_pid" 2>/dev/null || true

log "attach = \"ublk\" in the config: a device at start, removed at stop"
cat >/tmp/ramd-attach.toml <<'TOML'
[[drive]]
name = "cfg"
size = "64M"
attach = "ublk"

[[drive]]
name = "plain"
size = "16M"
TOML
"$RAMD" daemon --config /tmp/ramd-attach.toml >>/tmp/ramd.log 2>&1 &
ramd_pid=$!
cdev=
for i in $(seq 600); do
    cdev=$("$RAMD" attach --list --json 2>/dev/null | grep -o '/dev/ublkb[0-9]*' | head -1 || true)
    [ -n "$cdev" ] && break
    kill -0 "$ramd_pid" 2>/dev/null || fail "ramd with the config exited at start"
    sleep 0.1
done
[ -n "$cdev" ] || { "$RAMD" attach --list; fail "drive cfg has no ublk device after start"; }
[ -b "$cdev" ] || fail "'$cdev' is not a block device"
[ "$(blockdev --getsize64 "$cdev")" = $((64 << 20)) ] || fail "size of $cdev"
# Whole output first: grep -q would close the pipe early (SIGPIPE, and
# pipefail would call that a failure).
listed=$("$RAMD" attach --list --json)
grep -q '"drive": *"cfg"' <<<"$listed" || fail "the device is not cfg's: $listed"
if grep -q '"drive": *"plain"' <<<"$listed"; then fail "drive plain got a device it did not ask for"; fi
log_has "attached as $cdev (config" || fail "the start log does not say cfg was attached"
ok "drive cfg attached at start as $cdev"
kill "$ramd_pid"
wait "$ramd_pid" 2>/dev/null || true
[ ! -e "$cdev" ] || fail "$cdev outlived a graceful stop"
ok "a graceful stop removed $cdev"
echo "all ublk checks passed"
