#!/usr/bin/env bash
# The 10-minute soak (e2e/tests/it/soak_grpcgo.rs::soak_10_minutes): the kubelet emulator at 10x
# kubelet's pace reaching crisp through grpc-go (relist every 100 ms, status calls, pods with
# sidecars started and deleted through the ordering engine) plus grpc-go call loops of
# List*/Version/Status, against a private real containerd. Asserts 0 failed calls, 0 GOAWAYs,
# 0 "Broken pipe" in crisp's log and a flat crisp RSS; prints the numbers RELIABILITY.md records.
# Needs root and what hack/setup.sh installs.
#
#   sudo hack/soak.sh                        # 600 s
#   sudo CRISP_SOAK_SECS=120 hack/soak.sh    # shorter
#   sudo CRISP_SOAK_PODS=8 hack/soak.sh      # pods in flight at once (default 5)
#   sudo CRISP_SEED=123 hack/soak.sh         # replay the pod shapes and dwell times of a run
#
# The full log goes to $OUT (default target/soak/soak.log).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

OUT="${OUT:-target/soak}"
mkdir -p "$OUT"
log="$OUT/soak.log"

if [[ $EUID -ne 0 ]]; then
    echo "hack/soak.sh: needs root (it starts containerd and containers)" >&2
    exit 1
fi
bash hack/setup.sh >/dev/null || exit 1
bash hack/build-grpcgo.sh >/dev/null || exit 1
# Only what the test runs: crisp's binary and the test (a --workspace build unifies features
# differently from `cargo test -p crisp-e2e` and would compile crisp-e2e twice).
cargo build --locked -p crisp --bin crisp >/dev/null || exit 1
cargo test --locked -p crisp-e2e --test it --no-run >/dev/null || exit 1

echo "soak: ${CRISP_SOAK_SECS:-600} s at $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (uncommitted changes)'), log in $log"
t0=$SECONDS
RUST_TEST_THREADS=1 cargo test -p crisp-e2e --locked --test it soak_grpcgo::soak_10_minutes -- --ignored --nocapture >"$log" 2>&1
rc=$?
# The numbers: the report block the test prints, and the verdict.
# (The test harness's own "ok" for the test lands after them on a line of its own.)
sed -n '/^== soak:/,$p' "$log" | grep -vE '^(running|test |ok$|$)' | head -120
grep -oE 'soak: CRISP_SEED=[0-9]+' "$log"; grep -E '^Error|panicked' "$log"
if [[ $rc -eq 0 ]]; then
    echo "== soak: ok ($((SECONDS - t0)) s)"
else
    echo "== soak: FAILED ($((SECONDS - t0)) s) — $log"
fi
exit $rc
