#!/usr/bin/env bash
# Installs the client tools the integration tests drive (tests/clients.rs:
# qemu-img/qemu-io, nbdinfo/nbdcopy/nbdfuse, nbdsh, fio with its nbd engine,
# losetup, mount, mkfs.ext4, fusermount3; Python's prometheus_client for
# tests/metrics.rs; chromium, chromium-driver and python3-selenium for the
# dashboard in tests/dashboard.rs) plus the peer servers the benches
# compare against (nbdkit, nbd-server), on Debian 12, as root; and Garage,
# the S3 server of tests/snapshot_engine.rs (cargo install). Then the
# guest-kernel harness of the guest tests (scripts/guest.sh setup: QEMU, a
# Debian 6.12 kernel with ublk/nbd/nvme-tcp/brd, its initramfs), and on the
# host the kernel-client tools those tests run in the guest (nvme-cli,
# nbd-client, mdadm).
#
# Idempotent and fast when nothing is missing: apt is not touched at all
# then. Otherwise one `apt-get update` and one `apt-get install`.
set -euo pipefail

# Debian 12 packages. There is no separate nbdfuse package on Debian 12: the
# nbdfuse binary ships in libnbd-bin. losetup and mount are in `mount`.
packages=(
    qemu-utils     # qemu-img, qemu-io
    libnbd-bin     # nbdinfo, nbdcopy, nbdfuse
    python3-libnbd # nbdsh and Python's nbd module
    python3-prometheus-client # parses /metrics in tests/metrics.rs
    fio            # built with the libnbd ioengine on Debian
    nbdkit
    nbd-server
    fuse3          # fusermount3
    e2fsprogs      # mkfs.ext4, e2fsck
    util-linux
    mount          # mount, umount, losetup
    procps         # pgrep, ps
    coreutils      # sha256sum, sync, cp
    openssl        # certificates for tests/tls.rs and bench/tls.sh
    curl           # the API over TCP in tests/api_tcp.rs
    chromium       # the dashboard in a real browser (tests/dashboard.rs), headless
    chromium-driver # chromedriver, for selenium
    python3-selenium # drives chromium from tests/browser/dashboard.py
    nvme-cli       # nvme connect, run in the guest (tests/guest*.rs)
    nbd-client     # the kernel NBD client, run in the guest (tests/guest_nbd.rs)
    mdadm          # md raid1, run in the guest
)
tools=(
    qemu-img qemu-io nbdinfo nbdcopy nbdfuse nbdsh fio nbdkit nbd-server
    fusermount3 mkfs.ext4 e2fsck losetup mount umount pgrep sha256sum fstrim openssl curl
    chromium chromedriver nvme nbd-client mdadm
)

# The tests run tools with the system directories first on PATH (so a
# pyenv python3 earlier on PATH cannot hide Debian's nbd module): check the
# same way.
export PATH="/usr/sbin:/usr/bin:/sbin:/bin:${PATH:-}"

missing() {
    local t
    for t in "${tools[@]}"; do
        command -v "$t" >/dev/null 2>&1 || { echo "$t"; return 0; }
    done
    /usr/bin/python3 -c 'import nbd' >/dev/null 2>&1 || { echo "python3 nbd module"; return 0; }
    /usr/bin/python3 -c 'import prometheus_client' >/dev/null 2>&1 || { echo "python3 prometheus_client module"; return 0; }
    /usr/bin/python3 -c 'import selenium' >/dev/null 2>&1 || { echo "python3 selenium module"; return 0; }
    fio --enghelp=nbd 2>/dev/null | grep -q uri || { echo "fio nbd ioengine"; return 0; }
    return 1
}

# Garage, the S3 server tests/snapshot_engine.rs pushes snapshots to. Not
# packaged by Debian 12: built from crates.io (sqlite metadata, bundled C
# libraries; no LMDB), into ~/.cargo/bin. Slow the first time (~20 min on
# 2 cores), skipped when a garage binary is already there.
install_garage() {
    if command -v garage >/dev/null 2>&1 || [ -x "${HOME:-/root}/.cargo/bin/garage" ]; then
        return 0
    fi
    echo "test-deps: installing garage (cargo install; this takes a while)"
    cargo install garage --locked --no-default-features --features sqlite,bundled-libs
}
install_garage

# The guest-kernel harness (tests/guest*.rs): its own packages, a kernel
# download and an initramfs the first time (~1 min), instant afterwards.
bash "$(dirname "$0")/guest.sh" setup
# The second guest (Debian unstable's newest kernel) for what 6.12 lacks:
# tests/guest_ublk_next.rs.
RAMD_GUEST_NEXT=1 bash "$(dirname "$0")/guest.sh" setup

if ! what=$(missing); then
    echo "test-deps: all test tools are installed"
    exit 0
fi
echo "test-deps: missing $what; installing ${packages[*]}"
if [ "$(id -u)" != 0 ]; then
    echo "test-deps: must run as root to install packages (apt-get)" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends "${packages[@]}"
if what=$(missing); then
    echo "test-deps: still missing after install: $what" >&2
    exit 1
fi
echo "test-deps: all test tools are installed"
