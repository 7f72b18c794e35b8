#!/usr/bin/env bash
# ramd's NVMe/TCP target against the kernel's (nvmet-tcp over brd) and
# against ramd over the kernel NBD client (/dev/nbd0 on the same TCP
# address), in one run on one machine, through the kernel's NVMe/TCP
# initiator: fio libaio O_DIRECT, 4 KiB random 50-50 read/write at QD1, at
# QD32 with 1 job and with 2 jobs (2 I/O queues), 1 MiB sequential read and
# write (QD8); medians of RUNS runs, each target's ratio to the kernel's
# target, and ramd's CPU time per I/O on its NVMe/TCP target.
#
#   bench/nvme.sh                                  # on a host with nvme-tcp, nvmet-tcp, brd, nbd
#   scripts/guest.sh run --timeout 1500 -e RAMD=$PWD/target/release/ramd \
#       -e RUNTIME=3 -e SIZE=256M bench/nvme.sh    # in the guest kernel (TCG)
#
# Knobs (environment):
#   RUNS     runs (default 3); figures are medians across runs
#   RUNTIME  seconds per fio workload (default 10; 1 s ramp before)
#   SIZE     size of every device (default 1G; brd gets the same)
#   ADDR     the TCP address every target listens on (default 127.0.0.1;
#            on real hosts, run fio on another machine for true figures)
#   RAMD     the ramd binary (default target/release/ramd, else target/debug/ramd)
#   OUT      where results go (default: a temporary directory; printed)
#
# Needs root, fio, nvme-cli, nbd-client, python3, configfs, and the
# kernel's nvme-tcp, nvmet, nvmet-tcp, brd and nbd modules. Starts its own
# ramd with its own runtime and state directories; removes every device,
# connection and nvmet port at the end.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
runs=${RUNS:-3}
runtime=${RUNTIME:-10}
size=${SIZE:-1G}
addr=${ADDR:-127.0.0.1}
RAMD=${RAMD:-}
if [ -z "$RAMD" ]; then
    for c in "$root/target/release/ramd" "$root/target/debug/ramd"; do
        [ -x "$c" ] && RAMD=$c && break
    done
fi
[ -x "${RAMD:-}" ] || { echo "no ramd binary: build it (cargo build --release) or set RAMD" >&2; exit 2; }
out=${OUT:-$(mktemp -d /tmp/ramd-nvme-bench.XXXXXX)}
mkdir -p "$out"
bytes=$(numfmt --from=iec "${size%B}")
rt=$(mktemp -d /tmp/ramd-nvme-rt.XXXXXX)
export XDG_RUNTIME_DIR=$rt XDG_STATE_HOME=$rt/state
cfs=/sys/kernel/config/nvmet
knqn=nqn.2026-11.io.ramd.bench:kernel-brd
hostnqn=nqn.2014-08.org.nvmexpress:uuid:0b0b0b0b-0000-4000-8000-00000000be0c
ramd_pid= nbd_up= ramd_nqn= nvmet_up=

cleanup() {
    set +e
    [ -n "$ramd_nqn" ] && nvme disconnect -n "$ramd_nqn" >/dev/null 2>&1
    if [ -n "$nvmet_up" ]; then
        nvme disconnect -n "$knqn" >/dev/null 2>&1
        rm -f "$cfs/ports/1/subsystems/$knqn"
        rmdir "$cfs/ports/1" 2>/dev/null
        echo 0 >"$cfs/subsystems/$knqn/namespaces/1/enable" 2>/dev/null
        rmdir "$cfs/subsystems/$knqn/namespaces/1" "$cfs/subsystems/$knqn" 2>/dev/null
    fi
    [ -n "$nbd_up" ] && nbd-client -d /dev/nbd0 >/dev/null 2>&1
    if [ -n "$ramd_pid" ]; then kill "$ramd_pid"; wait "$ramd_pid"; fi
    rmmod brd 2>/dev/null
    rm -rf "$rt"
}
trap cleanup EXIT

# The block device of a connected subsystem (the multipath head, not a
# path), waited for.
dev_of() {
    local i b
    for i in $(seq 300); do
        for b in /sys/block/nvme*; do
            case ${b##*/} in nvme*c*n*) continue ;; esac
            [ -e "$b/device/subsysnqn" ] || continue
            [ "$(cat "$b/device/subsysnqn")" = "$1" ] && { echo "/dev/${b##*/}"; return 0; }
        done
        sleep 0.1
    done
    echo "no block device for $1" >&2
    return 1
}

modprobe nvme-tcp
modprobe nvmet
modprobe nvmet-tcp
modprobe nbd
mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config
rmmod brd 2>/dev/null || true
modprobe brd rd_nr=1 rd_size=$((bytes / 1024))

# The kernel's target: brd as namespace 1, on port 4421.
mkdir "$cfs/subsystems/$knqn"
nvmet_up=1
echo 1 >"$cfs/subsystems/$knqn/attr_allow_any_host"
mkdir "$cfs/subsystems/$knqn/namespaces/1"
echo /dev/ram0 >"$cfs/subsystems/$knqn/namespaces/1/device_path"
echo 1 >"$cfs/subsystems/$knqn/namespaces/1/enable"
mkdir "$cfs/ports/1"
echo "$addr" >"$cfs/ports/1/addr_traddr"
echo tcp >"$cfs/ports/1/addr_trtype"
echo 4421 >"$cfs/ports/1/addr_trsvcid"
echo ipv4 >"$cfs/ports/1/addr_adrfam"
ln -s "$cfs/subsystems/$knqn" "$cfs/ports/1/subsystems/$knqn"

# ramd: one drive on NVMe/TCP (4420), one on NBD over TCP (10809).
"$RAMD" daemon --no-config --drive nv="$size" --drive nb="$size" --nvme-listen "$addr:4420" \
    --nbd-listen "$addr:10809" --tls off --nvme-plaintext >"$out/ramd.log" 2>&1 &
ramd_pid=$!
for _ in $(seq 300); do "$RAMD" list >/dev/null 2>&1 && break; sleep 0.1; done
ramd_nqn=$("$RAMD" info nv --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["nvme_nqn"])')
queues=$(nproc)
nvme connect -t tcp -a "$addr" -s 4421 -n "$knqn" -q "$hostnqn" -i "$queues" >/dev/null
nvme connect -t tcp -a "$addr" -s 4420 -n "$ramd_nqn" -q "$hostnqn" -i "$queues" >/dev/null
nbd-client "$addr" 10809 -N nb -C "$queues" /dev/nbd0 >/dev/null
nbd_up=1
declare -A dev=([nvmet-brd]=$(dev_of "$knqn") [ramd-nvme]=$(dev_of "$ramd_nqn") [ramd-nbd]=/dev/nbd0)
targets=(nvmet-brd ramd-nvme ramd-nbd)
echo "devices: nvmet-brd=${dev[nvmet-brd]} ramd-nvme=${dev[ramd-nvme]} ramd-nbd=/dev/nbd0 (size $size, $queues queues, $(nproc) CPUs, kernel $(uname -r))"

# Every device holds data before it is read.
for t in "${targets[@]}"; do
    fio --name=fill --filename="${dev[$t]}" --ioengine=libaio --direct=1 --rw=write --bs=1M \
        --iodepth=8 --size="$bytes" >/dev/null
done

workloads=(
    "randrw-4k-qd1 randrw 4k 1 1"
    "randrw-4k-qd32x1 randrw 4k 32 1"
    "randrw-4k-qd32x2 randrw 4k 32 2"
    "read-1m-qd8 read 1m 8 1"
    "write-1m-qd8 write 1m 8 1"
)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$ramd_pid/stat"; }
tick=$(getconf CLK_TCK)
for run in $(seq "$runs"); do
    for w in "${workloads[@]}"; do
        read -r name rw bs qd jobs <<<"$w"
        for t in "${targets[@]}"; do
            before=$(cpu_ticks)
            fio --name="$name" --filename="${dev[$t]}" --ioengine=libaio --direct=1 --rw="$rw" \
                --bs="$bs" --iodepth="$qd" --numjobs="$jobs" --group_reporting --size="$bytes" \
                --time_based --runtime="$runtime" --ramp_time=1 \
                --output-format=json >"$out/$t.$name.$run.json"
            after=$(cpu_ticks)
            echo "$t $name $run $((after - before))" >>"$out/cpu.txt"
        done
        echo "run $run: $name done" >&2
    done
done

python3 - "$out" "$tick" "$runtime" <<'PY'
import json, os, statistics, sys
out, tick, runtime = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
targets = ["nvmet-brd", "ramd-nvme", "ramd-nbd"]
fig, names = {}, []
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
order = ["randrw-4k-qd1", "randrw-4k-qd32x1", "randrw-4k-qd32x2", "read-1m-qd8", "write-1m-qd8"]
cpu = {}
for line in open(os.path.join(out, "cpu.txt")):
    t, name, run, ticks = line.split()
    cpu.setdefault((t, name), []).append(int(ticks) / tick)
print("| workload | " + " | ".join(targets)
      + " | ramd-nvme / nvmet | ramd-nvme / ramd-nbd | ramd CPU us per I/O (nvme) |")
print("|---|" + "---|" * (len(targets) + 3))
for name in [n for n in order if n in names]:
    big = name.startswith(("read-1m", "write-1m"))
    med = {}
    for t in targets:
        v = fig.get((t, name), [])
        med[t] = statistics.median([b if big else i for i, b in v]) if v else 0
    unit = " MiB/s" if big else ""
    cells = [f"{med[t]:,.0f}{unit}" for t in targets]
    r1 = f"{med['ramd-nvme'] / med['nvmet-brd']:.2f}x" if med["nvmet-brd"] else "-"
    r2 = f"{med['ramd-nvme'] / med['ramd-nbd']:.2f}x" if med["ramd-nbd"] else "-"
    ios = statistics.median([i for i, _ in fig.get(("ramd-nvme", name), [(0, 0)])]) * runtime
    c = statistics.median(cpu.get(("ramd-nvme", name), [0]))
    per = f"{c / ios * 1e6:.1f}" if ios else "-"
    print(f"| {name} | " + " | ".join(cells) + f" | {r1} | {r2} | {per} |")
print()
print("IOPS (MiB/s for 1 MiB), medians of", len(next(iter(fig.values()))), "runs;", runtime, "s each")
PY
echo "raw results: $out"
