#!/usr/bin/env bash
# Persistent drives across kill -9 (issue 31, docs/restart.md): the time
# from kill -9 to served again for a persistent drive of each size in
# SIZES, filled with fio (1 MiB writes over NBD) and synced, two ways:
#   - supervised (`ramd daemon --supervise`): the next serving process
#     adopts the drive's memory and dirty set; the state directory is
#     checked, nothing is loaded;
#   - unsupervised: ramd is started again and restores the drive from its
#     state directory (the way a persistent drive came back before).
# The clock stops when an NBD client (nbdinfo) is served the drive.
# Medians of RUNS kills per size and way; prints a table.
#
#   cargo build --release
#   bench/restart-persistent.sh           # SIZES="1G 8G" RUNS=3
#
# Needs: fio with its nbd engine, nbdinfo, curl. Starts its own daemons in
# a temporary directory; needs the sizes' sum of free memory and of disk.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
RAMD=${RAMD:-$here/../target/release/ramd}
sizes=${SIZES:-1G 8G}
runs=${RUNS:-3}
dir=$(mktemp -d /var/tmp/ramd-restart-persistent.XXXXXX)
pid=
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT
api=$dir/api.sock
uri="nbd+unix:///pdb?socket=$dir/nbd.sock"
serving_pid() {
    curl -s --max-time 2 --unix-socket "$api" http://ramd/v1/health |
        /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["pid"])' 2>/dev/null
}
start() { # [--supervise]: the daemon, in the background; its pid in $pid
    "$RAMD" daemon "$@" --no-config --runtime-dir "$dir" --state-dir "$dir/state" \
        --drive "pdb=$size,persist,durability=periodic,sync-interval=1h" >>"$dir/ramd.log" 2>&1 &
    pid=$!
}
served() { until nbdinfo --size "$uri" >/dev/null 2>&1; do sleep 0.005; done; }
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
med() { printf '%s\n' "$@" | sort -n | sed -n "$(( (runs + 1) / 2 ))p"; }
waited=()
echo "| drive size | supervised: kill -9 to served (median of $runs) | runs (ms) | unsupervised: kill -9, start, restore, served (median) | runs (ms) |"
echo "|---|---|---|---|---|"
for size in $sizes; do
    rm -rf "$dir/state"
    start --supervise
    served
    fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 \
        --size="$size" --output=/dev/null
    "$RAMD" --api-socket "$api" sync pdb >/dev/null
    sup=()
    for _ in $(seq "$runs"); do
        old=$(serving_pid)
        t0=$(date +%s%N)
        kill -KILL "$old"
        until [ "$(serving_pid || true)" != "$old" ] && nbdinfo --size "$uri" >/dev/null 2>&1; do
            sleep 0.005
        done
        sup+=($(ms_since "$t0"))
    done
    grep -q "kept across a restart of the serving process" "$dir/ramd.log" ||
        { echo "the supervised daemon did not adopt the drive (log: $dir/ramd.log)" >&2; exit 1; }
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    plain=()
    start
    served
    for _ in $(seq "$runs"); do
        t0=$(date +%s%N)
        kill -KILL "$pid"
        wait "$pid" 2>/dev/null || true
        start
        served
        plain+=($(ms_since "$t0"))
    done
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    pid=
    echo "| $size | $(med "${sup[@]}") ms | ${sup[*]} | $(med "${plain[@]}") ms | ${plain[*]} |"
    # Restores the host's memory refused (the killed process's memory not
    # yet freed) wait and start again (docs/persistence.md): say how many.
    waited+=("$size: $(grep -c "restore attempt .* refused" "$dir/ramd.log" || true)")
    : >"$dir/ramd.log"
done
echo
echo "unsupervised restore attempts refused for the host's memory (each waited, then started again): ${waited[*]}"
