#!/usr/bin/env bash
# Cost of per-request metrics: fio's nbd engine, 4 KiB random mixed I/O at
# QD64 x 2 connections, against `ramd daemon --metrics on` and `--metrics
# off`, alternating RUNS times each (on, off, on, off, ...), then the median
# IOPS of each and the relative cost. Target: under 3%.
#
#   bench/metrics.sh                      # 5 runs each, 20 s per run
#   RUNS=7 RUNTIME=30 bench/metrics.sh
#   RUNS=1 RUNTIME=2 bench/metrics.sh     # a quick check that it works
#
# Needs: fio with the nbd engine (scripts/test-deps.sh). Run on a quiet
# machine: the figure is a difference of a few percent.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
runs=${RUNS:-5}
runtime=${RUNTIME:-20}
size=${SIZE:-1G}
out=${OUT:-$root/bench/results/metrics-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
cargo build --release --manifest-path "$root/Cargo.toml" >&2
bin="$out/ramd"
cp "$root/target/release/ramd" "$bin"
tmp=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT

start() { # start on|off
  "$bin" daemon --no-config --socket "$tmp/nbd.sock" --api-socket "$tmp/api.sock" \
    --drive "ram0=$size" --metrics "$1" --log warn &
  pid=$!
  for _ in $(seq 200); do [ -S "$tmp/api.sock" ] && return; sleep 0.05; done
  echo "ramd did not start" >&2; exit 1
}
stop() { kill "$pid"; wait "$pid" || true; pid=; }

one() { # one on|off RUN -> prints IOPS
  start "$1"
  local uri="nbd+unix:///ram0?socket=$tmp/nbd.sock"
  # Prefill so every run measures overwrites, not first-touch allocation.
  fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 \
      --size="$size" --output=/dev/null
  fio --name=randrw --ioengine=nbd --uri="$uri" --rw=randrw --bs=4k --iodepth=64 \
      --numjobs=2 --size="$size" --time_based --runtime="$runtime" --group_reporting \
      --output-format=json --output="$out/$1-$2.json"
  stop
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]; print(round(j["read"]["iops"]+j["write"]["iops"]))' \
      "$out/$1-$2.json"
}

: > "$out/iops.txt"
for i in $(seq 1 "$runs"); do
  for mode in on off; do
    iops=$(one "$mode" "$i")
    echo "$mode $i $iops" | tee -a "$out/iops.txt" >&2
  done
done
python3 - "$out/iops.txt" <<'PY' | tee "$out/summary.md"
import statistics, sys
runs = {"on": [], "off": []}
for line in open(sys.argv[1]):
    mode, _, iops = line.split()
    runs[mode].append(int(iops))
on, off = statistics.median(runs["on"]), statistics.median(runs["off"])
print("| metrics | runs | median IOPS (4 KiB randrw QD64x2) |")
print("|---|---|---|")
print(f"| on  | {runs['on']} | {on:.0f} |")
print(f"| off | {runs['off']} | {off:.0f} |")
print(f"\ncost of metrics: {100 * (off - on) / off:.2f}% IOPS (target: under 3%)")
PY
