#!/usr/bin/env bash
# QD1 latency of one server, alone: fills 1 GiB with 1 MiB writes, waits
# SETTLE seconds (ramd collapses full ranges into huge pages once fills stop;
# see docs/memory.md), then runs fio 4 KiB random reads and writes at QD1
# (5 s + 1 s ramp each) and prints IOPS, p50, p99 and the server's CPU.
#
#   SETTLE=8 bench/qd1.sh "target/release/ramd serve --no-config --socket {sock} --api-socket {dir}/api.sock --drive ram0=2G --log warn" ramd
#   bench/qd1.sh "nbdkit -f -U {sock} memory 2G allocator=malloc" nbdkit ""
#
# Arguments: server command ({sock} and {dir} are filled in), label, export
# name (default ram0; "" for nbdkit).
set -euo pipefail
cmd=$1 label=$2 export=${3-ram0}
dir=$(mktemp -d)
sock=$dir/nbd.sock
trap 'kill "$spid" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT
cmd=${cmd//\{sock\}/$sock}
cmd=${cmd//\{dir\}/$dir}
eval "$cmd" > "$dir/server.log" 2>&1 &
spid=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
# The server itself, not the shell that started it.
spid=$(pgrep -n -f -- "$sock" || echo "$spid")
uri="nbd+unix:///$export?socket=$sock"
fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 --size=1g > /dev/null
sleep "${SETTLE:-0}"
cpu() { awk '{print $14 + $15}' "/proc/$spid/stat"; }
for rw in randread randwrite; do
  t0=$(cpu)
  fio --name=qd1 --ioengine=nbd --uri="$uri" --rw=$rw --bs=4k --iodepth=1 --size=1g \
    --time_based --runtime=5 --ramp_time=1 --output-format=json > "$dir/fio.json"
  t1=$(cpu)
  python3 - "$dir/fio.json" "$label" "$rw" "$t0" "$t1" <<'PY'
import json, sys
path, label, rw, t0, t1 = sys.argv[1:]
text = open(path).read()
job = json.loads(text[text.index("{"):])["jobs"][0]
d = job["read" if rw == "randread" else "write"]
p = d["clat_ns"]["percentile"]
cpu = (float(t1) - float(t0)) / 100 / 6 * 100
print(f"{label} {rw:9s} kIOPS {d['iops'] / 1000:5.1f}  p50 {p['50.000000'] / 1000:6.1f} us"
      f"  p99 {p['99.000000'] / 1000:6.1f} us  server CPU {cpu:.0f}%")
PY
done
