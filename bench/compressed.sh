#!/usr/bin/env bash
# Compressed drives over NBD (issue 19), the older and smaller benchmark:
# issue 19's corpus benchmark against zram is bench/compressed-corpus.sh.
# Serves raw, lz4, zstd:1 and zstd:3 drives from examples/compressed_bench.rs
# (written before the daemon created compressed drives) and
# `nbdkit memory allocator=zstd`, then for each:
# fills SIZE with 1 MiB writes, runs fio 4 KiB random writes, then random
# reads, at QD32 x 2 jobs for RUNTIME seconds each, with buffers that
# compress to about half (fio's buffer_compress_percentage=50, per 4 KiB).
#
#   SIZE=256m RUNTIME=8 bench/compressed.sh
#
# Prints one line per drive: fill bandwidth, random write and read IOPS.
# The machine is shared: compare lines of one run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
size=${SIZE:-256m} runtime=${RUNTIME:-8}
cargo build --release --example compressed_bench --manifest-path "$root/Cargo.toml" >&2
dir=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$dir"' EXIT
size_mib=$(numfmt --from=iec "${size^^}" | awk '{print int($1 / 1048576)}')
"$root/target/release/examples/compressed_bench" --serve "$dir/ramd.sock" --size-mib "$size_mib" \
  > "$dir/ramd.log" 2>&1 &
pids+=($!)
nbdkit -f -U "$dir/nbdkit.sock" memory "$size" allocator=zstd > "$dir/nbdkit.log" 2>&1 &
pids+=($!)
for s in ramd nbdkit; do
  for _ in $(seq 100); do [ -S "$dir/$s.sock" ] && break; sleep 0.1; done
done
iops() { grep -oE 'IOPS=[0-9.]+k?' | head -1 | cut -d= -f2; }
for target in raw lz4 zstd1 zstd3 nbdkit; do
  if [ "$target" = nbdkit ]; then uri="nbd+unix:///?socket=$dir/nbdkit.sock"
  else uri="nbd+unix:///$target?socket=$dir/ramd.sock"; fi
  common=(--ioengine=nbd "--uri=$uri" "--size=$size" --buffer_compress_percentage=50
          --buffer_compress_chunk=4k --refill_buffers --group_reporting)
  fill=$(fio --name=fill "${common[@]}" --rw=write --bs=1m --iodepth=8 \
    | grep -oE 'BW=[0-9.]+[KMG]iB/s' | head -1 | cut -d= -f2)
  w=$(fio --name=w "${common[@]}" --rw=randwrite --bs=4k --iodepth=32 --numjobs=2 \
    --time_based "--runtime=$runtime" | iops)
  r=$(fio --name=r "${common[@]}" --rw=randread --bs=4k --iodepth=32 --numjobs=2 \
    --time_based "--runtime=$runtime" | iops)
  printf '%-7s fill %-10s randwrite %-7s randread %s IOPS\n' "$target" "$fill" "$w" "$r"
done
