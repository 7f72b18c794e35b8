#!/usr/bin/env bash
# Benchmarks a ramd cache in front of a slow disk (nbdkit memory behind its
# delay filter: every read and write of the backing costs DELAY).
#
#   bench/cache.sh                        # all three benchmarks, 30 s each
#   RUNTIME=60 RUNS=3 bench/cache.sh hit  # one of: hit zipf write
#
# 1. hit:   fio 4 KiB random read, QD32 x 2 connections, on a working set
#           that fits the cache (warmed first), against a plain RAM drive
#           with the same data: the hit path should be within 10%. Prints
#           IOPS and, per request, fio's completion latency (p50, p99,
#           p99.9, max) of both.
# 2. zipf:  fio 4 KiB random read with a zipf distribution (theta 0.9 and
#           1.1) over a working set twice the cache, once per eviction policy
#           (s3fifo, lru, fifo): the cache's own hit ratio and fio's IOPS.
#           Its cache is ZIPF_CACHE (default 32M), small enough that the
#           run makes many passes over the working set at the backing's
#           speed: with a cache too big to warm, every policy shows the
#           same ratio of cold misses.
# 3. write: fio 4 KiB random write, QD32 x 2, writeback vs writethrough, over
#           half the cache and over twice the cache (sustained: bound by
#           the write-back rate, which it reports).
#
# How caches are served: SERVE=ramd (default) uses the daemon:
#   ramd daemon + ramd create plain --size S + ramd cache create NAME
#   --backing SRC --size S --mode M --block-size B --policy P, and reads the
#   cache's counters with ramd cache info NAME --json;
# SERVE=example uses the in-process stand-in `cargo run --example
# cache-serve` (no API; SIGUSR1 prints its stats), for comparison.
#
# Knobs: RUNTIME (s, default 30), RUNS (default 1; the median is the figure
# to quote when > 1), CACHE (default 512M), DELAY (backing latency, default
# 1ms), BLOCK (cache block size, default 4K), SERVE (ramd|example),
# ZIPF_CACHE (the zipf benchmark's cache, default 32M), RAMD_BIN (another
# ramd binary to measure, for A/B runs).
# Needs: fio nbdkit (scripts/test-deps.sh). Do not run on a busy machine.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
runtime=${RUNTIME:-30}
runs=${RUNS:-1}
cache=${CACHE:-512M}
delay=${DELAY:-1ms}
block=${BLOCK:-4K}
serve=${SERVE:-ramd}
which=${1:-all}
export PATH="/usr/sbin:/usr/bin:/sbin:/bin:$PATH"

to_bytes() { python3 -c "import sys;s=sys.argv[1];u={'K':1<<10,'M':1<<20,'G':1<<30}.get(s[-1],1);print(int(s.rstrip('KMG'))*u)" "$1"; }
cache_bytes=$(to_bytes "$cache")
ws2=$((2 * cache_bytes))            # zipf working set: twice the cache
backing_bytes=$((4 * cache_bytes))

work=$(mktemp -d /tmp/ramd-cache-bench.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

cargo build --release --manifest-path "$root/Cargo.toml" --bin ramd --example cache-serve >&2
bin="$work/ramd"; cp "${RAMD_BIN:-$root/target/release/ramd}" "$bin"
example="$work/cache-serve"; cp "$root/target/release/examples/cache-serve" "$example"

# A fresh slow backing on its own socket; sets $slow (its URI). Not run in
# a subshell: nbdkit exits with its parent.
slow_backing() {
  local sock="$work/slow-$1.sock"
  nbdkit -f --exit-with-parent -U "$sock" --filter=delay memory "$backing_bytes" \
    delay-read="$delay" delay-write="$delay" >/dev/null 2>&1 &
  pids+=($!)
  wait_for "$sock" $!
  slow="nbd+unix:///?socket=$sock"
}

# wait_for SOCKET PID [LOG]: until SOCKET exists; fails if PID dies first.
wait_for() {
  while [ ! -S "$1" ]; do
    if ! kill -0 "$2" 2>/dev/null; then
      echo "bench: the server for $1 died${3:+; its log:}" >&2
      [ -n "${3:-}" ] && cat "$3" >&2
      exit 1
    fi
    sleep 0.05
  done
}

# start_server TAG "NAME SRC MODE POLICY" ... [-- plain]: serves the caches
# (and a plain 1x-cache RAM drive named plain); sets $nbd_sock.
start_server() {
  local tag=$1; shift
  nbd_sock="$work/$tag/nbd.sock"; mkdir -p "$work/$tag"
  if [ "$serve" = example ]; then
    local args=(--socket "$nbd_sock" --drive "plain=$cache")
    for c in "$@"; do
      set -- $c
      args+=(--cache "$1=$2,size=$cache,mode=$3,policy=$4,block-size=$block")
    done
    "$example" "${args[@]}" 2>"$work/$tag/server.log" &
    server_pid=$!; pids+=($server_pid)
    wait_for "$nbd_sock" "$server_pid" "$work/$tag/server.log"
  else
    export XDG_RUNTIME_DIR="$work/$tag" XDG_STATE_HOME="$work/$tag/state"
    nbd_sock="$XDG_RUNTIME_DIR/ramd/nbd.sock"
    "$bin" daemon --no-default-drive >"$work/$tag/server.log" 2>&1 &
    server_pid=$!; pids+=($server_pid)
    wait_for "$XDG_RUNTIME_DIR/ramd/api.sock" "$server_pid" "$work/$tag/server.log"
    "$bin" create plain --size "$cache" >/dev/null
    for c in "$@"; do
      set -- $c
      "$bin" cache create "$1" --backing "$2" --size "$cache" --mode "$3" \
        --policy "$4" --block-size "$block" >/dev/null
    done
  fi
}

# stop_server [SIGNAL]: TERM (default) writes every cache back first; the
# write benchmark uses KILL, as its dirty data need not be kept.
stop_server() {
  kill -"${1:-TERM}" "$server_pid"; wait "$server_pid" 2>/dev/null || true
}

uri() { echo "nbd+unix:///$1?socket=$nbd_sock"; }

# Prints "HITS MISSES" of cache $1's reads so far.
read_counts() {
  if [ "$serve" = example ]; then
    local n; n=$(grep -c "^cache $1: read hit ratio" "$work/$tag/server.log" || true)
    kill -USR1 "$server_pid"
    while [ "$(grep -c "^cache $1: read hit ratio" "$work/$tag/server.log" || true)" -le "$n" ]; do sleep 0.05; done
    grep "^cache $1: read hit ratio" "$work/$tag/server.log" | tail -1 |
      sed 's/.*(\([0-9]*\) hits, \([0-9]*\) misses).*/\1 \2/'
  else
    "$bin" cache info "$1" --json | python3 -c 'import json,sys; s=json.load(sys.stdin)["stats"]; print(s["read_hits"], s["read_misses"])'
  fi
}

# hit_ratio "H0 M0" "H1 M1": the read hit ratio between two snapshots.
hit_ratio() {
  python3 -c 'import sys; h0,m0=map(int,sys.argv[1].split()); h1,m1=map(int,sys.argv[2].split()); h,m=h1-h0,m1-m0; print(f"{h/max(1,h+m):.4f}")' "$1" "$2"
}

# fio_iops URI ARGS...: runs fio (nbd engine), prints total IOPS; the JSON
# stays in $work/fio.json for fio_lat.
fio_iops() {
  local u=$1; shift
  fio --ioengine=nbd --uri="$u" --name=b --bs=4k --output-format=json \
    --percentile_list=50:99:99.9 "$@" >"$work/fio.out"
  # The nbd engine prints a line before the JSON.
  sed -n '/^{/,$p' "$work/fio.out" >"$work/fio.json"
  python3 -c 'import json;j=json.load(open("'"$work/fio.json"'"));print(int(sum(x["read"]["iops"]+x["write"]["iops"] for x in j["jobs"])))'
}

# fio_lat: "p50 p99 p99.9 max" (us) of the last fio_iops run's completion
# latency (fio's clat: submission to completion, its histogram's
# percentiles), reads and writes together, over all its jobs.
fio_lat() {
  python3 - "$work/fio.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
ds = [x[d]["clat_ns"] for x in j["jobs"] for d in ("read", "write") if x[d]["total_ios"]]
assert len(ds) == 1, "fio_lat wants one job (--group_reporting) doing one direction"
c = ds[0]
p = c["percentile"]
print(" ".join(f"{v / 1000:.1f}" for v in (p["50.000000"], p["99.000000"], p["99.900000"], c["max"])))
PY
}

bench_hit() {
  local ws=$((cache_bytes / 2))
  for r in $(seq 1 "$runs"); do
    tag=hit$r
    slow_backing "$tag"
    start_server "$tag" "c0 $slow writethrough s3fifo"
    # Same data on both. Random 4 KiB reads warm the cache (sequential
    # ones would bypass it): fio's random map reads every block once.
    for d in plain c0; do
      fio_iops "$(uri $d)" --rw=write --bs=1M --iodepth=8 --size="$ws" >/dev/null
      fio_iops "$(uri $d)" --rw=randread --iodepth=32 --numjobs=1 --size="$ws" >/dev/null
    done
    s0=$(read_counts c0)
    p=$(fio_iops "$(uri plain)" --rw=randread --iodepth=32 --numjobs=2 --size="$ws" --time_based --runtime="$runtime" --group_reporting)
    lp=$(fio_lat); read -r p50p p99p p999p maxp <<<"$lp"
    c=$(fio_iops "$(uri c0)" --rw=randread --iodepth=32 --numjobs=2 --size="$ws" --time_based --runtime="$runtime" --group_reporting)
    lc=$(fio_lat); read -r p50c p99c p999c maxc <<<"$lc"
    s1=$(read_counts c0)
    stop_server
    echo "hit run $r: plain ${p} IOPS, cache ${c} IOPS, cache/plain $(python3 -c "print(f'{$c/$p:.3f}')"), cache hit ratio $(hit_ratio "$s0" "$s1")"
    echo "  clat plain: p50 $p50p us, p99 $p99p us, p99.9 $p999p us, max $maxp us"
    echo "  clat cache: p50 $p50c us, p99 $p99c us, p99.9 $p999c us, max $maxc us"
  done
}

bench_zipf() {
  local cache cache_bytes ws2
  cache=${ZIPF_CACHE:-32M}
  cache_bytes=$(to_bytes "$cache")
  ws2=$((2 * cache_bytes))
  for theta in 0.9 1.1; do
    for policy in s3fifo lru fifo; do
      tag=zipf-$theta-$policy
      slow_backing "$tag"
      start_server "$tag" "c0 $slow writethrough $policy"
      local zipf=(--rw=randread --random_distribution=zipf:$theta --iodepth=32 --numjobs=2
        --size="$ws2" --time_based --group_reporting)
      # Warm up for a third of the run, then measure.
      fio_iops "$(uri c0)" "${zipf[@]}" --runtime=$(( (runtime + 2) / 3 )) >/dev/null
      s0=$(read_counts c0)
      iops=$(fio_iops "$(uri c0)" "${zipf[@]}" --runtime="$runtime")
      s1=$(read_counts c0)
      stop_server
      echo "zipf theta $theta, working set 2x cache, $policy: hit ratio $(hit_ratio "$s0" "$s1"), $iops IOPS"
    done
  done
}

bench_write() {
  # Half the cache: write-back absorbs it all. Twice the cache: sustained
  # writes, bound by how fast dirty blocks go back to the backing.
  for ws in $((cache_bytes / 2)) $((2 * cache_bytes)); do
    for mode in writeback writethrough; do
      tag=write-$mode-$ws
      slow_backing "$tag"
      start_server "$tag" "c0 $slow $mode s3fifo"
      iops=$(fio_iops "$(uri c0)" --rw=randwrite --iodepth=32 --numjobs=2 --size="$ws" \
        --time_based --runtime="$runtime" --group_reporting)
      wb=$(write_back_rate c0)
      stop_server KILL
      echo "randwrite 4k QD32x2 over $((ws >> 20)) MiB, $mode: $iops IOPS, written back $wb"
    done
  done
}

# Bytes written back so far by cache $1, as MiB (ramd only).
write_back_rate() {
  if [ "$serve" = example ]; then echo "-"; return; fi
  "$bin" cache info "$1" --json | python3 -c 'import json,sys; s=json.load(sys.stdin)["stats"]; print("%.0f MiB" % (s["writeback_bytes"] / 1048576))'
}

case $which in
  hit) bench_hit ;;
  zipf) bench_zipf ;;
  write) bench_write ;;
  all) bench_hit; bench_zipf; bench_write ;;
  *) echo "usage: $0 [hit|zipf|write|all]" >&2; exit 2 ;;
esac
