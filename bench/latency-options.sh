#!/usr/bin/env bash
# QD1 latency (p50, p99, p99.9, max) of ramd with its latency options at
# their defaults and with each one changed, beside nbdkit memory, in the
# same run: what each option buys and what it costs the far tail.
#
#   bench/latency-options.sh                      # 3 runs, 8 s (+2 s ramp) each
#   RUNS=3 RUNTIME=5 RAMP=1 OUT=bench/results/$(date +%F)-latency bench/latency-options.sh
#
# ramd variants (each one a ramd server of bench/peers.py):
#   ramd             defaults: adaptive polling (--poll-us 50), no keep-awake
#   ramd-no-poll     --poll-us 0: connections block in read at once
#   ramd-keep-awake  --keep-cpu-awake true: idle-priority spinners keep the
#                    other CPUs from halting while a QD1 client runs
#
# Knobs: RUNS, OUT, RUNTIME, RAMP, RAMD (a binary instead of building), as
# in bench/peers.sh. Needs: fio nbdkit (scripts/test-deps.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
runs=${RUNS:-3}
out=${OUT:-$here/results/$(date +%Y%m%d-%H%M%S)-latency}
mkdir -p "$out"

bin="$out/ramd"
if [ -n "${RAMD:-}" ]; then
  cp "$RAMD" "$bin"
else
  cargo build --release --manifest-path "$root/Cargo.toml" >&2
  cp "$root/target/release/ramd" "$bin"
fi
# One wrapper per variant: the option goes after the harness's arguments.
variant() {
  local name=$1; shift
  printf '#!/bin/sh\nexec %q "$@" %s\n' "$bin" "$*" > "$out/$name"
  chmod +x "$out/$name"
}
variant ramd-no-poll --poll-us 0
variant ramd-keep-awake --keep-cpu-awake true

py=/usr/bin/python3
[ -x "$py" ] || py=python3
for i in $(seq 1 "$runs"); do
  echo "== run $i of $runs" >&2
  "$py" "$here/peers.py" \
    --ramd "ramd=$bin" --ramd "ramd-no-poll=$out/ramd-no-poll" \
    --ramd "ramd-keep-awake=$out/ramd-keep-awake" \
    --servers nbdkit-memory-malloc,ramd,ramd-no-poll,ramd-keep-awake \
    --workloads prefill,randread_4k_qd1,randwrite_4k_qd1 \
    --runtime "${RUNTIME:-8}" --ramp "${RAMP:-2}" --out "$out/run$i.json"
done
"$py" "$here/summarize.py" "$out"/run*.json | tee "$out/summary.md"
