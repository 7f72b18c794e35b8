#!/usr/bin/env bash
# Server CPU per I/O of one ramd build at a queue depth: fills 1 GiB,
# waits SETTLE seconds (huge-page collapse runs once fills stop), then runs
# fio 4 KiB randrw for 6 s with QD x JOBS and prints kIOPS, the server's CPU
# microseconds per I/O, and its context switches and syscalls per I/O
# (perf stat). For A/B runs of two builds, alternate them.
#
#   SETTLE=8 QD=64 JOBS=2 bench/qdprobe.sh target/release/ramd
#   SETTLE=8 QD=128 JOBS=1 bench/qdprobe.sh target/release/ramd
#   RW=randwrite SETTLE=8 QD=128 JOBS=1 bench/qdprobe.sh target/release/ramd
#
# PERF=FILE also records the server with `perf record -g` for the first 4 s
# of the run (read it with `perf report -i FILE --no-children`);
# SERVER_CPUS / CLIENT_CPUS (taskset lists, e.g. 0) pin ramd and fio.
# IDLE=N waits N s first, so that a VM that reports free memory to its
# host (free page reporting, after ~2 s) starts with cold free memory: with
# SETTLE=0 that measures I/O during the huge-page pass at its worst.
set -euo pipefail
sleep "${IDLE:-0}"
bin=$1
dir=$(mktemp -d)
spin=(); [ -n "${SERVER_CPUS:-}" ] && spin=(taskset -c "$SERVER_CPUS")
cpin=(); [ -n "${CLIENT_CPUS:-}" ] && cpin=(taskset -c "$CLIENT_CPUS")
"${spin[@]}" "$bin" serve --no-config --socket "$dir/nbd.sock" --api-socket "$dir/api.sock" \
  --drive ram0=2G --log warn > "$dir/server.log" 2>&1 &
spid=$!
trap 'kill "$spid" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do [ -S "$dir/nbd.sock" ] && break; sleep 0.1; done
uri="nbd+unix:///ram0?socket=$dir/nbd.sock"
fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 --size=1g > /dev/null
sleep "${SETTLE:-0}"
cpu() { awk '{print $14 + $15}' "/proc/$spid/stat"; }
t0=$(cpu)
perf stat -x, -e context-switches,raw_syscalls:sys_enter -p "$spid" -- sleep 6 \
  2> "$dir/perf.txt" > /dev/null &
pp=$!
rp=
if [ -n "${PERF:-}" ]; then
  perf record -q -g -p "$spid" -o "$PERF" -- sleep 4 > /dev/null 2>&1 &
  rp=$!
fi
"${cpin[@]}" fio --name=t --ioengine=nbd --uri="$uri" --rw="${RW:-randrw}" --bs=4k --iodepth="${QD:-64}" \
  --numjobs="${JOBS:-2}" --size=1g --time_based --runtime=6 --group_reporting \
  --output-format=json > "$dir/fio.json"
wait "$pp" $rp || true
t1=$(cpu)
python3 - "$dir" "$t0" "$t1" <<'PY'
import json, sys
d, t0, t1 = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
text = open(f"{d}/fio.json").read()
job = json.loads(text[text.index("{"):])["jobs"][0]
iops = job["read"]["iops"] + job["write"]["iops"]
ios = iops * 6
perf = {}
for line in open(f"{d}/perf.txt"):
    f = line.split(",")
    if len(f) > 3 and f[0].replace(".", "").isdigit():
        perf[f[2]] = float(f[0])
cpu = (t1 - t0) / 100
print(f"kIOPS {iops / 1000:.1f}  srv_us/IO {cpu / ios * 1e6:.2f}"
      f"  cs/IO {perf.get('context-switches', 0) / ios:.3f}"
      f"  sys/IO {perf.get('raw_syscalls:sys_enter', 0) / ios:.3f}"
      f"  client CPU {job['usr_cpu'] + job['sys_cpu']:.0f}%")
PY
