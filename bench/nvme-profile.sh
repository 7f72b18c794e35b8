#!/usr/bin/env bash
# Where ramd's NVMe/TCP target spends its time, in the guest of
# scripts/guest.sh (or on a real host with nvme-tcp): perf (cpu-clock,
# system-wide, call graphs) during fio through the kernel's NVMe/TCP
# initiator (2 I/O queues) at 4 KiB random 50-50 read/write QD32 with one
# job, and 1 MiB sequential writes at QD8 (the figures bench/nvme.sh finds
# weakest), and the same QD32 workload through the kernel's NBD client
# (2 connections) to ramd over TCP, the peer it is compared with; prints
# the split by CPU and by thread, the top symbols, and the callers in
# ramd's connection threads.
#
#   cargo build --release && cp target/release/ramd /work/ramd-bench
#   scripts/guest.sh run --timeout 900 -e RAMD=/work/ramd-bench bench/nvme-profile.sh
#
# Needs: perf (apt-get install linux-perf), fio, nvme-cli, the guest
# (scripts/guest.sh setup). Results: bench/RESULTS.md, "NVMe/TCP".
set -euo pipefail
RAMD=${RAMD:-$PWD/target/release/ramd}
hostnqn=nqn.2014-08.org.nvmexpress:uuid:0b0b0b0b-0000-4000-8000-00000000be0d
modprobe nvme-tcp
modprobe nbd
"$RAMD" daemon --no-config --drive nv=256M --drive nb=256M --nvme-listen 127.0.0.1:4420 \
    --nbd-listen 127.0.0.1:10809 --tls off >/tmp/ramd.log 2>&1 &
for i in $(seq 600); do "$RAMD" list >/dev/null 2>&1 && break; sleep 0.1; done
nqn=$("$RAMD" info nv --json | sed -n 's/.*"nvme_nqn": *"\([^"]*\)".*/\1/p')
nvme connect -t tcp -a 127.0.0.1 -s 4420 -n "$nqn" -q "$hostnqn" -i 2 >/dev/null
dev=
for i in $(seq 200); do
  for b in /sys/block/nvme*n*; do
    case ${b##*/} in nvme*c*n*) continue ;; esac
    [ "$(cat "$b/device/subsysnqn" 2>/dev/null)" = "$nqn" ] && dev=/dev/${b##*/}
  done
  [ -n "$dev" ] && break
  sleep 0.1
done
[ -n "$dev" ] || { echo "no block device for $nqn" >&2; exit 1; }
nbd-client 127.0.0.1 10809 -N nb -C 2 /dev/nbd0 >/dev/null
echo "devices $dev /dev/nbd0"
for d in "$dev" /dev/nbd0; do
  fio --name=fill --filename="$d" --ioengine=libaio --direct=1 --rw=write --bs=1M --size=256M --output=/dev/null
done
prof() { # name device fio-options...
  local name=$1 dev=$2
  shift 2
  perf record -q -a -g -e cpu-clock -F 999 -o "/tmp/$name.data" -- \
    fio --name="$name" --filename="$dev" --ioengine=libaio --direct=1 --size=256M \
        --time_based --runtime=5 --output="/tmp/$name.fio" "$@" >/dev/null 2>&1
  echo "=== $name: $(grep -o -m2 '\(IOPS\|BW\)=[^,]*' /tmp/$name.fio | tr '\n' ' ')"
  echo "--- $name: by CPU"
  perf report -q -i "/tmp/$name.data" --stdio --no-children --sort cpu -g none 2>/dev/null | grep -v '^$' || true
  echo "--- $name: by CPU and command"
  perf report -q -i "/tmp/$name.data" --stdio --no-children --sort cpu,comm -g none 2>/dev/null | grep -v '^$' | sed -n 1,12p || true
  echo "--- $name: by command"
  perf report -q -i "/tmp/$name.data" --stdio --no-children --sort comm -g none >"/tmp/$name.comm" 2>/dev/null || true
  sed -n 1,12p "/tmp/$name.comm"
  echo "--- $name: top symbols"
  perf report -q -i "/tmp/$name.data" --stdio --no-children --sort comm,dso,sym -g none >"/tmp/$name.sym" 2>/dev/null || true
  grep -v '^$' "/tmp/$name.sym" | sed -n 1,40p || true
  echo "--- $name: ramd's connection threads, top symbols"
  perf report -q -i "/tmp/$name.data" --stdio --no-children --comms nvme-conn --sort dso,sym -g none >"/tmp/$name.ramd" 2>/dev/null || true
  grep -v '^$' "/tmp/$name.ramd" | sed -n 1,40p || true
  echo "--- $name: ramd's connection threads, callers of the top ones"
  perf report -q -i "/tmp/$name.data" --stdio --no-children --comms nvme-conn -g caller,2,callee,function,percent --sort sym >"/tmp/$name.cg" 2>/dev/null || true
  grep -v '^$' "/tmp/$name.cg" | sed -n 1,80p || true
}
prof qd32x1 "$dev" --rw=randrw --bs=4k --iodepth=32 --numjobs=1
prof nbd-qd32x1 /dev/nbd0 --rw=randrw --bs=4k --iodepth=32 --numjobs=1
prof write1m "$dev" --rw=write --bs=1M --iodepth=8 --numjobs=1
cp /tmp/*.fio "$GUEST_RESULTS" 2>/dev/null || true
nvme disconnect -n "$nqn" >/dev/null
nbd-client -d /dev/nbd0 >/dev/null
echo done
