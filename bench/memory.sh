#!/usr/bin/env bash
# Memory behaviour of ramd, measured from the daemon's RSS (/proc/PID/status):
#  1. metadata: RSS of a daemon with one 16 GiB drive minus one with a 1 MiB
#     drive, before any write (target: under 0.1% of the drive size);
#  2. allocate-on-write: RSS after fio writes 512 MiB into a 1 GiB drive;
#  3. trim returns memory: RSS after trimming the whole drive (nbdsh).
# Needs fio with the nbd engine and nbdsh (libnbd-bin, python3-libnbd).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cargo build --release --manifest-path "$root/Cargo.toml" >&2
bin=$root/target/release/ramd
tmp=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; rm -rf "$tmp"' EXIT

start() { # start DRIVE-SPEC...
  local args=()
  for d in "$@"; do args+=(--drive "$d"); done
  "$bin" serve --no-config --socket "$tmp/nbd.sock" --api-socket "$tmp/api.sock" --log warn "${args[@]}" &
  pid=$!
  for _ in $(seq 100); do [ -S "$tmp/nbd.sock" ] && return; sleep 0.05; done
  echo "ramd did not start" >&2; exit 1
}
stop() { kill "$pid"; wait "$pid" || true; pid=; }
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$pid/status"; }

start small=1M
base=$(rss_kib)
stop
start small=1M big=16G,overcommit
with_big=$(rss_kib)
stop
meta_kib=$((with_big - base))

start ram0=1G
uri="nbd+unix:///ram0?socket=$tmp/nbd.sock"
idle=$(rss_kib)
fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --size=512M --iodepth=8 \
    --output=/dev/null
written=$(rss_kib)
PATH=/usr/bin:$PATH nbdsh -u "$uri" -c '
size = h.get_size()
off = 0
while off < size:
    n = min(1 << 30, size - off)
    h.trim(n, off)
    off += n
'
trimmed=$(rss_kib)
stop

cat <<TABLE
| measure | value |
|---|---|
| metadata of a 16 GiB drive (RSS delta, before writes) | ${meta_kib} KiB = $(awk "BEGIN {printf \"%.4f\", $meta_kib / (16 * 1024 * 1024) * 100}")% of size |
| RSS idle, 1 GiB drive | ${idle} KiB |
| RSS after writing 512 MiB | ${written} KiB |
| RSS after trimming the whole drive | ${trimmed} KiB |
TABLE
