#!/usr/bin/env bash
# What keeping a compressed drive across restarts costs (issue 31,
# docs/restart.md): the same ramd binary serves one compressed drive
# without a supervisor (arena in anonymous memory, objects rewritten in
# place when they fit) and one under `--supervise` (arena and tables'
# shadow in memfds, an object never rewritten in place, so an overwrite
# is an allocation, a switch and a free with its move). For each, in
# turn, ROUNDS times: fill SIZE with 1 MiB writes, then fio 4 KiB random
# writes and random reads at QD32 x 2 jobs for RUNTIME seconds each, with
# buffers that compress to about half (fio's buffer_compress_percentage=50
# per 4 KiB, as bench/compressed.sh). Prints each round and the medians.
#
#   cargo build --release
#   RAMD=target/release/ramd SIZE=1g RUNTIME=8 ROUNDS=3 COMPRESS=lz4 bench/compressed-kept.sh
#
# Needs fio with its nbd engine. The machine is shared: compare within a run.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
RAMD=${RAMD:-$here/../target/release/ramd}
size=${SIZE:-1g} runtime=${RUNTIME:-8} rounds=${ROUNDS:-3} compress=${COMPRESS:-lz4}
dir=$(mktemp -d /tmp/ramd-compressed-kept.XXXXXX)
pid=
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT
iops() { grep -oE 'IOPS=[0-9.]+k?' | head -1 | cut -d= -f2 | sed 's/k$/000/' | awk '{printf "%.0f", $1}'; }
bw() { grep -oE 'BW=[0-9.]+[KMG]iB/s' | head -1 | cut -d= -f2; }
declare -A W R
for round in $(seq "$rounds"); do
    for mode in anonymous supervised; do
        extra=()
        [ "$mode" = supervised ] && extra=(--supervise)
        rm -rf "$dir/run" && mkdir -p "$dir/run"
        "$RAMD" serve --no-config --socket "$dir/run/nbd.sock" --api-socket "$dir/run/api.sock" \
            --state-dir "$dir/run/state" --drive "cz=$size,compress=$compress" --log warn \
            "${extra[@]}" >"$dir/ramd-$mode.log" 2>&1 &
        pid=$!
        for _ in $(seq 300); do [ -S "$dir/run/nbd.sock" ] && break; sleep 0.1; done
        uri="nbd+unix:///cz?socket=$dir/run/nbd.sock"
        common=(--ioengine=nbd "--uri=$uri" "--size=$size" --buffer_compress_percentage=50
                --buffer_compress_chunk=4k --refill_buffers --group_reporting)
        fill=$(fio --name=fill "${common[@]}" --rw=write --bs=1m --iodepth=8 | bw)
        w=$(fio --name=w "${common[@]}" --rw=randwrite --bs=4k --iodepth=32 --numjobs=2 \
            --time_based "--runtime=$runtime" | iops)
        r=$(fio --name=r "${common[@]}" --rw=randread --bs=4k --iodepth=32 --numjobs=2 \
            --time_based "--runtime=$runtime" | iops)
        W[$mode]+="$w " R[$mode]+="$r "
        printf 'round %s %-10s fill %-10s randwrite %8s randread %8s IOPS\n' "$round" "$mode" "$fill" "$w" "$r"
        kill "$pid"
        wait "$pid" 2>/dev/null || true
        pid=
    done
done
med() { printf '%s\n' $1 | sort -n | sed -n "$(( (rounds + 1) / 2 ))p"; }
echo
echo "| compressed drive ($compress, $size) | randwrite IOPS (median of $rounds) | randread IOPS (median) |"
echo "|---|---|---|"
for mode in anonymous supervised; do
    echo "| $mode | $(med "${W[$mode]}") | $(med "${R[$mode]}") |"
done
