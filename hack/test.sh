#!/usr/bin/env bash
# Runs every test of crisp: unit, integration (fake CRI runtime) and end-to-end (a private real
# containerd + runc, driven by the kubelet emulator). Installs what the tests need first.
#
#   sudo hack/test.sh            # everything
#   sudo hack/test.sh -p crisp   # extra arguments go to `cargo test`
set -euo pipefail
cd "$(dirname "$0")/.."

# A full build with the end-to-end images needs about 8 GB; say so up front instead of failing
# mid-link with "No space left on device".
avail_kb=$(df -Pk . | awk 'NR==2 {print $4}')
echo "hack/test.sh: $((avail_kb / 1024 / 1024)) GiB free on $(df -P . | awk 'NR==2 {print $6}')" >&2
if (( avail_kb < 6 * 1024 * 1024 )); then
  echo "hack/test.sh: warning: less than 6 GiB free; the build may run out of space" >&2
fi
bash hack/setup.sh
# Formatting and clippy (-D warnings) first: a lint failure fails the run in a minute.
bash hack/lint.sh
# Real grpc-go peers (kubelet's client, containerd's server) for the end-to-end tests.
bash hack/build-grpcgo.sh >/dev/null
# The release artifacts (static binary, .deb, installer image) that tests/release_artifacts.rs
# and tests/node_systemd.rs check, and the cached root of the systemd test node.
bash hack/release.sh --out target/artifacts
bash hack/node-rootfs.sh >/dev/null

# End-to-end tests start containerd instances and busybox containers; four test threads keep
# a 2-core machine responsive while still overlapping the waits.
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-4}"
cargo build --workspace --all-targets --locked
cargo test --workspace --locked --no-fail-fast "$@"
