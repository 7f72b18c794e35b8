#!/usr/bin/env bash
# Where QD1's slowest requests wait: fio 4 KiB random writes at QD1 against
# ramd with and without keep-awake, and for each: p50 / p99 / p99.9 / max
# and the requests over 1 ms as fio sees them (client side), the requests
# over 1 ms inside ramd (from reading the request to writing its reply:
# the request-duration histogram of /metrics), the host's steal time (the
# time the hypervisor ran something else while our vCPUs wanted to run,
# /proc/stat, where the hypervisor reports it) and the vCPUs' idle time.
#
#   bench/qd1-steal.sh target/release/ramd        # 8 s per variant, 3 rounds
#   ROUNDS=1 RUNTIME=5 bench/qd1-steal.sh BIN
#
# Needs: fio with the nbd engine (scripts/test-deps.sh).
set -euo pipefail
bin=$(realpath "$1")
rounds=${ROUNDS:-3}
runtime=${RUNTIME:-8}
dir=$(mktemp -d)
trap 'kill "$spid" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT
spid=

# Sum of the steal and idle columns over all CPUs, in clock ticks.
cpu_ticks() { awk '/^cpu / { print $9, $5 }' /proc/stat; }

run_variant() {
  local label=$1; shift
  local sock=$dir/$label.sock
  "$bin" serve --no-config --socket "$sock" --api-socket "$dir/$label.api" \
    --drive ram0=2G --log warn "$@" > "$dir/$label.log" 2>&1 &
  spid=$!
  for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
  local uri="nbd+unix:///ram0?socket=$sock"
  fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 --size=1g > /dev/null
  sleep "${SETTLE:-2}"
  curl -s --unix-socket "$dir/$label.api" http://ramd/metrics > "$dir/metrics0.txt"
  read -r steal0 idle0 < <(cpu_ticks)
  fio --name=qd1 --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=1 --size=1g \
    --time_based --runtime="$runtime" --percentile_list=50:99:99.9 --output-format=json \
    --write_lat_log="$dir/lat" --log_avg_msec=0 > "$dir/fio.json"
  read -r steal1 idle1 < <(cpu_ticks)
  curl -s --unix-socket "$dir/$label.api" http://ramd/metrics > "$dir/metrics.txt"
  kill "$spid"; wait "$spid" 2>/dev/null || true; spid=
  /usr/bin/python3 - "$dir/fio.json" "$dir/lat_clat.1.log" "$dir/metrics0.txt" "$dir/metrics.txt" "$label" \
    "$((steal1 - steal0))" "$((idle1 - idle0))" "$(getconf CLK_TCK)" "$runtime" <<'PY'
import json, sys
path, lat, metrics0, metrics, label, steal, idle, tck, runtime = sys.argv[1:]
# Server side: writes slower than 1 ms (2^20 ns, a bucket bound) in ramd
# during the QD1 run (the histogram's counts after minus before).
def slow_writes(path):
    buckets = {}
    for line in open(path):
        if line.startswith("ramd_drive_request_duration_seconds_bucket") and 'op="write"' in line:
            le = line.split('le="')[1].split('"')[0]
            buckets[le] = float(line.split()[-1])
    total = buckets.get("+Inf", 0)
    under = max((v for k, v in buckets.items() if k != "+Inf" and float(k) <= 2**20 / 1e9), default=0)
    return total - under
inside = int(slow_writes(metrics) - slow_writes(metrics0))
text = open(path).read()
w = json.loads(text[text.index("{"):])["jobs"][0]["write"]
p = w["clat_ns"]["percentile"]
over = sum(1 for line in open(lat) if int(line.split(",")[1]) > 1_000_000)
tck, runtime = int(tck), float(runtime)
print(f"{label:12} {w['iops']/1e3:6.1f} kIOPS  p50 {p['50.000000']/1e3:6.1f}  p99 {p['99.000000']/1e3:7.1f}"
      f"  p99.9 {p['99.900000']/1e3:8.1f}  max {w['clat_ns']['max']/1e3:8.1f} us"
      f"  >1ms {over:4d} (in ramd {inside:3d})  steal {int(steal)/tck/runtime*100:5.1f}%  idle {int(idle)/tck/runtime*100:5.1f}% of a CPU")
PY
}

for r in $(seq "$rounds"); do
  echo "== round $r of $rounds"
  run_variant default
  run_variant keep-awake --keep-cpu-awake true
done
