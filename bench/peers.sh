#!/usr/bin/env bash
# Runs ../shared/tools/nbdbench peers with ramd beside nbdkit (memory sparse,
# memory malloc, null), qemu-nbd and nbd-server, RUNS times, and prints the
# median of each figure across runs (bench/summarize.py).
#
#   bench/peers.sh                 # 3 runs, default workloads + QD128x1
#   RUNS=5 NBDBENCH_RUNTIME=10 bench/peers.sh
#
# Needs: fio nbdkit libnbd-bin qemu-utils nbd-server (scripts/test-deps.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
nbdbench=${NBDBENCH:-$root/../shared/tools/nbdbench}
runs=${RUNS:-3}
out=${OUT:-$here/results/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"

cargo build --release --manifest-path "$root/Cargo.toml" >&2
# A private copy, so a rebuild during the run cannot change the binary.
bin="$out/ramd"
cp "$root/target/release/ramd" "$bin"

export NBDBENCH_WORKLOADS=${NBDBENCH_WORKLOADS:-prefill,randread_4k_qd1,randwrite_4k_qd1,randrw_4k_qd64x2,randrw_4k_qd128x1,seqread_1m_qd8,seqwrite_1m_qd8}
export NBDBENCH_RESULTS="$out"
for i in $(seq 1 "$runs"); do
  echo "== run $i of $runs" >&2
  python3 "$nbdbench" peers --no-kernel --no-memcpy \
    --extra "ramd=$bin serve --no-config --socket {sock} --api-socket {sock}.api --drive ram0={size} --log warn" \
    --out "$out/run$i.json" ${PEERS_ARGS:-}
done
python3 "$here/summarize.py" "$out"/run*.json | tee "$out/summary.md"
