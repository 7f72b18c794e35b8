#!/usr/bin/env bash
# 1 MiB sequential writes (fio nbd engine, QD8, one connection) into ramd
# and nbdkit null / nbdkit memory allocator=malloc, alternating, with the
# server's CPU use and its syscalls and context switches per MiB (perf stat):
# the A/B behind "1 MiB sequential writes" in bench/HISTORY.md.
#
#   bench/seqwrite.sh                    # 3 rounds of 6 s each
#   ROUNDS=5 RUNTIME=10 bench/seqwrite.sh
#   EXTRA="old=/path/to/other/ramd" bench/seqwrite.sh   # a second ramd build too
#
# Each run prefills 1 GiB (so writes land on allocated pages), then times the
# writes. Needs: fio nbdkit perf (linux-perf).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
rounds=${ROUNDS:-3}
runtime=${RUNTIME:-6}
cargo build --release --manifest-path "$root/Cargo.toml" >&2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sock=$work/nbd.sock

# run LABEL EXPORT CMD...: one measurement of the server CMD (its socket: $sock).
run() {
  local label=$1 export=$2; shift 2
  rm -f "$sock" "$sock.api"
  "$@" >/dev/null 2>&1 &
  local pid=$!
  for _ in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done
  local uri="nbd+unix:///$export?socket=$sock"
  fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 --size=1g >/dev/null
  local t0; t0=$(awk '{print $14+$15}' "/proc/$pid/stat")
  perf stat -x, -e context-switches,raw_syscalls:sys_enter -p "$pid" -o "$work/perf.txt" -- sleep "$runtime" &
  local pp=$!
  fio --name=t --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 --size=1g \
    --time_based --runtime="$runtime" --output-format=json >"$work/fio.json"
  wait "$pp" || true
  local t1; t1=$(awk '{print $14+$15}' "/proc/$pid/stat")
  kill "$pid"; wait "$pid" 2>/dev/null || true
  python3 - "$label" "$work/fio.json" "$work/perf.txt" "$t0" "$t1" "$runtime" <<'PY'
import json, sys
label, fio, perf, t0, t1, rt = sys.argv[1:]
t = open(fio).read(); j = json.loads(t[t.index('{'):])['jobs'][0]
mib = j['write']['bw'] / 1024
ev = {}
for line in open(perf):
    f = line.strip().split(',')
    if len(f) > 3 and f[0].replace('.', '').isdigit():
        ev[f[2]] = float(f[0])
total = mib * float(rt)
cpu = (int(t1) - int(t0)) / 100.0 / float(rt) * 100
print(f"{label:<8} {mib:7.0f} MiB/s  server CPU {cpu:3.0f}%  "
      f"switches/MiB {ev.get('context-switches', 0) / total:4.1f}  "
      f"syscalls/MiB {ev.get('raw_syscalls:sys_enter', 0) / total:5.1f}  "
      f"client CPU {j['usr_cpu'] + j['sys_cpu']:3.0f}%")
PY
}

ramd_cmd() {
  exec "$1" serve --no-config --socket "$sock" --api-socket "$sock.api" --drive ram0=1G --log warn
}

for r in $(seq 1 "$rounds"); do
  echo "-- round $r of $rounds"
  run ramd ram0 ramd_cmd "$root/target/release/ramd"
  if [ -n "${EXTRA:-}" ]; then run "${EXTRA%%=*}" ram0 ramd_cmd "${EXTRA#*=}"; fi
  run null "" nbdkit -f -U "$sock" null 1G
  run malloc "" nbdkit -f -U "$sock" memory 1G allocator=malloc
done
