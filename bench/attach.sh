#!/usr/bin/env bash
# The local block path: a loop device (direct I/O) over `ramd attach`'s
# FUSE file, beside a loop device over a file on tmpfs (kernel only), in
# one run. fio libaio O_DIRECT on the loop device: 4 KiB randrw QD64x2,
# 4 KiB QD1 read and write, 1 MiB sequential read and write (QD8); then a
# build-like file workload on ext4 over each loop device (untar a source
# tree 20 times, find, read every file back, sync).
#
#   bench/attach.sh                        # 3 runs, 10 s per fio workload
#   RUNS=1 RUNTIME=5 bench/attach.sh
#   RAMD=/tmp/ramd QUEUES=1,2,4 bench/attach.sh
#
# Knobs (environment):
#   RUNS     runs (default 3); figures are medians across runs
#   RUNTIME  seconds per fio workload (default 10; 2 s ramp before)
#   SIZE     drive and tmpfs file size (default 2G)
#   QUEUES   comma list of FUSE queue counts to measure (default: ramd's
#            default only); each is one more column (RAMD_FUSE_QUEUES)
#   URING    1 to add a column with FUSE over io_uring (needs the kernel's
#            fuse enable_uring parameter; the script sets it and restores it)
#   OUT      output directory (default bench/results/YYYYmmdd-HHMMSS-attach)
#   RAMD     a ramd binary to use instead of building target/release/ramd
#
# Needs root, fio, e2fsprogs, util-linux (losetup), git (for the tree).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
runs=${RUNS:-3}
runtime=${RUNTIME:-10}
size=${SIZE:-2G}
out=${OUT:-$here/results/$(date +%Y%m%d-%H%M%S)-attach}
mkdir -p "$out"
[ "$(id -u)" = 0 ] || { echo "bench/attach.sh needs root (losetup, mount)" >&2; exit 2; }

bin="$out/ramd"
if [ -n "${RAMD:-}" ]; then
  cp "$RAMD" "$bin"
else
  cargo build --release --manifest-path "$root/Cargo.toml" >&2
  cp "$root/target/release/ramd" "$bin"
fi

work=$(mktemp -d /tmp/ramd-attach-bench.XXXXXX)
loops=()
mounts=()
daemon=
cleanup() {
  set +e
  for m in "${mounts[@]}"; do umount "$m" 2>/dev/null; done
  for l in "${loops[@]}"; do losetup -d "$l" 2>/dev/null; done
  [ -n "$daemon" ] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null
  umount "$work/tmpfs" 2>/dev/null
  [ -n "${uring_was:-}" ] && echo "$uring_was" > /sys/module/fuse/parameters/enable_uring
  rm -rf "$work"
}
trap cleanup EXIT

# The source tree for the file workload: this repository's tracked files.
git -C "$root" archive --format=tar HEAD > "$work/tree.tar"

fio_json() { # device name rw bs depth jobs
  local dev=$1 name=$2 rw=$3 bs=$4 depth=$5 jobs=$6
  fio --name="$name" --filename="$dev" --ioengine=libaio --direct=1 --rw="$rw" \
      --bs="$bs" --iodepth="$depth" --numjobs="$jobs" --group_reporting \
      --time_based --ramp_time=2 --runtime="$runtime" --size="$size" \
      --randrepeat=0 --norandommap --output-format=json
}

workloads="randrw4k_qd64x2:randrw:4k:64:2 read4k_qd1:randread:4k:1:1 write4k_qd1:randwrite:4k:1:1 read1m_qd8:read:1m:8:1 write1m_qd8:write:1m:8:1"

measure() { # label device run
  local label=$1 dev=$2 run=$3
  for w in $workloads; do
    IFS=: read -r name rw bs depth jobs <<<"$w"
    fio_json "$dev" "$name" "$rw" "$bs" "$depth" "$jobs" > "$out/$label.$name.run$run.json"
  done
  # The file workload on ext4 (made fresh; a loop device with direct I/O).
  mkfs.ext4 -q -F -E nodiscard "$dev"
  local mnt="$work/mnt-$label"
  mkdir -p "$mnt" && mount -o noatime "$dev" "$mnt" && mounts+=("$mnt")
  local t0 t1 t2 t3
  t0=$(date +%s.%N)
  for i in $(seq 1 20); do mkdir -p "$mnt/t$i" && tar -xf "$work/tree.tar" -C "$mnt/t$i"; done
  sync -f "$mnt"
  t1=$(date +%s.%N)
  echo 3 > /proc/sys/vm/drop_caches
  find "$mnt" -type f | wc -l > /dev/null
  t2=$(date +%s.%N)
  find "$mnt" -type f -exec cat {} + > /dev/null
  t3=$(date +%s.%N)
  umount "$mnt"
  /usr/bin/python3 -c 'import json, sys; t = [float(x) for x in sys.argv[1:]]
print(json.dumps({"untar_sync_s": t[1] - t[0], "find_cold_s": t[2] - t[1], "read_all_s": t[3] - t[2]}))' \
    "$t0" "$t1" "$t2" "$t3" > "$out/$label.files.run$run.json"
}

loop_over() { # file: sets $dev to a new loop device over it (direct I/O)
  dev=$(losetup -f --show --direct-io=on "$1")
  loops+=("$dev")
}

loop_off() { # detach $dev and forget it
  losetup -d "$dev"
  local keep=() l
  for l in "${loops[@]}"; do [ "$l" = "$dev" ] || keep+=("$l"); done
  loops=("${keep[@]}")
}

# tmpfs, kernel only.
mkdir -p "$work/tmpfs" && mount -t tmpfs -o size=$(( $(numfmt --from=iec "$size") + (64 << 20) )) tmpfs "$work/tmpfs"
truncate -s "$size" "$work/tmpfs/disk"

start_daemon() { # queue count ("" = default), uring 0/1
  mkdir -p "$work/run" "$work/mp"
  chmod 700 "$work/run"
  RAMD_FUSE_QUEUES=$1 RAMD_FUSE_URING=$2 "$bin" daemon --no-config --runtime-dir "$work/run" \
    --state-dir "$work/state" --drive "ram0=$size" >"$out/daemon.log" 2>&1 &
  daemon=$!
  export RAMD_API_SOCKET="$work/run/api.sock"
  for _ in $(seq 1 100); do
    "$bin" list >/dev/null 2>&1 && break
    sleep 0.1
  done
  "$bin" attach ram0 "$work/mp" | tee -a "$out/attach.txt" >&2
}

stop_daemon() {
  "$bin" detach "$work/mp" >/dev/null
  kill "$daemon"; wait "$daemon" || true; daemon=
}

columns=("tmpfs-loop")
IFS=, read -ra queue_list <<<"${QUEUES:-}"
[ ${#queue_list[@]} -eq 0 ] && queue_list=("")
for q in "${queue_list[@]}"; do columns+=("fuse-classic${q:+-q$q}"); done
if [ "${URING:-0}" = 1 ]; then
  uring_was=$(cat /sys/module/fuse/parameters/enable_uring)
  columns+=("fuse-uring")
fi

for run in $(seq 1 "$runs"); do
  echo "== run $run of $runs" >&2
  for col in "${columns[@]}"; do
    echo "-- $col" >&2
    case $col in
      tmpfs-loop)
        loop_over "$work/tmpfs/disk"
        measure "$col" "$dev" "$run"
        loop_off ;;
      fuse-uring)
        echo Y > /sys/module/fuse/parameters/enable_uring
        start_daemon "" 1
        loop_over "$work/mp/ram0"
        measure "$col" "$dev" "$run"
        loop_off
        stop_daemon
        echo "$uring_was" > /sys/module/fuse/parameters/enable_uring ;;
      fuse-classic*)
        q=${col#fuse-classic}; q=${q#-q}
        start_daemon "$q" 0
        loop_over "$work/mp/ram0"
        measure "$col" "$dev" "$run"
        loop_off
        stop_daemon ;;
    esac
  done
done

/usr/bin/python3 "$here/attach_summary.py" "$out" "${columns[@]}" | tee "$out/summary.md"
