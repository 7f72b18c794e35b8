#!/usr/bin/env bash
# Sync time of ramd's directory sync beside `rsync -a`, on the same machine
# in the same run: a tree of many small files and one big file, each synced
# from a tmpfs (the RAM copy) to a directory on disk, three ways:
#   first   the destination is empty (everything is copied)
#   none    nothing changed (the cost of finding out)
#   some    1% of the small files rewritten / 1 MiB of the big file rewritten
# ramd fsyncs what it writes (crash-safe); rsync does not, so rsync is also
# timed followed by `sync -f` on the destination ("rsync+sync").
#
# Usage (root: it mounts a tmpfs):
#   bench/dirsync.sh [--files N] [--big SIZE] [--dir DISK_DIR] [--out FILE.md] [--runs N]
# Defaults: --files 100000 --big 2G --dir /var/tmp/ramd-dirsync-bench --runs 3
# Quick check that it works: bench/dirsync.sh --files 2000 --big 64M --runs 1
set -euo pipefail
cd "$(dirname "$0")/.."

files=100000
big=2G
dir=/var/tmp/ramd-dirsync-bench
out=""
runs=3
while [ $# -gt 0 ]; do
    case "$1" in
        --files) files=$2; shift 2 ;;
        --big) big=$2; shift 2 ;;
        --dir) dir=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --runs) runs=$2; shift 2 ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" = 0 ] || { echo "dirsync bench: run as root (it mounts a tmpfs)" >&2; exit 1; }
command -v rsync >/dev/null || { echo "dirsync bench: needs rsync: apt-get install rsync" >&2; exit 1; }

cargo build --release --example dirsync_sync >&2
engine=target/release/examples/dirsync_sync

mkdir -p "$dir"
ram="$dir/ram"
mkdir -p "$ram"
cleanup() { umount "$ram" 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
big_bytes=$(numfmt --from=iec "$big")
mount -t tmpfs -o size=$(( big_bytes + files * 8192 + (256 << 20) )) ramd-bench "$ram"

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; }

make_small_tree() { # $1 = root, $2 = count
    /usr/bin/python3 - "$1" "$2" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    d = os.path.join(root, "d%03d" % (i // 100 % 1000), "e%02d" % (i % 7))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "f%06d" % i), "wb") as f:
        f.write(os.urandom(512 + (i * 2654435761) % 3584))
PY
}

change_small_tree() { # rewrite 1% of the files
    /usr/bin/python3 - "$1" "$2" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(0, n, 100):
    p = os.path.join(root, "d%03d" % (i // 100 % 1000), "e%02d" % (i % 7), "f%06d" % i)
    with open(p, "r+b") as f:
        f.write(os.urandom(64))
PY
}

results=()
time_one() { # $1 = case, $2 = tool, $3... = command
    local case=$1 tool=$2; shift 2
    drop_caches
    local t0 t1
    t0=$(now); "$@" >/dev/null; t1=$(now)
    results+=("| $case | $tool | $(elapsed "$t0" "$t1") |")
}

bench_set() { # $1 = label, $2 = source dir, $3 = change command
    local label=$1 src=$2 change=$3 r
    for r in $(seq 1 "$runs"); do
        rm -rf "$dir/d-ramd" "$dir/d-rsync" "$dir/d-rsync-sync"
        mkdir -p "$dir/d-ramd" "$dir/d-rsync" "$dir/d-rsync-sync"
        time_one "$label first" ramd "$engine" "$src" "$dir/d-ramd"
        time_one "$label first" "rsync -a" rsync -a "$src/" "$dir/d-rsync/"
        time_one "$label first" "rsync -a + sync" sh -c "rsync -a '$src/' '$dir/d-rsync-sync/' && sync -f '$dir/d-rsync-sync'"
        time_one "$label none" ramd "$engine" "$src" "$dir/d-ramd"
        time_one "$label none" "rsync -a" rsync -a "$src/" "$dir/d-rsync/"
        $change
        time_one "$label some" ramd "$engine" "$src" "$dir/d-ramd"
        time_one "$label some" "rsync -a" rsync -a "$src/" "$dir/d-rsync/"
        time_one "$label some" "rsync -a + sync" sh -c "rsync -a '$src/' '$dir/d-rsync-sync/' && sync -f '$dir/d-rsync-sync'"
        diff -r "$src" "$dir/d-ramd" >/dev/null || { echo "ramd copy differs from the source!" >&2; exit 1; }
    done
}

echo "dirsync bench: $files small files, one $big file, $runs run(s), disk dir $dir" >&2
mkdir -p "$ram/small" "$ram/big"
make_small_tree "$ram/small" "$files"
bench_set "$files small files" "$ram/small" "change_small_tree $ram/small $files"
rm -rf "$ram/small" "$dir/d-ramd" "$dir/d-rsync" "$dir/d-rsync-sync"
head -c "$big_bytes" /dev/urandom > "$ram/big/file"
bench_set "one $big file" "$ram/big" "dd if=/dev/urandom of=$ram/big/file bs=1M count=1 seek=7 conv=notrunc status=none"

report=$(
    echo "## dirsync: sync time beside rsync ($(date -u +%Y-%m-%d), $(nproc) CPUs, $(uname -r))"
    echo
    echo "Source: a tmpfs. Destination: $(df --output=fstype "$dir" | tail -1) at $dir. Page cache dropped before each run."
    echo "\"some\" = 1% of the small files rewritten, or 1 MiB of the big file. Seconds; $runs run(s) each."
    echo
    echo "| case | tool | seconds |"
    echo "|---|---|---|"
    printf '%s\n' "${results[@]}"
)
echo "$report"
if [ -n "$out" ]; then
    mkdir -p "$(dirname "$out")"
    echo "$report" > "$out"
    echo "dirsync bench: written to $out" >&2
fi
