#!/usr/bin/env bash
# The kernel's NVMe/TCP initiator (nvme-tcp, nvme-cli) against ramd's own
# NVMe/TCP target, in the guest kernel of scripts/guest.sh, as docs/nvme.md
# tells users: nvme discover, nvme connect with 2 I/O queues, id-ctrl,
# id-ns, smart-log, error-log, ext4 with checksummed files and fsck, fio verify at
# QD32 over 2 jobs, trim, a read-only drive, a drive created and deleted
# while the host is connected, a host NQN off the allow-list (and one taken
# off it while connected), and kill -9
# of ramd with the host reconnecting to a persistent drive.
# tests/guest_nvme.rs runs it; by hand:
#
#   scripts/guest.sh run -e RAMD=$PWD/target/debug/ramd tests/guest-scripts/nvme.sh
#
# Every check prints "ok: ..." or stops the script with "FAILED: ..." (and
# ramd's log).
set -euo pipefail

RAMD=${RAMD:-$PWD/target/debug/ramd}
ADDR=127.0.0.1
PORT=4420
HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555
ramd_pid=

log() { echo "== $*"; }
ok() { echo "ok: $*"; }
fail() {
    echo "FAILED: $*" >&2
    echo "--- ramd log ---" >&2
    tail -50 /tmp/ramd.log >&2 || true
    echo "--- dmesg ---" >&2
    dmesg | grep -i nvme | tail -30 >&2 || true
    exit 1
}

start_ramd() {
    "$RAMD" daemon --no-config --drive db=256M --drive ro=32M,read-only \
        --drive pdb=64M,persist,durability=flush \
        --nvme-listen "$ADDR" >>/tmp/ramd.log 2>&1 &
    ramd_pid=$!
    local i
    for i in $(seq 600); do
        "$RAMD" list >/dev/null 2>&1 && return 0
        kill -0 "$ramd_pid" 2>/dev/null || fail "ramd exited at start"
        sleep 0.1
    done
    fail "ramd did not answer within 60 s"
}

# The NQN discovery lists for a drive.
nqn_of() { # drive
    nvme discover -t tcp -a "$ADDR" -s "$PORT" -q "$HOSTNQN" | awk '/subnqn:/ {print $2}' | grep ":$1\$" || true
}

# The block device of a connected subsystem, waited for (20 s).
dev_of() { # nqn
    local i b
    for i in $(seq 200); do
        for b in /sys/block/nvme*; do
            # nvmeXcYnZ: one path of a multipath head (no device node).
            case ${b##*/} in nvme*c*n*) continue ;; esac
            [ -e "$b/device/subsysnqn" ] || continue
            if [ "$(cat "$b/device/subsysnqn" 2>/dev/null)" = "$1" ]; then
                echo "/dev/${b##*/}"
                return 0
            fi
        done
        sleep 0.1
    done
    return 1
}

gone() { # nqn: its namespace's block device is gone within 20 s
    local i
    for i in $(seq 200); do
        dev_of_now "$1" || return 0
        sleep 0.1
    done
    return 1
}

dev_of_now() {
    local b
    for b in /sys/block/nvme*; do
        case ${b##*/} in nvme*c*n*) continue ;; esac
        [ -e "$b/device/subsysnqn" ] || continue
        [ "$(cat "$b/device/subsysnqn" 2>/dev/null)" = "$1" ] && return 0
    done
    return 1
}

connect() { # nqn [extra nvme connect options]
    local nqn=$1
    shift
    nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$nqn" -q "$HOSTNQN" "$@" >/dev/null
}

make_tree() { # dir manifest
    local d=$1 i
    mkdir -p "$d/a/b"
    for i in $(seq 1 20); do
        head -c $((i * 7919 % 150001 + 1)) /dev/urandom >"$d/a/f$i"
    done
    head -c 4M /dev/urandom >"$d/a/b/big"
    (cd "$d" && find . -type f ! -path './lost+found/*' -print0 | sort -z | xargs -0 sha256sum) >"$2"
}

check_tree() { # dir manifest what
    (cd "$1" && sha256sum --quiet -c "$2") || fail "$3: checksums differ"
    ok "$3: checksums match"
}

modprobe nvme-tcp
modprobe nvme-fabrics
start_ramd

log "nvme discover lists every drive"
DB=$(nqn_of db)
RO=$(nqn_of ro)
PDB=$(nqn_of pdb)
[ -n "$DB" ] && [ -n "$RO" ] && [ -n "$PDB" ] || fail "discovery did not list db, ro and pdb"
ok "discovery lists $DB"
info=$("$RAMD" info db)
[[ $info == *"$DB"* ]] || fail "ramd info db does not show the NQN"
ok "ramd info db shows the NQN"

log "nvme connect, 2 I/O queues"
connect "$DB" -i 2
DEV=$(dev_of "$DB") || fail "no block device for $DB"
ok "connected: $DEV"
info=$("$RAMD" info db)
[[ $info == *"nvme host"*"1 controller"* ]] || fail "ramd info db does not show the connected host: $info"
ok "ramd info db shows the connected host"
idctrl=$(nvme id-ctrl "$DEV")
[[ $idctrl == *ramd* ]] || fail "id-ctrl: no ramd model"
size=$(blockdev --getsize64 "$DEV")
[ "$size" = $((256 << 20)) ] || fail "size $size, not 256 MiB"
ok "id-ctrl and size"
nvme id-ns "$DEV" >/dev/null || fail "id-ns"
nvme smart-log "$DEV" >/dev/null || fail "smart-log"
ok "id-ns and smart-log"

log "ext4, checksummed files, fsck"
mkfs.ext4 -q "$DEV"
mkdir -p /mnt/db
mount "$DEV" /mnt/db
make_tree /mnt/db /tmp/db.sha
umount /mnt/db
echo 3 >/proc/sys/vm/drop_caches
mount "$DEV" /mnt/db
check_tree /mnt/db /tmp/db.sha "ext4 over NVMe/TCP"
log "fstrim frees memory"
before=$("$RAMD" info db --json | grep -o '"allocated_bytes": *[0-9]*' | grep -o '[0-9]*$' || echo 0)
rm -rf /mnt/db/a
sync
fstrim /mnt/db
after=$("$RAMD" info db --json | grep -o '"allocated_bytes": *[0-9]*' | grep -o '[0-9]*$' || echo 0)
echo "observed: allocated before trim $before, after $after"
[ "$after" -lt "$before" ] || fail "fstrim freed nothing ($before -> $after)"
ok "fstrim freed memory"
umount /mnt/db
e2fsck -fn "$DEV" >/tmp/fsck.log 2>&1 || { cat /tmp/fsck.log >&2; fail "e2fsck found errors"; }
ok "e2fsck clean"

log "fio verify, 4 KiB random, QD32, 2 jobs"
fio --name=v --filename="$DEV" --direct=1 --ioengine=libaio --rw=randwrite --bs=4k \
    --iodepth=32 --numjobs=2 --size=16M --offset_increment=32M --verify=crc32c \
    --verify_fatal=1 --group_reporting >/tmp/fio.log 2>&1 || { cat /tmp/fio.log >&2; fail "fio verify"; }
ok "fio verify passed"
nvme disconnect -n "$DB" >/dev/null
gone "$DB" || fail "$DEV still there after disconnect"
ok "disconnect"

log "a read-only drive"
connect "$RO"
RDEV=$(dev_of "$RO") || fail "no block device for $RO"
[ "$(blockdev --getro "$RDEV")" = 1 ] || fail "$RDEV is not read-only"
dd if=/dev/zero of="$RDEV" bs=4k count=1 oflag=direct 2>/dev/null && fail "a write to $RDEV succeeded"
dd if="$RDEV" of=/dev/null bs=4k count=1 iflag=direct 2>/dev/null || fail "a read of $RDEV failed"
ok "read-only namespace"
# A read past the end, sent as is (passthrough): its status, then its
# entry at the head of the controller's error log (the count, bytes 0-7,
# one more than before, whatever the host's own probes left there; the
# LBA, bytes 16-23).
elog() { nvme error-log "$RDEV" --log-entries=1 --output-format=binary | od -An -tu8 -j "$1" -N8 | tr -d ' '; }
before=$(elog 0)
nvme read "$RDEV" --start-block=$((1 << 40)) --block-count=0 --data-size=512 \
    --data=/tmp/past-end >/tmp/past-end.log 2>&1 && fail "a read past the end succeeded"
after=$(elog 0)
lba=$(elog 16)
echo "observed: error-log count ${before:-none} -> ${after:-none}, newest LBA ${lba:-none}; nvme read said: $(head -c 200 /tmp/past-end.log)"
[ "${after:-0}" = $((${before:-0} + 1)) ] && [ "${lba:-0}" = $((1 << 40)) ] ||
    fail "error-log: no entry for the failed read"
ok "a failed command is in the error log"
nvme disconnect -n "$RO" >/dev/null

log "a drive created and deleted while connected"
"$RAMD" create late --size 16M >/dev/null
LATE=$(nqn_of late)
[ -n "$LATE" ] || fail "discovery does not list a drive created at run time"
connect "$LATE"
LDEV=$(dev_of "$LATE") || fail "no block device for $LATE"
ok "created at run time: $LDEV"
"$RAMD" resize late 32M >/dev/null
for i in $(seq 200); do
    [ "$(blockdev --getsize64 "$LDEV")" = $((32 << 20)) ] && break
    sleep 0.1
done
[ "$(blockdev --getsize64 "$LDEV")" = $((32 << 20)) ] || fail "the host did not see the resize"
ok "resize seen by the host"
"$RAMD" delete late >/dev/null
gone "$LATE" || fail "the namespace of a deleted drive is still there"
ok "deleted drive's namespace went away"
nvme disconnect -n "$LATE" >/dev/null || true

log "a cache is served like a drive"
truncate -s 64M /tmp/cache-backing.img
"$RAMD" cache create c1 --backing /tmp/cache-backing.img --size 16M --mode writethrough >/dev/null
C1=$(nqn_of c1)
[ -n "$C1" ] || fail "discovery does not list the cache"
connect "$C1"
CDEV=$(dev_of "$C1") || fail "no block device for $C1"
head -c 1M /dev/urandom >/tmp/c1.bin
dd if=/tmp/c1.bin of="$CDEV" bs=1M count=1 oflag=direct 2>/dev/null || fail "a write to the cache failed"
cmp -n 1048576 /tmp/c1.bin /tmp/cache-backing.img || fail "writethrough: the backing file does not hold the write"
info=$("$RAMD" cache info c1)
[[ $info == *"$C1"* && $info == *"nvme host"*"1 controller"* ]] || fail "ramd cache info does not show the NQN and host: $info"
nvme disconnect -n "$C1" >/dev/null
"$RAMD" cache delete c1 >/dev/null
ok "cache over NVMe/TCP: written through to its backing, NQN and host in ramd cache info"

log "a host NQN off the allow-list is refused at connect"
"$RAMD" access db --allow-identity nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000000 >/dev/null
connect "$DB" 2>/dev/null && fail "a host off the allow-list connected"
ok "refused at connect"
"$RAMD" access db --allow-identity "$HOSTNQN" >/dev/null
connect "$DB" --ctrl-loss-tmo=5 --reconnect-delay=1 || fail "a listed host NQN was refused"
dev_of "$DB" >/dev/null || fail "no block device for a listed host"
ok "a listed host NQN connects"

log "an access change closes the controller of a host it no longer allows"
"$RAMD" access db --allow-identity nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000000 >/dev/null 2>/tmp/access.err
grep "closed 1 NVMe/TCP controller" /tmp/access.err >/dev/null || { cat /tmp/access.err >&2; fail "the access change did not report the closed controller"; }
gone "$DB" || fail "the namespace stayed after its host lost access"
nvme disconnect -n "$DB" >/dev/null 2>&1 || true
connect "$DB" 2>/dev/null && fail "a host that lost access connected again"
ok "controller closed, namespace gone, reconnect refused"

log "kill -9 of ramd: the host reconnects to a persistent drive"
connect "$PDB" --ctrl-loss-tmo=60 --reconnect-delay=1
PDEV=$(dev_of "$PDB") || fail "no block device for $PDB"
# No lazy initialisation: ext4 writes nothing in the background later.
mkfs.ext4 -q -E lazy_itable_init=0,lazy_journal_init=0 "$PDEV"
mkdir -p /mnt/pdb
mount "$PDEV" /mnt/pdb
make_tree /mnt/pdb /tmp/pdb.sha
# The drive promises what was flushed (durability=flush; the namespace has
# a volatile write cache): freezing flushes everything and holds further
# writes, so what the kill loses can only be what was never acknowledged
# as durable. Without the freeze ext4 may write (journal commit) between
# sync and the kill, and those writes are lost with the cache, as on a disk
# that loses power.
fsfreeze -f /mnt/pdb
kill -KILL "$ramd_pid"
wait "$ramd_pid" 2>/dev/null || true
start_ramd
fsfreeze -u /mnt/pdb
# I/O waits while the host reconnects; then the files read back.
echo 3 >/proc/sys/vm/drop_caches
check_tree /mnt/pdb /tmp/pdb.sha "after kill -9 and reconnect"
umount /mnt/pdb
e2fsck -fn "$PDEV" >/tmp/fsck.log 2>&1 || { cat /tmp/fsck.log >&2; fail "e2fsck after restart"; }
ok "e2fsck clean after restart"
nvme disconnect -n "$PDB" >/dev/null

kill "$ramd_pid"
wait "$ramd_pid" 2>/dev/null || true
echo "all nvme checks passed"
