#!/usr/bin/env bash
# Persistence benchmarks (issue 4): write latency during a sync, restore
# throughput vs dd, sync throughput vs dd. Run as root on a quiet machine so
# the page cache can be dropped between runs; DIR must be on the disk to
# measure (not tmpfs).
#
#   bench/persist.sh [DIR] [--quick]
#
# Full run (the figures for bench/RESULTS.md): 1 GiB of dirty data for the
# latency and sync runs, 1 GiB restored; each measurement 3 times (take the
# median). --quick uses 64 MiB and one run, to check the script works.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-/var/tmp/ramd-persist-bench}
quick=0
[ "${2:-}" = "--quick" ] || [ "${1:-}" = "--quick" ] && quick=1
[ "$dir" = "--quick" ] && dir=/var/tmp/ramd-persist-bench
mkdir -p "$dir"
if [ "$quick" = 1 ]; then
    size=256M dirty=64M data=64M idle=20000 runs=1
else
    size=2G dirty=1G data=1G idle=200000 runs=3
fi
cargo build --release --example persist_bench
bin=target/release/examples/persist_bench
echo "== persistence benchmarks in $dir ($(df -h --output=source,fstype "$dir" | tail -1))"
for i in $(seq "$runs"); do
    echo "-- run $i: 4 KiB write latency idle vs during a sync of $dirty"
    "$bin" latency "$dir" --size "$size" --dirty "$dirty" --idle-writes "$idle"
    echo "-- run $i: restore $data vs dd of the same image"
    "$bin" restore "$dir" --data "$data"
    echo "-- run $i: sync $dirty vs dd write+fdatasync"
    "$bin" sync "$dir" --dirty "$dirty"
done
# Not for the figures (per-write counters add ~1 us): what the slow writes
# during a sync were, and the sync thread at normal priority for comparison.
echo "-- explain: writes over 1 ms during a sync of $dirty"
"$bin" latency "$dir" --size "$size" --dirty "$dirty" --idle-writes "$idle" --explain
echo "-- comparison: the sync thread at the writers' priority"
"$bin" latency "$dir" --size "$size" --dirty "$dirty" --idle-writes "$idle" --same-priority
rm -rf "$dir/bench-drive"
