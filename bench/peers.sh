#!/usr/bin/env bash
# ramd beside nbdkit (memory sparse, malloc, zstd if available; null),
# qemu-nbd and nbd-server: bench/peers.py RUNS times (one JSON per run), then
# the median of each figure across the runs (bench/summarize.py).
#
#   bench/peers.sh                            # 3 runs of 8 s (+2 s ramp) per workload
#   RUNS=5 RUNTIME=5 RAMP=1 OUT=bench/results/$(date +%F)-peers bench/peers.sh
#   RAMD=/tmp/ramd RUNS=1 SERVERS=ramd,nbdkit-null bench/peers.sh
#
# Knobs (environment):
#   RUNS       runs (default 3)
#   OUT        output directory (default bench/results/YYYYmmdd-HHMMSS):
#              runN.json, summary.md, and a copy of the ramd binary (git-ignored)
#   RUNTIME    seconds measured per workload (default 8; NBDBENCH_RUNTIME also read)
#   RAMP       seconds before measuring (default 2; NBDBENCH_RAMP also read)
#   SIZE       region fio uses (default 1g); DISK: each server's disk (default 2G)
#   WORKLOADS  comma list (default: all seven, see bench/peers.py)
#   SERVERS    comma list (default: all)
#   RAMD       a ramd binary to use instead of building target/release/ramd
#
# Needs: fio nbdkit libnbd-bin qemu-utils nbd-server (scripts/test-deps.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
runs=${RUNS:-3}
out=${OUT:-$here/results/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"

# A private copy, so a rebuild during the run cannot change the binary.
bin="$out/ramd"
if [ -n "${RAMD:-}" ]; then
  cp "$RAMD" "$bin"
else
  cargo build --release --manifest-path "$root/Cargo.toml" >&2
  cp "$root/target/release/ramd" "$bin"
fi

args=(--ramd "$bin"
      --runtime "${RUNTIME:-${NBDBENCH_RUNTIME:-8}}" --ramp "${RAMP:-${NBDBENCH_RAMP:-2}}"
      --size "${SIZE:-1g}" --disk "${DISK:-2G}")
[ -n "${WORKLOADS:-${NBDBENCH_WORKLOADS:-}}" ] && args+=(--workloads "${WORKLOADS:-$NBDBENCH_WORKLOADS}")
[ -n "${SERVERS:-}" ] && args+=(--servers "$SERVERS")

# Debian's python3 (stdlib only): a pyenv python3 earlier on PATH works too,
# but /usr/bin/python3 is the one scripts/test-deps.sh sets up.
py=/usr/bin/python3
[ -x "$py" ] || py=python3
for i in $(seq 1 "$runs"); do
  echo "== run $i of $runs" >&2
  "$py" "$here/peers.py" "${args[@]}" --out "$out/run$i.json"
done
"$py" "$here/summarize.py" "$out"/run*.json | tee "$out/summary.md"
