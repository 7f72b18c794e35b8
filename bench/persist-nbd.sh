#!/usr/bin/env bash
# What an NBD client sees while a persistent drive syncs: 4 KiB random
# writes at QD1 (fio's nbd engine) to a 4 GiB persistent drive, their
# latency idle and during a sync of 1 GiB of dirty data, per I/O from fio's
# latency log (fio's total latency, submission to completion), counted
# during the sync only for I/Os that completed inside the sync's window
# (`ramd sync` start to end; fio logs Unix-epoch timestamps, so the window
# is exact). Reports p50, p99, p99.9 and max, idle and during the sync, per
# run, then the same as a markdown table. Targets (issue 4): p99 during the
# sync <= 2x the idle p99; no request waits more than 10 ms.
#
#   bench/persist-nbd.sh [DIR]        # DIR: where the state directory goes (a disk, not tmpfs)
#   DIRTY=256M bench/persist-nbd.sh   # a quick check
#
# Knobs: RUNS (default 3), DIRTY (default 1G), IDLE (s of idle writes,
# default 10), BUSY (s of writes around the sync, default 30; the sync starts
# 2 s in).
# Needs: fio with the nbd engine, root for nothing (any user).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-/var/tmp/ramd-persist-nbd}
dirty=${DIRTY:-1G}
runs=${RUNS:-3}
idle_s=${IDLE:-10}
busy_s=${BUSY:-30}
py=/usr/bin/python3; [ -x "$py" ] || py=python3
cargo build --release --manifest-path "$root/Cargo.toml" >&2
bin="$root/target/release/ramd"
tmp=$(mktemp -d)
pid= fpid=
cleanup() {
  [ -n "$fpid" ] && kill "$fpid" 2>/dev/null
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$tmp" "$dir"
}
trap cleanup EXIT
export RAMD_API_SOCKET="$tmp/api.sock"
uri="nbd+unix:///pd?socket=$tmp/nbd.sock"
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

# pct LOGFILE [FROM_MS TO_MS] -> "n p50 p99 p99.9 max" (us) of the I/Os in
# fio's latency log that completed in the window (epoch ms; all without
# one). Warns if fio's log does not cover the whole window.
pct() {
  "$py" - "$@" <<'PY'
import sys
path = sys.argv[1]
rows = [(int(l.split(",")[0]), int(l.split(",")[1]) / 1000) for l in open(path)]
if len(sys.argv) > 2:
    lo, hi = int(sys.argv[2]), int(sys.argv[3])
    if rows[0][0] > lo or rows[-1][0] < hi:
        print(f"persist-nbd: fio's log ({rows[0][0]}-{rows[-1][0]}) does not cover the sync ({lo}-{hi})", file=sys.stderr)
    rows = [r for r in rows if lo <= r[0] <= hi]
v = sorted(r[1] for r in rows)
q = lambda p: v[min(len(v) - 1, int(p * len(v)))]
print(f"{len(v)} {q(.5):.1f} {q(.99):.1f} {q(.999):.1f} {v[-1]:.1f}")
PY
}

fio_writes() { # fio_writes NAME SECONDS: QD1 4 KiB random writes over 256 MiB, per-I/O latency log
  fio --name="$1" --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=1 \
    --size=256m --time_based --runtime="$2" --write_lat_log="$tmp/$1" --log_avg_msec=0 \
    --log_unix_epoch=1 >/dev/null 2>&1
}

us() { "$py" -c 'import sys; v=float(sys.argv[1]); print(f"{v/1000:.2f} ms" if v >= 1000 else f"{v:.1f} us")' "$1"; }
table=()
for run in $(seq "$runs"); do
  rm -rf "$dir"; mkdir -p "$dir"
  "$bin" daemon --no-config --socket "$tmp/nbd.sock" --api-socket "$tmp/api.sock" \
    --state-dir "$dir" --log warn &
  pid=$!
  for _ in $(seq 200); do [ -S "$tmp/api.sock" ] && break; sleep 0.05; done
  "$bin" create pd --size 4G --persist --durability periodic --sync-interval 1h >/dev/null
  # Idle: QD1 random writes over 256 MiB, no sync.
  fio_writes idle "$idle_s"
  "$bin" sync pd >/dev/null
  # The dirty set the sync will save.
  fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 \
    --offset=1g --size="$dirty" >/dev/null 2>&1
  # Writes during the sync: fio runs BUSY s; the sync starts 2 s after fio.
  fio_writes busy "$busy_s" &
  fpid=$!
  sleep 2
  t0=$(now_ms)
  "$bin" sync pd >/dev/null
  t1=$(now_ms)
  wait "$fpid"; fpid=
  kill "$pid"; wait "$pid" || true; pid=
  sync_ms=$((t1 - t0))
  read -r n_i p50_i p99_i p999_i max_i < <(pct "$tmp/idle_lat.1.log")
  read -r n_b p50_b p99_b p999_b max_b < <(pct "$tmp/busy_lat.1.log" "$t0" "$t1")
  ratio=$("$py" -c 'import sys; print(f"{float(sys.argv[2])/float(sys.argv[1]):.2f}")' "$p99_i" "$p99_b")
  echo "run $run: sync of $dirty took ${sync_ms} ms"
  printf '  idle        n=%-7s p50 %7s us  p99 %7s us  p99.9 %7s us  max %8s us\n' "$n_i" "$p50_i" "$p99_i" "$p999_i" "$max_i"
  printf '  during sync n=%-7s p50 %7s us  p99 %7s us  p99.9 %7s us  max %8s us\n' "$n_b" "$p50_b" "$p99_b" "$p999_b" "$max_b"
  echo "  p99 ratio ${ratio}x (target <= 2x), max during sync $(us "$max_b") (target <= 10 ms)"
  table+=("| $run | $("$py" -c "print(f'{$sync_ms/1000:.2f} s')") | $(us "$p50_i") / $(us "$p50_b") | $(us "$p99_i") / $(us "$p99_b") | $(us "$p999_i") / $(us "$p999_b") | $(us "$max_i") / $(us "$max_b") | ${ratio}x | $(us "$max_b") |")
done
echo
echo "| run | sync of $dirty | p50 idle / during | p99 idle / during | p99.9 idle / during | max idle / during | p99 ratio (target <= 2x) | max during sync (target <= 10 ms) |"
echo "|---|---|---|---|---|---|---|---|"
printf '%s\n' "${table[@]}"
