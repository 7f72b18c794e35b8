#!/usr/bin/env bash
# NBD over TLS on loopback TCP (issue 17): ramd with TLS, nbdkit memory
# --tls=require, qemu-nbd with tls-creds-x509, and ramd in plaintext, in one
# run (bench/tls.py): 4 KiB randrw QD64x2, 1 MiB sequential read and write,
# QD1 4 KiB read and write latency, and the handshake time (connect to the
# first reply). Every TLS server verifies a client certificate (mutual TLS).
#
#   bench/tls.sh                       # 5 s (+1 s ramp) per workload
#   RUNTIME=8 RAMP=2 OUT=bench/results/tls-$(date +%F) bench/tls.sh
#
# Knobs: RUNTIME, RAMP, SIZE (fio's region, default 1g), DISK (default 2G),
# SERVERS (comma list of ramd-tls,nbdkit-tls,qemu-nbd-tls,ramd-plain),
# HANDSHAKES (default 50), OUT (default bench/results/tls-YYYYmmdd-HHMMSS),
# RAMD (a built ramd binary to use instead of building one).
# Needs: openssl fio nbdkit qemu-utils python3-libnbd (scripts/test-deps.sh).
# The ramd server is the daemon itself (`ramd daemon --nbd-listen ...
# --tls require`, and `--tls off` for ramd-plain).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
out=${OUT:-$here/results/tls-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"

# A private copy, so a rebuild during the run cannot change the binary.
if [ -n "${RAMD:-}" ]; then
  cp "$RAMD" "$out/ramd"
else
  cargo build --release --bin ramd --manifest-path "$root/Cargo.toml" >&2
  cp "$root/target/release/ramd" "$out/ramd"
fi

# Certificates: one CA (EC P-256), a server certificate for 127.0.0.1,
# a client certificate. World-readable: fio may run as nobody.
work=$(mktemp -d /tmp/ramd-tls-bench-XXXXXX)
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"
cd "$work"
ossl() { openssl "$@" 2>/dev/null; }
ossl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout ca-key.pem -out ca-cert.pem -days 2 -subj "/CN=bench CA" \
  -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
leaf() { # NAME EXTENSIONS
  ossl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$1-key.pem" -out "$1.csr" -subj "/CN=$1"
  printf '%s\n' "$2" | tr ';' '\n' > "$1.ext"
  ossl x509 -req -in "$1.csr" -CA ca-cert.pem -CAkey ca-key.pem -CAcreateserial \
    -days 2 -out "$1-cert.pem" -extfile "$1.ext"
}
leaf server 'basicConstraints=CA:FALSE;keyUsage=critical,digitalSignature,keyEncipherment;extendedKeyUsage=serverAuth;subjectAltName=DNS:localhost,IP:127.0.0.1'
leaf client 'basicConstraints=CA:FALSE;keyUsage=critical,digitalSignature,keyEncipherment;extendedKeyUsage=clientAuth'
mkdir -p server home/.pki/libnbd
cp ca-cert.pem server/ && cp server-cert.pem server/ && cp server-key.pem server/
cp ca-cert.pem home/.pki/libnbd/ && cp client-cert.pem home/.pki/libnbd/ && cp client-key.pem home/.pki/libnbd/
chmod -R a+rX "$work"

# fio as a user whose libnbd looks in $HOME/.pki/libnbd (root's looks in
# /etc/pki/libnbd): nobody when we are root.
cat > "$work/fio" <<EOF
#!/bin/sh
export HOME=$work/home
if [ "\$(id -u)" = 0 ]; then
  exec setpriv --reuid=65534 --regid=65534 --clear-groups fio "\$@"
fi
exec fio "\$@"
EOF
chmod 755 "$work/fio"
cd "$root"

args=(--ramd "$out/ramd" --certs "$work/server"
      --client-dir "$work/home/.pki/libnbd" --fio "$work/fio"
      --runtime "${RUNTIME:-5}" --ramp "${RAMP:-1}" --size "${SIZE:-1g}" --disk "${DISK:-2G}"
      --handshakes "${HANDSHAKES:-50}" --out "$out/run.json")
[ -n "${SERVERS:-}" ] && args+=(--servers "$SERVERS")
/usr/bin/python3 "$here/tls.py" "${args[@]}" | tee "$out/summary.md"
