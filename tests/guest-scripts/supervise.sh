#!/usr/bin/env bash
# `ramd daemon --supervise` in the guest kernel of scripts/guest.sh: the
# serving process killed with SIGKILL under real kernel clients of RAM
# (volatile) drives, and nothing they were acknowledged is lost:
# - a ublk device with ext4 mounted and fio writing: the device stays,
#   its I/O is held, the restarted process takes it over (user recovery of
#   a drive whose memory the supervisor kept); fio ends, every file matches
#   its checksum, fsck is clean;
# - an NVMe/TCP host with ext4 mounted: it reconnects (--ctrl-loss-tmo) to
#   the same namespace (same NGUID: the same memory), files intact, fsck
#   clean;
# - `ramd upgrade` to another binary during fio on the ublk device: the
#   device is taken over by the new binary, fio with verify goes on; and
#   with ext4 mounted over NVMe/TCP: the host reconnects, files intact;
# - `ramd info` counts the restarts and says why;
# - a persistent drive (durability=periodic, no sync before the kill) with
#   ext4 over ublk: kill -9 during fio, the memory and its dirty set are
#   adopted (nothing restored), fio goes on, files intact; after a clean
#   stop, a daemon *without* a supervisor restores it from its state
#   directory alone: every file there;
# - a compressed drive with ext4 over ublk: kill -9 during fio, its arena
#   and tables' shadow adopted, fio goes on, files intact, fsck clean.
# tests/guest_supervise.rs runs it; by hand:
#
#   scripts/guest.sh run -e RAMD=$PWD/target/debug/ramd tests/guest-scripts/supervise.sh
#
# Every check prints "ok: ..." or stops the script with "FAILED: ...".
set -euo pipefail

RAMD=${RAMD:-$PWD/target/debug/ramd}
ADDR=127.0.0.1
PORT=4420
HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:5a5a5a5a-0000-4000-8000-000000000031
sup_pid=

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

serving_pid() {
    "$RAMD" info --json 2>/dev/null | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["pid"])' 2>/dev/null
}

# Waits (60 s) for a serving process other than $1; prints its pid.
wait_serving() {
    local i p
    for i in $(seq 600); do
        p=$(serving_pid || true)
        if [ -n "$p" ] && [ "$p" != "$1" ]; then
            echo "$p"
            return 0
        fi
        kill -0 "$sup_pid" 2>/dev/null || fail "the supervisor exited"
        sleep 0.1
    done
    fail "no serving process within 60 s"
}

make_tree() { # dir manifest
    local d=$1 i
    mkdir -p "$d/a/b"
    for i in $(seq 1 20); do
        head -c $((i * 7919 % 150001 + 1)) /dev/urandom >"$d/a/f$i"
    done
    head -c 4M /dev/urandom >"$d/a/b/big"
    (cd "$d" && find . -type f ! -path './lost+found/*' ! -name 'load*' -print0 | sort -z | xargs -0 sha256sum) >"$2"
}

verify_tree() { # dir manifest what
    (cd "$1" && sha256sum -c --quiet "$2") || fail "$3: files differ from their checksums"
    ok "$3: $(wc -l <"$2") files match their checksums"
}

fresh_fs() { # dev dir manifest: ext4 on dev (no lazy init: the device may
    # stall under it at a kill), mounted on dir, with a tree and its checksums
    mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$1" || fail "mkfs.ext4 $1"
    mkdir -p "$2"
    mount "$1" "$2"
    make_tree "$2" "$3"
}

start_fio() { # name dir size seconds: 4 KiB random writes with verify in
    # the background; its pid in $fio_pid, its output in /tmp/fio-NAME.out
    fio --name="$1" --directory="$2" --ioengine=libaio --direct=1 --rw=randwrite --bs=4k \
        --iodepth=32 --size="$3" --time_based --runtime="$4" --verify=crc32c --verify_fatal=1 \
        --output="/tmp/fio-$1.out" &
    fio_pid=$!
}

kill_during_fio() { # drive dir manifest load what: ext4 over a ublk device
    # of the drive (left in $ublk_dev), kill -9 of the serving process
    # during fio with verify; fio goes on, every file matches, fsck is
    # clean; the device detached
    ublk_dev=$("$RAMD" attach "$1" --ublk)
    fresh_fs "$ublk_dev" "$2" "$3"
    start_fio "$4" "$2" 16M 12
    sleep 3
    kill -KILL "$pid"
    pid=$(wait_serving "$pid")
    wait "$fio_pid" || { cat "/tmp/fio-$4.out"; fail "fio (with verify) on the $5 across the kill failed"; }
    ok "$5: fio with verify went on across the kill"
    echo 3 >/proc/sys/vm/drop_caches
    verify_tree "$2" "$3" "$5 after kill -9"
    umount "$2"
    e2fsck -fn "$ublk_dev" >/tmp/fsck.log 2>&1 || { cat /tmp/fsck.log >&2; fail "e2fsck of the $5"; }
    "$RAMD" detach "$1" >/dev/null
}

dev_of() { # nqn: its namespace's block device, waited for (20 s)
    local i b
    for i in $(seq 200); do
        for b in /sys/block/nvme*; do
            case ${b##*/} in nvme*c*n*) continue ;; esac
            [ "$(cat "$b/device/subsysnqn" 2>/dev/null)" = "$1" ] && { echo "/dev/${b##*/}"; return 0; }
        done
        sleep 0.1
    done
    return 1
}

modprobe ublk_drv || fail "modprobe ublk_drv"
modprobe nvme-tcp || fail "modprobe nvme-tcp"
PDRIVE="pd=128M,persist,durability=periodic,sync-interval=1h"
"$RAMD" daemon --supervise --no-config --drive db=256M --drive nv=128M --drive "$PDRIVE" \
    --drive cz=128M,compress=lz4 \
    --state-dir /tmp/ramd-state --nvme-listen "$ADDR:$PORT" >>/tmp/ramd.log 2>&1 &
sup_pid=$!
pid=$(wait_serving 0)
ok "supervised: serving process $pid, supervisor $sup_pid"

log "ublk: kill -9 of the serving process during fio on a mounted RAM drive"
dev=$("$RAMD" attach db --ublk)
fresh_fs "$dev" /mnt/u /tmp/u.sha
start_fio load /mnt/u 32M 15
sleep 4
kill -KILL "$pid"
ok "serving process $pid killed during fio"
pid=$(wait_serving "$pid")
[ -b "$dev" ] || fail "$dev vanished"
for i in $(seq 300); do
    "$RAMD" attach --list 2>/dev/null | grep "$dev" >/dev/null && break
    sleep 0.1
done
log_has "recovered" || fail "no ublk recovery in the log"
ok "serving process $pid took $dev over"
wait "$fio_pid" || { cat /tmp/fio-load.out; fail "fio (with verify) across the kill failed"; }
ok "fio with verify went on across the kill"
echo 3 >/proc/sys/vm/drop_caches
verify_tree /mnt/u /tmp/u.sha "ublk after kill -9"

log "ublk: ramd upgrade during fio on the mounted RAM drive"
cp "$RAMD" /tmp/ramd-new
start_fio load2 /mnt/u 32M 12
sleep 3
"$RAMD" upgrade --binary /tmp/ramd-new >/tmp/upgrade.out 2>&1 || { cat /tmp/upgrade.out; fail "ramd upgrade"; }
grep "upgraded: pid" /tmp/upgrade.out >/dev/null || { cat /tmp/upgrade.out; fail "ramd upgrade said nothing"; }
pid=$(serving_pid)
[ "$(readlink "/proc/$pid/exe")" = /tmp/ramd-new ] || fail "the serving process is not the new binary: $(readlink "/proc/$pid/exe")"
wait "$fio_pid" || { cat /tmp/fio-load2.out; fail "fio (with verify) across the upgrade failed"; }
ok "upgraded to /tmp/ramd-new (pid $pid) while fio with verify went on"
echo 3 >/proc/sys/vm/drop_caches
verify_tree /mnt/u /tmp/u.sha "ublk after the upgrade"
umount /mnt/u
e2fsck -fn "$dev" >/tmp/fsck.log 2>&1 || { cat /tmp/fsck.log >&2; fail "e2fsck after kill -9"; }
ok "e2fsck clean"
"$RAMD" detach db >/dev/null

log "NVMe/TCP: kill -9 of the serving process with ext4 mounted"
nqn=$("$RAMD" info nv --json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["nvme_nqn"])')
nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$nqn" -q "$HOSTNQN" --ctrl-loss-tmo=60 \
    --reconnect-delay=1 >/dev/null || fail "nvme connect"
ndev=$(dev_of "$nqn") || fail "no block device for $nqn"
nguid=$(cat "/sys/block/${ndev#/dev/}/nguid" 2>/dev/null || cat "/sys/block/${ndev#/dev/}/wwid")
fresh_fs "$ndev" /mnt/n /tmp/n.sha
sync
kill -KILL "$pid"
pid=$(wait_serving "$pid")
echo 3 >/proc/sys/vm/drop_caches
verify_tree /mnt/n /tmp/n.sha "NVMe/TCP after kill -9 and reconnect"
now=$(cat "/sys/block/${ndev#/dev/}/nguid" 2>/dev/null || cat "/sys/block/${ndev#/dev/}/wwid")
[ "$now" = "$nguid" ] || fail "the namespace changed identity ($nguid -> $now)"
log "NVMe/TCP: ramd upgrade with ext4 mounted"
"$RAMD" upgrade --binary /tmp/ramd-new >/tmp/upgrade2.out 2>&1 || { cat /tmp/upgrade2.out; fail "ramd upgrade (NVMe/TCP)"; }
pid=$(serving_pid)
echo 3 >/proc/sys/vm/drop_caches
verify_tree /mnt/n /tmp/n.sha "NVMe/TCP after ramd upgrade and reconnect"
echo more >/mnt/n/after-upgrade && sync || fail "a write over NVMe/TCP after the upgrade failed"
now=$(cat "/sys/block/${ndev#/dev/}/nguid" 2>/dev/null || cat "/sys/block/${ndev#/dev/}/wwid")
[ "$now" = "$nguid" ] || fail "the namespace changed identity across the upgrade ($nguid -> $now)"
umount /mnt/n
e2fsck -fn "$ndev" >/tmp/fsck.log 2>&1 || { cat /tmp/fsck.log >&2; fail "e2fsck after kill -9"; }
ok "same namespace ($nguid), e2fsck clean"
nvme disconnect -n "$nqn" >/dev/null

info=$("$RAMD" info)
[[ $info == *"supervisor"*"4 restart(s), last: upgrade"* ]] || fail "ramd info does not count the restarts: $info"
ok "ramd info: 4 restarts (2 kills, 2 upgrades), last an upgrade"

log "persistent drive over ublk: kill -9 during fio, nothing synced since"
kill_during_fio pd /mnt/p /tmp/p.sha load3 "persistent drive"
pdev=$ublk_dev
log_has "kept across a restart of the serving process: its memory adopted" ||
    fail "the persistent drive was not adopted"
ok "persistent drive adopted (not restored)"

log "compressed drive over ublk: kill -9 during fio"
kill_during_fio cz /mnt/c /tmp/c.sha load4 "compressed drive"

kill -TERM "$sup_pid"
wait "$sup_pid" || fail "the supervisor did not exit 0 on SIGTERM"
ok "SIGTERM stopped the supervisor and the serving process"

log "the persistent drive from its state directory alone, without a supervisor"
"$RAMD" daemon --no-config --drive "$PDRIVE" --state-dir /tmp/ramd-state >>/tmp/ramd2.log 2>&1 &
plain=$!
for i in $(seq 600); do
    st=$("$RAMD" info pd --json 2>/dev/null | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])' 2>/dev/null || true)
    [ "$st" = ready ] && break
    sleep 0.1
done
[ "$st" = ready ] || { cat /tmp/ramd2.log >&2; fail "the persistent drive did not come back (state: $st)"; }
pdev=$("$RAMD" attach pd --ublk)
e2fsck -fn "$pdev" >/tmp/fsck.log 2>&1 || { cat /tmp/fsck.log >&2; fail "e2fsck of the restored drive"; }
mount -o ro "$pdev" /mnt/p
verify_tree /mnt/p /tmp/p.sha "persistent drive restored from its directory"
umount /mnt/p
"$RAMD" detach pd >/dev/null
kill -TERM "$plain"
wait "$plain" || fail "the unsupervised daemon did not exit 0 on SIGTERM"
echo "all supervise checks passed"
