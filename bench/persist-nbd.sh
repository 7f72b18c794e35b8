#!/usr/bin/env bash
# What an NBD client sees while a persistent drive syncs: 4 KiB random
# writes at QD1 (fio's nbd engine), their latency idle and during a sync of
# 1 GiB of dirty data, per I/O from fio's latency log, counted only inside
# the sync's window (fio's total latency, submission to completion). Targets
# (issue 4): p99 during the sync <= 2x the idle p99; no request waits more
# than 10 ms.
#
#   bench/persist-nbd.sh [DIR]        # DIR: where the state directory goes (a disk, not tmpfs)
#   DIRTY=256M bench/persist-nbd.sh   # a quick check
#
# Needs: fio with the nbd engine, root for nothing (any user).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-/var/tmp/ramd-persist-nbd}
dirty=${DIRTY:-1G}
runs=${RUNS:-3}
cargo build --release --manifest-path "$root/Cargo.toml" >&2
bin="$root/target/release/ramd"
tmp=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT
export RAMD_API_SOCKET="$tmp/api.sock"
uri="nbd+unix:///pd?socket=$tmp/nbd.sock"

pct() { # pct LOGFILE FROM_MS TO_MS -> "n p50 p99 p99.9 max" (us) of I/Os completed in the window
  python3 - "$@" <<'PY'
import sys
path, lo, hi = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
v = sorted(int(l.split(",")[1]) / 1000 for l in open(path)
           if lo <= float(l.split(",")[0]) <= hi)
q = lambda p: v[min(len(v) - 1, int(p * len(v)))]
print(f"{len(v)} {q(.5):.1f} {q(.99):.1f} {q(.999):.1f} {v[-1]:.1f}")
PY
}

for run in $(seq "$runs"); do
  rm -rf "$dir"; mkdir -p "$dir"
  "$bin" daemon --no-config --socket "$tmp/nbd.sock" --api-socket "$tmp/api.sock" \
    --state-dir "$dir" --log warn &
  pid=$!
  for _ in $(seq 200); do [ -S "$tmp/api.sock" ] && break; sleep 0.05; done
  "$bin" create pd --size 4G --persist --durability periodic --sync-interval 1h >/dev/null
  # Idle: 10 s of QD1 random writes over 256 MiB.
  fio --name=idle --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=1 \
    --size=256m --time_based --runtime=10 --write_lat_log="$tmp/idle" --log_avg_msec=0 \
    >/dev/null 2>&1
  "$bin" sync pd >/dev/null
  # The dirty set the sync will save.
  fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 \
    --offset=1g --size="$dirty" >/dev/null 2>&1
  # Writes during the sync: fio runs 30 s; the sync starts after 2 s.
  fio --name=busy --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=1 \
    --size=256m --time_based --runtime=30 --write_lat_log="$tmp/busy" --log_avg_msec=0 \
    >/dev/null 2>&1 &
  fpid=$!
  sleep 2
  t0=$(date +%s%N)
  "$bin" sync pd >/dev/null
  t1=$(date +%s%N)
  wait "$fpid"
  kill "$pid"; wait "$pid" || true; pid=
  sync_ms=$(( (t1 - t0) / 1000000 ))
  read -r n_i p50_i p99_i p999_i max_i < <(pct "$tmp/idle_lat.1.log" 0 1e12)
  # Window: from 2 s (sync start) to 2 s + sync duration, in fio's clock
  # (ms since fio started, which was just before the 2 s sleep).
  read -r n_b p50_b p99_b p999_b max_b < <(pct "$tmp/busy_lat.1.log" 2000 $((2000 + sync_ms)))
  echo "run $run: sync of $dirty took ${sync_ms} ms"
  printf '  idle        n=%-7s p50 %7s us  p99 %7s us  p99.9 %7s us  max %8s us\n' "$n_i" "$p50_i" "$p99_i" "$p999_i" "$max_i"
  printf '  during sync n=%-7s p50 %7s us  p99 %7s us  p99.9 %7s us  max %8s us\n' "$n_b" "$p50_b" "$p99_b" "$p999_b" "$max_b"
  python3 -c "import sys; i,b,m=map(float,sys.argv[1:]); print(f'  p99 ratio {b/i:.2f}x (target <= 2x), max {m/1000:.2f} ms (target <= 10 ms)')" "$p99_i" "$p99_b" "$max_b"
done
rm -rf "$dir"
