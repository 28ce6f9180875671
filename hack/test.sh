#!/usr/bin/env bash
# Runs every test of crisp: unit, integration (fake CRI runtime) and end-to-end (a private real
# containerd + runc, driven by the kubelet emulator). Installs what the tests need first.
#
#   sudo hack/test.sh                                      # everything, as CI runs it
#   sudo hack/test.sh -p crisp-e2e --test it -- observe::  # only this `cargo test` (after setup)
#
# Each crate's integration tests are one test binary (tests/it, e2e/tests/it), one module per
# former binary. cargo ran those binaries one after another; this script keeps that schedule by
# running each binary once per module with a filter (`--test it -- observe::`): the tests of
# one module run side by side (RUST_TEST_THREADS), never beside another module's. The load and
# timing bounds (reliability_*, adversarial, soak_grpcgo, tap_latency, ...) were set under that
# schedule. A plain `cargo test --workspace` runs the modules of a binary side by side: it
# passes too, with more tests at once on the machine (docs/TESTING.md, "Test binaries").
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
# The release artifacts (static binary, .deb, installer image) that tests/it/release_artifacts.rs
# and tests/it/node_systemd.rs check, and the cached root of the systemd test node.
bash hack/release.sh --out target/artifacts
bash hack/node-rootfs.sh >/dev/null

# End-to-end tests start containerd instances and busybox containers; four test threads keep
# a 2-core machine responsive while still overlapping the waits.
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-4}"
cargo build --workspace --all-targets --locked
if (($#)); then
  exec cargo test --locked --no-fail-fast "$@"
fi

failed=()
run() {
  echo "hack/test.sh: cargo test $*" >&2
  cargo test --locked --no-fail-fast "$@" || failed+=("cargo test $*")
}
# Unit tests, the binaries' own tests, doc tests, and the two integration tests that must be
# alone in their process (tests/it/main.rs says why).
run --workspace --lib --bins
run --workspace --doc
run -p crisp --test relay_sigpipe --test exec_probe_memory --test tap_memory
# The `it` binaries, one module at a time. The modules come from the binary's own listing, so
# none is left out; a test outside any module, or a filter that would also match another
# module's tests, is an error here rather than a test run twice or never.
for pkg in crisp crisp-e2e; do
  listing=$(cargo test --locked -p "$pkg" --test it -- --list 2>/dev/null | sed -n 's/: test$//p')
  if [[ -z $listing ]] || grep -qv '::' <<<"$listing"; then
    echo "hack/test.sh: $pkg --test it: no tests listed, or a test outside any module" >&2
    failed+=("$pkg --test it -- --list")
    continue
  fi
  mapfile -t modules < <(cut -d: -f1 <<<"$listing" | sort -u)
  for module in "${modules[@]}"; do
    if [[ $(grep -cF "$module::" <<<"$listing") != $(grep -c "^$module::" <<<"$listing") ]]; then
      echo "hack/test.sh: the filter $module:: also matches tests of other modules" >&2
      failed+=("$pkg --test it -- $module::")
      continue
    fi
    run -p "$pkg" --test it -- "$module::"
  done
done

if ((${#failed[@]})); then
  printf 'hack/test.sh: FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "hack/test.sh: every test passed" >&2
