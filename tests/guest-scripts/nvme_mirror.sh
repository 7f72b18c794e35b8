#!/usr/bin/env bash
# A RAM drive that survives the loss of one host: the kernel's md RAID1
# over two ramd daemons' drives, each reached with the kernel's NVMe/TCP
# initiator, as docs/nvme.md "Mirroring across hosts" tells users. In the
# guest kernel of scripts/guest.sh, two daemons stand for two hosts (two
# ports, two runtime and state directories, one drive "leg" each):
#
#   near  port 4420, the leg reads go to; its drive persistent
#         (durability=flush)
#   far   port 4421, the leg added --write-mostly (a remote host's); its
#         drive in RAM only
#
# The mirror is built (--bitmap=internal), ext4 with checksummed files;
# then kill -9 of far: writes stall until the host gives the controller up
# (--ctrl-loss-tmo 5) and md fails the leg, then continue degraded. far is
# started again the way a lost host comes back: its RAM drive is empty,
# so the leg is removed, connected again, added and fully resynced. Then
# near is failed out and every checksum, and fsck, read from the resynced
# far leg alone. near (its data intact: it was only failed) comes back
# with --re-add, a partial resync through the internal bitmap. Last, the
# near daemon is stopped (SIGTERM: its persistent drive synced) and
# started again: its drive comes back with everything md wrote to it,
# --re-add resyncs what the bitmap marks, and every checksum is read from
# near alone. Then kill -9 of near: a crashed leg may lack writes md
# counts as done on it, so its superblock is wiped and it is added and
# resynced in full, and read alone once more.
# tests/guest_nvme_mirror.rs runs it; by hand:
#
#   scripts/guest.sh run -e RAMD=$PWD/target/debug/ramd tests/guest-scripts/nvme_mirror.sh
#
# Every check prints "ok: ..." or stops the script with "FAILED: ..." (and
# both daemons' logs, /proc/mdstat and the kernel's nvme and md messages).
set -euo pipefail

RAMD=${RAMD:-$PWD/target/debug/ramd}
ADDR=127.0.0.1
SIZE=128M
HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:66666666-7777-8888-9999-000000000000
# How long the host keeps a lost controller reconnecting (queueing its
# I/O) before it deletes it and fails the I/O: the time md waits before it
# sees the leg fail and goes on degraded. The default (600 s) would hang
# every write to the mirror for 10 minutes after a host dies.
CTRL_LOSS_TMO=5
declare -A port=([near]=4420 [far]=4421) pid=() nqn=() dev=()

log() { echo "== $*"; }
ok() { echo "ok: $*"; }
fail() {
    local n
    echo "FAILED: $*" >&2
    for n in near far; do
        echo "--- ramd $n log ---" >&2
        tail -30 "/tmp/ramd-$n.log" >&2 || true
    done
    echo "--- /proc/mdstat ---" >&2
    cat /proc/mdstat >&2 || true
    echo "--- dmesg ---" >&2
    dmesg | grep -iE 'nvme|md0|md/raid1|raid1' | tail -40 >&2 || true
    exit 1
}

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# Polls CMD... every 0.2 s until it succeeds, for at most SECS.
wait_for() { # secs what cmd...
    local secs=$1 what=$2 end
    shift 2
    end=$((SECONDS + secs))
    until "$@"; do
        [ "$SECONDS" -lt "$end" ] || fail "$what: not within $secs s"
        sleep 0.2
    done
}

# ramd's client against one daemon.
rd() { # near|far args...
    local n=$1
    shift
    "$RAMD" "$@" --api-socket "/run/ramd-$n/api.sock"
}

start_ramd() { # near|far
    local n=$1
    mkdir -p "/run/ramd-$n" "/var/lib/ramd-$n"
    local drive=leg=$SIZE
    # near's drive is persistent (flushed writes survive a kill), far's
    # lives in RAM only.
    [ "$n" = near ] && drive=$drive,persist,durability=flush
    "$RAMD" daemon --no-config --runtime-dir "/run/ramd-$n" --state-dir "/var/lib/ramd-$n" \
        --drive "$drive" --nvme-listen "$ADDR:${port[$n]}" >>"/tmp/ramd-$n.log" 2>&1 &
    pid[$n]=$!
    local i
    for i in $(seq 600); do
        rd "$n" list >/dev/null 2>&1 && break
        kill -0 "${pid[$n]}" 2>/dev/null || fail "ramd $n exited at start"
        sleep 0.1
    done
    # A persistent drive is restored in the background: wait for it.
    wait_for 120 "ramd $n's drive ready" restored "$n"
}

restored() { # near|far: its drive is ready (not restoring)
    local out
    out=$(rd "$1" info leg --json 2>/dev/null) || return 1
    [[ $out == *'"state": "ready"'* ]]
}

kill_ramd() { # near|far
    kill -KILL "${pid[$1]}"
    wait "${pid[$1]}" 2>/dev/null || true
}

# The subsystem NQN discovery lists for a daemon's drive.
nqn_of() { # near|far
    nvme discover -t tcp -a "$ADDR" -s "${port[$1]}" -q "$HOSTNQN" |
        awk '/subnqn:/ {print $2}' | grep ':leg$' || true
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

connect() { # near|far: connects its drive and sets dev[near|far]
    local n=$1
    nqn[$n]=$(nqn_of "$n")
    [ -n "${nqn[$n]}" ] || fail "discovery on port ${port[$n]} does not list the drive"
    nvme connect -t tcp -a "$ADDR" -s "${port[$n]}" -n "${nqn[$n]}" -q "$HOSTNQN" \
        --ctrl-loss-tmo="$CTRL_LOSS_TMO" --reconnect-delay=1 >/dev/null ||
        fail "nvme connect to $n"
    dev[$n]=$(dev_of "${nqn[$n]}") || fail "no block device for $n (${nqn[$n]})"
}

md_attr() { cat "/sys/block/md0/md/$1"; }
leg_state() { cat "/sys/block/md0/md/dev-${dev[$1]#/dev/}/state"; }
# Both legs in sync, no resync or recovery running or pending.
synced() {
    [ "$(md_attr degraded)" = 0 ] && [ "$(md_attr sync_action)" = idle ] &&
        [ "$(md_attr resync_start)" = none ]
}
degraded() { [ "$(md_attr degraded)" = 1 ]; }
# Waits for a resync as docs/nvme.md does (mdadm --wait, bounded here),
# notes in $waited whether that was enough, then polls to the end.
resync_wait() { # what
    timeout 300 mdadm --wait /dev/md0 >/dev/null 2>&1 || true
    if synced; then waited="mdadm --wait waited for it"; else waited="mdadm --wait returned early"; fi
    wait_for 300 "$1" synced
}

# The bitmap's chunk size and dirty chunks (read from the far leg).
dirty() { # when
    local out
    out=$(mdadm --examine-bitmap "${dev[far]}" 2>&1) || true
    echo "observed: bitmap $1: $(echo "$out" | grep -E 'Chunksize|Bitmap :' | tr -s ' ' | tr '\n' ';' || true)"
}

make_files() { # name: files under /mnt/md/NAME, their checksums added to /tmp/md.sha
    local d=/mnt/md/$1 i
    mkdir -p "$d"
    for i in $(seq 1 12); do
        head -c $((i * 7919 % 150001 + 1)) /dev/urandom >"$d/f$i"
    done
    head -c 3M /dev/urandom >"$d/big"
    (cd /mnt/md && sha256sum "$1"/*) >>/tmp/md.sha
}

# Every file written so far, read back from the disk (unmounted, caches
# dropped, mounted again), then an fsck of the unmounted filesystem.
check_all() { # what
    umount /mnt/md
    echo 3 >/proc/sys/vm/drop_caches
    mount /dev/md0 /mnt/md
    (cd /mnt/md && sha256sum --quiet -c /tmp/md.sha) || fail "$1: checksums differ"
    ok "$1: $(wc -l </tmp/md.sha) checksums match"
    umount /mnt/md
    e2fsck -fn /dev/md0 >/tmp/fsck.log 2>&1 || { cat /tmp/fsck.log >&2; fail "$1: e2fsck found errors"; }
    ok "$1: e2fsck clean"
    mount /dev/md0 /mnt/md
}

modprobe nvme-tcp
modprobe nvme-fabrics
modprobe raid1
[ -e /proc/mdstat ] || fail "no md in the guest kernel"

log "two daemons, one drive each, connected over NVMe/TCP"
start_ramd near
start_ramd far
connect near
connect far
[ "${nqn[near]}" != "${nqn[far]}" ] || fail "both daemons name their drive ${nqn[near]}"
ok "near ${dev[near]} (${nqn[near]}), far ${dev[far]} (${nqn[far]})"

log "md RAID1 over both, the far leg write-mostly, internal bitmap"
t=$(now)
# A 4 MiB bitmap chunk (mdadm picks 64 MiB here: 2 chunks for 128 MiB) so
# the --re-add below shows a partial resync.
mdadm --create /dev/md0 --level=1 --raid-devices=2 --bitmap=internal --bitmap-chunk=4M --run \
    "${dev[near]}" --write-mostly "${dev[far]}" >/tmp/mdadm.log 2>&1 ||
    { cat /tmp/mdadm.log >&2; fail "mdadm --create"; }
resync_wait "initial resync"
echo "observed: initial resync of $SIZE took $(since "$t") s ($waited)"
[[ $(leg_state far) == *write_mostly* ]] || fail "far leg is not write-mostly: $(leg_state far)"
[[ $(leg_state near) != *write_mostly* ]] || fail "near leg is write-mostly: $(leg_state near)"
ok "mirror in sync; far leg: $(leg_state far)"

log "ext4, checksummed files"
: >/tmp/md.sha
# No lazy initialisation: ext4 writes nothing in the background later.
mkfs.ext4 -q -E lazy_itable_init=0,lazy_journal_init=0 /dev/md0
mkdir -p /mnt/md
mount /dev/md0 /mnt/md
make_files before
sync
check_all "mirror of two legs"

log "kill -9 of the far daemon: I/O goes on degraded"
kill_ramd far
t=$(now)
make_files degraded
# The writes wait on the far leg until the host deletes its controller
# (ctrl-loss-tmo) and fails them; md then fails the leg and completes
# them on the near leg alone.
sync
stall=$(since "$t")
wait_for 60 "md failing the far leg" degraded
echo "observed: writes stalled $stall s after the kill (ctrl-loss-tmo $CTRL_LOSS_TMO s) until md failed the far leg"
mdstat=$(cat /proc/mdstat)
[[ $mdstat == *"[2/1]"* && $mdstat == *"[U_]"* && $mdstat == *"(F)"* ]] ||
    fail "/proc/mdstat does not show the failed far leg: $mdstat"
echo "observed: $(echo "$mdstat" | grep '^md0' || true)"
ok "/proc/mdstat shows the far leg failed: [2/1] [U_]"
t=$(now)
make_files degraded2
sync
echo "observed: degraded writes took $(since "$t") s (no stall)"
check_all "degraded, from the near leg"

log "far comes back empty (a lost host's RAM): remove, connect, add, full resync"
# Only now, after the host deleted far's controller: a daemon back within
# ctrl-loss-tmo would be reconnected to by the host on its own, and its
# empty drive (the same NQN and namespace ids) served to md as the old
# leg, with no error (docs/nvme.md, "Mirroring across hosts").
start_ramd far
allocated=$(rd far info leg --json | grep -o '"allocated_bytes": *[0-9]*' | grep -o '[0-9]*$' || true)
[ "$allocated" = 0 ] || fail "the restarted far drive is not empty: $allocated bytes allocated"
mdadm /dev/md0 --remove failed >/tmp/mdadm.log 2>&1 || { cat /tmp/mdadm.log >&2; fail "mdadm --remove failed"; }
old=${dev[far]}
connect far
ok "far connected again: ${dev[far]} (was $old)"
# An empty drive has no md superblock: --re-add is refused, --add
# rebuilds the whole leg.
mdadm /dev/md0 --re-add "${dev[far]}" >/tmp/mdadm.log 2>&1 && fail "--re-add took an empty drive"
t=$(now)
mdadm /dev/md0 --add --write-mostly "${dev[far]}" >/tmp/mdadm.log 2>&1 ||
    { cat /tmp/mdadm.log >&2; fail "mdadm --add"; }
resync_wait "full resync of the far leg"
echo "observed: full resync of the far leg ($SIZE) took $(since "$t") s ($waited)"
[[ $(leg_state far) == *in_sync*write_mostly* ]] || fail "far leg after resync: $(leg_state far)"
ok "far leg in sync again: $(leg_state far)"
make_files resynced
sync

log "fail the near leg: everything read from the resynced far leg alone"
mdadm /dev/md0 --fail "${dev[near]}" >/tmp/mdadm.log 2>&1 || { cat /tmp/mdadm.log >&2; fail "mdadm --fail near"; }
degraded || fail "md not degraded after failing near"
check_all "the resynced far leg alone"

log "near back with --re-add: the bitmap resyncs only what changed"
make_files far_only
sync
mdadm /dev/md0 --remove "${dev[near]}" >/tmp/mdadm.log 2>&1 || { cat /tmp/mdadm.log >&2; fail "mdadm --remove near"; }
dirty "after writes to far alone"
t=$(now)
mdadm /dev/md0 --re-add "${dev[near]}" >/tmp/mdadm.log 2>&1 || { cat /tmp/mdadm.log >&2; fail "mdadm --re-add near"; }
resync_wait "bitmap resync of the near leg"
echo "observed: --re-add resync of the near leg took $(since "$t") s ($waited)"
ok "near leg in sync again: $(leg_state near)"

log "the near daemon stopped and started again, its drive persistent: --re-add"
# SIGTERM: the daemon answers what it received, closes the connections and
# syncs the persistent drive, so what comes back holds every write md
# completed on it. (Not after kill -9: writes the drive acknowledged but
# had not flushed are lost, and md, which counted them as done on both
# legs, may have cleared their regions in the bitmap, so --re-add would
# not copy them. A crashed leg is --add'ed, in full, like an empty one.)
make_files before_near_stop
sync
kill -TERM "${pid[near]}"
wait "${pid[near]}" 2>/dev/null || true
t=$(now)
make_files near_down
sync
stall=$(since "$t")
wait_for 60 "md failing the near leg" degraded
echo "observed: writes stalled $stall s after the near daemon stopped until md failed the near leg"
mdstat=$(cat /proc/mdstat)
[[ $mdstat == *"[2/1]"* && $mdstat == *"[_U]"* ]] || fail "/proc/mdstat does not show the failed near leg: $mdstat"
ok "/proc/mdstat shows the near leg failed: [2/1] [_U]"
start_ramd near
info=$(rd near info leg --json)
restore_ms=$(echo "$info" | grep -o '"restore_duration_ms": *[0-9.]*' | grep -o '[0-9.]*$' || true)
echo "observed: the near drive was restored from its state directory in $(awk -v m="${restore_ms:-0}" 'BEGIN { printf "%.0f", m }') ms"
mdadm /dev/md0 --remove failed >/tmp/mdadm.log 2>&1 || { cat /tmp/mdadm.log >&2; fail "mdadm --remove failed"; }
connect near
dirty "while near was down"
t=$(now)
mdadm /dev/md0 --re-add "${dev[near]}" >/tmp/mdadm.log 2>&1 || { cat /tmp/mdadm.log >&2; fail "mdadm --re-add near"; }
resync_wait "bitmap resync of the near leg"
echo "observed: --re-add resync of the restarted near leg took $(since "$t") s ($waited)"
mdadm /dev/md0 --fail "${dev[far]}" >/tmp/mdadm.log 2>&1 || { cat /tmp/mdadm.log >&2; fail "mdadm --fail far"; }
check_all "the restarted, re-added near leg alone"

log "kill -9 of the near daemon: a crashed leg goes back in full"
mdadm /dev/md0 --remove failed >/tmp/mdadm.log 2>&1 || { cat /tmp/mdadm.log >&2; fail "mdadm --remove far"; }
mdadm /dev/md0 --re-add "${dev[far]}" >/tmp/mdadm.log 2>&1 || { cat /tmp/mdadm.log >&2; fail "mdadm --re-add far"; }
resync_wait "bitmap resync of the far leg"
ok "far leg in sync again: $(leg_state far)"
make_files before_near_kill
sync
kill_ramd near
make_files near_killed
sync
wait_for 60 "md failing the near leg" degraded
start_ramd near
mdadm /dev/md0 --remove failed >/tmp/mdadm.log 2>&1 || { cat /tmp/mdadm.log >&2; fail "mdadm --remove failed"; }
connect near
# mdadm --add re-adds a device that was a member recently: wipe its md
# superblock first, so the whole leg is copied.
mdadm --zero-superblock "${dev[near]}" >/tmp/mdadm.log 2>&1 || { cat /tmp/mdadm.log >&2; fail "mdadm --zero-superblock"; }
t=$(now)
mdadm /dev/md0 --add "${dev[near]}" >/tmp/mdadm.log 2>&1 || { cat /tmp/mdadm.log >&2; fail "mdadm --add near"; }
resync_wait "full resync of the near leg"
echo "observed: full resync of the crashed near leg took $(since "$t") s ($waited)"
mdadm /dev/md0 --fail "${dev[far]}" >/tmp/mdadm.log 2>&1 || { cat /tmp/mdadm.log >&2; fail "mdadm --fail far"; }
check_all "the crashed, fully resynced near leg alone"

log "stop"
umount /mnt/md
mdadm --stop /dev/md0 >/dev/null 2>&1 || fail "mdadm --stop"
nvme disconnect -n "${nqn[near]}" >/dev/null
nvme disconnect -n "${nqn[far]}" >/dev/null
for n in near far; do
    kill "${pid[$n]}"
    wait "${pid[$n]}" 2>/dev/null || true
done
echo "all nvme mirror checks passed"
