#!/usr/bin/env bash
# Time from kill -9 of ramd's serving process to serving again under
# `ramd daemon --supervise` (issue 31, docs/restart.md), for RAM drives of
# each size in SIZES filled with data: fio (1 MiB writes over NBD) fills
# the drive, then the serving process is killed with SIGKILL, and the
# clock stops when an NBD client (nbdinfo) is served by the new process;
# then `ramd upgrade` to a copy of the same binary, timed from the command
# to the new process serving (the pause an upgrade costs, including the
# 200 ms the old process waits so that its answer goes out). Medians of
# RUNS kills and RUNS upgrades per size; prints a table.
# DRIVE_OPTS adds drive options: ",compress=lz4" times compressed drives,
# whose adoption rebuilds their tables (store/compressed/adopt.rs); the fill
# then writes buffers that compress to about half (fio's
# buffer_compress_percentage=50 per 4 KiB).
#
#   cargo build --release
#   bench/restart.sh                      # SIZES="1G 8G" RUNS=3
#   DRIVE_OPTS=,compress=lz4 bench/restart.sh
#
# Needs: fio with its nbd engine, nbdinfo, curl. Starts its own daemon in
# a temporary directory; the machine needs the sizes' sum of free memory.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
RAMD=${RAMD:-$here/../target/release/ramd}
sizes=${SIZES:-1G 8G}
runs=${RUNS:-3}
opts=${DRIVE_OPTS:-}
fill_opts=()
case "$opts" in *compress=*) fill_opts=(--buffer_compress_percentage=50 --buffer_compress_chunk=4k --refill_buffers) ;; esac
dir=$(mktemp -d /tmp/ramd-restart-bench.XXXXXX)
sup=
cleanup() {
    [ -n "$sup" ] && kill "$sup" 2>/dev/null && wait "$sup" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT
api=$dir/api.sock
health() { curl -s --max-time 2 --unix-socket "$api" http://ramd/v1/health; }
pid_of() { health | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["pid"])' 2>/dev/null; }
cp "$RAMD" "$dir/ramd-new"
echo "| drive size | data | kill -9 to served again (median of $runs) | runs (ms) | ramd upgrade, command to served (median) | runs (ms) |"
echo "|---|---|---|---|---|---|"
for size in $sizes; do
    "$RAMD" daemon --supervise --no-config --runtime-dir "$dir" --state-dir "$dir/state" \
        --drive "db=$size$opts" >"$dir/ramd-$size.log" 2>&1 &
    sup=$!
    for _ in $(seq 300); do [ -n "$(pid_of)" ] && break; sleep 0.1; done
    uri="nbd+unix:///db?socket=$dir/nbd.sock"
    fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 \
        --size="$size" "${fill_opts[@]}" --output=/dev/null
    times=()
    for _ in $(seq "$runs"); do
        old=$(pid_of)
        t0=$(date +%s%N)
        kill -KILL "$old"
        while :; do
            new=$(pid_of || true)
            if [ -n "$new" ] && [ "$new" != "$old" ] && nbdinfo --size "$uri" >/dev/null 2>&1; then
                break
            fi
            sleep 0.005
        done
        t1=$(date +%s%N)
        times+=($(( (t1 - t0) / 1000000 )))
    done
    ups=()
    for _ in $(seq "$runs"); do
        old=$(pid_of)
        t0=$(date +%s%N)
        "$RAMD" --api-socket "$api" upgrade --binary "$dir/ramd-new" >/dev/null
        until nbdinfo --size "$uri" >/dev/null 2>&1; do sleep 0.005; done
        t1=$(date +%s%N)
        [ "$(pid_of)" != "$old" ] || { echo "upgrade did not change the serving process" >&2; exit 1; }
        ups+=($(( (t1 - t0) / 1000000 )))
    done
    alloc=$("$RAMD" --api-socket "$api" info db --json | sed -n 's/.*"allocated_bytes": *\([0-9]*\).*/\1/p')
    med() { printf '%s\n' "$@" | sort -n | sed -n "$(( (runs + 1) / 2 ))p"; }
    echo "| $size | $(numfmt --to=iec "$alloc") | $(med "${times[@]}") ms | ${times[*]} | $(med "${ups[@]}") ms | ${ups[*]} |"
    kill "$sup"
    wait "$sup" 2>/dev/null || true
    sup=
done
