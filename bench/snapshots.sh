#!/usr/bin/env bash
# Snapshots in S3-compatible object storage (issue 18): ramd's push and
# restore against rclone moving the raw image, same single-node Garage on
# loopback, same run.
#
#   (1) ramd full push of a drive full of mixed data (25% zeroes, 25% text
#       from /usr/share/doc, 25% random, 25% one 1 MiB block repeated), to a
#       fresh prefix each run   vs   `rclone copy` of the raw image file
#       (in /dev/shm) to the bucket;
#   (2) change 1% (CHANGE_BLOCK-sized random writes at distinct, block-
#       aligned scattered offsets) and time ramd's incremental push; the
#       bytes it sent (the job's push.bytes_uploaded) vs the bytes changed;
#   (3) ramd restore into a new drive, read back with nbdcopy and checked
#       with sha256 against the changed image   vs   `rclone copy` download
#       of the raw image to /dev/shm (also checked).
# CPU seconds of ramd and garage (from /proc/PID/stat) and of rclone
# (/usr/bin/time) are recorded for each step. Medians of RUNS.
#
# Needs: garage (cargo install garage --locked --no-default-features
# --features sqlite,bundled-libs; found on PATH or in ~/.cargo/bin),
# rclone (apt-get install -y rclone), nbdcopy (libnbd-bin), python3 with
# the nbd module (python3-libnbd), /usr/bin/time.
#
# Env knobs: SIZE=2G RUNS=3 OUT=dir CHANGE_BLOCK=1M (bytes per changed
# extent; 1% of SIZE is changed in total) CHUNK= (the remote's chunk size,
# `ramd remote add --chunk-size`; empty: ramd's default).
set -euo pipefail

SIZE=${SIZE:-2G}
RUNS=${RUNS:-3}
CHANGE_BLOCK=${CHANGE_BLOCK:-1M}
CHUNK=${CHUNK:-}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/bench/results/$(date -u +%F)-snapshots}
PY=/usr/bin/python3

to_bytes() { numfmt --from=iec "$1"; }
SIZE_B=$(to_bytes "$SIZE")
BLOCK_B=$(to_bytes "$CHANGE_BLOCK")
MiB=$((1 << 20))
(( SIZE_B % (4 * MiB) == 0 )) || { echo "SIZE must be a multiple of 4 MiB" >&2; exit 2; }

missing=0
GARAGE=$(command -v garage || true)
[[ -n $GARAGE ]] || GARAGE=$HOME/.cargo/bin/garage
[[ -x $GARAGE ]] || { echo "missing garage: cargo install garage --locked --no-default-features --features sqlite,bundled-libs" >&2; missing=1; }
command -v rclone >/dev/null || { echo "missing rclone: apt-get install -y rclone" >&2; missing=1; }
command -v nbdcopy >/dev/null || { echo "missing nbdcopy: apt-get install -y libnbd-bin" >&2; missing=1; }
$PY -c 'import nbd' 2>/dev/null || { echo "missing python3 nbd module: apt-get install -y python3-libnbd" >&2; missing=1; }
[[ -x /usr/bin/time ]] || { echo "missing /usr/bin/time: apt-get install -y time" >&2; missing=1; }
(( missing == 0 )) || exit 2

# Build once: skip when the release binary is newer than every source.
RAMD=$ROOT/target/release/ramd
if [[ ! -x $RAMD ]] || [[ -n $(find "$ROOT/src" "$ROOT/Cargo.toml" "$ROOT/Cargo.lock" -newer "$RAMD" -print -quit) ]]; then
  (cd "$ROOT" && cargo build --release)
fi

mkdir -p "$OUT"
TMP=$(mktemp -d /tmp/ramd-snapbench.XXXXXX)
SHM=$(mktemp -d /dev/shm/ramd-snapbench.XXXXXX)
GPID= RPID=
cleanup() {
  [[ -n $RPID ]] && kill "$RPID" 2>/dev/null && wait "$RPID" 2>/dev/null || true
  [[ -n $GPID ]] && kill "$GPID" 2>/dev/null && wait "$GPID" 2>/dev/null || true
  rm -rf "$TMP" "$SHM"
}
trap cleanup EXIT

now() { date +%s.%N; }
sub() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a - b }'; }
# utime+stime of a process in seconds.
cpu_of() { awk -v hz="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); print ($12 + $13) / hz }' "/proc/$1/stat"; }
free_port() { $PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# ---------------------------------------------------------------- Garage
RPC=$(free_port) S3=$(free_port) ADMIN=$(free_port)
ENDPOINT=http://127.0.0.1:$S3
cat >"$TMP/garage.toml" <<EOF
metadata_dir = "$TMP/garage/meta"
data_dir = "$TMP/garage/data"
db_engine = "sqlite"
replication_factor = 1
rpc_bind_addr = "127.0.0.1:$RPC"
rpc_public_addr = "127.0.0.1:$RPC"
rpc_secret = "$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')"

[s3_api]
s3_region = "garage"
api_bind_addr = "127.0.0.1:$S3"
root_domain = ".s3.garage.localhost"

[admin]
api_bind_addr = "127.0.0.1:$ADMIN"
EOF
g() { "$GARAGE" -c "$TMP/garage.toml" "$@"; }
RUST_LOG=garage=warn "$GARAGE" -c "$TMP/garage.toml" server >"$TMP/garage.log" 2>&1 &
GPID=$!
for _ in $(seq 600); do
  g status >/dev/null 2>&1 && break
  sleep 0.1
done
g status >/dev/null
NODE=$(g node id -q | cut -d@ -f1)
g layout assign -z dc1 -c 100G "$NODE" >/dev/null
g layout apply --version 1 >/dev/null
KEYOUT=$(g key create bench-key)
KEY_ID=$(awk -F': *' '/Key ID:/ {print $2; exit}' <<<"$KEYOUT")
SECRET=$(awk -F': *' '/Secret key:/ {print $2; exit}' <<<"$KEYOUT")
BUCKET=bench
g bucket create $BUCKET >/dev/null
g bucket allow --read --write --owner $BUCKET --key bench-key >/dev/null

CREDS=$TMP/creds.toml
( umask 077; printf 'access_key_id = "%s"\nsecret_access_key = "%s"\n' "$KEY_ID" "$SECRET" >"$CREDS" )
chmod 600 "$CREDS"
export RCLONE_CONFIG=$TMP/rclone.conf
cat >"$RCLONE_CONFIG" <<EOF
[garage]
type = s3
provider = Other
access_key_id = $KEY_ID
secret_access_key = $SECRET
endpoint = $ENDPOINT
region = garage
force_path_style = true
no_check_bucket = true
EOF
chmod 600 "$RCLONE_CONFIG"
# rclone 1.60's S3 backend refuses AWS_CA_BUNDLE ("unsupported transport");
# the endpoint is plain http on loopback, so it is not needed.
unset AWS_CA_BUNDLE

# ------------------------------------------------------------ the daemon
SOCK=$TMP/ramd.sock
export RAMD_API_SOCKET=$TMP/ramd-api.sock
"$RAMD" daemon --no-config --state-dir "$TMP/state" --socket "$SOCK" --api-socket "$RAMD_API_SOCKET" \
  --drive "bench=$SIZE" >"$TMP/ramd.log" 2>&1 &
RPID=$!
for _ in $(seq 600); do
  [[ -S $SOCK && -S $RAMD_API_SOCKET ]] && "$RAMD" list >/dev/null 2>&1 && break
  sleep 0.1
done
"$RAMD" list >/dev/null || { echo "ramd did not start:" >&2; cat "$TMP/ramd.log" >&2; exit 1; }
uri() { echo "nbd+unix:///$1?socket=$SOCK"; }

# --------------------------------------------------------- the image
# Zeroes and text are made once; the random quarter and the repeated block
# are new each run, so Garage (which stores blocks by hash) cannot
# deduplicate one run's uploads against the previous run's.
IMG=$SHM/base.img
Q=$((SIZE_B / 4))
echo "making the text part from /usr/share/doc..." >&2
$PY - "$Q" "$SHM/text.part" <<'EOF2'
import gzip, os, sys
q, out = int(sys.argv[1]), sys.argv[2]
files = sorted(os.path.join(d, f) for d, _, fs in os.walk("/usr/share/doc") for f in fs)
buf, n = [], 0
while n < q:
    for p in files:
        try:
            data = gzip.open(p).read() if p.endswith(".gz") else open(p, "rb").read()
        except Exception:
            continue
        buf.append(data); n += len(data)
        if n >= q:
            break
open(out, "wb").write(b"".join(buf)[:q])
EOF2
make_image() {
  {
    head -c "$Q" /dev/zero
    cat "$SHM/text.part"
    head -c "$Q" /dev/urandom
    head -c "$MiB" /dev/urandom >"$TMP/block"
    for ((i = 0; i < Q / MiB; i++)); do cat "$TMP/block"; done
  } >"$IMG"
  [[ $(stat -c %s "$IMG") == "$SIZE_B" ]] || { echo "image has the wrong size" >&2; exit 1; }
  BASE_SHA=$(sha256sum "$IMG" | cut -d' ' -f1)
}

# The 1% change: N distinct CHANGE_BLOCK-aligned offsets, random bytes,
# written to the drive over NBD and to a copy of the image. Prints N.
change() { # seed
  $PY - "$1" "$SIZE_B" "$BLOCK_B" "$SHM/changed.img" "$(uri bench)" <<'EOF'
import nbd, os, random, sys
seed, size, block, img, uri = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
n = max(1, size // 100 // block)
rng = random.Random(seed)
offs = sorted(rng.sample(range(size // block), n))
h = nbd.NBD(); h.connect_uri(uri)
with open(img, "r+b") as f:
    for o in offs:
        data = os.urandom(block)
        h.pwrite(data, o * block)
        f.seek(o * block); f.write(data)
h.flush(); h.shutdown()
print(n)
EOF
}

jq_py() { $PY -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

RUNS_JSON=$OUT/runs.jsonl
: >"$RUNS_JSON"
for run in $(seq "$RUNS"); do
  echo "run $run/$RUNS" >&2
  make_image
  nbdcopy "$IMG" "$(uri bench)"
  cp "$IMG" "$SHM/changed.img"
  "$RAMD" remote add "r$run" "s3://$BUCKET/ramd-run$run" --endpoint "$ENDPOINT" --region garage \
    --credentials-file "$CREDS" ${CHUNK:+--chunk-size "$CHUNK"} >/dev/null
  chunk_b=$("$RAMD" remote list --json | jq_py "[r['chunk_bytes'] for r in d['remotes'] if r['name'] == 'r$run'][0]")
  sync

  # (1) ramd full push.
  c0=$(cpu_of $RPID) g0=$(cpu_of $GPID) t0=$(now)
  "$RAMD" snapshot create bench --to "r$run" --json >"$TMP/full.json"
  t1=$(now) c1=$(cpu_of $RPID) g1=$(cpu_of $GPID)
  full_s=$(sub "$t1" "$t0"); full_ramd_cpu=$(sub "$c1" "$c0"); full_garage_cpu=$(sub "$g1" "$g0")
  full_up=$(jq_py 'd["push"]["bytes_uploaded"]' <"$TMP/full.json")
  sync

  # (1') rclone copy of the raw image.
  g0=$(cpu_of $GPID) t0=$(now)
  /usr/bin/time -f '%U %S' -o "$TMP/rc.time" rclone copy "$IMG" "garage:$BUCKET/raw-run$run/"
  t1=$(now) g1=$(cpu_of $GPID)
  rc_up_s=$(sub "$t1" "$t0"); rc_up_garage_cpu=$(sub "$g1" "$g0")
  rc_up_cpu=$(awk '{print $1 + $2}' "$TMP/rc.time")
  sync

  # (2) 1% change, incremental push.
  nchg=$(change "$run")
  changed_b=$((nchg * BLOCK_B))
  c0=$(cpu_of $RPID) g0=$(cpu_of $GPID) t0=$(now)
  "$RAMD" snapshot create bench --to "r$run" --json >"$TMP/incr.json"
  t1=$(now) c1=$(cpu_of $RPID) g1=$(cpu_of $GPID)
  incr_s=$(sub "$t1" "$t0"); incr_ramd_cpu=$(sub "$c1" "$c0"); incr_garage_cpu=$(sub "$g1" "$g0")
  incr_up=$(jq_py 'd["push"]["bytes_uploaded"]' <"$TMP/incr.json")
  incr_chunks=$(jq_py 'd["push"]["chunks_uploaded"]' <"$TMP/incr.json")
  sync

  # (3) ramd restore into a new drive, then verified end to end.
  c0=$(cpu_of $RPID) g0=$(cpu_of $GPID) t0=$(now)
  "$RAMD" restore bench --from "r$run" --as "rest$run" >/dev/null
  t1=$(now) c1=$(cpu_of $RPID) g1=$(cpu_of $GPID)
  rest_s=$(sub "$t1" "$t0"); rest_ramd_cpu=$(sub "$c1" "$c0"); rest_garage_cpu=$(sub "$g1" "$g0")
  nbdcopy "$(uri "rest$run")" "$SHM/restored.img"
  want=$(sha256sum "$SHM/changed.img" | cut -d' ' -f1)
  got=$(sha256sum "$SHM/restored.img" | cut -d' ' -f1)
  rest_ok=false; [[ $got == "$want" ]] && rest_ok=true
  rm -f "$SHM/restored.img"
  "$RAMD" delete "rest$run" --force >/dev/null
  sync

  # (3') rclone download of the raw image.
  g0=$(cpu_of $GPID) t0=$(now)
  /usr/bin/time -f '%U %S' -o "$TMP/rc.time" rclone copy "garage:$BUCKET/raw-run$run/base.img" "$SHM/dl/"
  t1=$(now) g1=$(cpu_of $GPID)
  rc_dn_s=$(sub "$t1" "$t0"); rc_dn_garage_cpu=$(sub "$g1" "$g0")
  rc_dn_cpu=$(awk '{print $1 + $2}' "$TMP/rc.time")
  rc_ok=false; [[ $(sha256sum "$SHM/dl/base.img" | cut -d' ' -f1) == "$BASE_SHA" ]] && rc_ok=true
  rm -rf "$SHM/dl"

  cat >>"$RUNS_JSON" <<EOF
{"run": $run, "chunk_bytes": $chunk_b, "full_push_s": $full_s, "full_push_ramd_cpu_s": $full_ramd_cpu, "full_push_garage_cpu_s": $full_garage_cpu, "full_push_uploaded_bytes": $full_up, "full_push_report": $(cat "$TMP/full.json" | tr -d '\n'), "rclone_upload_s": $rc_up_s, "rclone_upload_cpu_s": $rc_up_cpu, "rclone_upload_garage_cpu_s": $rc_up_garage_cpu, "changed_extents": $nchg, "changed_bytes": $changed_b, "incr_push_s": $incr_s, "incr_push_ramd_cpu_s": $incr_ramd_cpu, "incr_push_garage_cpu_s": $incr_garage_cpu, "incr_push_uploaded_bytes": $incr_up, "incr_push_chunks_uploaded": $incr_chunks, "restore_s": $rest_s, "restore_ramd_cpu_s": $rest_ramd_cpu, "restore_garage_cpu_s": $rest_garage_cpu, "restore_verified": $rest_ok, "rclone_download_s": $rc_dn_s, "rclone_download_cpu_s": $rc_dn_cpu, "rclone_download_garage_cpu_s": $rc_dn_garage_cpu, "rclone_download_verified": $rc_ok}
EOF
  tail -1 "$RUNS_JSON" | $PY -c 'import json,sys; d=json.load(sys.stdin); d.pop("full_push_report"); print(json.dumps(d))' >&2
done

# ------------------------------------------------------------ summary
$PY - "$RUNS_JSON" "$OUT" "$SIZE_B" "$BLOCK_B" "$(rclone version | head -1)" "$("$RAMD" --version 2>/dev/null | head -1)" "$("$GARAGE" --version 2>/dev/null | head -1)" "$(nproc)" <<'EOF'
import json, statistics, sys
path, out, size, block, rcv, ramdv, garagev, ncpu = sys.argv[1:]
size, block = int(size), int(block)
runs = [json.loads(l) for l in open(path) if l.strip()]
keys = [k for k in runs[0] if isinstance(runs[0][k], (int, float)) and not isinstance(runs[0][k], bool) and k not in ("run", "chunk_bytes")]
med = {k: statistics.median(r[k] for r in runs) for k in keys}
mib = size / (1 << 20)
res = {
    "size_bytes": size, "change_block_bytes": block, "chunk_bytes": runs[0]["chunk_bytes"], "runs": len(runs), "cpus": int(ncpu),
    "rclone": rcv, "ramd": ramdv, "garage": garagev,
    "median": med,
    "full_push_mib_s": mib / med["full_push_s"], "rclone_upload_mib_s": mib / med["rclone_upload_s"],
    "restore_mib_s": mib / med["restore_s"], "rclone_download_mib_s": mib / med["rclone_download_s"],
    "incr_uploaded_per_changed": med["incr_push_uploaded_bytes"] / med["changed_bytes"],
    "restore_verified_all": all(r["restore_verified"] for r in runs),
    "rclone_download_verified_all": all(r["rclone_download_verified"] for r in runs),
    "per_run": runs,
}
json.dump(res, open(f"{out}/results.json", "w"), indent=2)
m = med
lines = [
    f"# Snapshots in object storage (issue 18): ramd vs rclone, one Garage on loopback",
    "",
    f"{size / (1 << 30):g} GiB drive (25% zeroes, 25% text, 25% random, 25% one repeated 1 MiB block); ramd chunks of {runs[0]['chunk_bytes'] >> 10} KiB; {len(runs)} runs, medians; {ncpu} CPUs; {rcv}; {garagev}.",
    "",
    "| step | ramd | rclone |",
    "|---|---|---|",
    f"| full push / upload | {m['full_push_s']:.2f} s ({res['full_push_mib_s']:.0f} MiB/s of drive), sent {m['full_push_uploaded_bytes'] / (1 << 20):.0f} MiB | {m['rclone_upload_s']:.2f} s ({res['rclone_upload_mib_s']:.0f} MiB/s) |",
    f"| incremental push after 1% ({m['changed_bytes'] / (1 << 20):.0f} MiB in {block >> 10} KiB extents) | {m['incr_push_s']:.2f} s, sent {m['incr_push_uploaded_bytes'] / (1 << 20):.1f} MiB = {res['incr_uploaded_per_changed']:.2f}x changed | (whole image again) |",
    f"| restore / download | {m['restore_s']:.2f} s ({res['restore_mib_s']:.0f} MiB/s), verified: {'yes' if res['restore_verified_all'] else 'NO'} | {m['rclone_download_s']:.2f} s ({res['rclone_download_mib_s']:.0f} MiB/s), verified: {'yes' if res['rclone_download_verified_all'] else 'NO'} |",
    "",
    "CPU seconds (medians): ",
    f"full push: ramd {m['full_push_ramd_cpu_s']:.2f}, garage {m['full_push_garage_cpu_s']:.2f}; rclone upload: rclone {m['rclone_upload_cpu_s']:.2f}, garage {m['rclone_upload_garage_cpu_s']:.2f};",
    f"incremental: ramd {m['incr_push_ramd_cpu_s']:.2f}, garage {m['incr_push_garage_cpu_s']:.2f};",
    f"restore: ramd {m['restore_ramd_cpu_s']:.2f}, garage {m['restore_garage_cpu_s']:.2f}; rclone download: rclone {m['rclone_download_cpu_s']:.2f}, garage {m['rclone_download_garage_cpu_s']:.2f}.",
]
open(f"{out}/summary.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
