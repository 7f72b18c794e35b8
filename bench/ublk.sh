#!/usr/bin/env bash
# ramd's ublk device against the kernel's brd (/dev/ram0), ramd's FUSE file
# under a loop device (direct I/O) and the kernel NBD client (/dev/nbd0 over
# ramd's unix socket), in one run on one machine: fio libaio O_DIRECT,
# 4 KiB random read / write / 50-50 mixed at QD1 and QD32, 1 MiB sequential
# read and write (QD8); medians of RUNS runs and each one's ratio to brd,
# plus ramd's CPU time per I/O on the ublk device.
#
#   bench/ublk.sh                                  # on a host with ublk_drv, nbd, brd
#   RUNS=3 RUNTIME=3 SIZE=256M bench/ublk.sh       # what the guest run used
#   scripts/guest.sh run --timeout 1200 -e RAMD=$PWD/target/release/ramd \
#       -e RUNTIME=3 -e SIZE=256M bench/ublk.sh    # in the guest kernel (TCG)
#
# Knobs (environment):
#   RUNS     runs (default 3); figures are medians across runs
#   RUNTIME  seconds per fio workload (default 10; 1 s ramp before)
#   SIZE     size of every device (default 1G; brd gets the same)
#   RAMD     the ramd binary (default target/release/ramd, else target/debug/ramd)
#   OUT      where results go (default: a temporary directory; printed)
#
# Needs root, fio, nbd-client, util-linux (losetup), python3, and the
# kernel's ublk_drv, brd and nbd modules. Starts its own ramd with its own
# runtime directory; stops it and removes every device at the end.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
runs=${RUNS:-3}
runtime=${RUNTIME:-10}
size=${SIZE:-1G}
RAMD=${RAMD:-}
if [ -z "$RAMD" ]; then
    for c in "$root/target/release/ramd" "$root/target/debug/ramd"; do
        [ -x "$c" ] && RAMD=$c && break
    done
fi
[ -x "${RAMD:-}" ] || { echo "no ramd binary: build it (cargo build --release) or set RAMD" >&2; exit 2; }
out=${OUT:-$(mktemp -d /tmp/ramd-ublk-bench.XXXXXX)}
mkdir -p "$out"
bytes=$(numfmt --from=iec "${size%B}")
rt=$(mktemp -d /tmp/ramd-ublk-rt.XXXXXX)
export XDG_RUNTIME_DIR=$rt XDG_STATE_HOME=$rt/state
mnt=$rt/fuse
ramd_pid= loopdev= nbd_up=

cleanup() {
    set +e
    [ -n "$nbd_up" ] && nbd-client -d /dev/nbd0 >/dev/null 2>&1
    [ -n "$loopdev" ] && losetup -d "$loopdev"
    if [ -n "$ramd_pid" ]; then
        "$RAMD" detach u >/dev/null 2>&1
        "$RAMD" detach "$mnt" >/dev/null 2>&1
        kill "$ramd_pid"; wait "$ramd_pid"
    fi
    rmmod brd 2>/dev/null
    rm -rf "$rt"
}
trap cleanup EXIT

modprobe ublk_drv
modprobe nbd
modprobe loop 2>/dev/null || true
rmmod brd 2>/dev/null || true
modprobe brd rd_nr=1 rd_size=$((bytes / 1024))

"$RAMD" daemon --no-config --drive u="$size" --drive f="$size" --drive n="$size" >"$out/ramd.log" 2>&1 &
ramd_pid=$!
for _ in $(seq 300); do "$RAMD" list >/dev/null 2>&1 && break; sleep 0.1; done
ublkdev=$("$RAMD" attach u --ublk)
mkdir -p "$mnt"
"$RAMD" attach f "$mnt" >/dev/null
loopdev=$(losetup -f --show --direct-io=on "$mnt/f")
sock=$rt/ramd/nbd.sock
nbd-client -unix "$sock" -N n -C "$(nproc)" /dev/nbd0 >/dev/null
nbd_up=1
declare -A dev=([brd]=/dev/ram0 [ublk]=$ublkdev [fuse-loop]=$loopdev [nbd]=/dev/nbd0)
targets=(brd ublk fuse-loop nbd)
echo "devices: brd=/dev/ram0 ublk=$ublkdev fuse-loop=$loopdev nbd=/dev/nbd0 (size $size, $(nproc) CPUs, kernel $(uname -r))"

# Every device holds data before it is read.
for t in "${targets[@]}"; do
    fio --name=fill --filename="${dev[$t]}" --ioengine=libaio --direct=1 --rw=write --bs=1M \
        --iodepth=8 --size="$bytes" >/dev/null
done

workloads=(
    "randread-4k-qd1 randread 4k 1"
    "randwrite-4k-qd1 randwrite 4k 1"
    "randrw-4k-qd1 randrw 4k 1"
    "randread-4k-qd32 randread 4k 32"
    "randwrite-4k-qd32 randwrite 4k 32"
    "randrw-4k-qd32 randrw 4k 32"
    "read-1m-qd8 read 1m 8"
    "write-1m-qd8 write 1m 8"
)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$ramd_pid/stat"; }
tick=$(getconf CLK_TCK)
for run in $(seq "$runs"); do
    for w in "${workloads[@]}"; do
        read -r name rw bs qd <<<"$w"
        for t in "${targets[@]}"; do
            before=$(cpu_ticks)
            fio --name="$name" --filename="${dev[$t]}" --ioengine=libaio --direct=1 --rw="$rw" \
                --bs="$bs" --iodepth="$qd" --size="$bytes" --time_based --runtime="$runtime" \
                --ramp_time=1 --output-format=json >"$out/$t.$name.$run.json"
            after=$(cpu_ticks)
            echo "$t $name $run $(( (after - before) ))" >>"$out/cpu.txt"
        done
        echo "run $run: $name done" >&2
    done
done

python3 - "$out" "$tick" "$runtime" <<'PY'
import json, os, statistics, sys
out, tick, runtime = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
targets = ["brd", "ublk", "fuse-loop", "nbd"]
names = []
fig = {}
for f in sorted(os.listdir(out)):
    if not f.endswith(".json"):
        continue
    t, name, run, _ = f.rsplit(".", 3)
    j = json.load(open(os.path.join(out, f)))["jobs"][0]
    iops = j["read"]["iops"] + j["write"]["iops"]
    bw = (j["read"]["bw_bytes"] + j["write"]["bw_bytes"]) / 2**20
    fig.setdefault((t, name), []).append((iops, bw))
    if name not in names:
        names.append(name)
order = ["randread-4k-qd1", "randwrite-4k-qd1", "randrw-4k-qd1", "randread-4k-qd32",
         "randwrite-4k-qd32", "randrw-4k-qd32", "read-1m-qd8", "write-1m-qd8"]
cpu = {}
for line in open(os.path.join(out, "cpu.txt")):
    t, name, run, ticks = line.split()
    cpu.setdefault((t, name), []).append(int(ticks) / tick)
print("| workload | " + " | ".join(targets) + " | ublk/brd | fuse-loop/brd | nbd/brd | ramd CPU us per I/O (ublk) |")
print("|---|" + "---|" * (len(targets) + 4))
for name in [n for n in order if n in names]:
    big = name.endswith("qd8")
    med = {}
    for t in targets:
        v = fig.get((t, name), [])
        med[t] = statistics.median([b if big else i for i, b in v]) if v else 0
    unit = " MiB/s" if big else ""
    cells = [f"{med[t]:,.0f}{unit}" for t in targets]
    ratios = [f"{med[t] / med['brd']:.2f}x" if med["brd"] else "-" for t in targets[1:]]
    ios = statistics.median([i for i, _ in fig.get(("ublk", name), [(0, 0)])]) * runtime
    c = statistics.median(cpu.get(("ublk", name), [0]))
    per = f"{c / ios * 1e6:.1f}" if ios else "-"
    print(f"| {name} | " + " | ".join(cells) + " | " + " | ".join(ratios) + f" | {per} |")
print()
print("IOPS (MiB/s for 1 MiB), medians of", len(next(iter(fig.values()))), "runs;", runtime, "s each")
PY
echo "raw results: $out"
