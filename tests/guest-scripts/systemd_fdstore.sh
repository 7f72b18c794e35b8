#!/usr/bin/env bash
# ramd as a systemd service whose file-descriptor store keeps its RAM
# drives (docs/restart.md, contrib/systemd/ramd.service.d/fdstore.conf.example),
# with the real systemd (this host's, 254+) as PID 1 of a PID namespace in
# the guest of scripts/guest.sh:
# - a plain and a compressed RAM drive written over NBD, then the service's
#   main process killed with SIGKILL: systemd restarts it (Restart=), passes
#   the stored descriptors back, and both drives read back what was
#   written; `ramd info` counts the restart;
# - `systemctl restart ramd` (the upgrade path under systemd: the store is
#   kept across restarts): the drives again;
# - `systemctl stop` then `start`: the store is released at a stop, the
#   drives come back empty (systemd's rule, documented).
# tests/guest_systemd.rs runs it; by hand:
#
#   scripts/guest.sh run -e RAMD=$PWD/target/debug/ramd tests/guest-scripts/systemd_fdstore.sh
#
# Every check prints "ok: ..." or stops the script with "FAILED: ...".
set -euo pipefail

RAMD=${RAMD:-$PWD/target/debug/ramd}
results=/run/fdstore-test
mkdir -p "$results" /run/systemd/system

# The service under test.
cat >/run/systemd/system/ramd.service <<EOF
[Unit]
Description=ramd under test (descriptor store)
DefaultDependencies=no
[Service]
Type=notify
NotifyAccess=main
ExecStart=$RAMD daemon --no-config --runtime-dir /run/ramd --state-dir /run/ramd-state --drive db=32M --drive cz=32M,compress=lz4 --log info
FileDescriptorStoreMax=256
Restart=on-failure
RestartSec=100ms
StandardOutput=append:$results/ramd.log
StandardError=append:$results/ramd.log
EOF

# The test, run by systemd once it is up; it ends systemd with its status.
cat >/run/fdstore-test.sh <<'EOF'
#!/usr/bin/env bash
set -euo pipefail
exec >>/run/fdstore-test/out 2>&1
RAMD=$1
fail() { echo "FAILED: $*"; systemctl exit 1; exit 1; }
ok() { echo "ok: $*"; }
api=/run/ramd/api.sock
info() { "$RAMD" --api-socket "$api" info --json 2>/dev/null; }
pid_of() { info | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["pid"])' 2>/dev/null; }
wait_serving() { # not-this-pid
    for _ in $(seq 600); do
        p=$(pid_of || true)
        if [ -n "$p" ] && [ "$p" != "$1" ]; then echo "$p"; return 0; fi
        sleep 0.1
    done
    fail "ramd did not serve within 60 s (state: $(systemctl show -p ActiveState --value ramd))"
}
uri() { echo "nbd+unix:///$1?socket=/run/ramd/nbd.sock"; }
write_both() { # seed
    for d in db cz; do
        /usr/bin/python3 -c "
import random, sys
r = random.Random($1 + len('$d'))
out = bytearray()
for i in range(32 * 256):
    n = r.randrange(4097)
    out += r.randbytes(n) + bytes([i % 251]) * (4096 - n)
sys.stdout.buffer.write(out)" >/run/fdstore-test/$d.img
        nbdcopy /run/fdstore-test/$d.img "$(uri $d)" || fail "nbdcopy to $d"
    done
}
check_both() { # what
    for d in db cz; do
        nbdcopy "$(uri $d)" /run/fdstore-test/$d.back || fail "$1: nbdcopy from $d"
        cmp -s /run/fdstore-test/$d.img /run/fdstore-test/$d.back || fail "$1: drive $d differs from what was written"
        ok "$1: drive $d holds every byte written (32 MiB)"
    done
}

systemctl start ramd || fail "systemctl start ramd"
pid=$(wait_serving 0)
write_both 1
stored=$(systemctl show -p NFileDescriptorStore --value ramd)
[ "${stored:-0}" -gt 0 ] || fail "systemd's store holds nothing (NFileDescriptorStore=$stored)"
ok "systemd's descriptor store holds $stored descriptors"

kill -KILL "$pid"
new=$(wait_serving "$pid")
ok "killed $pid with SIGKILL: systemd started $new"
check_both "after kill -9"
restarts=$(info | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["supervisor"]["restarts"])')
[ "$restarts" = 1 ] || fail "ramd info counts $restarts restarts, not 1"
ok "ramd info counts 1 restart"

write_both 2
systemctl restart ramd || fail "systemctl restart ramd"
new2=$(wait_serving "$new")
ok "systemctl restart: $new2 serves"
check_both "after systemctl restart"

systemctl stop ramd
systemctl start ramd
wait_serving "$new2" >/dev/null
nbdcopy "$(uri db)" /run/fdstore-test/db.back
if cmp -s /run/fdstore-test/db.img /run/fdstore-test/db.back; then
    fail "after stop and start the drive still holds its data (the store should be released at a stop)"
fi
ok "stop, start: the store was released, the drives are new (systemd's rule)"
echo "all fdstore checks passed"
systemctl exit 0
EOF
chmod 755 /run/fdstore-test.sh

cat >/run/systemd/system/fdstore-test.service <<EOF
[Unit]
Description=ramd descriptor store test
DefaultDependencies=no
[Service]
Type=oneshot
ExecStart=/run/fdstore-test.sh $RAMD
EOF

echo "== systemd $(/lib/systemd/systemd --version | head -1)"
# systemd as PID 1 of a new PID and mount namespace; it runs the test
# unit and exits with the status the test gives it (systemctl exit).
set +e
unshare --pid --fork --mount --mount-proc --propagation private \
    env container=ramd-guest /lib/systemd/systemd --system --unit=fdstore-test.service \
    --log-target=console --log-level=notice >"$results/systemd.log" 2>&1 </dev/null
rc=$?
set -e
cat "$results/out" 2>/dev/null || true
if [ $rc -ne 0 ] || ! grep -q "all fdstore checks passed" "$results/out" 2>/dev/null; then
    echo "--- systemd (exit $rc) ---"
    tail -n 60 "$results/systemd.log"
    echo "--- ramd ---"
    tail -n 60 "$results/ramd.log" 2>/dev/null || true
    echo "FAILED: the descriptor store test did not pass"
    exit 1
fi
echo "all systemd checks passed"
