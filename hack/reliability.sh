#!/usr/bin/env bash
# The long versions of crisp's reliability tests (issue #8); RELIABILITY.md records their last
# results. Needs root and what hack/setup.sh installs (a real containerd is started per test).
#
#   sudo hack/reliability.sh              # everything below, ~9–10 min on 2 cores (6 min with CHAOS_RUNS=3)
#   sudo FUZZ=1 hack/reliability.sh       # ... plus every fuzz target for 10 min (hack/fuzz.sh)
#   sudo CRISP_SEED=123 hack/reliability.sh   # replay the random choices of a failed run
#
# Steps (each prints its result lines; logs in $OUT, default target/reliability/):
#   load     200 pods in 5 waves (reliability_load::load_200_pods)
#   faults   containerd SIGKILLed twice during a 20-pod wave
#   chaos    crisp SIGKILLed 5× per wave, plain and socket-activated, CHAOS_RUNS times (10)
#   slow     every runtime answer 2 s late, kubelet deadline 8 s
#   huge     200 containers / 100 sidecars / 3 MiB of annotations
#   admin    hostile clients on the admin socket
#   sockets  socket modes before listen (strace + non-root connect race)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

OUT="${OUT:-target/reliability}"
CHAOS_RUNS="${CHAOS_RUNS:-10}"
mkdir -p "$OUT"
export RUST_TEST_THREADS=1

cargo build --workspace --all-targets --locked >/dev/null || exit 1

failed=()
step() {
    local name="$1" pattern="$2"
    shift 2
    local log="$OUT/$name.log"
    local t0=$SECONDS
    if "$@" >"$log" 2>&1; then
        echo "== $name: ok ($((SECONDS - t0)) s)"
    else
        echo "== $name: FAILED ($((SECONDS - t0)) s) — $log"
        failed+=("$name")
    fi
    grep -E "$pattern" "$log" | sed 's/^/   /'
}

step load "CRISP_SEED|^wave|^ +[0-9]+ +[0-9]+|== load|secrets:|^Error" \
    env CRISP_LOAD_PODS="${CRISP_LOAD_PODS:-200}" CRISP_LOAD_WAVES="${CRISP_LOAD_WAVES:-5}" \
    cargo test -p crisp-e2e --test it reliability_load::load_200_pods -- --ignored --nocapture
step faults "CRISP_SEED|containerd|faults:|^Error" \
    env CRISP_FAULT_PODS="${CRISP_FAULT_PODS:-20}" cargo test -p crisp-e2e --test it -- reliability_faults:: --nocapture
for i in $(seq 1 "$CHAOS_RUNS"); do
    step "chaos-$i" "CRISP_SEED|chaos: [0-9]|^Error|before|never ran" \
        env CRISP_CHAOS_PODS="${CRISP_CHAOS_PODS:-12}" cargo test -p crisp-e2e --test it -- reliability_crisp_chaos:: --nocapture
done
step slow "slow runtime|running after|^Error" \
    env CRISP_SLOW_DELAY_MS="${CRISP_SLOW_DELAY_MS:-2000}" cargo test -p crisp-e2e --test it -- reliability_slow:: --nocapture
step huge "normal pod|huge pod|^Error" \
    cargo test -p crisp-e2e --test it -- reliability_huge:: --nocapture
step admin "admin attack|panicked" \
    cargo test -p crisp --test it -- reliability_admin:: --nocapture
step sockets "control:|bind →|skipped|panicked" \
    cargo test -p crisp --test it -- reliability_sockets:: --nocapture
if [ "${FUZZ:-0}" = 1 ]; then
    step fuzz "^[a-z]+ +[0-9]+|REGRESSION|panicked" hack/fuzz.sh 600
fi

if [ ${#failed[@]} -ne 0 ]; then
    echo "FAILED: ${failed[*]}"
    exit 1
fi
echo "all reliability steps passed"
