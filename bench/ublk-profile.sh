#!/usr/bin/env bash
# Where the time of a QD1 request on /dev/ublkbN goes, in the guest of
# scripts/guest.sh (or on a real host with ublk_drv): perf (cpu-clock,
# system-wide, call graphs) during fio 4 KiB random reads at QD1 on brd and
# on a ramd ublk device; prints the split by thread, the top symbols, and
# who re-enables interrupts (where cpu-clock samples of IRQ-off code land).
#
#   scripts/guest.sh run --timeout 600 -e RAMD=$PWD/target/release/ramd bench/ublk-profile.sh
#
# Needs: perf (apt-get install linux-perf), fio, the guest (scripts/guest.sh setup).
# Results: bench/RESULTS.md, "ublk" (QD1).
set -euo pipefail
RAMD=${RAMD:-$PWD/target/release/ramd}
modprobe ublk_drv
modprobe brd rd_nr=1 rd_size=262144
"$RAMD" daemon --no-config --drive db=256M >/tmp/ramd.log 2>&1 &
for i in $(seq 600); do "$RAMD" list >/dev/null 2>&1 && break; sleep 0.1; done
dev=$("$RAMD" attach db --ublk)
echo "device $dev"
for d in /dev/ram0 "$dev"; do
  fio --name=fill --filename="$d" --ioengine=libaio --direct=1 --rw=write --bs=1M --size=64M --output=/dev/null
done
prof() { # name dev
  perf record -q -a -g -e cpu-clock -F 999 -o "/tmp/$1.data" -- \
    fio --name="$1" --filename="$2" --ioengine=libaio --direct=1 --rw=randread --bs=4k --iodepth=1 \
        --size=64M --time_based --runtime=5 --output="/tmp/$1.fio" >/dev/null 2>&1
  echo "=== $1: $(grep -o 'IOPS=[^,]*' /tmp/$1.fio), clat: $(grep -m1 ' clat (' /tmp/$1.fio)"
  echo "--- $1: by command"
  perf report -q -i "/tmp/$1.data" --stdio --no-children --sort comm -g none >"/tmp/$1.comm" 2>/dev/null || true
  sed -n 1,12p "/tmp/$1.comm"
  echo "--- $1: top symbols"
  perf report -q -i "/tmp/$1.data" --stdio --no-children --sort comm,sym -g none >"/tmp/$1.sym" 2>/dev/null || true
  grep -v '^$' "/tmp/$1.sym" | sed -n 1,45p || true
  echo "--- $1: ramd's queue thread, callers (top)"
  perf report -q -i "/tmp/$1.data" --stdio --no-children --comms ublk-db-0,ublk-db-1 -g caller,0.5,callee --sort sym >"/tmp/$1.cg" 2>/dev/null || true
  grep -v '^$' "/tmp/$1.cg" | sed -n 1,60p || true
}
prof brd /dev/ram0
prof ublk "$dev"
echo "--- ublk: who re-enables interrupts (the samples' skid lands there): callers"
perf report -q -i /tmp/ublk.data --stdio --no-children --comms fio,ublk-db-0 \
  --symbols _raw_spin_unlock_irqrestore,_raw_spin_unlock_irq -g caller,2,callee,function,percent --sort comm,sym \
  >/tmp/ublk.irq 2>/dev/null || true
grep -v '^$' /tmp/ublk.irq | sed -n 1,120p || true
cp /tmp/*.fio "$GUEST_RESULTS" 2>/dev/null || true
"$RAMD" detach db >/dev/null
echo done
