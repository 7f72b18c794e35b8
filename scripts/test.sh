#!/usr/bin/env bash
# Runs the whole test suite: installs the test tools (scripts/test-deps.sh),
# checks formatting and lints, then runs every unit, model, protocol and
# real-client test. Tests that need a missing tool fail rather than skip.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/test-deps.sh
cargo fmt --all -- --check
cargo clippy --all-targets --locked -- -D warnings
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --locked --no-fail-fast "$@" 2>&1 | tee "$log"
# One closing line over every test binary.
awk '/^test result:/ { p += $4; f += $6 } END { printf "ramd tests: %d passed, %d failed\n", p, f }' "$log"
