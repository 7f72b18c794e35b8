#!/usr/bin/env bash
# Cost of a 4 KiB request on the hit path, measured by callgrind
# (instruction counts do not depend on the machine's load, unlike time): a
# plain RAM drive's read and write next to a cache hit (write-through read,
# write-back overwrite of a cached block), over a 256 MiB working set.
# In-process: no NBD, so the numbers isolate the cache's data structures
# from the protocol. Also the last-level cache misses per request that
# callgrind's cache simulator counts (a 2 MiB LL cache, like one core's L2
# here): the data's 64 lines, plus whatever metadata a hit touches.
#
#   bench/cache-hitpath.sh            # N=100000 requests per kind
#   N=20000 bench/cache-hitpath.sh    # quicker
#   KEEP=1 bench/cache-hitpath.sh     # keep the callgrind files (callgrind_annotate)
#
# Needs: valgrind, bc.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
n=${N:-100000}
cargo build --release --manifest-path "$root/Cargo.toml" --example cache-hitpath >&2
bin="$root/target/release/examples/cache-hitpath"
out=$(mktemp -d /tmp/ramd-hitpath.XXXXXX)
if [ "${KEEP:-0}" = 1 ]; then echo "callgrind files in $out" >&2; else trap 'rm -rf "$out"' EXIT; fi
declare -A ir miss
for what in plain-read cache-read plain-write cache-write; do
  valgrind --tool=callgrind --cache-sim=yes --LL=2097152,16,64 \
    --collect-atstart=no --toggle-collect='*requests*' \
    --callgrind-out-file="$out/$what.cg" "$bin" count "$what" "$n" >/dev/null 2>"$out/$what.log"
  # events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw
  read -r -a t < <(sed -n 's/^summary: //p' "$out/$what.cg")
  ir[$what]=$(( t[0] / n ))
  miss[$what]=$(echo "(${t[6]} + ${t[7]} + ${t[8]}) / $n" | bc -l)
  printf '%-12s %6d instructions, %5.1f LL misses per 4 KiB request\n' \
    "$what" "${ir[$what]}" "${miss[$what]}"
done
printf 'cache/plain instructions: read %.2f, write %.2f\n' \
  "$(echo "${ir[cache-read]} / ${ir[plain-read]}" | bc -l)" \
  "$(echo "${ir[cache-write]} / ${ir[plain-write]}" | bc -l)"
