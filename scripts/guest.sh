#!/usr/bin/env bash
# The guest-kernel harness: runs a script as root in a QEMU guest whose
# kernel has the block drivers this machine's kernel lacks (ublk_drv, nbd,
# nvme-tcp, nvmet-tcp, brd, null_blk, md/raid1, loop), against this host's
# own binaries.
#
#   scripts/guest.sh setup     installs QEMU and the guest tools, downloads
#                              Debian's linux-image-6.12.*-amd64 into
#                              $RAMD_GUEST_CACHE (/var/cache/ramd-guest) and
#                              builds the initramfs. Idempotent; instant when
#                              done.
#   scripts/guest.sh check     exit 0 when setup is complete (quiet), else 1
#                              with what is missing.
#   scripts/guest.sh run [OPTIONS] SCRIPT_FILE
#   scripts/guest.sh run [OPTIONS] -c 'COMMANDS'
#       --cpus N          vCPUs (default 2)
#       --mem SIZE        guest memory, QEMU syntax (default 2G)
#       --timeout SECS    the script's time limit (default 600); the host
#                         allows another $RAMD_GUEST_BOOT_ALLOWANCE (180) s
#                         for boot and power-off before it kills QEMU
#       --results DIR     keep the results in DIR (an empty or new
#                         directory) instead of a temporary one
#       -e NAME=VALUE     an environment variable for the script (repeatable)
#       -v                stream the guest's serial console to stderr
#
# How it works. The guest (QEMU, TCG: this machine's /dev/kvm cannot run a
# normal guest) boots the downloaded kernel with a busybox initramfs whose
# /init (see init_script below):
#   - loads the 9p, virtio and overlay modules (decompressed copies in the
#     initramfs);
#   - mounts this host's / read-only over 9p (mount tag "host") and lays a
#     tmpfs over it with overlayfs, so the guest sees the whole host
#     filesystem (the repository at the same path, target/debug/ramd, fio,
#     nvme-cli, nbd-client, mkfs.ext4, mdadm, ...) and can write anywhere
#     without touching the host;
#   - mounts a writable 9p share (tag "results", a fresh directory on the
#     host) that carries the job in (job/script, job/cwd, job/env,
#     job/timeout) and the results out (stdout, stderr, exit_code, status,
#     dmesg);
#   - mounts proc, sys, devtmpfs (so /dev/ublkb*, /dev/nbd*, /dev/nvme*,
#     /dev/ram* appear by themselves: there is no udev), devpts, /dev/shm,
#     configfs at /sys/kernel/config (nvmet), debugfs, and fresh tmpfs on
#     /tmp, /var/tmp, /run, /root and /mnt; binds the kernel's modules
#     (cached on the host, decompressed where the tests need them, depmod
#     run) at /lib/modules/$(uname -r), so plain `modprobe nbd` works;
#     brings `lo` up and sets the hostname;
#   - chroots into that root and runs the script with bash as root, in the
#     host's working directory, with PATH, HOME=/root and
#     GUEST_RESULTS=/run/ramd-guest/results (the results share: files the
#     script leaves there come back to the host);
#   - writes the exit code and dmesg to the results share and powers off
#     (poweroff -f). A panic reboots, and -no-reboot turns that into QEMU's
#     exit.
#
# Exit status of `run`: the script's own exit code, or
#   124  the script outlived --timeout (the guest killed it; its output so
#        far and dmesg are printed), or QEMU outlived the boot allowance and
#        was killed;
#   125  the guest did not boot or the harness failed (no exit code came
#        back; the console log is printed), or setup was not done;
#     2  bad usage.
# A script's own 124 or 125 is told apart by the results' `status` file
# (ok / timeout) when --results is given.
#
# Timing: every guest instruction is emulated (TCG), so figures measured in
# the guest are only meaningful as ratios within one run, never as speeds.
# A boot to the script takes ~10 s on an idle 2-core machine.
#
# Environment: RAMD_GUEST_CACHE (default /var/cache/ramd-guest),
# RAMD_GUEST_NEXT=1 (the second guest: the newest kernel of Debian unstable,
# for features newer than 6.12; its own cache in $RAMD_GUEST_CACHE/next),
# RAMD_GUEST_KERNEL (setup: a kernel version like 6.12.117+deb12-amd64
# instead of the newest), RAMD_GUEST_REFRESH=1 (setup: pick the newest
# kernel again even though one is cached), RAMD_GUEST_BOOT_ALLOWANCE.
set -euo pipefail

export PATH="/usr/sbin:/usr/bin:/sbin:/bin:${PATH:-}"
cache=${RAMD_GUEST_CACHE:-/var/cache/ramd-guest}
# RAMD_GUEST_NEXT=1: the second guest, with the newest kernel of Debian
# unstable (features newer than 6.12: ublk's UPDATE_SIZE, ...), in its own
# cache subdirectory; setup, check and run all take it.
next=${RAMD_GUEST_NEXT:-0}
[ "$next" = 1 ] && cache=$cache/next
me=$(basename "$0")

# The Debian release, for its backports suite (bookworm on Debian 12).
codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
codename=${codename:-bookworm}
backports=$codename-backports

# Bump to rebuild every cached initramfs and module tree (their recipe
# below changed in a way the stamp's hash of init_script cannot see).
setup_version=1

die() {
    echo "$me: $*" >&2
    exit 125
}

# ---------------------------------------------------------------- setup ---

# Debian 12 packages: QEMU, the initramfs' busybox, the module tools (depmod
# on the host; modprobe in the guest, from the host's root), and the tools
# the guest tests drive.
packages=(
    qemu-system-x86 # qemu-system-x86_64 (TCG)
    busybox-static  # the initramfs' only binary
    cpio            # packs the initramfs
    kmod            # depmod, modprobe (not in the base image)
    xz-utils        # the kernel package's modules are .ko.xz
    util-linux      # setpriv --pdeathsig: QEMU dies with this script
    nvme-cli        # nvme connect (nvme-tcp)
    nbd-client      # the kernel NBD client
    mdadm           # md raid1
    fio
    e2fsprogs       # mkfs.ext4, e2fsck
)
tools=(
    qemu-system-x86_64 /bin/busybox cpio depmod modprobe xz setpriv nvme
    nbd-client mdadm fio mkfs.ext4 e2fsck
)

# Modules decompressed in the cache (with everything they depend on) so the
# guest loads them without decompressing xz under emulation. Any other
# module still loads with modprobe (kmod reads .ko.xz itself), just slower.
guest_modules=(
    ublk_drv nbd nvme-core nvme-fabrics nvme-tcp nvmet nvmet-tcp brd null_blk
    md-mod raid1 loop ext4 configfs overlay 9p 9pnet_virtio
)
# Modules the initramfs loads itself, in this order after their
# dependencies: 9p and its virtio transport for the shares, overlay for the
# writable root, configfs for nvmet.
initramfs_modules=(9pnet_virtio 9p overlay configfs)

missing_tool() {
    local t
    for t in "${tools[@]}"; do
        command -v "$t" >/dev/null 2>&1 || { echo "$t"; return 0; }
    done
    return 1
}

# The Debian mirror this machine already uses (deb.debian.org if none is
# configured), for the backports source.
debian_mirror() {
    local uri
    uri=$(grep -rhsE '^(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/ |
        grep -oE 'https?://[^ ]+/debian/?( |$)' | grep -v security | head -n1 | tr -d ' ')
    echo "${uri:-http://deb.debian.org/debian}"
}

apt_updated=
apt_update() {
    [ -n "$apt_updated" ] && return 0
    apt-get update -q >/dev/null
    apt_updated=1
}

# $codename-backports: newer 6.12 kernels can land there first, and a
# machine whose qemu-utils came from backports needs QEMU from there too.
# Added once; backports are not upgraded to automatically (priority 100).
ensure_backports() {
    if grep -rqs "$backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
        return 0
    fi
    echo "$me: adding $backports (/etc/apt/sources.list.d/ramd-backports.sources)"
    cat >/etc/apt/sources.list.d/ramd-backports.sources <<EOF
Types: deb
URIs: $(debian_mirror)
Suites: $backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    apt_updated=
}

install_packages() {
    local what pkgs=("${packages[@]}") v i
    what=$(missing_tool) || return 0
    [ "$(id -u)" = 0 ] || die "missing $what; run as root to install ${packages[*]}"
    echo "$me: missing $what; installing ${packages[*]}"
    ensure_backports
    apt_update
    # QEMU's packages must match an installed qemu-utils from backports
    # (its Breaks: forbid the older qemu-system-common): take exactly those
    # four from backports, nothing else.
    v=$(dpkg-query -W -f '${Version}' qemu-utils 2>/dev/null || true)
    if [[ "$v" == *bpo* ]]; then
        for i in "${!pkgs[@]}"; do
            [ "${pkgs[$i]}" = qemu-system-x86 ] && pkgs[i]=qemu-system-x86/$backports
        done
        pkgs+=(qemu-system-common/"$backports" qemu-system-data/"$backports"
            seabios/"$backports")
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${pkgs[@]}"
    if what=$(missing_tool); then
        die "still missing after install: $what"
    fi
}

# The kernel to use: RAMD_GUEST_KERNEL, else the one already cached, else
# the newest linux-image-6.12.N+debX-amd64 apt offers after an update (not
# -cloud, -rt, -dbg or -unsigned), compared as versions: deterministic for
# given apt lists. (On Debian 12 they come from bookworm-security and
# bookworm-backports.)
pick_kernel() {
    if [ "$next" = 1 ]; then
        pick_next_kernel
        return
    fi
    if [ -n "${RAMD_GUEST_KERNEL:-}" ]; then
        echo "$RAMD_GUEST_KERNEL"
        return
    fi
    if [ "${RAMD_GUEST_REFRESH:-0}" != 1 ] && [ -f "$cache/current/ready" ]; then
        basename "$(readlink -f "$cache/current")"
        return
    fi
    local k
    ensure_backports
    apt_update
    k=$(apt-cache search --names-only '^linux-image-6\.12\.[0-9]+\+deb[0-9.]+-amd64$' |
        awk '{print $1}' | sed 's/^linux-image-//' | sort -V | tail -n1)
    [ -n "$k" ] || die "apt offers no linux-image-6.12.*-amd64 (is $backports or $codename-security configured?)"
    echo "$k"
}

# The next guest's kernel: the cached one, else the newest
# linux-binary-N.N.N+debX-amd64 in Debian unstable's package index (not
# -cloud or -rt), compared as versions. Unstable splits the kernel into
# linux-binary (vmlinuz), linux-modules and linux-base; their pool paths
# are kept in $cache/$kver.debs for fetch_kernel.
pick_next_kernel() {
    if [ "${RAMD_GUEST_REFRESH:-0}" != 1 ] && [ -f "$cache/current/ready" ]; then
        basename "$(readlink -f "$cache/current")"
        return
    fi
    local index=$cache/sid-Packages k
    mkdir -p "$cache"
    curl -fsSL "$(debian_mirror)/dists/sid/main/binary-amd64/Packages.xz" | xz -dc >"$index.tmp" ||
        die "cannot read Debian unstable's package index from $(debian_mirror)"
    mv "$index.tmp" "$index"
    k=$(sed -n 's/^Package: linux-binary-\([0-9][0-9.]*+deb[0-9.]*-amd64\)$/\1/p' "$index" | sort -V | tail -n1)
    [ -n "$k" ] || die "Debian unstable offers no linux-binary-*-amd64"
    awk -v k="$k" '/^Package: /{p=$2} /^Filename: /{f=$2}
        /^$/{ if (p == "linux-binary-" k || p == "linux-modules-" k || p == "linux-base-" k) print f }' \
        "$index" >"$cache/$k.debs"
    [ "$(wc -l <"$cache/$k.debs")" = 3 ] || die "unstable's $k is not linux-binary + linux-modules + linux-base"
    echo "$k"
}

# Downloads the kernel package and unpacks vmlinuz and the module tree
# into $cache/$kver (the .deb itself is not kept).
fetch_kernel() {
    local kver=$1 dir=$cache/$1 tmp deb
    [ -f "$dir/unpacked" ] && return 0
    if [ -f "$cache/$kver.debs" ]; then
        fetch_split_kernel "$kver"
        return
    fi
    echo "$me: downloading linux-image-$kver"
    rm -rf "$dir"
    mkdir -p "$dir"
    tmp=$(mktemp -d "$cache/download.XXXXXX")
    (cd "$tmp" && apt-get download -q -o APT::Sandbox::User=root "linux-image-$kver" >/dev/null) ||
        { rm -rf "$tmp"; die "cannot download linux-image-$kver"; }
    deb=$(echo "$tmp"/*.deb)
    mkdir -p "$dir/root"
    dpkg-deb -x "$deb" "$dir/root"
    rm -rf "$tmp"
    cp "$dir/root/boot/vmlinuz-$kver" "$dir/vmlinuz"
    cp "$dir/root/boot/config-$kver" "$dir/config"
    touch "$dir/unpacked"
}

# fetch_kernel for unstable's split packages (pool paths in $cache/$kver.debs).
fetch_split_kernel() {
    local kver=$1 dir=$cache/$1 tmp f
    echo "$me: downloading the $kver kernel from Debian unstable"
    rm -rf "$dir"
    mkdir -p "$dir/root"
    tmp=$(mktemp -d "$cache/download.XXXXXX")
    while read -r f; do
        curl -fsSL -o "$tmp/pkg.deb" "$(debian_mirror)/$f" || { rm -rf "$tmp"; die "cannot download $f"; }
        dpkg-deb -x "$tmp/pkg.deb" "$dir/root"
    done <"$cache/$kver.debs"
    rm -rf "$tmp"
    # Newer packages keep the kernel and modules under /usr/lib/modules
    # only; the rest of this script (and depmod -b) reads lib/modules.
    [ -e "$dir/root/lib" ] || ln -s usr/lib "$dir/root/lib"
    local m=$dir/root/lib/modules/$kver
    if [ -f "$m/vmlinuz" ]; then cp "$m/vmlinuz" "$dir/vmlinuz"; else cp "$dir/root/boot/vmlinuz-$kver" "$dir/vmlinuz"; fi
    cp "$m/config" "$dir/config" 2>/dev/null || cp "$dir/root/boot/config-$kver" "$dir/config" 2>/dev/null || true
    touch "$dir/unpacked"
}

# Decompresses the guest modules and their dependencies, runs depmod over
# the tree (so modprobe works in the guest), and builds the initramfs.
build_guest() {
    local kver=$1 dir=$cache/$1 mods f m work stamp
    mods=$dir/root/lib/modules/$kver
    stamp="$setup_version $kver $(init_script | sha256sum | cut -c1-16) ${guest_modules[*]} / ${initramfs_modules[*]}"
    if [ -f "$dir/ready" ] && [ "$(cat "$dir/ready")" = "$stamp" ]; then
        return 0
    fi
    echo "$me: preparing modules and initramfs for $kver"
    rm -f "$dir/ready"
    depmod -b "$dir/root" "$kver"
    for m in "${guest_modules[@]}"; do
        modprobe -d "$dir/root" -S "$kver" --show-depends "$m" |
            awk '$1 == "insmod" {print $2}'
    done | sort -u | while read -r f; do
        case "$f" in *.ko.xz) xz -d -f "$f" ;; esac
    done
    depmod -b "$dir/root" "$kver"

    work=$(mktemp -d)
    mkdir -p "$work"/{bin,modules,etc,proc,sys,dev,host,results,newroot,rw}
    cp /bin/busybox "$work/bin/busybox"
    # The initramfs' modules in load order (dependencies first), without
    # duplicates, as plain .ko for busybox insmod.
    for m in "${initramfs_modules[@]}"; do
        modprobe -d "$dir/root" -S "$kver" --show-depends "$m" |
            awk '$1 == "insmod" {print $2}'
    done | awk '!seen[$0]++' | while read -r f; do
        cp "$f" "$work/modules/"
        basename "$f" >>"$work/modules/order"
    done
    echo "kver=$kver" >"$work/etc/guest.conf"
    init_script >"$work/init"
    chmod 755 "$work/init"
    (cd "$work" && find . | LC_ALL=C sort | cpio -o -H newc --quiet) | gzip -1 >"$dir/initramfs.tmp"
    mv "$dir/initramfs.tmp" "$dir/initramfs.cpio.gz"
    rm -rf "$work"
    echo "$stamp" >"$dir/ready"
}

# The guest's PID 1 (busybox sh). Everything it needs comes from the
# initramfs (busybox, the modules in /modules/order, /etc/guest.conf) and
# from the results share (/results/job/*).
init_script() {
    cat <<'INIT'
#!/bin/busybox sh
# PID 1 of the ramd test guest (written by scripts/guest.sh setup).
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
. /etc/guest.conf
log() { echo "ramd-guest: $*" >/dev/console; }
# Any failure before the script: say why, keep dmesg if the results share
# is there, power off (the host then finds no exit code).
fail() {
    log "FAILED: $*"
    if mountpoint -q /results; then
        echo "$*" >/results/harness_error
        dmesg >/results/dmesg 2>/dev/null
    fi
    dmesg | tail -n 30 >/dev/console
    poweroff -f
}
log "booted ($(cut -d' ' -f1 /proc/uptime) s)"
for m in $(cat /modules/order); do
    insmod "/modules/$m" || fail "insmod $m"
done
mount9p() { # tag dir options: the virtio devices may still be probing
    i=0
    until mount -t 9p -o "trans=virtio,version=9p2000.L,msize=262144,$3" "$1" "$2" 2>/dev/null; do
        i=$((i + 1))
        [ $i -ge 50 ] && fail "cannot mount the 9p share $1"
        sleep 0.1
    done
}
mount9p results /results cache=none
mount9p host /host ro,cache=loose
mount -t tmpfs -o mode=0755 tmpfs /rw
mkdir -p /rw/upper /rw/work
mount -t overlay overlay -o lowerdir=/host,upperdir=/rw/upper,workdir=/rw/work /newroot ||
    fail "cannot mount the overlay root"
R=/newroot
mount -t proc proc $R/proc
mount -t sysfs sysfs $R/sys
mount -t devtmpfs devtmpfs $R/dev
mkdir -p $R/dev/pts $R/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts $R/dev/pts
ln -sf pts/ptmx $R/dev/ptmx 2>/dev/null
mount -t tmpfs -o mode=1777 tmpfs $R/dev/shm
ln -sf /proc/self/fd $R/dev/fd
ln -sf /proc/self/fd/0 $R/dev/stdin
ln -sf /proc/self/fd/1 $R/dev/stdout
ln -sf /proc/self/fd/2 $R/dev/stderr
mount -t configfs configfs $R/sys/kernel/config || fail "cannot mount configfs"
mount -t debugfs debugfs $R/sys/kernel/debug 2>/dev/null
for d in tmp var/tmp; do mkdir -p $R/$d; mount -t tmpfs -o mode=1777 tmpfs $R/$d; done
for d in run mnt; do mkdir -p $R/$d; mount -t tmpfs -o mode=0755 tmpfs $R/$d; done
mkdir -p $R/root && mount -t tmpfs -o mode=0700 tmpfs $R/root
mkdir -p $R/run/lock $R/run/ramd-guest/results
mount --bind /results $R/run/ramd-guest/results
# The cached module tree as /lib/modules/$(uname -r): plain modprobe works.
moddir=$(cat /results/job/modules)
mkdir -p $R/usr/lib/modules/$kver
mount --bind $R$moddir $R/usr/lib/modules/$kver || fail "cannot bind the modules from $moddir"
# The kernel's own module requests (mount -t ext4, a socket family, ...)
# run its modprobe helper in the initramfs' root, not the chroot: hand
# them to the chroot's modprobe.
printf '#!/bin/sh\nexec chroot /newroot /sbin/modprobe "$@"\n' >/bin/guest-modprobe
chmod 755 /bin/guest-modprobe
echo /bin/guest-modprobe >/proc/sys/kernel/modprobe
hostname ramd-guest
ip link set lo up || fail "cannot bring lo up"

timeout=$(cat /results/job/timeout)
log "running the script (timeout ${timeout}s)"
cat /proc/uptime >/results/started
# The script runs in the background so a watchdog can kill it at the
# timeout and still leave its output, the status and dmesg.
chroot $R /usr/bin/env -i \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root USER=root LOGNAME=root SHELL=/bin/bash TERM=dumb LANG=C.UTF-8 \
    HOSTNAME=ramd-guest GUEST_RESULTS=/run/ramd-guest/results \
    /bin/bash -c 'set -a; . /run/ramd-guest/results/job/env; set +a
        cd "$(cat /run/ramd-guest/results/job/cwd)" || exit 125
        exec /bin/bash /run/ramd-guest/results/job/script' \
    </dev/null >/results/stdout 2>/results/stderr &
pid=$!
(sleep "$timeout"; touch /rw/timed-out; kill -KILL $pid) &
watchdog=$!
wait $pid
rc=$?
kill $watchdog 2>/dev/null
cat /proc/uptime >/results/finished
if [ -e /rw/timed-out ]; then
    echo timeout >/results/status
    log "the script timed out after ${timeout}s"
else
    echo ok >/results/status
fi
echo $rc >/results/exit_code
dmesg >/results/dmesg
log "script exited with $rc"
sync
poweroff -f
INIT
}

setup() {
    install_packages
    mkdir -p "$cache"
    local kver
    kver=$(pick_kernel)
    fetch_kernel "$kver"
    build_guest "$kver"
    ln -sfn "$kver" "$cache/current"
    echo "$me: guest kernel $kver ready in $cache/$kver"
}

check() {
    local what
    if what=$(missing_tool); then
        echo "$me: missing $what (run scripts/guest.sh setup)" >&2
        return 1
    fi
    if [ ! -f "$cache/current/ready" ]; then
        echo "$me: no guest kernel in $cache (run scripts/guest.sh setup)" >&2
        return 1
    fi
    local kver
    kver=$(basename "$(readlink -f "$cache/current")")
    local stamp
    stamp="$setup_version $kver $(init_script | sha256sum | cut -c1-16) ${guest_modules[*]} / ${initramfs_modules[*]}"
    if [ "$(cat "$cache/current/ready")" != "$stamp" ]; then
        echo "$me: the guest in $cache is out of date (run scripts/guest.sh setup)" >&2
        return 1
    fi
}

# ------------------------------------------------------------------ run ---

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed -n '/scripts\/guest.sh run/,/-v  /p' >&2
    exit 2
}

run() {
    local cpus=2 mem=2G timeout=600 results= script= command= verbose=0
    local -a envs=()
    while [ $# -gt 0 ]; do
        case "$1" in
            --cpus) cpus=${2:?}; shift 2 ;;
            --mem) mem=${2:?}; shift 2 ;;
            --timeout) timeout=${2:?}; shift 2 ;;
            --results) results=${2:?}; shift 2 ;;
            -e) envs+=("${2:?}"); shift 2 ;;
            -c) command=${2?}; shift 2 ;;
            -v) verbose=1; shift ;;
            -h | --help) usage ;;
            -*) echo "$me: unknown option $1" >&2; usage ;;
            *) [ -z "$script" ] || usage; script=$1; shift ;;
        esac
    done
    if [ -n "$script" ] && [ -n "$command" ] || [ -z "$script$command" ]; then
        echo "$me: run needs exactly one of SCRIPT_FILE or -c COMMANDS" >&2
        usage
    fi
    [[ "$timeout" =~ ^[0-9]+$ ]] || { echo "$me: --timeout takes whole seconds" >&2; exit 2; }
    check || exit 125
    local dir kver
    dir=$(readlink -f "$cache/current")
    kver=$(basename "$dir")

    local keep=1
    if [ -z "$results" ]; then
        results=$(mktemp -d /tmp/ramd-guest.XXXXXX)
        keep=0
    fi
    mkdir -p "$results/job"
    results=$(readlink -f "$results")
    if [ -n "$script" ]; then
        cp "$script" "$results/job/script"
    else
        printf '%s\n' "$command" >"$results/job/script"
    fi
    pwd >"$results/job/cwd"
    echo "$timeout" >"$results/job/timeout"
    echo "$dir/root/lib/modules/$kver" >"$results/job/modules"
    : >"$results/job/env"
    local e
    for e in "${envs[@]}"; do
        [[ "$e" == [A-Za-z_]*=* ]] || { echo "$me: -e takes NAME=VALUE, not $e" >&2; exit 2; }
        printf '%s=%q\n' "${e%%=*}" "${e#*=}" >>"$results/job/env"
    done

    # QEMU dies with this script (setpriv --pdeathsig), so a killed test
    # leaves no guest behind; the trap covers a plain exit or a signal.
    local qemu_pid=
    cleanup() {
        [ -n "$qemu_pid" ] && kill -KILL "$qemu_pid" 2>/dev/null
        [ "$keep" = 1 ] || rm -rf "$results"
    }
    trap cleanup EXIT
    trap 'exit 130' INT TERM

    local start=$SECONDS started_at
    started_at=$(date +%s.%N)
    setpriv --pdeathsig KILL -- qemu-system-x86_64 \
        -machine q35,accel="${RAMD_GUEST_ACCEL:-tcg}" -cpu max \
        -smp "$cpus" -m "$mem" \
        -nodefaults -no-user-config -nographic -no-reboot -monitor none \
        -serial "file:$results/console.log" \
        -kernel "$dir/vmlinuz" -initrd "$dir/initramfs.cpio.gz" \
        -append "console=ttyS0 quiet panic=-1 random.trust_cpu=on" \
        -virtfs local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap \
        -virtfs "local,path=$results,mount_tag=results,security_model=none,multidevs=remap" \
        </dev/null >"$results/qemu.log" 2>&1 &
    qemu_pid=$!
    local tail_pid=
    if [ "$verbose" = 1 ]; then
        tail -F -s 0.2 -n +1 "$results/console.log" >&2 2>/dev/null &
        tail_pid=$!
    fi

    local allowance=${RAMD_GUEST_BOOT_ALLOWANCE:-180} killed=0
    while kill -0 "$qemu_pid" 2>/dev/null; do
        if [ $((SECONDS - start)) -ge $((timeout + allowance)) ]; then
            kill -KILL "$qemu_pid" 2>/dev/null || true
            killed=1
            break
        fi
        sleep 0.2
    done
    wait "$qemu_pid" 2>/dev/null || true
    qemu_pid=
    [ -n "$tail_pid" ] && { sleep 0.5; kill "$tail_pid" 2>/dev/null || true; }

    if [ ! -f "$results/exit_code" ]; then
        if [ -f "$results/stdout" ]; then cat "$results/stdout"; fi
        if [ -f "$results/stderr" ]; then cat "$results/stderr" >&2; fi
        if [ "$killed" = 1 ]; then
            echo "$me: the guest did not finish within ${timeout}+${allowance}s; killed QEMU" >&2
        else
            echo "$me: the guest failed before the script finished" >&2
        fi
        echo "--- qemu ---" >&2
        cat "$results/qemu.log" >&2 || true
        echo "--- serial console (last 60 lines) ---" >&2
        tail -n 60 "$results/console.log" >&2 || true
        [ "$keep" = 1 ] && echo "$me: results kept in $results" >&2
        if [ "$killed" = 1 ]; then exit 124; else exit 125; fi
    fi

    local rc status boot ran
    rc=$(cat "$results/exit_code")
    status=$(cat "$results/status")
    cat "$results/stdout"
    cat "$results/stderr" >&2
    # Boot time: QEMU's start to the guest's first write of `started`
    # (its mtime is the host's clock); the script's time from the guest's
    # uptime.
    boot=$(awk -v a="$started_at" -v b="$(stat -c %.9Y "$results/started")" 'BEGIN { printf "%.1f", b - a }')
    ran=$(awk -v a="$(cut -d' ' -f1 "$results/started")" -v b="$(cut -d' ' -f1 "$results/finished")" \
        'BEGIN { printf "%.1f", b - a }')
    echo "$me: boot ${boot}s, script ${ran}s, total $((SECONDS - start))s (kernel $kver, TCG)" >&2
    if [ "$status" = timeout ]; then
        echo "$me: the script did not finish within --timeout ${timeout}s; the guest killed it" >&2
        rc=124
    fi
    if [ "$rc" != 0 ]; then
        echo "--- guest dmesg (last 40 lines; all in the results' dmesg) ---" >&2
        tail -n 40 "$results/dmesg" >&2 || true
        [ "$keep" = 1 ] && echo "$me: results kept in $results" >&2
    fi
    exit "$rc"
}

case "${1:-}" in
    setup) shift; setup "$@" ;;
    check) shift; check ;;
    run) shift; run "$@" ;;
    *)
        sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
        exit 2
        ;;
esac
