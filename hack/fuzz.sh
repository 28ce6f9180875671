#!/usr/bin/env bash
# Runs crisp's cargo-fuzz targets (fuzz/fuzz_targets/*.rs) on the stable toolchain and prints,
# per target, the executions and the crashes of this run. Results go into RELIABILITY.md.
#
#   hack/fuzz.sh                  # every target, 600 s each, 2 at a time
#   hack/fuzz.sh 60 patch wire    # 60 s each, only these targets
#   FUZZ_JOBS=1 hack/fuzz.sh      # one target at a time (shared machines)
#
# What works on stable Rust (1.95, no nightly installed):
# - `cargo fuzz build/run --sanitizer none` passes no `-Z` flag at all (sancov instrumentation is
#   `-C passes=sancov-module` + `-C llvm-args`, both stable), so it needs no RUSTC_BOOTSTRAP.
#   crisp's fuzzed code is safe Rust, so AddressSanitizer would add little; debug assertions
#   (`-a`: integer overflow, slice bounds are checked anyway) are on.
# - The default `--sanitizer address` passes `-Zsanitizer=address`, which stable rustc refuses;
#   RUSTC_BOOTSTRAP=1 unlocks the flag (set FUZZ_SANITIZER=address to try it; not used here).
# Known inputs that once crashed a target are replayed first (fuzz/regressions/<target>/).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

SECS="${1:-600}"
shift || true
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
    TARGETS=(annotations readiness views patch wire hpack huffman probe_input frames stop_numbers core)
fi
JOBS="${FUZZ_JOBS:-2}"
SAN="${FUZZ_SANITIZER:-none}"
FLAGS=(--sanitizer "$SAN" --release --debug-assertions)
if [ "$SAN" != none ]; then
    export RUSTC_BOOTSTRAP=1
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz (crates.io)..."
    cargo install cargo-fuzz --locked
fi

# Seeds for the text targets: every readiness form.
mkdir -p corpus/readiness
i=0
for s in 'running' 'tcp://:24224' 'tcp://127.0.0.1:80' 'http://:15021/healthz/ready' 'http://[::1]:8080/' 'exec:["cat","/tmp/ready"]' 'exec:["sh","-c","test -f /x"]' 'http://localhost:1/a?b=c'; do
    printf '%s' "$s" > "corpus/readiness/seed-$i"
    i=$((i + 1))
done

# Seeds for probe_input (first byte: 0 CIDR list, 1 sandbox info JSON, 2 readiness spec).
mkdir -p corpus/probe_input
printf '\x0010.0.0.0/8\nfd00::/8\n192.0.2.7' > corpus/probe_input/seed-cidrs
printf '\x01{"pid":4242,"runtimeSpec":{"linux":{"namespaces":[{"type":"network","path":"/var/run/netns/cni-1"}]}}}' > corpus/probe_input/seed-info
printf '\x02http://169.254.169.254:80/latest' > corpus/probe_input/seed-spec

echo "building ${TARGETS[*]} (${FLAGS[*]})..."
for t in "${TARGETS[@]}"; do
    cargo fuzz build "${FLAGS[@]}" "$t" >/dev/null
done

# Regressions: the inputs that crashed a target before its fix must pass now.
for t in "${TARGETS[@]}"; do
    if [ -d "regressions/$t" ] && [ -n "$(ls -A "regressions/$t")" ]; then
        cargo fuzz run "${FLAGS[@]}" "$t" regressions/"$t"/* >/dev/null 2>&1 \
            || { echo "REGRESSION: a known crash input of $t crashes again (cargo fuzz run ${FLAGS[*]} $t fuzz/regressions/$t/...)"; exit 1; }
        echo "$t: $(find "regressions/$t" -mindepth 1 -maxdepth 1 | wc -l) regression input(s) pass"
    fi
done

mkdir -p logs
marker=$(mktemp)
run_one() {
    local t="$1"
    mkdir -p "corpus/$t"
    cargo fuzz run "${FLAGS[@]}" "$t" "corpus/$t" -- -max_total_time="$SECS" -print_final_stats=1 \
        > "logs/$t.log" 2>&1 || true
}
pids=()
for t in "${TARGETS[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do
        wait -n || true
    done
    echo "fuzzing $t for ${SECS}s (log: fuzz/logs/$t.log)"
    run_one "$t" &
    pids+=($!)
done
wait

status=0
printf '\n%-12s %14s %10s %8s %s\n' target executions exec/s corpus crashes
for t in "${TARGETS[@]}"; do
    runs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "logs/$t.log" | tail -1 | awk '{print $2}')
    speed=$(grep -o 'stat::average_exec_per_sec:[[:space:]]*[0-9]*' "logs/$t.log" | tail -1 | awk '{print $2}')
    corpus=$(find "corpus/$t" -mindepth 1 -maxdepth 1 | wc -l)
    crashes=$(find "artifacts/$t" -type f -newer "$marker" 2>/dev/null | wc -l)
    printf '%-12s %14s %10s %8s %s\n' "$t" "${runs:-?}" "${speed:-?}" "$corpus" "$crashes"
    if [ "$crashes" != 0 ]; then
        status=1
        find "artifacts/$t" -type f -newer "$marker" | sed 's/^/    /'
        grep -m1 -A2 panicked "logs/$t.log" | sed 's/^/    /' || true
    fi
done
rm -f "$marker"
exit $status
